"""f04's status rows (:func:`claims`), judged by the rules fixed before any number, the
assumptions its prose makes about the run's numbers (:func:`assumption`) and the values it glues
(:func:`glue_values`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from coupling_utils.analysis import k_policy
from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.verdicts import Interval, claim, verdict_word
from coupling_utils.chapters.f04_vision_transformers.exercises import exercise_glue
from coupling_utils.chapters.f04_vision_transformers.plan import (
    ABOVE_TWIN,
    EMERGES,
    FAMILY,
    HUB_ABOVE_TWIN,
    RULES,
    Params,
    Results,
)


def twin_values(r: Results) -> dict[str, Any]:
    """What :data:`ABOVE_TWIN` judges: the run's excess over its twin with its interval (paired
    bootstrap over the test images), the init gap."""
    gap = r.gap
    return {"excess": vt.excess_interval(gap), "init_gap": r.init_gap}


def hub_values(h) -> dict[str, Any]:
    """What :data:`HUB_ABOVE_TWIN` judges for one hub ViT (a row of ``hub_gaps``)."""
    return {"excess": vt.excess_interval(h)}


def family_values(r: Results) -> dict[str, Any]:
    """What :data:`FAMILY` judges: Spearman's rho of test accuracy with the excess coupling, with
    its bootstrap interval over the members."""
    row = r.fits.loc["excess coupling"]
    rho = Interval(
        row["spearman"], row["spearman_ci_low"], row["spearman_ci_high"], over=f"{len(r.vits)} ViTs"
    )
    return {"rho_excess": rho}


def claims(p: Params, r: Results) -> list[dict[str, Any]]:
    """The reproduction-status rows (for ``pipeline.status.report``): emergence, the run against
    its twin, each hub ViT measured against its twin, and the family."""
    shape, gap, fam = r.shape, r.gap, family_values(r)
    note = f"{p.n_images} test digits, {r.token_words}, K = {p.k}"
    rows = [
        claim("coupling emerges during ViT training", paper="emerges over training (no numbers published)",
              rule=EMERGES, values=r.emerges_values,
              ours=f"{shape['init']:.3f} → {shape['final']:.3f}, peak {shape['peak']:.3f} at step "
                   f"{shape['peak_step']}, ρ(step) {shape['spearman']:.2f}",
              note=f"{r.named['run']}; {note}"),
        claim("a trained ViT is more coupled than its untrained twin",
              paper="coupling absent at initialisation", rule=ABOVE_TWIN, values=twin_values(r),
              ours=f"{gap.trained:.3f} vs twin {gap.twin:.3f} (step 0: {r.step0.coupling.mean():.3f})",
              note=f"{r.named['twins']}; paired over {int(gap.n_images)} images, excess interval "
                   f"{twin_values(r)['excess'].bracketed('.3f')}; twin seed {p.init_seed}; {note}"),
    ]  # fmt: skip
    for h in r.hub_gaps.itertuples() if r.hub_gaps is not None else ():
        rows.append(claim(f"pretrained {h.model} is more coupled than its untrained twin",
                          paper="coupling absent at initialisation", rule=HUB_ABOVE_TWIN,
                          values=hub_values(h),
                          ours=f"{h.trained:.3f} vs twin {h.twin:.3f}",
                          note=f"paired over {h.n_images} images; {note}"))  # fmt: skip
    rows.append(claim("more coupled ViTs generalise better (family, test accuracy)",
                      paper="coupling relates to generalisation", rule=FAMILY, values=fam,
                      ours=f"ρ(excess) {fam['rho_excess'].estimate:.2f}; "
                           f"raw ρ {r.fits.loc['coupling', 'spearman']:.2f}",
                      note=f"{len(r.vits)} ViTs trained here on MNIST (last third of training: at most "
                           f"{100 * r.members.plateau_share.max():.1f}% of each one's accuracy rise), "
                           f"K/d = {p.family_k_over_d}; {p.n_images} test digits, "
                           f"{r.token_words}"))  # fmt: skip
    return rows


ASSUMPTIONS = {
    "f04_twin_above_zero": "the untrained twin's coupling is clearly above 0",
    "f04_family_plateau": "every family member's validation accuracy rose by less than 5% of its whole rise "
    "over its last third of training (the book's plateau test)",
}


def assumption(key: str, r: Results) -> tuple[str, bool, str]:
    """``(key, holds, text)`` of an assumption the prose makes about this run's numbers, for
    ``verdicts.assume`` next to that prose."""
    holds = {
        "f04_twin_above_zero": lambda: r.gap.twin > 0.005,
        "f04_family_plateau": lambda: bool((r.members.plateau_share < 0.05).all()),
    }[key]()
    return key, holds, ASSUMPTIONS[key]


def glue_values(p: Params, r: Results) -> dict[str, Any]:
    """Every value the prose glues, by name (``glue:md`` values as Markdown)."""
    from IPython.display import Markdown

    shape = r.shape
    values: dict[str, Any] = {f"f04_rule_{key}": Markdown(rule.text) for key, rule in RULES.items()}
    values |= {
        "f04_token": Markdown(r.token_words),
        "f04_digits": Markdown(", ".join(map(str, r.facts["digits"]))),
        "f04_n_images": p.n_images,
        "f04_init_seed": p.init_seed,
        "f04_k_over_d": p.family_k_over_d,
        "f04_n_tokens": 1 + int(np.prod(r.facts["grid"])),
    }
    values |= {f"f04_{key}": shape[key] for key in ("init", "final", "rise", "spearman", "max_drop", "peak",
                                                      "peak_fraction")}  # fmt: skip
    values |= {
        "f04_peak_step": shape["peak_step"],
        "f04_final_step": int(r.curve.step.max()),
        "f04_final_acc": float(r.curve.test_acc.iloc[-1]),
        "f04_rho_acc": r.rho_acc,
        "f04_run_plateau_gain": 100 * r.run_plateau["gain"],
        "f04_run_plateau_words": Markdown(_change_words(100 * r.run_plateau["gain"])),
        "f04_run_plateau_from": r.run_plateau["from_step"],
        "f04_shape_words": Markdown(vt.describe_curve(shape)),
    }
    rows = claims(p, r)  # the prose's verdicts are the status rows': emergence, the twin, the family
    verdicts = {"f04_emerges": verdict_word(rows[0]), "f04_above_twin": verdict_word(rows[1]),
                "f04_family": verdict_word(rows[-1])}  # fmt: skip
    return (
        values
        | _twin_glue(r)
        | _family_glue(r)
        | verdicts
        | {"f04_hub_missing": Markdown(_hub_missing(r)), "f04_hub_words": Markdown(hub_words(p, r))}
        | {"f04_model_words": r.named["run"]}
        | {"f04_ex_kd_curve": Markdown(_kd_sentence(p, r))}
        | exercise_glue(p, r)
    )


def _sign_sentence(trained: float) -> str:
    """What a coupling below 0 means: 1 − m² < 0 is m > 1, past unrelated random matrices (m ≈ 1)."""
    if trained >= 0:
        return ""
    return (
        f"The trained value is negative: 1 − m² = {trained:.3f} means m ≈ {(1 - trained) ** 0.5:.3f} > 1, "
        "farther from diagonalising each other than two unrelated random matrices (m ≈ 1, coupling "
        "about 0) and inside the metric's range (m ≤ √2). So training did not merely fail to "
        "couple this ViT's blocks; their top singular vectors line up with each other's less than "
        "chance would."
    )


def _twin_glue(r: Results) -> dict[str, Any]:
    from IPython.display import Markdown

    gap, init_gap = r.gap, r.init_gap
    return {
        "f04_trained": float(gap.trained),
        "f04_twin": float(gap.twin),
        "f04_step0": float(r.step0.coupling.mean()),
        "f04_excess": float(gap.excess),
        "f04_excess_interval": twin_values(r)["excess"].words(".3f"),
        "f04_init_gap": init_gap,
        "f04_init_gap_words": _two_digits(abs(init_gap)),
        "f04_twin_word": Markdown("above" if gap.excess > 0 else "below"),
        "f04_sign_sentence": Markdown(_sign_sentence(float(gap.trained))),
        "f04_excess_abs": abs(float(gap.excess)),
    }


def _two_digits(x: float) -> str:
    """``x`` with at least three decimals and as many more as two significant digits need: the gap
    between two random draws read "0.000" at three decimals, where it was 0.000024."""
    x = float(x)
    if not math.isfinite(x) or x == 0:
        return f"{x:.3f}"
    return f"{x:.{max(3, 1 - math.floor(math.log10(abs(x))))}f}"


def _change_words(points: float) -> str:
    """A change in accuracy points in words that follow its sign: "rose by 1.2", "fell by 1.6"."""
    if round(points, 1) == 0:
        return "did not change (0.0 points)"
    return f"{'rose' if points > 0 else 'fell'} by {abs(points):.1f} points"


def _plateau_words(r: Results) -> tuple[str, str]:
    """The family's plateau test in words: what the members' last thirds show, and what follows
    by the test (every ``plateau_share`` below 5%, as :func:`assumption` checks)."""
    m = r.members
    gain, share = 100 * float(m.plateau_gain.max()), 100 * float(m.plateau_share.max())
    if gain > 0:
        shown = (
            "no member's validation accuracy rose over its last third of training by more than "
            f"{gain:.1f} points"
        )
        if share == share:
            shown += f" or {share:.1f}% of its whole rise"
    else:
        shown = "no member's validation accuracy rose over its last third of training"
    undefined = int(m.plateau_share.isna().sum())
    if undefined:
        shown += (
            f"; {undefined} of the {len(m)} members never rose over their whole training, so "
            + ("it has" if undefined == 1 else "they have")
            + " no share to test"
        )
    _, held, _ = assumption("f04_family_plateau", r)
    if not held:
        return shown[0].upper() + shown[1:], (
            "not every member passed the 5% plateau test, so the family compares in part how far training got"
        )
    conclusion = (
        "every member passed the 5% plateau test, so by that test the members are compared at their plateau"
    )
    if gain > 0:
        spread = 100 * float(m.test_acc.max() - m.test_acc.min())
        conclusion += (
            f", though validation accuracy still rose by up to {gain:.1f} points over a member's last "
            f"third, against a spread of {spread:.1f} points in test accuracy across the family"
        )
    return shown[0].upper() + shown[1:], conclusion


def _steps_words(m) -> str:
    """How long the family's members trained, from their table: "a fixed 800 steps (4.1 epochs)"
    when all ran the same number of steps, else the range."""
    steps, epochs = m.steps.astype(int), m.epochs.astype(float)
    if steps.nunique() == 1:
        return f"the same fixed {steps.iloc[0]} steps ({epochs.iloc[0]:.1f} epochs)"
    return f"{steps.min()} to {steps.max()} steps ({epochs.min():.1f} to {epochs.max():.1f} epochs)"


def _twin_levels(vits) -> str:
    """The twins' coupling (each configuration's chance level) by depth and width, as words:
    "0.080 (width 32) and 0.120 (width 48) at depth 2; ..."."""
    levels = vits.groupby(["n_layers", "d_model"])["twin"].mean()
    return "; ".join(
        listed([f"{level:.3f} (width {width})" for (_, width), level in by_width.items()])
        + f" at depth {depth}"
        for depth, by_width in levels.groupby(level="n_layers")
    )


def _family_glue(r: Results) -> dict[str, Any]:
    from IPython.display import Markdown

    fits, vits = r.fits, r.vits
    shown, conclusion = _plateau_words(r)
    values = {
        "f04_plateau_shown": Markdown(shown),
        "f04_plateau_conclusion": Markdown(conclusion),
        "f04_plateau_share_max": 100 * float(r.members.plateau_share.max()),
        "f04_plateau_gain_max": 100 * float(r.members.plateau_gain.max()),
        "f04_family_steps": Markdown(_steps_words(r.members)),
        "f04_twin_levels": Markdown(_twin_levels(vits)),
        "f04_family_n": len(vits),
        "f04_acc_low": float(vits.test_acc.min()),
        "f04_acc_high": float(vits.test_acc.max()),
    }
    for label, key in (("excess coupling", "excess"), ("coupling", "raw")):
        values[f"f04_rho_{key}"] = float(fits.loc[label, "spearman"])
        row = fits.loc[label]
        est, low, high = float(row["spearman"]), float(row["spearman_ci_low"]), float(row["spearman_ci_high"])
        rho = Interval(est, min(low, est), max(high, est), over=f"{len(vits)} ViTs")
        values[f"f04_rho_{key}_interval"] = rho.words(".2f")
    signs = np.sign(fits.loc["excess coupling", "spearman"]) * np.sign(fits.loc["coupling", "spearman"])
    values["f04_sign_words"] = Markdown(
        "agree in sign" if signs > 0 else
        "disagree in sign, and the excess decides, as stated before the result" if signs < 0
        else "do not both have a sign (one is 0), and the excess decides"
    )  # fmt: skip
    values["f04_r2_words"] = Markdown(_r2_words(fits, len(vits)))
    values["f04_r2_size"] = Markdown(_size_words(fits, len(vits)))
    return values


SIZES = ("log10 params", "depth", "width")  # the size measures the paper sets coupling against
COUPLINGS = ("excess coupling", "coupling")


def _r2_intervals(fits, n: int) -> dict[str, Interval]:
    """Each fitted predictor's R² of test accuracy with its bootstrap interval over the ``n``
    members, in the table's order."""
    bounds = {"estimate": "r2", "ci_low": "r2_ci_low", "ci_high": "r2_ci_high"}
    return {
        str(name): Interval.from_bootstrap(
            {key: row[col] for key, col in bounds.items()} | {"level": row.get("level", 0.95)},
            over=f"{n} ViTs",
        )
        for name, row in fits.dropna(subset=["r2"]).iterrows()
    }


