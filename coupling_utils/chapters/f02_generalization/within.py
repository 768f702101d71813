"""f02's training family (``training_family``): one architecture, only training varies.

In the size family (``family``) the members differ in width and depth, and so do their twins:
the twins alone, untouched by training, order the members by accuracy about as well as the
excess does, so that family cannot say what training added. Here width, depth and seed are
fixed and only the steps and the data differ; every twin is the same model (same config, same
``init_seed``), so the chance level is one number and the excess is raw coupling minus it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import plots
from coupling_utils.analysis.predictors import predictor_comparison
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.verdicts import Interval, claim
from coupling_utils.chapters.f02_generalization.plan import CLAIMS, MIN_TAIL_POINTS, WITHIN, Params, Results
from coupling_utils.chapters.f02_generalization.sections import Family, Training, join_family, training

WITHIN_PREDICTORS = {
    "excess": "excess",
    "raw coupling": "coupling",
    "twin coupling": "twin_coupling",
    "log10 steps": "log10 steps",
}
"""The predictors of held-out accuracy in the training family (size is constant there)."""


@dataclass
class Within:
    """The training family: its members and learning curves (``training``), their coupling
    beside their twin's (``family``), every predictor of held-out accuracy (``fits``) and
    Spearman's ρ of the excess with accuracy, with its bootstrap interval over members (``rho``)."""

    training: Training
    family: Family
    fits: pd.DataFrame
    rho: Interval

    @property
    def span(self) -> float:
        """The range of held-out accuracy over the members measured (max − min)."""
        acc = self.family.ours["val_acc"]
        return float(acc.max() - acc.min()) if len(acc) else float("nan")


def within(p: Params, results: Results) -> Within:
    """The training family's members, curves (judged by the flat rule), coupling and fits."""
    t = training(p, "training_family")
    f = join_family(p, t, results.training)
    ours = f.ours
    ours["log10 steps"] = np.log10(ours["steps"].clip(lower=1))
    fits = predictor_comparison(ours, "val_acc", WITHIN_PREDICTORS, p.boot)
    return Within(t, f, fits, spearman_interval(fits.set_index("predictor").loc["excess"]))


def spearman_interval(fit: pd.Series) -> Interval:
    """Spearman's ρ of a :func:`predictor_comparison` row with its bootstrap interval over
    members, widened to hold its estimate (NaN where no fit was possible)."""
    est = float(fit["spearman"])
    if np.isnan(est):
        return Interval(np.nan, np.nan, np.nan, over="members")
    low, high = float(fit["spearman_ci_low"]), float(fit["spearman_ci_high"])
    over = f"{int(fit['n'])} members" if "n" in fit.index else "members"  # fewer than 6: no interval
    return Interval(est, min(low, est), max(high, est), over=over)


def within_table(w: Within) -> pd.DataFrame:
    """The training family's table the chapter shows: training, coupling and held-out scores."""
    columns = ["run", "steps", "tokens", "K", "coupling", "twin_coupling", "excess", "excess_se"]
    stage = w.training.stage[["run", "tail_drop_rel", "tail_points", "flat"]].astype({"flat": object})
    stage.loc[~w.training.stage["judged"].astype(bool), "flat"] = "too short to judge"
    return w.family.ours[[*columns, "val_loss", "val_acc"]].merge(stage, on="run").round(4)


def within_chart(w: Within):
    """Held-out accuracy against the excess over the (one) twin, one point per member."""
    return plots.scatter_fit(
        w.family.ours,
        "excess",
        "val_acc",
        label="run",
        look=plots.Look(
            title="One architecture, only training varies",
            x_title="excess coupling (trained − twin)",
            y_title="held-out accuracy",
        ),
    )


def within_claims(p: Params, w: Within) -> list[dict[str, Any]]:
    """The training family's status row, judged by :data:`WITHIN` (no row without members)."""
    ours = w.family.ours
    if ours.empty:
        return []
    twin = ours["twin_coupling"]
    return [
        claim(
            CLAIMS["within"],
            paper="positive correlation with performance",
            rule=WITHIN,
            values={"rho": w.rho, "n": len(ours), "span": w.span},
            ours=f"Spearman ρ {w.rho.estimate:.2f} {w.rho.bracketed()}",
            note=f"{len(ours)} models of one architecture trained here, K/d = {p.k_over_d}; held-out "
            f"accuracy {ours.val_acc.min():.4f} to {ours.val_acc.max():.4f} (span {w.span:.4f}); "
            f"{_twin_words(twin)}; {w.training.flat_note()}; {_trimmed_note(w)}",
        )
    ]


