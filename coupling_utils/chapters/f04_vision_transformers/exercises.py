"""f04's exercise variants, measured in the chapter's plan so that each solution states what the
variant gives (``f04-ex-token``, ``f04-ex-patch``, ``f04-ex-mean``, ``f04-ex-seed``): the run
and its twin at the other tokens (:data:`EX_TOKENS`), the run's checkpoints averaged over every
token, and twins drawn under :data:`N_SEEDS` ``init_seed`` values. At the smoke profile this
costs seconds, at the default one (64 digits, 19 checkpoints) minutes (:data:`CURVE_IMAGES`).
:func:`exercise_jobs` plans it, :func:`condense_exercises` reads it back and
:func:`exercise_glue` puts it into the solutions' words."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import torch

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.analysis.stats import mean_ci
from coupling_utils.analysis.verdicts import Interval
from coupling_utils.measurement import Job, Result, relabel

# the tokens the token exercises compare (the chapter's own token comes from its twins study)
CENTRE = ("patch5", "patch6", "patch9", "patch10")
EX_TOKENS = ("cls", "last", *CENTRE)
N_SEEDS = 5  # f04-ex-seed: the twins drawn under this many init_seed values
# f04-ex-mean's curve over every token reads at most this many digits: over all 64 of the default
# profile its 19 checkpoints took about 13 of the variants' 19 minutes on a 2-core CPU
CURVE_IMAGES = 16


def twin_seeds(model: str, init_seed: int) -> list[int]:
    """:data:`N_SEEDS` twin seeds from ``init_seed`` on, skipping the seed the run was trained from."""
    trained = vt.training_seed(model)
    seeds, s = [], int(init_seed)
    while len(seeds) < N_SEEDS:
        if s != trained:
            seeds.append(s)
        s += 1
    return seeds


def curve_token(token: str) -> str:
    """The token of f04-ex-mean's second training curve: every token (``mean``), or the CLS token
    when the chapter already measures the mean."""
    return "mean" if token != "mean" else "cls"


def variant_setup(setup: vt.ViTSetup, variant: str) -> vt.ViTSetup:
    """The run's setup as a variant measures it: at its own token, and for the curve over every
    token on at most :data:`CURVE_IMAGES` digits."""
    kind, _, token = variant.partition(":")
    if kind == "seed":
        return setup
    if kind == "curve":
        return dataclasses.replace(setup, token=token, n_images=min(setup.n_images, CURVE_IMAGES))
    return dataclasses.replace(setup, token=token)


def exercise_jobs(p, setup: vt.ViTSetup, name: str, revisions: list[str]) -> list[Job]:
    """The variants' jobs, each labelled with its ``variant``: ``token:<t>`` (the run and its twin at
    each of :data:`EX_TOKENS` but the chapter's token), ``curve:<t>`` (every checkpoint at
    :func:`curve_token`) and ``seed:<s>`` (the twin alone, at each of
    :func:`twin_seeds` but ``init_seed``)."""
    twins = {"twins": True, "init_seed": p.init_seed}
    planned: list[Job] = []
    for token in (t for t in EX_TOKENS if t != p.token):
        jobs = vt.vit_jobs({name: p.model}, dataclasses.replace(setup, token=token), k=p.k, **twins)
        planned += relabel(jobs, lambda _, t=token: {"variant": f"token:{t}"})
    other = curve_token(p.token)
    refs = {rev: {"name_or_path": p.model, "revision": rev} for rev in revisions}
    jobs = vt.vit_jobs(refs, variant_setup(setup, f"curve:{other}"), k=p.k)
    planned += relabel(jobs, lambda _: {"variant": f"curve:{other}"})
    for seed in twin_seeds(p.model, p.init_seed)[1:]:
        jobs = vt.vit_jobs({name: p.model}, setup, k=p.k, twins=True, init_seed=seed)
        twin = [j for j in jobs if j.labels["weights"] == "random init"]
        planned += relabel(twin, lambda _, s=seed: {"variant": f"seed:{s}"})
    return planned


def condense_exercises(
    results: Iterable[Result], setup: vt.ViTSetup, echo: Callable[[str], None] | None = None
) -> dict[str, vt.ViTCoupling]:
    """The collected variants by ``variant`` label, each condensed at its own token."""
    by: dict[str, list[Result]] = {}
    for r in results:
        by.setdefault(r.job.labels["variant"], []).append(r)
    return {variant: vt.condense(done, variant_setup(setup, variant), echo) for variant, done in by.items()}


# --------------------------------------------------------------------------- the solutions' values
def token_coupling(p, r, token: str) -> vt.ViTCoupling:
    """The run and its twin at ``token``: the chapter's twins study, or the variant that measured it."""
    return r.twins if token == p.token else r.exercises[f"token:{token}"]