def _r2_above(iv: dict[str, Interval]) -> dict[str, list[str]]:
    """For each predictor, those it explains more than: whose R² interval lies wholly below its own
    (both resampled). Only such pairs are told apart; every other pair's intervals overlap."""

    def clear(a: Interval, b: Interval) -> bool:
        return a.resampled and b.resampled and a.low > b.high

    return {a: [b for b in iv if b != a and clear(iv[a], iv[b])] for a in iv}


def _r2_words(fits, n: int) -> str:
    """Each predictor's R² of test accuracy with its bootstrap interval over the ``n`` members, then
    every pair told apart (one's interval wholly above the other's) and whether the highest is named:
    only where its interval lies above every other's. No rule names a best predictor here."""
    iv = _r2_intervals(fits, n)
    if not iv:
        return "no predictor varies over the members, so none has an R²"
    listed_r2 = "; ".join(f"{name} {i.estimate:.2f} ({i.words()})" for name, i in iv.items())
    if len(iv) == 1:
        return listed_r2
    if not any(i.resampled for i in iv.values()):
        none = "With no intervals, no two are told apart and none is named the one with the highest R²"
        return f"{listed_r2}. {none}"
    above = _r2_above(iv)
    top = max(iv, key=lambda name: iv[name].estimate)
    rivals = [b for b in iv if b != top and b not in above[top]]
    told = [
        f"The R² of {a} is above that of {below[0]}: their intervals do not overlap"
        if len(below) == 1
        else f"The R² of {a} is above those of {listed(below)}: its interval lies above each of theirs"
        for a, below in above.items()
        if below and (a != top or rivals)  # a top above all is said once, below
    ]
    if not rivals:
        told.append(f"The R² of {top} is the highest: its interval lies above every other's")
    else:
        those = f"that of {rivals[0]}" if len(rivals) == 1 else f"those of {listed(rivals)}"
        told.append(
            f"The interval of {top} overlaps {those}, so no predictor is named the one with the highest R²"
        )
    pairs = len(iv) * (len(iv) - 1) // 2
    if sum(map(len, above.values())) + len(rivals) < pairs:
        unresampled = not all(i.resampled for i in iv.values())
        told[-1] += (
            "; no other pair is told apart" if unresampled else "; every other pair's intervals overlap"
        )
    return f"{listed_r2}. " + ". ".join(told)


