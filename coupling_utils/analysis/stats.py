"""Small, explicit statistics for "does coupling predict the leaderboard score?".

Ordinary least squares with one predictor, rank correlations, a seeded bootstrap and a
side-by-side comparison of predictors (coupling vs log parameters vs depth vs width). Each
returns a tidy pandas DataFrame, so results can be concatenated, saved and shown as-is.
Only numpy and scipy are used (no statsmodels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as _st

Predictor = str | Callable[[pd.DataFrame], pd.Series]


@dataclass(frozen=True)
class Bootstrap:
    """How a percentile bootstrap over the rows (the models) is drawn and read: ``n_resamples``
    seeded resamples (``seed``, :func:`resample_rows`), intervals at ``level``. One object, so
    every comparison of a chapter resamples alike and the options travel together."""

    n_resamples: int = 1000
    level: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not _whole(self.n_resamples) or self.n_resamples < 10:
            raise ValueError(
                f"Bootstrap: n_resamples must be an integer of at least 10, got {self.n_resamples!r}"
            )
        if not isinstance(self.level, int | float | np.floating) or not 0.0 < self.level < 1.0:
            raise ValueError(f"Bootstrap: level must lie strictly between 0 and 1, got {self.level!r}")
        if not _whole(self.seed) or self.seed < 0:
            raise ValueError(f"Bootstrap: seed must be a non-negative integer, got {self.seed!r}")


def _whole(v: object) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


DEFAULT_BOOTSTRAP = Bootstrap()
"""The bootstrap every comparison draws unless told otherwise: 1000 resamples, 95%, seed 0."""


def _xy(df: pd.DataFrame, y: str, x: Predictor) -> tuple[np.ndarray, np.ndarray, str]:
    """Numeric x and y with rows missing either dropped; x may be a column or a function of df."""
    if y not in df.columns:
        raise KeyError(f"column {y!r} not in the table (columns: {list(df.columns)})")
    if callable(x):
        xs = pd.Series(x(df), index=df.index)
        name = getattr(x, "__name__", "x")
    else:
        if x not in df.columns:
            raise KeyError(f"column {x!r} not in the table (columns: {list(df.columns)})")
        xs, name = df[x], x
    xv = pd.to_numeric(xs, errors="coerce").astype(float).to_numpy()
    yv = pd.to_numeric(df[y], errors="coerce").astype(float).to_numpy()
    keep = np.isfinite(xv) & np.isfinite(yv)
    return xv[keep], yv[keep], name


def _ols_arrays(x: np.ndarray, y: np.ndarray, level: float) -> dict:
    n = len(x)
    if n < 3:
        raise ValueError(f"OLS needs at least 3 complete rows, got {n}.")
    if np.ptp(x) == 0:
        raise ValueError("OLS: the predictor is constant, so the slope is undefined.")
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    ssr = float((resid**2).sum())
    sst = float(((y - ym) ** 2).sum())
    dof = n - 2
    s2 = ssr / dof
    se_slope = float(np.sqrt(s2 / sxx))
    se_int = float(np.sqrt(s2 * (1.0 / n + xm**2 / sxx)))
    tcrit = float(_st.t.ppf(0.5 + level / 2.0, dof))
    if se_slope > 0:
        t_slope = slope / se_slope
        p = float(2.0 * _st.t.sf(abs(t_slope), dof))
    else:  # a perfect fit
        t_slope, p = np.inf, 0.0
    p_int = float(2.0 * _st.t.sf(abs(intercept / se_int), dof)) if se_int > 0 else 0.0
    r2 = 1.0 - ssr / sst if sst > 0 else np.nan
    return {
        "n": n,
        "slope": slope,
        "slope_se": se_slope,
        "slope_ci_low": slope - tcrit * se_slope,
        "slope_ci_high": slope + tcrit * se_slope,
        "intercept": intercept,
        "intercept_se": se_int,
        "intercept_ci_low": intercept - tcrit * se_int,
        "intercept_ci_high": intercept + tcrit * se_int,
        "r2": r2,
        "r2_adj": 1.0 - (1.0 - r2) * (n - 1) / dof if np.isfinite(r2) else np.nan,
        "r": float(np.sign(slope) * np.sqrt(max(r2, 0.0))) if np.isfinite(r2) else np.nan,
        "t": float(t_slope),
        "p": p,
        "intercept_p": p_int,
        "residual_se": float(np.sqrt(s2)),
        "level": level,
    }


def ols(df: pd.DataFrame, y: str, x: Predictor, *, level: float = 0.95) -> pd.DataFrame:
    """Least-squares line ``y = intercept + slope * x`` over the complete rows of ``df``.

    One row: ``y, x, n, slope, slope_se, slope_ci_low/high, intercept (+ se, CI, p), r2,
    r2_adj, r, t, p`` (two-sided t-test of slope = 0, the same p as the F-test) and
    ``residual_se``. CIs are t-intervals at ``level``. ``x`` is a column name or a function
    of ``df`` (e.g. ``lambda d: np.log10(d.params_b)``).
    """
    xv, yv, name = _xy(df, y, x)
    return pd.DataFrame([{"y": y, "x": name, **_ols_arrays(xv, yv, level)}])


def rank_correlation(df: pd.DataFrame, x: Predictor, y: str) -> pd.DataFrame:
    """Spearman's rho and Kendall's tau-b of ``x`` and ``y`` with two-sided p-values (two rows)."""
    xv, yv, name = _xy(df, y, x)
    if len(xv) < 3:
        raise ValueError(f"rank correlation needs at least 3 complete rows, got {len(xv)}.")
    sp = _st.spearmanr(xv, yv)
    kt = _st.kendalltau(xv, yv)
    return pd.DataFrame(
        [
            {
                "x": name,
                "y": y,
                "method": "spearman",
                "statistic": float(sp.statistic),
                "p": float(sp.pvalue),
                "n": len(xv),
            },
            {
                "x": name,
                "y": y,
                "method": "kendall",
                "statistic": float(kt.statistic),
                "p": float(kt.pvalue),
                "n": len(xv),
            },
        ]
    )


def resample_rows(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """The rows each bootstrap resample draws: ``[n_resamples, n]`` indices, one
    ``rng.integers(0, n, size=n)`` per resample from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, n, size=n) for _ in range(n_resamples)])


