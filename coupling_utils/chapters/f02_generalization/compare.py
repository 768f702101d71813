"""f02's comparisons of predictors, each read by a rule fixed before the result and by its interval:
on which leaderboard tasks the paper's coupling predicts better than parameter count
(:data:`~.plan.TASK_VS_SIZE`), and whether the predictor with the highest R² in the family is the
best single one (:data:`~.plan.BEST_PREDICTOR`). The sentences here say what the rules found."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis.verdicts import Interval
from coupling_utils.chapters.f02_generalization.plan import BEST_PREDICTOR, TASK_VS_SIZE

SIDES = ("coupling", "parameter count", "neither")
"""Which predictor a task counts for by :data:`~.plan.TASK_VS_SIZE`: coupling, parameter count, or
neither (the interval of the difference includes 0)."""


def gap_interval(row: Mapping[str, Any]) -> Interval:
    """R²(coupling) − R²(log10 params) of a ``leaderboards.task_fits`` row, with its paired bootstrap
    interval over the row's models (widened to hold the estimate)."""
    est, low, high = (float(row[c]) for c in ("gap", "gap_ci_low", "gap_ci_high"))
    return Interval(est, min(low, est), max(high, est), over=f"{int(row['n'])} models")


def task_side(row: Mapping[str, Any]) -> str:
    """The predictor a task counts for (one of :data:`SIDES`): :data:`~.plan.TASK_VS_SIZE` judged on
    the difference, then on its negative for parameter count."""
    gap = gap_interval(row)
    if TASK_VS_SIZE.judge({"gap": gap}) == "yes":
        return SIDES[0]
    against = Interval(-gap.estimate, -gap.high, -gap.low, gap.level, gap.over)
    return SIDES[1] if TASK_VS_SIZE.judge({"gap": against}) == "yes" else SIDES[2]


def _named(tasks: pd.DataFrame) -> str:
    return ", ".join(f"{v} {name}" for v, name in zip(tasks["version"], tasks["name"]))


def tasks_sentence(tasks: pd.DataFrame) -> str:
    """What the per-task comparison found, from the single tasks of ``task_fits`` with their ``side``:
    how many estimates favour coupling, then where the task rule counts a task for either."""
    n, above = len(tasks), int((tasks["gap"] > 0).sum())
    ours, theirs = tasks[tasks["side"] == SIDES[0]], tasks[tasks["side"] == SIDES[1]]
    said = f"Coupling's $R^2$ is above parameter count's on {above} of the {n} tasks"
    low, high = float(tasks["gap_ci_low"].min()), float(tasks["gap_ci_high"].max())
    if ours.empty and theirs.empty:
        return (
            f"{said} in the estimates, but by the task-vs-size rule the paired 95% interval of the "
            f"difference includes 0 on every one of them (the intervals run from {low:.3f} to "
            f"{high:.3f}): no task separates coupling from parameter count on these models"
        )
    parts = [
        f"lies above 0 on {len(ours)} ({_named(ours)})" if len(ours) else "lies above 0 on none",
        f"below 0 on {len(theirs)} ({_named(theirs)})" if len(theirs) else "below 0 on none",
    ]
    rest = n - len(ours) - len(theirs)
    return (
        f"{said} in the estimates; by the task-vs-size rule, the paired 95% interval of the difference "
        f"{parts[0]} and {parts[1]}, and includes 0 on the other {rest}, which do not separate the two"
    )


def lead_interval(lead: Mapping[str, Any], unit: str) -> Interval:
    """The lead of ``predictor_lead``'s best over the best of the others, as an Interval over its
    ``n`` ``unit``s (widened to hold the estimate)."""
    est, low, high = float(lead["estimate"]), float(lead["ci_low"]), float(lead["ci_high"])
    return Interval(est, min(low, est), max(high, est), float(lead["level"]), f"{lead['n']} {unit}")


def _share(s: float) -> str:
    """A share of the resamples in words: "62%", or "under 1%" where it rounds to 0."""
    return f"{s:.0%}" if s >= 0.005 else "under 1%"


