"""How well each predictor explains a score across models, with the intervals few models need.

The paper's Fig. 1(a) finds that coupling fits the Open LLM Leaderboard score more tightly than
parameter count, depth or width do. With a handful of models an R² alone says little, so:

- :func:`predictor_comparison`: R², slope, p and rank correlations of a score on each
  predictor (:func:`coupling_utils.analysis.stats.compare_predictors`, on the same rows), plus
  seeded bootstrap confidence intervals of R² and Spearman's rho; :func:`best_predictor` reads
  the best fit off such a table;
- :func:`r2_difference`: whether one predictor beats another on the same models (a paired
  bootstrap of the R² difference), and :func:`agreement`, the status verdict ("yes" /
  "partly" / "no") such an interval supports;
- :func:`predictor_lead`: whether the predictor with the highest R² is the best of all of them
  (the interval of its lead over the best of the others, every predictor fitted on the same
  resampled models) and how often each one comes out best; or the same for a predictor named in
  advance (``leader``: does coupling beat every size measure?), or for the lowest R² (``lowest``).

A predictor is a column name or a function of the table that returns one value per row. The
bootstrap's options travel as one :class:`~coupling_utils.analysis.stats.Bootstrap`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis.stats import DEFAULT_BOOTSTRAP, Bootstrap, bootstrap_ci, bootstrap_draws

__all__ = [
    "COMPARISON_COLUMNS",
    "predictor_comparison",
    "best_predictor",
    "r2_difference",
    "predictor_lead",
    "agreement",
]

Predictor = str | Callable[[pd.DataFrame], pd.Series]


def _check_boot(boot: Bootstrap, name: str) -> None:
    if not isinstance(boot, Bootstrap):
        raise TypeError(f"{name}: boot must be a stats.Bootstrap, got {type(boot).__name__}")


def _resampled(work: pd.DataFrame, statistic: Callable, boot: Bootstrap, *, draws: bool = False) -> Any:
    """``statistic`` (vectorized: every resample at once) on ``work`` and on seeded resamples of its
    rows, drawn as ``boot`` says, the one place this module reads a Bootstrap: the percentile
    intervals (:func:`~coupling_utils.analysis.stats.bootstrap_ci`) or, with ``draws``, the
    estimates and the draws (:func:`~coupling_utils.analysis.stats.bootstrap_draws`)."""
    if draws:
        return bootstrap_draws(work, statistic, n_resamples=boot.n_resamples, seed=boot.seed, vectorized=True)
    return bootstrap_ci(
        work, statistic, n_resamples=boot.n_resamples, level=boot.level, seed=boot.seed, vectorized=True
    )


def _values(df: pd.DataFrame, x: Predictor) -> pd.Series:
    return pd.to_numeric(pd.Series(x(df), index=df.index) if callable(x) else df[x], errors="coerce")


COMPARISON_COLUMNS = [
    "predictor",
    "y",
    "n",
    "r2",
    "r2_ci_low",
    "r2_ci_high",
    "slope",
    "slope_ci_low",
    "slope_ci_high",
    "p",
    "spearman",
    "spearman_ci_low",
    "spearman_ci_high",
    "spearman_p",
    "kendall",
    "kendall_p",
    "level",
    "note",
]
"""The columns of a :func:`predictor_comparison` table."""


def predictor_comparison(
    df: pd.DataFrame,
    y: str,
    predictors: Mapping[str, Predictor],
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> pd.DataFrame:
    """How well each predictor explains ``y``: OLS R², slope, p, rank correlations, bootstrap CIs.

    All predictors are fitted on the same rows (complete for ``y`` and every predictor), so
    their R² compare. Adds percentile-bootstrap intervals (``boot``: resamples of the rows,
    seeded) for R² and Spearman's rho: ``r2_ci_low/high``, ``spearman_ci_low/high``.
    A predictor that takes one value only on these rows (e.g. depth in a family of equally deep
    models) gets NaN statistics and a ``note`` instead of an error.
    """
    from coupling_utils.analysis.stats import compare_predictors

    _check_boot(boot, "predictor_comparison")
    level = boot.level
    if not predictors:
        raise ValueError("predictor_comparison needs at least one predictor")
    work = _complete_rows(df, y, predictors)
    usable = [label for label in predictors if work[label].nunique() > 1]
    rows = []
    if usable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant resamples: scipy warns, the bootstrap skips them
            table = compare_predictors(work, y, {label: label for label in usable}, level=level)
            for label in usable:
                row = table[table.predictor == label].iloc[0].to_dict()
                row.update(_bootstrap_intervals(work, label, y, boot))
                rows.append(row)
    for label in predictors:
        if label not in usable:
            rows.append(
                {
                    "predictor": label,
                    "y": y,
                    "n": len(work),
                    "level": level,
                    "note": f"constant over these {len(work)} models: no fit",
                }
            )
    order = {label: i for i, label in enumerate(predictors)}
    out = pd.DataFrame(rows).reindex(columns=COMPARISON_COLUMNS)
    return out.sort_values("predictor", key=lambda s: s.map(order)).reset_index(drop=True)


def _complete_rows(df: pd.DataFrame, y: str, predictors: Mapping[str, Predictor]) -> pd.DataFrame:
    """``y`` and every predictor as float columns, on the rows where all are finite (at least 3)."""
    cols = {label: _values(df, x) for label, x in predictors.items()}
    work = pd.DataFrame(cols, index=df.index).astype(float)
    work[y] = pd.to_numeric(df[y], errors="coerce").astype(float)
    work = work[np.isfinite(work.to_numpy()).all(axis=1)].reset_index(drop=True)
    if len(work) < 3:
        raise ValueError(f"need at least 3 models with {y!r} and every predictor, got {len(work)}")
    return work


def _bootstrap_intervals(work: pd.DataFrame, label: str, y: str, boot: Bootstrap) -> dict[str, Any]:
    """Percentile-bootstrap intervals of R² and Spearman's rho of ``y`` on predictor ``label``."""
    from scipy.stats import rankdata

    from coupling_utils.analysis.stats import rowwise_pearson

    def stat(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # every resample at once: [R, n]
        x, v = c[label], c[y]
        r = rowwise_pearson(x, v)
        rho = rowwise_pearson(rankdata(x, axis=-1), rankdata(v, axis=-1))  # average ranks for ties
        return {"r2": r * r, "spearman": rho}

    ci = _resampled(work[[label, y]], stat, boot).set_index("statistic")
    return {
        "r2_ci_low": ci.loc["r2", "ci_low"],
        "r2_ci_high": ci.loc["r2", "ci_high"],
        "spearman_ci_low": ci.loc["spearman", "ci_low"],
        "spearman_ci_high": ci.loc["spearman", "ci_high"],
        "note": "",
    }


def best_predictor(comparison: pd.DataFrame, among: Sequence[str] | None = None) -> str:
    """The predictor with the highest R² in a :func:`predictor_comparison` table (``among``: only
    these predictors, e.g. the size measures when asking which rival coupling has to beat)."""
    fitted = comparison.dropna(subset=["r2"])
    if among is not None:
        fitted = fitted[fitted["predictor"].isin(list(among))]
    if fitted.empty:
        raise ValueError("no predictor could be fitted" + ("" if among is None else f" among {list(among)}"))
    return str(fitted.loc[fitted["r2"].idxmax(), "predictor"])


def r2_difference(
    df: pd.DataFrame,
    y: str,
    a: Predictor,
    b: Predictor,
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
) -> dict[str, float]:
    """``R²(y ~ a) − R²(y ~ b)`` on the same rows, with a paired percentile-bootstrap interval.

    Both fits see the same resampled models, so the interval says whether ``a`` explains ``y``
    better than ``b`` beyond what the choice of models does (an interval above 0), rather than
    comparing two separate intervals. Returns ``estimate, ci_low, ci_high, n, level``.
    """
    from coupling_utils.analysis.stats import rowwise_pearson

    _check_boot(boot, "r2_difference")
    work = pd.DataFrame(
        {"a": _values(df, a), "b": _values(df, b), "y": pd.to_numeric(df[y], errors="coerce")}
    ).astype(float)
    work = work[np.isfinite(work.to_numpy()).all(axis=1)].reset_index(drop=True)
    if len(work) < 3:
        raise ValueError(f"need at least 3 complete rows to compare R², got {len(work)}")

    def diff(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # every resample at once: [R, n]
        return {"statistic": rowwise_pearson(c["a"], c["y"]) ** 2 - rowwise_pearson(c["b"], c["y"]) ** 2}

    ci = _resampled(work, diff, boot).iloc[0]
    return {
        "estimate": float(ci["estimate"]),
        "ci_low": float(ci["ci_low"]),
        "ci_high": float(ci["ci_high"]),
        "n": len(work),
        "level": boot.level,
    }


def predictor_lead(
    df: pd.DataFrame,
    y: str,
    predictors: Mapping[str, Predictor],
    boot: Bootstrap = DEFAULT_BOOTSTRAP,
    *,
    leader: str | None = None,
    lowest: bool = False,
) -> dict[str, Any]:
    """How surely the predictor with the highest R² of ``y`` is the best of ``predictors``.

    Every predictor is fitted on the same rows (complete for ``y`` and all of them), and on each
    seeded resample of those rows (the models; ``boot``) all are fitted again together. ``best``
    is the one with the highest R² on the rows as drawn (or ``leader``, named before the fit:
    e.g. coupling against the size measures), ``runner_up`` the highest of the others; ``estimate``
    is ``best``'s lead, R²(best) − R²(runner_up), and ``ci_low``/``ci_high`` the percentile
    interval of the lead over the best of the *others* in each resample (whichever that is
    there), so an interval above 0 says ``best`` beats all of them, not one rival chosen after the
    fact. ``lowest``: the same for the lowest R² (``best`` is the lowest, the lead is how far the
    lowest of the others lies above it). ``share``: ``{predictor: fraction of valid resamples in
    which it comes out best}``. A predictor constant on these rows is left out (``left_out``);
    two must remain. Also returns ``n`` (models), ``level``, ``n_resamples`` and ``n_valid``."""
    from coupling_utils.analysis.stats import rowwise_pearson

    _check_boot(boot, "predictor_lead")
    work = _complete_rows(df, y, predictors)
    usable = [label for label in predictors if work[label].nunique() > 1]
    if len(usable) < 2:
        raise ValueError(
            f"predictor_lead needs at least 2 predictors that vary over the {len(work)} models, got "
            f"{usable}; pass more predictors"
        )
    if leader is not None and leader not in usable:
        raise ValueError(f"predictor_lead: leader {leader!r} is not among the predictors that vary: {usable}")
    sign = -1.0 if lowest else 1.0  # the lowest R² is the highest of −R²

    def r2s(c: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # every resample at once: [R, n]
        return {label: sign * rowwise_pearson(c[label], c[y]) ** 2 for label in usable}

    estimate, draws = _resampled(work[[*usable, y]], r2s, boot, draws=True)
    order = sorted(usable, key=lambda label: -estimate[label])
    best = order[0] if leader is None else leader
    runner_up = next(label for label in order if label != best)
    interval = _lead_interval(np.stack([draws[label] for label in usable]), usable.index(best), boot.level)
    return {
        "best": best,
        "runner_up": runner_up,
        "estimate": estimate[best] - estimate[runner_up],
        **interval,
        "share": dict(zip(usable, interval["share"])),
        "left_out": [label for label in predictors if label not in usable],
        "n": len(work),
        "level": boot.level,
        "n_resamples": boot.n_resamples,
    }


def _lead_interval(drawn: np.ndarray, best: int, level: float) -> dict[str, Any]:
    """Row ``best``'s lead over the highest other row in each resample (``drawn``: [predictors, R],
    NaN where a resample leaves a predictor constant): its percentile interval at ``level``, the
    ``share`` of valid resamples each row is highest in (by row index), and ``n_valid``."""
    filled = np.where(np.isfinite(drawn), drawn, -np.inf)
    others = np.delete(filled, best, axis=0).max(axis=0)
    valid = np.isfinite(drawn[best]) & np.isfinite(others)
    lead = drawn[best][valid] - others[valid]
    low, high = np.quantile(lead, [(1 - level) / 2, (1 + level) / 2]) if len(lead) else (np.nan, np.nan)
    winner = filled.argmax(axis=0)[valid]
    share = [float((winner == i).mean()) if len(lead) else np.nan for i in range(len(drawn))]
    return {"ci_low": float(low), "ci_high": float(high), "share": share, "n_valid": int(valid.sum())}


def agreement(
    estimate: float,
    ci_low: float,
    ci_high: float,
    *,
    expected_sign: int = 1,
    n: int | None = None,
    min_n: int = 6,
) -> str:
    """Status verdict for a directional claim from an estimate and its interval.

    "yes": the interval lies on the expected side of 0; "partly": the estimate does but the
    interval reaches 0 (or is unknown), or there are fewer than ``min_n`` models (``n``), too
    few for a bootstrap interval to mean much; "no": the estimate is on the other side (or
    missing).
    """
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be 1 or -1, got {expected_sign}")
    e, lo, hi = (expected_sign * v for v in (estimate, ci_low, ci_high))
    if not np.isfinite(e) or e <= 0:
        return "no"
    if np.isfinite(lo) and np.isfinite(hi) and min(lo, hi) > 0 and (n is None or n >= min_n):
        return "yes"
    return "partly"