def bootstrap_ci(
    df: pd.DataFrame,
    statistic: Callable[[pd.DataFrame], float | Mapping[str, float]],
    *,
    n_resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    vectorized: bool = False,
) -> pd.DataFrame:
    """Percentile bootstrap CI of ``statistic(df)``, resampling rows with replacement.

    ``statistic`` returns a float or a mapping name -> float (several statistics from the
    same resamples). Seeded (:func:`resample_rows`), so reruns agree exactly. With
    ``vectorized=True`` it is called once on every resample together: it gets a mapping column
    -> ``[n_resamples, n]`` array and returns a mapping name -> ``[n_resamples]`` array (NaN
    where undefined); the estimate is the same call on the rows as drawn once. Resamples where a
    statistic is not finite (e.g. a constant predictor) are skipped and counted in ``n_valid``.
    One row per statistic: ``statistic, estimate, ci_low, ci_high, level, n_resamples,
    n_valid, seed``.
    """
    estimate, draws = bootstrap_draws(
        df, statistic, n_resamples=n_resamples, seed=seed, vectorized=vectorized
    )
    alpha = (1.0 - level) / 2.0
    out = []
    for k, est in estimate.items():
        arr = draws[k][np.isfinite(draws[k])]
        lo, hi = np.quantile(arr, [alpha, 1.0 - alpha]) if len(arr) else (np.nan, np.nan)
        out.append(
            {
                "statistic": k,
                "estimate": est,
                "ci_low": float(lo),
                "ci_high": float(hi),
                "level": level,
                "n_resamples": n_resamples,
                "n_valid": int(len(arr)),
                "seed": seed,
            }
        )
    return pd.DataFrame(out)


