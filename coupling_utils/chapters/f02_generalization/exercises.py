"""The values f02's exercise solutions glue, from this run and the stored data: the K/d
sensitivity curve beside this run's own family means (f02-ex-kd), the leaderboard snapshot
(f02-ex-y), the joint fit of excess and size (f02-ex-partial) and the worst v2 task (f02-ex-v2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import k_policy
from coupling_utils.analysis.prose_list import listed
from coupling_utils.chapters.f02_generalization.compare import SIDES, gap_interval
from coupling_utils.chapters.f02_generalization.plan import Params
from coupling_utils.chapters.f02_generalization.sections import Beyond, Family, PaperFit

PROMPT_WORDS = {
    "corpus": "windows of the held-out plays",
    "prompts": "prompts of `data/prompts.csv` (modern English)",
    "prompt_set": "prompts of `data/prompts.csv` (modern English)",
}
"""What a measurement's prompts are, by ``prompt_source`` (this run) or the curve's ``input``."""


def kd_curve_words(p: Params, f: Family) -> str:
    """Exercise f02-ex-kd: what the stored K/d sensitivity curve (``data/k_sensitivity.csv``) says
    of the family at this run's K/d and at twice it, where its numbers come from (its prompts and
    twin seed, which need not be this run's), and this run's own means at its K/d."""
    from coupling_utils.analysis.data import read_table

    said = k_policy.family_sentence(p.family, (p.k_over_d, 2 * p.k_over_d))
    rows = read_table("k_sensitivity.csv")
    rows = rows[rows["model"].str.startswith(f"{p.family}/")]
    ours, n = f.ours, f.measured.per_prompt["prompt"].nunique()
    here = (
        f"This run measures the members on {n} {PROMPT_WORDS[p.prompt_source]} with twins of init seed "
        f"{p.init_seed}: at K/d = {p.k_over_d:g} its members' twins average "
        f"{ours['twin_coupling'].mean():.3f} and the excess {ours['excess'].mean():.3f}."
    )
    if rows.empty:
        return f"{said} {here}"
    inputs = listed(dict.fromkeys(PROMPT_WORDS.get(i, str(i)) for i in rows["input"].unique()))
    seeds = listed(int(s) for s in rows["init_seed"].unique())
    return (
        f"{said} Those numbers are the curve's own (`data/k_sensitivity.csv`, written by "
        f"`coupling-book k-sensitivity`): {inputs}, twins of init seed {seeds}. {here}"
    )


def _r2(ours: pd.DataFrame, columns: list[str]) -> float:
    """R² of the least-squares fit of ``val_acc`` on an intercept and ``columns`` (exercise
    f02-ex-partial: the excess and size together); NaN when accuracy does not vary."""
    X = np.column_stack([np.ones(len(ours)), *(ours[c].to_numpy(float) for c in columns)])
    y = ours["val_acc"].to_numpy(float)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    total = float(((y - y.mean()) ** 2).sum())
    return 1 - float(((y - X @ beta) ** 2).sum()) / total if total > 0 else float("nan")


def solutions_glue(p: Params, paper: PaperFit, f: Family, b: Beyond) -> dict[str, Any]:
    """Every value the exercise solutions glue that no section's prose does."""
    v1, tasks = b.fit("v1"), b.tasks
    lowest = tasks[tasks.version == "v2"].sort_values("r2").iloc[0]  # exercise f02-ex-v2
    moved = (paper.points["score"] - paper.points["average"]).dropna()  # exercise f02-ex-y
    top = paper.points.loc[moved.abs().idxmax()]
    return {
        "f02_ex_kd_curve": Markdown(kd_curve_words(p, f)),
        "f02_joint_r2": _r2(f.ours, ["excess", "log10 params"]),
        "f02_size_r2": _r2(f.ours, ["log10 params"]),
        "f02_v2_worst_size": Markdown(
            f"For {lowest['name']}, the v2 task with the lowest estimate (R² = {lowest['r2']:.3f}), log "
            f"parameter count gives R² = {lowest['size_r2']:.3f}; the difference, {lowest['gap']:.3f} "
            f"({gap_interval(lowest).words('.3f')}), "
            + {
                SIDES[0]: "counts it for coupling",
                SIDES[1]: "counts it for parameter count",
                SIDES[2]: "does not separate the two there",
            }[lowest["side"]]
        ),  # fmt: skip
        "f02_snapshot_moves": Markdown(
            f"the largest change is that of {top['label']} ({float(top['score']):.1f} in the paper, "
            f"{float(top['average']):.2f} in the final snapshot); {int((moved.abs() > 1).sum())} of the "
            f"{len(moved)} models with both moved by more than 1 point"
        ),
        "f02_snapshot_word": Markdown(
            f"the two differ by {abs(v1.r2 - paper.r2):.3f}, over different sets of models "
            f"({int(paper.by_predictor.loc['coupling', 'n'])} and {int(v1.n)}); no interval of the "
            "change is computed"
        ),
    }
