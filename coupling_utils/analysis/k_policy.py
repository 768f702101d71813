"""Choosing one K/d for the whole book: the grid, the measured sensitivity curve and the rule.

K, the number of top singular pairs the coupling metric compares, is set as a fraction of the
width d (``engine.metric.k_for_width``), because the chance level of ``1 − m_K²`` grows with K/d.
One K/d for every chapter should not be guessed: :func:`choose` picks it from a measured
sensitivity curve, the excess coupling of each trained model over its random-init twin at each
K/d of :data:`GRID` (``data/k_sensitivity.csv``, written by ``coupling-book k-sensitivity``). The
rule was fixed (and committed) before the curve was measured.

**Status: no policy yet.** On the curve measured so far (4 embedded models) the rule chooses no
K/d: the models peak at opposite ends of the grid (MiniLM at 1/2; pythia-tiny and the ViT at
1/64-1/32), so the median share never reaches :data:`SHARE`, and :func:`choose` says so. The
chapters therefore keep their own K (f01 10/30/50, f02 d/8, f03 d/16, f04 d/4), each named in its
captions. Amending the rule after seeing the curve would make the choice a fit to the data; a
next rule (a minimum K, one per model family, more models) must be fixed before a new curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from coupling_utils.engine.metric import k_for_width

__all__ = [
    "GRID",
    "SHARE",
    "Choice",
    "NoChoiceError",
    "choose",
    "decide",
    "grid_ks",
    "curve",
    "measured_curve",
]

GRID = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
"""The K/d values the sensitivity curve is measured at."""

SHARE = 0.9
"""The share of a model's largest excess that the chosen K/d must reach (median over models)."""


CURVE_COLUMNS = ("model", "k_over_d", "excess")


class NoChoiceError(ValueError):
    """The rule reaches its share at no grid value: the curve chooses no K/d."""


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


def decide(curve: pd.DataFrame, *, share: float = SHARE) -> Choice:
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
    if not len(reached):
        shares = ", ".join(f"{k:g}: {v:.3f}" for k, v in median.items())
        raise NoChoiceError(
            f"the rule chooses no K/d: the median share of the largest excess reaches {share} at no grid "
            f"value ({shares}); the models peak at different K/d. Fix a new rule before measuring again"
        )
    return Choice(float(reached[0]), tuple(kept), left_out, median)


def choose(curve: pd.DataFrame) -> float:
    """The book's K/d from a measured sensitivity curve, by a rule fixed before the measurement.

    The rule, in words: for each model, take its excess, the mean over prompts of its coupling
    minus its random-init twin's coupling, at each K/d of the grid. A model whose largest excess
    on the grid is not above zero shows no coupling to choose K by; it is left out (and named in
    :func:`decide`). For the others, divide each excess by the model's largest one. The book's K/d
    is the smallest grid value at which the median of these shares over the models reaches 0.9:
    the smallest K that keeps nearly all of the trained-versus-random signal, since a smaller K
    is cheaper and nearer the paper's own K/d (about 0.01).

    ``curve`` has one row per model and K/d with columns ``model``, ``k_over_d``, ``excess``.
    """
    return decide(curve).k_over_d


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