def _size_words(fits, n: int) -> str:
    """Whether size or coupling explains test accuracy better, where the two are told apart
    (:func:`_r2_above`), set against the paper's finding for its LLMs; a comparison of
    intervals, not a judged claim."""
    iv = _r2_intervals(fits, n)
    above = _r2_above(iv) if iv else {}
    sizes, couplings = [s for s in SIZES if s in iv], [c for c in COUPLINGS if c in iv]
    size_first = [f"{s} better than {c}" for s in sizes for c in couplings if c in above[s]]
    coupling_first = [f"{c} better than {s}" for c in couplings for s in sizes if s in above[c]]
    paper = (
        "the paper finds for its LLMs (coupling explains the leaderboard score better than parameter "
        "count, depth and embedding dimension)"
    )
    if not size_first and not coupling_first:
        return (
            "Comparing intervals: no size measure is told apart from a coupling measure, so this family "
            f"neither shows nor reverses what {paper}"
        )
    if size_first and coupling_first:
        said = (
            f"the pairs go both ways ({listed(size_first + coupling_first)}), so this family neither "
            f"shows nor reverses what {paper}"
        )
    elif size_first:
        said = f"size explains test accuracy better ({listed(size_first)}), the reverse of what {paper}"
    else:
        said = f"coupling explains test accuracy better ({listed(coupling_first)}), as {paper}"
    head = "Comparing intervals (no claim here is judged on it): where a size measure and a coupling measure"
    return f"{head} are told apart, {said}"


