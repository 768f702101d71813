"""f02's comparisons of predictors, each read by a rule fixed before the result and by its interval:
whether coupling beats the size measures (:data:`~.plan.BEATS_SIZE`: its lead over the best of
them in each resample, so no rival is chosen on the estimates, and each size measure alone), on
which leaderboard tasks the paper's coupling predicts better than parameter count
(:data:`~.plan.TASK_VS_SIZE`), which task it predicts best and worst (:data:`~.plan.TASK_RANK`),
and whether the predictor with the highest R² in the family is the best single one
(:data:`~.plan.BEST_PREDICTOR`). The sentences here say what the rules found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import leaderboards
from coupling_utils.analysis.predictors import predictor_lead, r2_difference
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap
from coupling_utils.analysis.verdicts import Interval, Rule
from coupling_utils.chapters.f02_generalization.plan import (
    BEATS_SIZE,
    BEST_PREDICTOR,
    TASK_RANK,
    TASK_VS_SIZE,
)

SIDES = ("coupling", "parameter count", "neither")
"""Which predictor a task counts for by :data:`~.plan.TASK_VS_SIZE`: coupling, parameter count, or
neither (the interval of the difference includes 0)."""


def gap_interval(row: Mapping[str, Any]) -> Interval:
    """R²(coupling) − R²(log10 params) of a ``leaderboards.task_fits`` row, with its paired bootstrap
    interval over the row's models (widened to hold the estimate)."""
    est, low, high = (float(row[c]) for c in ("gap", "gap_ci_low", "gap_ci_high"))
    return Interval(est, min(low, est), max(high, est), over=f"{int(row['n'])} models")


def _side(gap: Interval, rule: Rule) -> int:
    """1 where ``rule`` says yes of the difference ``gap`` (the first predictor is the better), -1
    where it says yes of its negative (the second is), 0 where neither (not separated)."""
    if rule.judge({"gap": gap}) == "yes":
        return 1
    against = Interval(-gap.estimate, -gap.high, -gap.low, gap.level, gap.over)
    return -1 if rule.judge({"gap": against}) == "yes" else 0


def task_side(row: Mapping[str, Any]) -> str:
    """The predictor a task counts for (one of :data:`SIDES`): :data:`~.plan.TASK_VS_SIZE` judged on
    the difference, then on its negative for parameter count."""
    return {1: SIDES[0], -1: SIDES[1], 0: SIDES[2]}[_side(gap_interval(row), TASK_VS_SIZE)]


# --------------------------------------------------------------------------- coupling against size
@dataclass
class AgainstSize:
    """A coupling measure (``name``, as the prose calls it) against the size measures as predictors
    of one score over ``unit``s, by :data:`~.plan.BEATS_SIZE`: its ``lead`` over the best of them in
    each resample (``predictor_lead`` with the coupling named in advance) and, for each size
    measure alone, the paired difference (``pairs``: ``predictor, r2, estimate, ci_low, ci_high,
    side``, side 1 / -1 / 0: coupling / the size measure the better / not separated)."""

    name: str
    lead: dict[str, Any]
    pairs: pd.DataFrame
    unit: str

    @property
    def gap(self) -> Interval:
        """The lead over the best size measure in each resample, as an Interval."""
        return lead_interval(self.lead, self.unit)


def against_size(
    df: pd.DataFrame,
    y: str,
    coupling: tuple[str, str],
    sizes: Mapping[str, str],
    boot: Bootstrap,
    unit: str,
    name: str,
) -> AgainstSize:
    """``coupling`` (``(label, column)``) against each of ``sizes`` (``{label: column}``) as
    predictors of ``y``, all on the models complete for every one of them; a size measure
    constant on them is left out of the lead and has no pair."""
    label, column = coupling
    df = df.dropna(subset=[y, column, *sizes.values()])
    lead = predictor_lead(df, y, {label: column, **sizes}, boot, leader=label)
    rows = []
    for size, col in sizes.items():
        if size in lead["left_out"]:
            continue
        d = r2_difference(df, y, column, col, boot)
        rows.append({"predictor": size, **d, "side": _side(lead_interval(d, unit), BEATS_SIZE)})
    return AgainstSize(name, lead, pd.DataFrame(rows), unit)


def sizes_words(a: AgainstSize, r2: Mapping[str, float]) -> str:
    """Each size measure's R² (``r2``, by predictor), in words: "0.776 (log10 params), 0.316 (depth)
    and 0.571 (width)"."""
    return listed([f"{r2[size]:.3f} ({size})" for size in a.pairs["predictor"]])


def separates_words(a: AgainstSize) -> str:
    """What :data:`~.plan.BEATS_SIZE` reads off the lead's interval, after "the interval"."""
    side = _side(a.gap, BEATS_SIZE)
    if side == 1:
        return f"lies above 0: {a.name} explains the score better than every size measure"
    if side == -1:
        return f"lies below 0: the best of the size measures explains the score better than {a.name}"
    return (
        f"includes 0, so these {a.lead['n']} {a.unit} do not separate {a.name} from the best of the size "
        "measures"
    )