def _excess_by_image(c: vt.ViTCoupling) -> pd.Series:
    """Trained minus twin per image (the first model measured both ways)."""
    paired = c.per_prompt.pivot_table(index="prompt", columns="weights", values="coupling", aggfunc="mean")
    return (paired["trained"] - paired["random init"]).rename("excess")


def _mean(p, values: pd.Series, over: str) -> Interval:
    """The mean of ``values`` with its bootstrap interval (resampling them)."""
    return Interval.from_bootstrap(mean_ci(values, n_resamples=p.n_resamples, seed=p.seed), over=over)


def token_excesses(p, r, tokens) -> pd.DataFrame:
    """Per image, each token's excess over its twin (a column per token)."""
    return pd.concat({t: _excess_by_image(token_coupling(p, r, t)) for t in tokens}, axis=1).dropna()


def _difference(p, diff: pd.Series) -> Interval:
    """The mean of paired differences with its bootstrap interval over the images."""
    return _mean(p, diff, f"{len(diff)} images")


def _told_apart(d: Interval) -> bool:
    """Whether a difference's interval lies on one side of 0 (no interval: not told apart)."""
    return d.resampled and (d.low > 0 or d.high < 0)


def _compared(p, diff: pd.Series, what: str) -> str:
    """ "larger/smaller than <what> by d (difference d [lo, hi]: an interval that excludes 0)" where
    the paired interval lies on one side of 0; otherwise "not told apart from <what>" with the
    difference and its interval, and no direction word."""
    d = _difference(p, diff)
    if _told_apart(d):
        word = "larger" if d.estimate > 0 else "smaller"
        return f"{word} than {what} by {abs(d.estimate):.3f} (difference {d}: an interval that excludes 0)"
    why = ": an interval that includes 0" if d.resampled else ""  # str(d) says why there is none
    return f"not told apart from {what} on these images (difference {d}{why})"


def token_sentence(p, r) -> str:
    """f04-ex-token's expected result: the last patch against the CLS token."""
    last = vt.twin_gap(token_coupling(p, r, "last"), n_resamples=p.n_resamples, seed=p.seed).iloc[0]
    both = token_excesses(p, r, ("last", "cls"))
    return (
        f"Measured here at the last patch token: trained {last.trained:.3f} against twin {last.twin:.3f}, "
        f"an excess of {last.excess:.3f} ({vt.excess_interval(last).words('.3f')}), "
        + _compared(p, both["last"] - both["cls"], "the CLS token's excess")
        + "."
    )


_PATCH_ORDER = ("cls", "centre", "last")  # the order f04-ex-patch asks about: CLS > centre > last
_PATCH_NAMES = {"cls": "CLS", "centre": "centre", "last": "last"}


def patch_sentence(p, r) -> str:
    """f04-ex-patch's expected result: the centre patches between the CLS token and the last patch?
    Each pair of the three is ordered only where its paired difference over the images has an
    interval on one side of 0; the pairs that are not told apart are said so, and the order
    CLS > centre > last is said to hold only when all three pairs are told apart that way."""
    per = token_excesses(p, r, ("cls", *CENTRE, "last"))
    per["centre"] = per[list(CENTRE)].mean(axis=1)
    over = f"{len(per)} images"
    centre = _mean(p, per["centre"], over)
    means = per.mean()
    patches = ", ".join(f"{t.removeprefix('patch')}: {means[t]:.3f}" for t in CENTRE)
    apart, together, against = [], [], False
    for i, a in enumerate(_PATCH_ORDER):
        for b in _PATCH_ORDER[i + 1 :]:
            d = _difference(p, per[a] - per[b])  # a before b in the asked order
            diff = f"{_PATCH_NAMES[a]} − {_PATCH_NAMES[b]} {d}"
            if _told_apart(d):
                hi, lo = (a, b) if d.estimate > 0 else (b, a)
                against = against or d.estimate < 0
                apart.append(f"{_PATCH_NAMES[hi]} > {_PATCH_NAMES[lo]} ({diff})")
            else:
                together.append(f"{_PATCH_NAMES[a]} and {_PATCH_NAMES[b]} ({diff})")
    told = (
        f"told apart (paired intervals over the images that exclude 0): {'; '.join(apart)}"
        if apart
        else "no pair is told apart by a paired interval over the images"
    )
    if together:
        told += f"; not told apart (an interval that includes 0, or none): {'; '.join(together)}"
    verdict = (
        "So the order CLS > centre > last holds for every pair"
        if not together and not against
        else "That contradicts the order CLS > centre > last"
        if against
        else "So the order CLS > centre > last is neither shown nor contradicted"
    )
    return (
        f"Measured here, the excess over the twin is {means['cls']:.3f} at the CLS token, {patches} at "
        f"the centre patches (their mean {centre}) and {means['last']:.3f} at the last patch. Of the three "
        f"pairs, {told}. {verdict}."
    )


