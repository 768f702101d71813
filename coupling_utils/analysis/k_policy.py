"""The book's one K/d policy: which K every chapter reads its verdicts at, and the rule that chose it.

K, the number of top singular pairs the coupling metric compares, is set as a fraction of the
width d (``engine.metric.k_for_width``), because the chance level of ``1 − m_K²`` grows with K/d.
The fraction is not guessed: it is chosen by :func:`choose` from a measured sensitivity curve,
the excess coupling of each trained model over its random-init twin at each K/d of :data:`GRID`
(``data/k_sensitivity.csv``, drawn on the method page). The rule was fixed before the curve was
measured; the book build fails if ``choose(curve)`` no longer equals :data:`K_OVER_D`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from coupling_utils.engine.metric import k_for_width

__all__ = [
    "GRID",
    "K_OVER_D",
    "SHARE",
    "Choice",
    "choose",
    "choice",
    "k_for",
    "grid_ks",
    "curve",
    "measured_curve",
]

GRID = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
"""The K/d values the sensitivity curve is measured at."""

SHARE = 0.9
"""The share of a model's largest excess that the chosen K/d must reach (median over models)."""

K_OVER_D = 1 / 16
"""The book's K/d: ``choose`` of the measured curve (the book build checks that they agree)."""

CURVE_COLUMNS = ("model", "k_over_d", "excess")


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided: the K/d, the models it read and those it left out (and why)."""

    k_over_d: float
    models: tuple[str, ...]
    left_out: tuple[str, ...]
    share: pd.Series
    """Median over the kept models of excess / largest excess, one value per grid K/d."""


def _check_curve(curve: pd.DataFrame) -> None:
    missing = [c for c in CURVE_COLUMNS if c not in curve.columns]
    if missing:
        raise ValueError(
            f"the K/d sensitivity curve lacks the columns {missing} (it has {list(curve.columns)}); "
            "pass one row per model and K/d with its mean excess, as k_sensitivity.curve() returns"
        )
    if curve.empty:
        raise ValueError("the K/d sensitivity curve is empty: measure it first (coupling-book k-sensitivity)")
    if curve.duplicated(["model", "k_over_d"]).any():
        raise ValueError(
            "the K/d sensitivity curve has two rows for one model and K/d: aggregate over prompts first"
        )


def choice(curve: pd.DataFrame, *, share: float = SHARE) -> Choice:
    """:func:`choose`'s decision with its reasons (kept and left-out models, the median share)."""
    _check_curve(curve)
    wide = curve.pivot(index="k_over_d", columns="model", values="excess").sort_index()
    if wide.isna().any().any():
        holes = [m for m in wide.columns if wide[m].isna().any()]
        raise ValueError(
            f"the K/d sensitivity curve misses grid values for {holes}: measure every model at every K/d"
        )
    peak = wide.max(axis=0)
    kept = [m for m in wide.columns if peak[m] > 0]
    left_out = tuple(m for m in wide.columns if peak[m] <= 0)
    if not kept:
        raise ValueError(
            f"no model's excess over its random-init twin is positive at any K/d ({list(wide.columns)}): "
            "the curve cannot choose a K/d; check the twins and the prompts"
        )
    ratios = wide[kept] / peak[kept]
    median = ratios.median(axis=1)
    reached = median.index[median.to_numpy() >= share]
    return Choice(float(reached[0]), tuple(kept), left_out, median)


def choose(curve: pd.DataFrame) -> float:
    """The book's K/d from a measured sensitivity curve, by a rule fixed before the measurement.

    The rule, in words: for each model, take its excess, the mean over prompts of its coupling
    minus its random-init twin's coupling, at each K/d of the grid. A model whose largest excess
    on the grid is not above zero shows no coupling to choose K by; it is left out (and named in
    :func:`choice`). For the others, divide each excess by the model's largest one. The book's K/d
    is the smallest grid value at which the median of these shares over the models reaches 0.9:
    the smallest K that keeps nearly all of the trained-versus-random signal, since a smaller K
    is cheaper and nearer the paper's own K/d (about 0.01).

    ``curve`` has one row per model and K/d with columns ``model``, ``k_over_d``, ``excess``.
    """
    return choice(curve).k_over_d


def k_for(d_model: int) -> int:
    """K at the book's K/d for a model of width ``d_model`` (``k_for_width(d_model, K_OVER_D)``)."""
    return k_for_width(d_model, K_OVER_D)


def grid_ks(d_model: int) -> dict[float, int]:
    """K of each grid K/d at width ``d_model`` (several K/d may share a K at a small width)."""
    return {r: k_for_width(d_model, r) for r in GRID}


def curve(rows: pd.DataFrame, *, n_resamples: int = 1000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """The sensitivity curve from its per-prompt rows (``data/k_sensitivity.csv``): per model and
    K/d the mean excess over prompts (``excess``) with its percentile bootstrap interval over
    prompts (``low``, ``high``; the prompts are resampled once for every K/d of a model), and
    ``d_model``, ``K``, ``n`` (prompts)."""
    from coupling_utils.analysis.stats import bootstrap_ci

    out = []
    for model, one in rows.groupby("model", sort=False):
        wide = one.pivot(index="prompt", columns="k_over_d", values="excess")
        ci = bootstrap_ci(
            wide,
            lambda df: {str(r): float(df[r].mean()) for r in df.columns},
            n_resamples=n_resamples,
            level=level,
            seed=seed,
        ).set_index("statistic")
        ks = one.drop_duplicates("k_over_d").set_index("k_over_d")["K"]
        for r in wide.columns:
            est = ci.loc[str(r)]
            out.append(
                {
                    "model": model,
                    "d_model": int(one["d_model"].iloc[0]),
                    "k_over_d": float(r),
                    "K": int(ks[r]),
                    "excess": float(est["estimate"]),
                    "low": float(est["ci_low"]),
                    "high": float(est["ci_high"]),
                    "n": int(wide[r].notna().sum()),
                }
            )
    return pd.DataFrame(out)


def measured_curve() -> pd.DataFrame:
    """:func:`curve` of the measured rows, ``data/k_sensitivity.csv`` (coupling-book k-sensitivity)."""
    from coupling_utils.analysis.data import read_table

    return curve(read_table("k_sensitivity.csv"))