def pairs_words(a: AgainstSize) -> str:
    """Each size measure alone against the coupling measure, by the same rule on its paired
    interval: which ones it is separated from, and (when none) that it is separated from none."""
    side = dict(zip(a.pairs["predictor"], a.pairs["side"]))
    above = [s for s, v in side.items() if v == 1]
    below = [s for s, v in side.items() if v == -1]
    rest = [s for s, v in side.items() if v == 0]
    if not above and not below:
        return (
            f"Against each size measure alone the paired 95% interval of the difference includes 0 as "
            f"well: these {a.lead['n']} {a.unit} separate {a.name} from none of them"
        )
    parts = [f"above 0 for {listed(above)}" if above else "",
             f"below 0 for {listed(below)}" if below else "",
             f"includes 0 for {listed(rest)}" if rest else ""]  # fmt: skip
    return "Against each size measure alone, the paired 95% interval of the difference lies " + listed(
        [x for x in parts if x]
    )


def size_note(a: AgainstSize) -> str:
    """A status note of coupling against the size measures: the lead and which size measures alone
    its paired intervals separate it from."""
    side = dict(zip(a.pairs["predictor"], a.pairs["side"]))
    alone = [s for s, v in side.items() if v == 1]
    return f"lead over the best size measure in each resample {a.gap}; separated alone from " + (
        ", ".join(alone) if alone else "no size measure"
    )


def size_glue(prefix: str, a: AgainstSize, r2: pd.Series) -> dict[str, Any]:
    """The glued values of a coupling measure against the size measures, named ``f02_<prefix>_*``:
    each size measure's R², the lead over the best of them in each resample with its interval, what
    the beats-size rule reads off it, and each size measure alone."""
    gap = a.gap
    return {
        f"f02_{prefix}_sizes": Markdown(sizes_words(a, r2)),
        f"f02_{prefix}_gap": gap.estimate,
        f"f02_{prefix}_gap_interval": gap.words(".3f"),
        f"f02_{prefix}_separates": Markdown(separates_words(a)),
        f"f02_{prefix}_pairs": Markdown(pairs_words(a)),
    }


# --------------------------------------------------------------------------- which task best, worst
def task_ranks(version: str, boot: Bootstrap) -> dict[str, dict[str, Any]]:
    """By :data:`~.plan.TASK_RANK`: which task of leaderboard ``version`` the paper's coupling
    predicts best (``"best"``) and worst (``"worst"``), each a ``predictor_lead`` answer over the
    models with every task's score (R² is symmetric, so each task is a "predictor" of coupling)."""
    table = leaderboards.score_table(version)
    tasks = {leaderboards.TASK_NAMES[t]: t for t in leaderboards.TASKS[version]}
    table = table.dropna(subset=["coupling", *tasks.values()])
    return {
        "best": predictor_lead(table, "coupling", tasks, boot),
        "worst": predictor_lead(table, "coupling", tasks, boot, lowest=True),
    }


def rank_sentence(version: str, ranks: Mapping[str, Mapping[str, Any]], r2: Mapping[str, float]) -> str:
    """The ``version`` tasks coupling predicts best and worst (``ranks``: :func:`task_ranks`;
    ``r2``: each task's R²), named as such only where :data:`~.plan.TASK_RANK` separates them."""
    said = []
    for end, word in (("best", "highest"), ("worst", "lowest")):
        lead = ranks[end]
        gap = lead_interval(lead, "models")
        top, nxt = lead["best"], lead["runner_up"]
        head = (
            f"{word} for {top} ({r2[top]:.3f}; the next is {nxt}, {r2[nxt]:.3f}: a difference of "
            f"{gap.estimate:.3f}, {gap.words('.3f')}, against the {word} of the others in each resample)"
        )
        if TASK_RANK.judge({"lead": gap}) == "yes":
            said.append(f"{head}, so by the task-ranking rule coupling predicts {top} {end}")
        else:
            said.append(f"{head}: by the task-ranking rule {top} is not separated from the other tasks")
    return f"Among the {version} tasks coupling's R² is " + "; it is ".join(said)


def _named(tasks: pd.DataFrame) -> str:
    return ", ".join(f"{v} {name}" for v, name in zip(tasks["version"], tasks["name"]))


def tasks_sentence(tasks: pd.DataFrame) -> str:
    """What the per-task comparison found, from the single tasks of ``task_fits`` with their ``side``:
    how many estimates favour coupling, then where the task rule counts a task for either."""
    n, above = len(tasks), int((tasks["gap"] > 0).sum())
    ours, theirs = tasks[tasks["side"] == SIDES[0]], tasks[tasks["side"] == SIDES[1]]
    said = f"Coupling's R² is above parameter count's on {above} of the {n} tasks"
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
    often = f"{shares[0][1]} has the highest R² in {_share(shares[0][0])} of the resamples" + (
        f", {often}" if often else ""
    )
    head = (
        f"its lead over the next, {second} ({r2[second]:.3f}), is {gap.estimate:.3f} "
        f"({gap.words('.3f')}, against the best of the others in each resample)"
    )
    if BEST_PREDICTOR.judge({"lead": gap}) == "yes":
        return (
            f"The best single predictor of {y} is {best} (R² = {r2[best]:.3f}): {head}, above 0 "
            f"throughout, so the best-predictor rule names it; {often}"
        )
    return (
        f"The highest R² of {y}, {r2[best]:.3f}, is that of {best}, but {head}, not wholly above 0: by "
        f"the best-predictor rule no single predictor is the best on these {lead['n']} {unit}; {often}"
    )


