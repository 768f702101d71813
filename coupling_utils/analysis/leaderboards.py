"""Beyond the paper: its own coupling values against each leaderboard task, v1 and v2.

The paper regresses the Open LLM Leaderboard v1 *average* on its per-model coupling (Fig. 1a).
With the data this book holds (the digitised Fig. 1a points, the v1 final snapshot and the v2
export, ``data/``) two questions the paper does not ask can be answered without measuring
anything: does the paper's coupling also predict the harder v2 leaderboard (IFEval, BBH,
MATH Lvl 5, GPQA, MuSR, MMLU-Pro), and which single task carries the v1 fit? This is the
book's extension, built on the paper's own (digitised) numbers: it is never counted as a
reproduction.

- :func:`score_table`: the Fig. 1a points joined with one leaderboard version's task scores;
- :func:`task_fits`: for each task and the average, OLS R² (percentile-bootstrap interval),
  slope (t interval) and Spearman's rho of the score on coupling, with the R² of log
  parameter count on the same models beside it, the paired-bootstrap interval of the
  difference between the two, and the models each fit covers;
- :func:`drop_one`: the fit of the average of all tasks but one, for each task left out, so
  a task whose removal lowers R² most is the one that carries the average's fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from coupling_utils.analysis.data import V1_TASKS, V2_TASKS, join_scores, load_paper_points
from coupling_utils.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap

__all__ = ["TASKS", "TASK_NAMES", "score_table", "task_fits", "drop_one"]

TASKS = {"v1": V1_TASKS, "v2": V2_TASKS}
TASK_NAMES = {
    "arc": "ARC",
    "hellaswag": "HellaSwag",
    "mmlu": "MMLU",
    "truthfulqa": "TruthfulQA",
    "winogrande": "Winogrande",
    "gsm8k": "GSM8K",
    "ifeval": "IFEval",
    "bbh": "BBH",
    "math_lvl5": "MATH Lvl 5",
    "gpqa": "GPQA",
    "musr": "MuSR",
    "mmlu_pro": "MMLU-Pro",
    "average": "average",
}
FIT_COLUMNS = [
    "version",
    "task",
    "name",
    "n",
    "r2",
    "r2_ci_low",
    "r2_ci_high",
    "slope",
    "slope_ci_low",
    "slope_ci_high",
    "spearman",
    "spearman_ci_low",
    "spearman_ci_high",
    "size_r2",
    "gap",
    "gap_ci_low",
    "gap_ci_high",
    "models",
    "missing",
]


def _check_version(version: str) -> tuple[str, ...]:
    if version not in TASKS:
        raise ValueError(f"version must be 'v1' or 'v2', got {version!r}")
    return TASKS[version]


def score_table(version: str) -> pd.DataFrame:
    """The digitised Fig. 1a points (``label, model_id, coupling``) with the ``version``
    leaderboard's task scores and average, and ``log10_params`` from the model metadata; models
    without a row on that leaderboard are kept with NaN scores."""
    _check_version(version)
    table = join_scores(load_paper_points("1a"), model_col="model_id", leaderboard=version, warn=False)
    table["log10_params"] = np.log10(table["params_b"] * 1e9)
    return table


def task_fits(
    version: str,
    *,
    tasks: Sequence[str] | None = None,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> pd.DataFrame:
    """One row per task (and ``average``) of leaderboard ``version``: how well the paper's
    coupling predicts it (see the module doc and :data:`FIT_COLUMNS`).

    Each fit uses the Fig. 1a models with a score for that task (``n``, ``models``; the others
    are listed in ``missing``); ``size_r2`` is the R² of log10 parameter count on the same rows,
    and ``gap`` = ``r2 − size_r2`` with its paired percentile-bootstrap interval over those models
    (``gap_ci_low``, ``gap_ci_high``; :func:`~coupling_utils.analysis.predictors.r2_difference`).
    """
    from coupling_utils.analysis.predictors import predictor_comparison, r2_difference

    known = _check_version(version)
    tasks = list(known if tasks is None else tasks)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ValueError(f"{unknown} are not {version} tasks; they are {list(known)}")
    table = score_table(version)
    rows = []
    for task in [*tasks, "average"]:
        have = table[task].notna() & table["coupling"].notna() & table["log10_params"].notna()
        fit = predictor_comparison(
            table[have],
            task,
            {"coupling": "coupling", "size": "log10_params"},
            boot,
        ).set_index("predictor")
        c = fit.loc["coupling"]
        gap = r2_difference(table[have], task, "coupling", "log10_params", boot)
        rows.append(
            {
                "version": version,
                "task": task,
                "name": TASK_NAMES.get(task, task),
                "n": int(c["n"]),
                **{col: float(c[col]) for col in FIT_COLUMNS[4:13]},
                "size_r2": float(fit.loc["size", "r2"]),
                "gap": gap["estimate"],
                "gap_ci_low": gap["ci_low"],
                "gap_ci_high": gap["ci_high"],
                "models": ", ".join(table.loc[have, "label"]),
                "missing": ", ".join(table.loc[~have, "label"]),
            }
        )
    return pd.DataFrame(rows, columns=FIT_COLUMNS)


def drop_one(version: str, *, boot: Bootstrap = DEFAULT_BOOTSTRAP) -> pd.DataFrame:
    """R² of coupling for the mean of all ``version`` tasks but one, for each task left out
    (``left_out``), beside the R² with every task (``left_out = "none"``), on the models that have
    every task. ``r2_change``: R² without the task minus R² with all (negative: the task helps
    the fit)."""
    from coupling_utils.analysis.predictors import predictor_comparison

    tasks = list(_check_version(version))
    table = score_table(version)
    table = table[table[tasks].notna().all(axis=1) & table["coupling"].notna()].reset_index(drop=True)
    rows = []
    for left_out in ["none", *tasks]:
        kept = [t for t in tasks if t != left_out]
        y = table[kept].mean(axis=1).rename("y")
        fit = predictor_comparison(table.assign(y=y), "y", {"coupling": "coupling"}, boot).iloc[0]
        rows.append(
            {
                "version": version,
                "left_out": left_out,
                "name": "none" if left_out == "none" else TASK_NAMES.get(left_out, left_out),
                "n": int(fit["n"]),
                "r2": float(fit["r2"]),
                "r2_ci_low": float(fit["r2_ci_low"]),
                "r2_ci_high": float(fit["r2_ci_high"]),
            }
        )
    out = pd.DataFrame(rows)
    out["r2_change"] = out["r2"] - float(out.loc[out["left_out"] == "none", "r2"].iloc[0])
    return out