def _trimmed_note(w: Within) -> str:
    """The status note's caveat: what the ρ rests on (:func:`least_trained_out`, the steps' ρ)."""
    trimmed = least_trained_out(w.family.ours)
    steps = float(w.fits.set_index("predictor").loc["log10 steps", "spearman"])
    if len(trimmed) < 2:  # none left out
        return f"accuracy with log10 steps ρ {steps:.2f}"
    return (
        "ρ over the members on all the data, least trained left out one at a time: "
        f"{_trimmed_words(trimmed)}; accuracy with log10 steps ρ {steps:.2f}"
    )


def _twin_words(twin: pd.Series) -> str:
    """The twins' coupling in the status note: one value where every member shares one twin (the
    note read "twin coupling 0.065 to 0.065"), else its range."""
    low, high = f"{twin.min():.3f}", f"{twin.max():.3f}"
    return f"twin coupling {low} for every member" if low == high else f"twin coupling {low} to {high}"


def on_slice(ours: pd.DataFrame) -> pd.Series:
    """Whether each member was trained on a slice of the training plays rather than all of them
    (the zoo names those runs ``s<steps>-data<tokens>``, e.g. ``s512-data16k``)."""
    return ours["run"].str.contains("-data", regex=False)


def _pairs(ours: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(member with less data, the member of as many steps on all the data), by run name
    (``s512-data16k`` beside ``s512``)."""
    by_run = ours.set_index("run")
    return [
        (by_run.loc[run], by_run.loc[run.split("-")[0]])
        for run in by_run.index
        if "-" in run and run.split("-")[0] in by_run.index
    ]


FEWEST_RANKED = 4
"""The fewest members :func:`least_trained_out` computes a ρ over (fewer ranks say almost nothing)."""


def least_trained_out(ours: pd.DataFrame) -> pd.DataFrame:
    """What the excess's ρ with held-out accuracy rests on: Spearman's ρ over the members on all the
    data, the least trained (fewest steps) left out one at a time while at least
    :data:`FEWEST_RANKED` remain. One row per step: ``n``, ``from_steps`` (the fewest steps kept),
    ``rho`` (NaN where either column is constant)."""
    from scipy.stats import spearmanr

    full = ours[~on_slice(ours)].sort_values("steps", kind="stable")
    rows = []
    for start in range(max(len(full) - FEWEST_RANKED + 1, 0)):
        kept = full.iloc[start:]
        constant = kept["excess"].nunique() < 2 or kept["val_acc"].nunique() < 2
        rho = float("nan") if constant else float(spearmanr(kept["excess"], kept["val_acc"]).statistic)
        rows.append({"n": len(kept), "from_steps": int(kept["steps"].min()), "rho": rho})
    return pd.DataFrame(rows, columns=["n", "from_steps", "rho"])


def _trimmed_words(trimmed: pd.DataFrame) -> str:
    """The :func:`least_trained_out` ρs in a list: "0.60 (6 members, from 2 steps), 0.30 (5, ...)"."""
    return listed(
        f"{r.rho:.2f} ({r.n}{' members' if i == 0 else ''}, from {r.from_steps} steps)"
        for i, r in enumerate(trimmed.itertuples())
    )


def _rests_sentence(w: Within, steps_rho: float) -> str:
    """The caveat beside the training family's verdict: ρ with the least trained left out one at a
    time, ρ of accuracy with the steps alone, and, read from them, whether the positive ρ over all
    members survives among the members trained longest (the last ρ of the list above 0) or not."""
    trimmed = least_trained_out(w.family.ours)
    said = f"held-out accuracy and the number of steps alone have ρ = {steps_rho:.2f}"
    if len(trimmed) < 2:
        too_few = f"Too few members on all the data to leave any out (at least {FEWEST_RANKED} must stay)"
        return f"{too_few}; {said}."
    last = trimmed.iloc[-1]
    out = (
        "Over the members on all the data, leaving out the least trained one at a time gives ρ = "
        f"{_trimmed_words(trimmed)}, while {said}"
    )
    if np.isnan(last.rho) or not w.rho.estimate > 0:
        return out + "."
    if last.rho <= 0:
        return (
            out + f": the positive ρ over all members rests on those trained least (in steps or in data); "
            f"among the {int(last.n)} on all the data from {int(last.from_steps)} steps on, excess coupling "
            "does not rise with accuracy."
        )
    return out + ": it stays positive as the least trained are left out."


def _data_sentence(ours: pd.DataFrame) -> Markdown:
    pairs = _pairs(ours)
    if not pairs:
        return Markdown("No member is trained on less data at the same number of steps as another.")
    return Markdown(
        " ".join(
            f"`{few.name}`, trained for as many steps as `{full.name}` on a fraction of the data, reaches "
            f"held-out accuracy {few.val_acc:.3f} ({full.name}: {full.val_acc:.3f}) with excess coupling "
            f"{few.excess:.3f} ({full.name}: {full.excess:.3f})."
            for few, full in pairs
        )
    )


def _flat_sentence(t: Training) -> Markdown:
    """How many of the training family's curves are not flat at their end, and how each moved;
    it follows "By the flat rule," in the prose, so it does not name the rule again."""
    short = t.stage[~t.stage["judged"].astype(bool)]
    stage = t.stage[t.stage["judged"].astype(bool)]
    falling = stage[~stage["flat"]]
    too_short = (
        f"; {listed([f'`{r}`' for r in short['run']])} {'is' if len(short) == 1 else 'are'} too short to "
        f"judge (evaluated fewer than {MIN_TAIL_POINTS} times in {'its' if len(short) == 1 else 'their'} "
        "last stretch)"
        if len(short)
        else ""
    )
    if stage.empty:
        return Markdown(f"no member's curve is long enough to judge{too_short}")
    if falling.empty:
        every = "every curve long enough to judge" if len(short) else "every member's curve"
        return Markdown(f"{every} is flat at its end{too_short}")
    names = ", ".join(f"`{r}`" for r in falling["run"])
    parts = []
    down, up = falling[falling["tail_drop"] > 0], falling[falling["tail_drop"] < 0]
    if len(down):
        worst = down.loc[down["tail_drop_rel"].idxmax()]
        parts.append(
            f"`{worst.run}`'s held-out loss still fell by {worst.tail_drop:.3f} nats, "
            f"{worst.tail_drop_rel:.1%} of its final value, over its last stretch, so more steps would "
            "still have lowered it"
        )
    if len(up):
        worst = up.loc[up["tail_drop_rel"].idxmin()]
        parts.append(
            f"`{worst.run}`'s rose by {-worst.tail_drop:.3f} nats ({-worst.tail_drop_rel:.1%}): it was "
            "overfitting its training data"
        )
    judged = " long enough to judge" if len(short) else ""
    return Markdown(
        f"{len(falling)} of {len(stage)} curves{judged} are not flat at their end ({names}): "
        + "; ".join(parts)
        + too_short
    )


def _peak_sentence(ours: pd.DataFrame) -> Markdown:
    """Where the excess peaks against where training went furthest. A member is named the largest
    only where its excess exceeds every other's by more than two standard errors of the gap
    (√(se₁² + se₂²), each over prompts); otherwise the members within that of it are named as not
    told apart."""
    order = ours.sort_values("excess", ascending=False, kind="stable")
    top, longest = order.iloc[0], ours.loc[ours["steps"].idxmax()]
    within = ~((top.excess - order["excess"]) > 2 * np.sqrt(top.excess_se**2 + order["excess_se"] ** 2))
    tied = order[within]
    most = (
        f"the most trained member, `{longest.run}`, has {longest.excess:.3f} at accuracy "
        f"{longest.val_acc:.3f}"
    )
    if len(tied) > 1:
        others = tied.iloc[1:]
        names = (
            "any other member's"
            if len(others) == len(order) - 1
            else listed([f"`{r.run}`'s ({r.excess:.3f})" for r in others.itertuples()])
        )
        return Markdown(
            f"`{top.run}`'s excess ({top.excess:.3f}, after {int(top.steps)} steps) is the highest estimate "
            f"but is not told apart from {names} (within two standard errors of the gap, over prompts); "
            f"{most}."
        )
    if top.run == longest.run:
        return Markdown(
            f"The most trained member, `{top.run}`, also has the largest excess ({top.excess:.3f}, more than "
            "two standard errors of the gap above every other member's)."
        )
    return Markdown(
        f"The largest excess is `{top.run}`'s ({top.excess:.3f}, after {int(top.steps)} steps, held-out "
        f"accuracy {top.val_acc:.3f}; more than two standard errors of the gap above every other member's); "
        f"{most}."
    )


def within_glue(w: Within | None) -> dict[str, Any]:
    """Every value the training family's prose glues, by name."""
    if w is None or w.family.ours.empty:
        return {}
    ours, t = w.family.ours, w.training
    fits = w.fits.set_index("predictor")
    span = w.span
    sliced = on_slice(ours)
    full = ours[~sliced]
    steps = (full if len(full) else ours)["steps"]  # the members on all the data
    return {
        "f02_within_n": len(ours),
        "f02_within_n_full": len(full),
        "f02_within_n_slice": int(sliced.sum()),
        "f02_within_arch": Markdown(
            f"d = {int(ours.d_model.iloc[0])}, {int(ours.n_layers.iloc[0])} blocks, K = {int(ours.K.iloc[0])}"
        ),
        "f02_within_steps": Markdown(f"{int(steps.min())} to {int(steps.max())}"),
        "f02_within_rho": w.rho.estimate,
        "f02_within_rho_interval": w.rho.words(".2f"),
        "f02_within_r2": float(fits.loc["excess", "r2"]),
        "f02_within_rests": Markdown(_rests_sentence(w, float(fits.loc["log10 steps", "spearman"]))),
        "f02_within_acc_low": float(ours.val_acc.min()),
        "f02_within_acc_high": float(ours.val_acc.max()),
        "f02_within_span": span,
        "f02_within_span_word": Markdown(
            "at least the 0.2 this family was built to span"
            if span >= 0.2
            else "less than the 0.2 it was built to span"
        ),
        "f02_within_twin": float(ours.twin_coupling.mean()),
        "f02_within_twin_spread": float(ours.twin_coupling.max() - ours.twin_coupling.min()),
        "f02_within_excess_low": float(ours.excess.min()),
        "f02_within_excess_high": float(ours.excess.max()),
        "f02_within_n_flat": t.n_flat,
        "f02_within_flat_sentence": _flat_sentence(t),
        "f02_within_data_sentence": _data_sentence(ours),
        "f02_within_peak": _peak_sentence(ours),
        "f02_within_sign": Markdown(
            sign_words(
                w.rho.estimate,
                w.rho.low,
                w.rho.high,
                "not positive: more training raised accuracy without raising coupling in the same order",
                n=len(ours),
            )
        ),
    }


def sign_words(
    rho: float, low: float, high: float, against: str, n: int | None = None, min_n: int = 6
) -> str:
    """The sign of a Spearman ρ as the prose says it, read with its interval: the paper's
    direction (or ``against``) only where the whole interval has that sign and there are at least
    ``min_n`` members (``n``; the family rules ask for 6: fewer are too few for a bootstrap interval
    to mean much); otherwise undecided."""
    if np.isnan([rho, low, high]).any():
        return "undecided: too few members for a rank correlation and its interval"
    if (low > 0 or high < 0) and n is not None and n < min_n:
        side = "positive" if low > 0 else "negative"
        return (
            f"{side} over its whole interval, but {n} members are fewer than the {min_n} the family rules "
            "ask for, so these members do not settle the sign"
        )
    if low > 0:
        return "positive, the direction the paper reports"
    if high < 0:
        return against
    side = "positive" if rho > 0 else "not positive"
    return f"{side} in its estimate, but its interval includes 0, so these members do not settle the sign"