def compare_glue(
    lead: Mapping[str, Any],
    acc: pd.DataFrame,
    tasks: pd.DataFrame,
    v2: pd.Series,
    v1: pd.Series,
    ranks: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The glued values of the comparisons: the family's best predictor of accuracy (``lead``:
    ``predictor_lead``'s answer; ``acc``: each predictor's fit, by predictor), coupling against
    parameter count per leaderboard task (``tasks``, with their ``side``) and on the v2 average
    (``v2``), the v2 average's fit against the v1 average's (``v1``), and the tasks coupling
    predicts best and worst on each leaderboard (``ranks``: :func:`task_ranks` by version)."""
    r2 = acc["r2"].dropna().to_dict()
    by_task = {v: tasks[tasks["version"] == v].set_index("name")["r2"].to_dict() for v in ranks}
    best, interval = str(lead["best"]), lead_interval(lead, "members")
    return {
        "f02_family_best": Markdown(best),
        "f02_family_best_r2": float(r2[best]),
        "f02_family_best_lead": interval.estimate,
        "f02_family_best_lead_interval": interval.words(".3f"),
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
        **{f"f02_{v}_rank_sentence": Markdown(rank_sentence(v, ranks[v], by_task[v])) for v in ranks},
    }  # fmt: skip


def r2_interval(fit: Mapping[str, Any]) -> Interval:
    """A fit's R² with its 95% interval over the ``n`` models it covers (a row of
    :func:`~coupling_utils.analysis.predictors.predictor_comparison`: rows resampled, at the level
    of the chapter's bootstrap, ``Params.boot``, which keeps the default's)."""
    level = DEFAULT_BOOTSTRAP.level
    row = {"estimate": fit["r2"], "ci_low": fit["r2_ci_low"], "ci_high": fit["r2_ci_high"], "level": level}
    return Interval.from_bootstrap(row, over=f"{int(fit['n'])} models")


def versions_sentence(v2: Mapping[str, Any], v1: Mapping[str, Any]) -> str:
    """The v2 average's fit against the v1 average's, each with its R² interval: "weaker" or
    "stronger" only where the two intervals do not overlap (the fits cover different sets of
    models; no paired difference is computed)."""
    two, one = r2_interval(v2), r2_interval(v1)
    said = f"{one.estimate:.3f}, {one.words('.3f')}"
    if two.high < one.low:
        return f"weaker than on v1 ({said}): the two intervals do not overlap"
    if two.low > one.high:
        return f"stronger than on v1 ({said}): the two intervals do not overlap"
    return (
        f"against {one.estimate:.3f} on v1 ({one.words('.3f')}); the two intervals overlap, so these fits do "
        "not settle on which leaderboard coupling does better"
    )


def carrier_words(drop: pd.DataFrame) -> str:
    """Which task the v1 fit leans on (``drop``: :func:`~coupling_utils.analysis.leaderboards.drop_one`
    of one version), in words that follow the intervals: the task whose leaving out gives the lowest R²
    is named the one the fit leans on most only where its 95% interval lies below every other task's
    (the intervals are each over the models, not paired: no interval of a change is computed)."""
    left = drop[drop.left_out != "none"].sort_values("r2")
    every = float(drop.loc[drop.left_out == "none", "r2"].iloc[0])
    low, nxt = left.iloc[0], left.iloc[1] if len(left) > 1 else None

    def said(r) -> str:
        iv = Interval(
            r["r2"], min(r["r2_ci_low"], r["r2"]), max(r["r2_ci_high"], r["r2"]), over=f"{r['n']} models"
        )
        return f"{r['r2']:.3f}, {iv.words('.3f')}"

    if low["r2"] >= every:
        return (
            f"No task left out of the v1 average gives an R² estimate below the {every:.3f} of every task: "
            "no one task carries it"
        )
    head = (
        f"Left out of the v1 average, {low['name']} leaves the lowest R² estimate ({said(low)}; "
        f"{every:.3f} with every task, no interval of the change computed)"
    )
    if nxt is None or low["r2_ci_high"] < left.iloc[1:]["r2_ci_low"].min():
        return head + ": its interval lies below every other task's, so it is the task the fit leans on most"
    return (
        f"{head}, but its interval overlaps the next's ({nxt['name']}, {said(nxt)}): no one task is told "
        "apart as the one the fit leans on"
    )