def best_sentence(lead: Mapping[str, Any], r2: Mapping[str, float], y: str, unit: str) -> str:
    """Which predictor of ``y`` is the best, as :data:`~.plan.BEST_PREDICTOR` reads ``lead``
    (``predictor_lead``'s answer; ``r2``: each predictor's R² on the rows as drawn)."""
    best, second = lead["best"], lead["runner_up"]
    gap = lead_interval(lead, unit)
    shares = sorted(((s, name) for name, s in lead["share"].items() if s > 0), reverse=True)[:3]
    often = ", ".join(f"{name} in {_share(s)}" for s, name in shares[1:])
    often = f"{shares[0][1]} has the highest $R^2$ in {_share(shares[0][0])} of the resamples" + (
        f", {often}" if often else ""
    )
    head = (
        f"its lead over the next, {second} ({r2[second]:.3f}), is {gap.estimate:.3f} "
        f"({gap.words('.3f')}, against the best of the others in each resample)"
    )
    if BEST_PREDICTOR.judge({"lead": gap}) == "yes":
        return (
            f"The best single predictor of {y} is {best} ($R^2$ = {r2[best]:.3f}): {head}, above 0 "
            f"throughout, so the best-predictor rule names it; {often}"
        )
    return (
        f"The highest $R^2$ of {y} is {best}'s ({r2[best]:.3f}), but {head}, not wholly above 0: by "
        f"the best-predictor rule no single predictor is the best on these {lead['n']} {unit}; {often}"
    )


def compare_glue(
    lead: Mapping[str, Any], acc: pd.DataFrame, tasks: pd.DataFrame, v2: pd.Series, v1: pd.Series
) -> dict[str, Any]:
    """The glued values of the comparisons: the family's best predictor of accuracy (``lead``:
    ``predictor_lead``'s answer; ``acc``: each predictor's fit, by predictor), coupling against
    parameter count per leaderboard task (``tasks``, with their ``side``) and on the v2 average
    (``v2``), and the v2 average's fit against the v1 average's (``v1``)."""
    r2 = acc["r2"].dropna().to_dict()
    best, interval = str(lead["best"]), lead_interval(lead, "members")
    return {
        "f02_family_best": Markdown(best),
        "f02_family_best_r2": float(r2[best]),
        "f02_family_best_lead": interval.estimate,
        "f02_family_best_lead_low": interval.low,
        "f02_family_best_lead_high": interval.high,
        "f02_family_best_sentence": Markdown(best_sentence(lead, r2, "accuracy", "members")),
        "f02_family_best_verdict": Markdown(
            f"by the best-predictor rule {best} is the best single predictor"
            if BEST_PREDICTOR.judge({"lead": interval}) == "yes"
            else "by the best-predictor rule no single predictor is the best"
        ),
        "f02_tasks_beats_size": int((tasks["gap"] > 0).sum()),
        "f02_tasks_n": len(tasks),
        "f02_tasks_for_coupling": int((tasks["side"] == SIDES[0]).sum()),
        "f02_tasks_for_size": int((tasks["side"] == SIDES[1]).sum()),
        "f02_tasks_sentence": Markdown(tasks_sentence(tasks)),
        "f02_v2_size_gap": Markdown(
            f"difference {v2.gap:.3f}, {gap_interval(v2).words('.3f')}: "
            + {SIDES[0]: "coupling the better of the two", SIDES[1]: "parameter count the better of the two",
               SIDES[2]: "the interval includes 0, so these models do not separate the two"}[v2.side]
        ),
        "f02_v2_vs_v1": Markdown(versions_sentence(v2, v1)),
    }  # fmt: skip


def versions_sentence(v2: Mapping[str, Any], v1: Mapping[str, Any]) -> str:
    """The v2 average's fit against the v1 average's, each with its R² interval: "weaker" or
    "stronger" only where the two intervals do not overlap (the fits cover different sets of
    models; no paired difference is computed)."""
    low, high, n = float(v1["r2_ci_low"]), float(v1["r2_ci_high"]), int(v1["n"])
    interval = f"95% interval {low:.3f} to {high:.3f} over {n} models"
    if v2["r2_ci_high"] < low:
        return f"weaker than on v1 ({float(v1['r2']):.3f}, {interval}): the two intervals do not overlap"
    if v2["r2_ci_low"] > high:
        return f"stronger than on v1 ({float(v1['r2']):.3f}, {interval}): the two intervals do not overlap"
    return (
        f"against {float(v1['r2']):.3f} on v1 ({interval}); the two intervals overlap, so these fits do "
        "not settle on which leaderboard coupling does better"
    )