def _curve_rho(r, token: str, main: str) -> Interval:
    """Spearman ρ of a training curve with the step, with its 95% interval over the images: the
    chapter's own curve as its rule judges it (:attr:`Results.emerges_values`), the exercise's
    curve resampled the same way (images resampled, their mean curve's ρ recomputed)."""
    from coupling_utils.analysis.training_curves import shape_intervals

    if token == main:
        rho = r.emerges_values["spearman"]
    else:
        per = r.exercises[f"curve:{token}"].per_prompt.rename(columns={"prompt": "image"})
        per = per.assign(step=per.model.str.removeprefix("step").astype(int))
        found = shape_intervals(per, "coupling", vt.curve_shape, ["spearman"], unit="image", n_resamples=500)
        rho = found.get("spearman", float("nan"))
    return rho if isinstance(rho, Interval) else Interval(float(rho), -float("inf"), float("inf"))


def trend_words(rho: Interval) -> str:
    """What a curve does with the step, read from its ρ's interval: it rises (or falls) only when the
    interval lies above (below) 0."""
    if rho.low > 0:
        return "rises with the step (its interval lies above 0)"
    if rho.high < 0:
        return "falls with the step (its interval lies below 0)"
    return "shows no clear trend with the step (its interval includes 0)"


def mean_sentence(p, r) -> str:
    """f04-ex-mean's expected result: the shape of the curve over every token against the CLS token's;
    what each curve does with the step, and which ranks higher, follow the ρ intervals."""
    other = curve_token(p.token)
    c = r.exercises[f"curve:{other}"].summary.rename(columns={"model": "revision"})
    c["step"] = c.revision.str.removeprefix("step").astype(int)
    shapes = {p.token: r.shape, other: vt.curve_shape(c)}
    ref = "cls" if "cls" in shapes else p.token  # the laptop profile measures the last patch
    mean, cls = shapes["mean"], shapes[ref]
    rho = {t: _curve_rho(r, t, p.token) for t in ("mean", ref)}
    which = "the CLS token's" if ref == "cls" else f"{r.token_words}'s"
    rank = (
        f"ρ is higher than {which}" if rho["mean"].low > rho[ref].high else
        f"ρ is lower than {which}" if rho["mean"].high < rho[ref].low else
        f"ρ is not told apart from {which}"
    )  # fmt: skip
    later = (
        "later" if mean["peak_fraction"] > cls["peak_fraction"] else
        "earlier" if mean["peak_fraction"] < cls["peak_fraction"] else "at the same place"
    )  # fmt: skip
    n_curve, n_run = min(p.n_images, CURVE_IMAGES), p.n_images
    digits = (
        f"on the run's {n_run} digits" if n_curve == n_run else f"on {n_curve} of the run's {n_run} digits"
    )
    return (
        f"Measured here over the same checkpoints ({digits}), the curve averaged over every token has ρ = "
        f"{rho['mean'].estimate:.2f} with the step ({rho['mean'].words()}) and its peak at "
        f"{mean['peak_fraction']:.2f} of training, against {which} ρ = {rho[ref].estimate:.2f} "
        f"({rho[ref].words()}) and {cls['peak_fraction']:.2f}. By ρ, the mean's curve "
        f"{trend_words(rho['mean'])} and {which} {trend_words(rho[ref])}; the mean's {rank} (higher or "
        f"lower is said only where the two intervals do not overlap). It peaks {later}; its largest fall is "
        f"{mean['max_drop']:.2f} of its range (against {cls['max_drop']:.2f})."
    )