def bootstrap_draws(
    df: pd.DataFrame,
    statistic: Callable,
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    vectorized: bool = False,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """``statistic`` on ``df`` and on each of ``n_resamples`` seeded resamples of its rows: the
    estimates ``{name: value}`` and the draws ``{name: [n_resamples] array}`` (NaN where a resample
    leaves it undefined). The resampling of :func:`bootstrap_ci` (same rows, same seed), for
    summaries other than a percentile interval, such as how often one predictor comes out best.
    ``statistic`` and ``vectorized`` as in :func:`bootstrap_ci`."""
    if n_resamples < 10:
        raise ValueError(f"n_resamples must be at least 10, got {n_resamples}.")
    rows = resample_rows(len(df), n_resamples, seed)
    if not vectorized:
        return _draw_each(df, statistic, rows)
    columns = float_columns(df)
    once = statistic({c: a[None, :] for c, a in columns.items()})
    estimate = {str(k): float(v[0]) for k, v in once.items()}
    drawn = statistic({c: a[rows] for c, a in columns.items()})
    return estimate, {k: np.asarray(drawn[k], dtype=float) for k in estimate}


def float_columns(df: pd.DataFrame) -> dict:
    """``{column: its values as a contiguous float array}``, from one conversion of the whole table
    (a wide table's columns looked up one by one by name cost seconds: f01's tiles have thousands)."""
    values = np.ascontiguousarray(df.to_numpy(dtype=float).T)  # [columns, rows]
    return dict(zip(df.columns, values))


def _draw_each(df: pd.DataFrame, statistic: Callable, rows: np.ndarray) -> tuple[dict, dict]:
    """``statistic`` on the whole table, then on each resample (``rows``): estimate and draws."""

    def as_dict(value) -> dict[str, float]:
        if isinstance(value, Mapping):
            return {str(k): float(v) for k, v in value.items()}
        return {"statistic": float(value)}

    estimate = as_dict(statistic(df))
    draws: dict[str, list[float]] = {k: [] for k in estimate}
    for idx in rows:
        try:
            value = as_dict(statistic(df.iloc[idx]))
        except (ValueError, ZeroDivisionError, FloatingPointError):
            value = dict.fromkeys(estimate, np.nan)
        for k in estimate:
            draws[k].append(value.get(k, np.nan))
    return estimate, {k: np.asarray(v) for k, v in draws.items()}  # lists of floats and NaNs


def resampled_sums(a: np.ndarray, order: str = "pairwise") -> np.ndarray:
    """The sum of each resample (``a: [n_resamples, n]``) in the order pandas adds it, so that a
    vectorized statistic gives the bits of the pandas one it replaces (tests hold each to it):
    ``"pairwise"``, numpy's own sum, as pandas adds a Series or a column in a block of its own;
    ``"left_to_right"``, as pandas adds a column of a resampled table whose block it shares with
    other columns (a table made by ``pivot_table`` or ``concat``). The last bits differ."""
    if order == "pairwise":
        return a.sum(axis=-1)
    if order != "left_to_right":
        raise ValueError(f"order={order!r}: give 'pairwise' or 'left_to_right'")
    out = np.zeros(a.shape[:-1])
    for j in range(a.shape[-1]):
        out += a[..., j]
    return out


def resampled_means(a: np.ndarray, order: str = "pairwise") -> np.ndarray:
    """The mean of each resample (``a: [n_resamples, n]``) over its values that are not NaN
    (NaN where none is), summed in ``order`` (:func:`resampled_sums`)."""
    seen = ~np.isnan(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        return resampled_sums(np.where(seen, a, 0.0), order) / seen.sum(axis=-1)


def mean_ci(
    values: pd.Series | np.ndarray, *, n_resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> pd.Series:
    """:func:`bootstrap_ci`'s row for the mean of ``values`` (NaNs skipped), every resample at once:
    the same resamples and the same bits as ``bootstrap_ci(frame, lambda f: f[col].mean())`` on a
    frame holding ``values`` as a float column (a pairwise sum, as pandas adds such a column)."""
    frame = pd.DataFrame({"values": np.asarray(values, dtype=float)})
    ci = bootstrap_ci(
        frame,
        lambda c: {"statistic": resampled_means(c["values"])},
        n_resamples=n_resamples,
        level=level,
        seed=seed,
        vectorized=True,
    )
    return ci.iloc[0]


def rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of ``x: [..., n]`` with the same row of ``y``; NaN for a constant row.

    Rows whose sums of squares multiply past the float range (spreads far below 1e-75 or above
    1e75) are rescaled by their largest deviation first, so their r is as exact as any other row's.
    """
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        squares = (xc * xc).sum(axis=-1) * (yc * yc).sum(axis=-1)
        r = np.asarray((xc * yc).sum(axis=-1) / np.sqrt(squares))
        outside = ~((squares >= np.finfo(squares.dtype).tiny) & np.isfinite(squares))
        if outside.any():  # rescaled rows only: every other row keeps the plain formula's bits
            xs, ys = xc[outside], yc[outside]  # [rows, n]
            xs, ys = xs / np.abs(xs).max(axis=1, keepdims=True), ys / np.abs(ys).max(axis=1, keepdims=True)
            r[outside] = (xs * ys).sum(axis=1) / np.sqrt((xs * xs).sum(axis=1) * (ys * ys).sum(axis=1))
    constant = (np.ptp(x, axis=-1) == 0) | (np.ptp(y, axis=-1) == 0)
    return np.where(constant, np.nan, np.clip(r, -1.0, 1.0))


def bootstrap_intervals(
    df: pd.DataFrame,
    statistic: Callable[[pd.DataFrame], Mapping[str, float]],
    unit: str,
    *,
    detail: str = "",
    n_resamples: int = 1000,
    seed: int = 0,
    vectorized: bool = False,
) -> dict:
    """:func:`bootstrap_ci` of several statistics as ``verdicts.Interval``s, rows = ``unit``s.

    One Interval per statistic whose estimate (and percentile bounds) are finite, ``over``
    "N units" (+ ``detail``). A single row leaves nothing to resample: its intervals are then
    unbounded, so no rule can give a "yes" on them. ``vectorized``: ``statistic`` takes every
    resample at once, as in :func:`bootstrap_ci`.
    """
    from coupling_utils.analysis.verdicts import Interval

    if vectorized:
        once = statistic({c: a[None, :] for c, a in float_columns(df).items()})
        estimate = {str(k): float(v[0]) for k, v in once.items() if np.isfinite(v[0])}
    else:
        estimate = {k: float(v) for k, v in statistic(df).items() if np.isfinite(v)}
    if len(df) < 2:
        return {k: Interval(v, -np.inf, np.inf, over=f"{len(df)} {unit}") for k, v in estimate.items()}
    ci = bootstrap_ci(df, statistic, n_resamples=n_resamples, seed=seed, vectorized=vectorized)
    ci = ci.set_index("statistic")
    over = f"{len(df)} {unit}s{detail}"
    return {
        k: Interval.from_bootstrap(ci.loc[k], over=over)
        for k in estimate
        if np.isfinite(ci.at[k, "ci_low"])  # both bounds are finite, or both NaN (no finite resample)
    }


def compare_predictors(
    df: pd.DataFrame,
    y: str,
    xs: Sequence[Predictor] | Mapping[str, Predictor],
    *,
    level: float = 0.95,
    complete_cases: bool = True,
) -> pd.DataFrame:
    """One row per predictor of ``y``: ``n, r2, slope (+ CI), p, spearman (+ p), kendall (+ p)``.

    ``xs``: column names, or a mapping label -> column name / function of ``df`` (for
    transformed predictors such as log parameters). With ``complete_cases`` (default) every
    predictor is fitted on the same rows (those complete for ``y`` and all predictors), so
    the R² values are comparable.
    """
    items = (
        list(xs.items())
        if isinstance(xs, Mapping)
        else [(x if isinstance(x, str) else getattr(x, "__name__", "x"), x) for x in xs]
    )
    if not items:
        raise ValueError("compare_predictors needs at least one predictor.")
    cols = {}
    for label, x in items:
        if callable(x):
            cols[label] = pd.to_numeric(pd.Series(x(df), index=df.index), errors="coerce")
        else:
            if x not in df.columns:
                raise KeyError(f"column {x!r} not in the table (columns: {list(df.columns)})")
            cols[label] = pd.to_numeric(df[x], errors="coerce")
    if y not in df.columns:
        raise KeyError(f"column {y!r} not in the table (columns: {list(df.columns)})")
    work = pd.DataFrame(cols, index=df.index).astype(float)
    work["__y__"] = pd.to_numeric(df[y], errors="coerce").astype(float)
    if complete_cases:
        work = work[np.isfinite(work.to_numpy()).all(axis=1)]
    rows = []
    for label, _ in items:
        fit = ols(work, "__y__", label, level=level).iloc[0]
        rc = rank_correlation(work, label, "__y__").set_index("method")
        rows.append(
            {
                "predictor": label,
                "y": y,
                "n": int(fit["n"]),
                "r2": fit["r2"],
                "slope": fit["slope"],
                "slope_ci_low": fit["slope_ci_low"],
                "slope_ci_high": fit["slope_ci_high"],
                "p": fit["p"],
                "spearman": rc.loc["spearman", "statistic"],
                "spearman_p": rc.loc["spearman", "p"],
                "kendall": rc.loc["kendall", "statistic"],
                "kendall_p": rc.loc["kendall", "p"],
                "level": level,
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "Bootstrap",
    "DEFAULT_BOOTSTRAP",
    "ols",
    "rank_correlation",
    "bootstrap_ci",
    "bootstrap_draws",
    "bootstrap_intervals",
    "resampled_means",
    "resampled_sums",
    "mean_ci",
    "compare_predictors",
]