KD_EXERCISE = (1 / 8, 1 / 2)  # the two K/d the f04-ex-kd solution reads from the stored curve


def _kd_sentence(p: Params, r: Results) -> str:
    """f04-ex-kd's expected result: the family at :data:`KD_EXERCISE` on the stored K/d curve."""
    accuracy = r.vits.set_index("run")["test_acc"].rename("test accuracy")
    return k_policy.family_sentence(
        p.family, KD_EXERCISE, accuracy, unit="test digits (fewer than this run's)"
    )


def hub_words(p: Params, r: Results) -> str:
    """What matched for the pretrained hub ViTs: each one's excess over its twin with its interval
    and verdict (the status rows'), or, when none was measured, where they are measured."""
    if r.hub_gaps is None or r.hub_gaps.empty:
        return (
            "**Not reproduced here.** The paper's ViTs are unknown; ViTs of a few blocks on 28×28 digits "
            "are much smaller than ImageNet ViTs. The `paper` profile adds two pretrained ImageNet ViTs "
            "from the hub (ViT-B/16 and DeiT-B) against their twins on the same digits."
        )
    rows = {row["claim"]: row for row in claims(p, r)}
    parts = [
        f"{r.named[h.model]}: trained {h.trained:.3f} against its twin's {h.twin:.3f}, excess {h.excess:.3f} "
        f"({hub_values(h)['excess'].words('.3f')}): verdict "
        f"{verdict_word(rows[f'pretrained {h.model} is more coupled than its untrained twin']).data}"
        for h in r.hub_gaps.itertuples()
    ]
    return (
        f"**Pretrained hub ViTs.** {'; '.join(parts)}. The paper's ViTs are unknown: these are ImageNet "
        "ViTs measured on MNIST digits resized to their input size, not the paper's setting."
    )


def _hub_missing(r: Results) -> str:
    """ "Not measured in this run: ..." for hub ViTs that are missing (empty when none is)."""
    hub = r.hub
    if hub is None or not len(hub.failures):
        return ""
    missing = "; ".join(f"{m} ({hub.failures[hub.failures.model == m].error.iloc[0]})" for m in hub.missing)
    return f"Not measured in this run: {missing}."