def seed_values(p, r) -> dict[str, Any]:
    """f04-ex-seed: the twins' coupling at :func:`twin_seeds` against the trained run's."""
    seeds = twin_seeds(p.model, p.init_seed)
    per = {seeds[0]: r.twins.per_prompt}
    per |= {s: r.exercises[f"seed:{s}"].per_prompt for s in seeds[1:]}
    twins = pd.Series({s: float(pp[pp.weights == "random init"].coupling.mean()) for s, pp in per.items()})
    mean = _mean(p, twins, f"{len(twins)} seeds")
    sd, trained = float(twins.std(ddof=1)), float(r.gap.trained)
    gap = trained - float(twins.mean())
    outside = trained > twins.max() or trained < twins.min()
    return {
        "seeds": seeds, "twins": twins, "mean": mean, "sd": sd, "trained": trained, "gap": gap,
        "in_sd": abs(gap) / sd if sd > 0 else float("inf"), "outside": outside,
        "range": float(twins.max() - twins.min()),
    }  # fmt: skip


def seed_sentence(p, r) -> str:
    """f04-ex-seed's expected result, in words that follow :func:`seed_values`."""
    v = seed_values(p, r)
    twins = ", ".join(f"{c:.3f}" for c in v["twins"])
    where = (
        "outside the range of the twins, so the trained–twin gap does not hang on the seed" if v["outside"]
        else "inside the range of the twins, so the trained–twin gap depends on which seed draws the twin"
    )  # fmt: skip
    return (
        f"Measured here, twins drawn under seeds {', '.join(map(str, v['seeds']))} give {twins}: mean "
        f"{v['mean']} and standard deviation {v['sd']:.4f} (range {v['range']:.4f}). The trained ViT's "
        f"{v['trained']:.3f} is {v['gap']:+.3f} from their mean, {v['in_sd']:.1f} standard deviations, "
        f"and {where}."
    )


def seed_words(v: dict[str, Any]) -> str:
    """Where the trained run lies against the twins of :func:`seed_values`, in their standard
    deviations over the seeds (the chapter's spread of chance, with its number of seeds)."""
    n, side = len(v["seeds"]), "above" if v["gap"] > 0 else "below"
    if not v["sd"] > 0:
        return f"{abs(v['gap']):.3f} {side} the mean of twins drawn under {n} seeds, which do not vary"
    return (
        f"{v['in_sd']:.1f} standard deviations {side} the mean of twins drawn under {n} seeds "
        f"(trained minus their mean {v['gap']:+.3f}, standard deviation over the {n} seeds {v['sd']:.4f})"
    )


def exercise_glue(p, r) -> dict[str, Any]:
    """The solutions' values: a sentence per exercise (``glue:md``) and the seed study's numbers."""
    from IPython.display import Markdown

    v = seed_values(p, r)
    return {
        "f04_ex_token": Markdown(token_sentence(p, r)),
        "f04_ex_patch": Markdown(patch_sentence(p, r)),
        "f04_ex_mean": Markdown(mean_sentence(p, r)),
        "f04_ex_seed": Markdown(seed_sentence(p, r)),
        "f04_ex_seed_sd": v["sd"],
        "f04_ex_seed_in_sd": v["in_sd"],
        "f04_ex_seed_n": len(v["seeds"]),
        "f04_seed_words": Markdown(seed_words(v)),
        **ink_values(p, r),
    }


def ink_values(p, r) -> dict[str, Any]:
    """How often the last patch and the centre four patches of the run's digits hold ink (a pixel
    above 0): the share of the digits for the last patch (``f04_ink_last``), and the smallest of
    the centre four's shares (``f04_ink_centre``), with the number of digits (``f04_ink_n``)."""
    (rows, cols), (ph, pw) = r.facts["grid"], r.facts["patch"]
    digits, _ = vt.mnist_digits(p.n_images, split="test", seed=p.seed)
    stack = torch.stack(list(digits.values()))  # [n, H, W] uint8
    patches = stack[:, : rows * ph, : cols * pw].reshape(len(stack), rows, ph, cols, pw)
    ink = (patches > 0).any(dim=4).any(dim=2).float().mean(dim=0)  # [rows, cols]: share with ink
    centre = ink[rows // 2 - 1 : rows // 2 + 1, cols // 2 - 1 : cols // 2 + 1]
    return {
        "f04_ink_last": float(ink[-1, -1]),
        "f04_ink_centre": float(centre.min()),
        "f04_ink_n": len(stack),
    }
