"""Choosing one K/d for the whole book: the grid, the measured sensitivity curve and the rule.

K, the number of top singular pairs the coupling metric compares, is set as a fraction of the
width d (``engine.metric.k_for_width``), because the chance level of ``1 − m_K²`` depends on K/d
(on the measured curve every random-init twin's coupling falls as K/d grows).
One K/d for every chapter should not be guessed: :func:`choose` picks it from a measured
sensitivity curve, the excess coupling of each trained model over its random-init twin at each
K/d of :data:`GRID` (``data/k_sensitivity.csv``, written by ``coupling-book k-sensitivity``).

**History of the rule (say it whenever the choice is quoted).** Rule 1 (the smallest K/d where
the median share of each model's largest excess reaches 0.9) was committed before any curve was
measured; on the first curve (4 embedded models: SmolLM2, MiniLM, pythia-tiny, the MNIST ViT) it
chose nothing, the models peaking at opposite ends of the grid. Rule 2, :func:`decide` below, was
written *after seeing that first curve* and committed before the second curve, on more models
(the embedded families as well), was measured: it is not independent of the first curve, and the
book must say so beside the value it gives.

**Status: rule 2 gives K/d = 1/8 on the second curve, and the book applies it.** The second
curve (2026-12-03) holds 27 models in 7 voices (SmolLM2, MiniLM, pythia-tiny, the MNIST ViT, and
the LM, LM-training and ViT families member by member); it reproduces the first curve's four
models to 1e-7. Left out: pythia-tiny and lm-training-family/s2 (their largest excess has an
interval that touches 0), so 6 voices decide; their median share is 0.710 at 1/8, 0.671 at 1/4,
0.617 at 1/2 (and 0.795 at 1/16, which keeps only 2 pairs at d = 32). :data:`BOOK_K_OVER_D`
holds the value; every chapter's default profile measures its verdicts at it (f00 K = 72 and
f01 K = 72 at d = 576, f02's families d/8, f03 K = 8 and f04 K = 8 at d = 64), and
tests/test_k_policy.py holds both to the curve. The paper profile keeps the paper's own K.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from coupling_utils.engine.metric import k_for_width

__all__ = [
    "BOOK_K_OVER_D",
    "GRID",
    "MIN_K",
    "NARROWEST",
    "TOLERANCE",
    "eligible",
    "voice",
    "voice_shares",
    "Choice",
    "NoChoiceError",
    "choose",
    "decide",
    "grid_ks",
    "curve",
    "measured_curve",
    "member_means",
    "family_sentence",
]

BOOK_K_OVER_D = 1 / 8
"""The book's K/d: what :func:`choose` gives on ``data/k_sensitivity.csv`` (a test holds them
equal, so a new curve that moves the choice fails until the chapters move with it)."""

GRID = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
"""The K/d values the sensitivity curve is measured at."""

MIN_K = 4
"""The fewest singular pairs a usable K keeps at the book's narrowest width: with K of 1-2 the
metric compares one or two directions, which swap places wherever two singular values are close."""

NARROWEST = 32
"""The narrowest model any chapter measures (d = 32: members of the embedded LM and ViT families;
tests/test_k_policy.py holds it to the zoo)."""

TOLERANCE = 0.05
"""How far below the best median share a smaller K/d may be and still be preferred (cheaper, and
nearer the paper's own K/d of about 0.01)."""

CURVE_COLUMNS = ("model", "k_over_d", "excess", "low")


class NoChoiceError(ValueError):
    """The rule finds no K/d: no model shows an excess to choose by, or no eligible K/d keeps any."""


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided: the K/d, the voices it read (a single model, or a family as
    one voice), the models it left out (and why), and the median share at each grid K/d."""

    k_over_d: float
    models: tuple[str, ...]
    left_out: tuple[str, ...]
    share: pd.Series
    """Median over the voices of (excess / the model's largest excess), one value per grid K/d."""
    eligible: tuple[float, ...]
    """The grid values the rule may choose: K ≥ :data:`MIN_K` at width :data:`NARROWEST`."""


def voice(model: str) -> str:
    """The voice a model speaks with: an embedded family's member speaks as its family
    (``embedded:lm-family/w32-l2-seed0`` -> ``embedded:lm-family``), any other model alone."""
    if model.startswith("embedded:") and "/" in model:
        return model.split("/", 1)[0]
    return model


def voice_shares(curve: pd.DataFrame, left_out=()) -> pd.DataFrame:
    """What the rule reads, per voice and K/d: each model's excess (and, where the curve has them,
    its interval's ends ``low``, ``high``) divided by the model's largest excess, then the median
    over the voice's models; the models in ``left_out`` take no part. Voices in curve order."""
    kept = curve[~curve["model"].isin(left_out)]
    cols = [c for c in ("excess", "low", "high") if c in kept.columns]
    peak = kept.groupby("model")["excess"].transform("max")
    shares = kept[cols].div(peak, axis=0).assign(voice=kept["model"].map(voice), k_over_d=kept["k_over_d"])
    return shares.groupby(["voice", "k_over_d"], as_index=False, sort=False)[cols].median()


def eligible(grid=GRID) -> tuple[float, ...]:
    """Grid values whose K at :data:`NARROWEST` is at least :data:`MIN_K`."""
    return tuple(r for r in grid if k_for_width(NARROWEST, r) >= MIN_K)


def _check_curve(curve: pd.DataFrame) -> None:
    missing = [c for c in CURVE_COLUMNS if c not in curve.columns]
    if missing:
        raise ValueError(
            f"the K/d sensitivity curve lacks the columns {missing} (it has {list(curve.columns)}); "
            "pass one row per model and K/d with its mean excess and interval, as k_policy.curve() returns"
        )
    if curve.empty:
        raise ValueError("the K/d sensitivity curve is empty: measure it first (coupling-book k-sensitivity)")
    if curve.duplicated(["model", "k_over_d"]).any():
        raise ValueError(
            "the K/d sensitivity curve has two rows for one model and K/d: aggregate over prompts first"
        )


def decide(curve: pd.DataFrame, *, tolerance: float = TOLERANCE) -> Choice:
    """:func:`choose`'s decision with its reasons (voices, left-out models, the median share)."""
    _check_curve(curve)
    wide = curve.pivot(index="k_over_d", columns="model", values="excess").sort_index()
    low = curve.pivot(index="k_over_d", columns="model", values="low").sort_index()
    if wide.isna().any().any():
        holes = [m for m in wide.columns if wide[m].isna().any()]
        raise ValueError(
            f"the K/d sensitivity curve misses grid values for {holes}: measure every model at every K/d"
        )
    peak_at = wide.idxmax(axis=0)
    clears = {m: bool(low.loc[peak_at[m], m] > 0) for m in wide.columns}
    kept = [m for m in wide.columns if clears[m]]
    left_out = tuple(m for m in wide.columns if not clears[m])
    if not kept:
        raise NoChoiceError(
            f"no model's largest excess over its random-init twin has an interval clear of 0 "
            f"({list(wide.columns)}): the curve cannot choose a K/d; check the twins and the prompts"
        )
    shares = voice_shares(curve, left_out)
    by_voice = shares.pivot(index="k_over_d", columns="voice", values="excess")
    by_voice = by_voice[list(dict.fromkeys(shares["voice"]))]
    median = by_voice.median(axis=1)
    allowed = [r for r in eligible(tuple(median.index)) if r in median.index]
    if not allowed:
        raise NoChoiceError(f"no grid value gives K >= {MIN_K} at d = {NARROWEST}: widen the grid")
    best = float(median[allowed].max())
    if not best > 0:
        listed = ", ".join(f"{k:g}: {v:.3f}" for k, v in median.items())
        raise NoChoiceError(
            f"the rule chooses no K/d: no eligible K/d keeps a positive median share ({listed})"
        )
    chosen = min(r for r in allowed if median[r] >= best - tolerance)
    return Choice(float(chosen), tuple(by_voice.columns), left_out, median, tuple(allowed))


def choose(curve: pd.DataFrame) -> float:
    """The book's K/d from a measured sensitivity curve (rule 2; see the module's history).

    The rule, in words: for each model, take its excess, the mean over prompts of its coupling
    minus its random-init twin's coupling, at each K/d of the grid, with its bootstrap interval. A
    model whose largest excess has an interval that does not clear zero shows no coupling to choose
    K by; it is left out (and named in :func:`decide`). For the others, divide each excess by the
    model's largest one (its share). Members of one embedded family speak as one voice, the median
    of their shares, so that eight tiny siblings do not outvote four other models. The eligible
    values are the grid values that keep at least 4 singular pairs at the narrowest width the book
    measures (d = 32). The book's K/d is the eligible value with the largest median share over the
    voices, or the smallest eligible value within 0.05 of it (cheaper, nearer the paper's K/d).

    ``curve`` has one row per model and K/d with columns ``model``, ``k_over_d``, ``excess``,
    ``low`` (the interval's lower end), as :func:`curve` returns.
    """
    return decide(curve).k_over_d


def grid_ks(d_model: int, grid: Sequence[float] = GRID) -> dict[float, int]:
    """K of each K/d of ``grid`` at width ``d_model`` (several K/d may share a K at a small width)."""
    return {r: k_for_width(d_model, r) for r in grid}


def _column_means(columns: Mapping) -> dict[str, np.ndarray]:
    """Each K/d column's mean over the prompts it has (a missing prompt is NaN), on every
    resample at once (``columns``: K/d -> ``[n_resamples, n]``): pandas' ``Series.mean``, summed
    in its order, without a pandas call per resample (1000 of them per model cost every
    book build 13 s)."""
    from coupling_utils.analysis.stats import resampled_means

    return {str(r): resampled_means(a, "pairwise") for r, a in columns.items()}


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
            wide, _column_means, n_resamples=n_resamples, level=level, seed=seed, vectorized=True
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


def member_means(family: str) -> pd.DataFrame:
    """Per K/d and member of the embedded family ``family`` (``"embedded:vit-family"``), its mean
    over the curve's prompts of the twin's coupling and of the excess, from the measured rows
    (``data/k_sensitivity.csv``); columns ``k_over_d``, ``run``, ``coupling_twin``, ``excess``,
    ``n`` (prompts). Empty when the curve holds no member of ``family``."""
    from coupling_utils.analysis.data import read_table

    rows = read_table("k_sensitivity.csv")
    rows = rows[rows["model"].str.startswith(f"{family}/")]
    rows = rows.assign(run=rows["model"].str.split("/", n=1).str[1])
    return rows.groupby(["k_over_d", "run"], as_index=False).agg(
        coupling_twin=("coupling_twin", "mean"), excess=("excess", "mean"), n=("prompt", "nunique")
    )


def family_sentence(family: str, ratios, accuracy: pd.Series | None = None, *, unit: str = "prompts") -> str:
    """What the stored curve says of the embedded family ``family`` at each K/d of ``ratios``, in
    one sentence (an exercise's expected result): the members' mean twin coupling and mean
    excess and, with ``accuracy`` (by run, named), Spearman's ρ of the members' excess with it.
    Plain text (no math markup): it is glued as Markdown, where math is not rendered."""
    from scipy.stats import spearmanr

    means = member_means(family)
    if means.empty:
        return f"The stored sensitivity curve holds no member of {family}: rerun the exercise to see."
    parts = []
    for r in ratios:
        per = means[np.isclose(means["k_over_d"], r)].set_index("run")
        if per.empty:
            grid = ", ".join(f"{g:g}" for g in GRID)
            parts.append(f"at K/d = {r:g} it was not measured (its grid: {grid})")
            continue
        part = (
            f"at K/d = {r:g} the twins average {per['coupling_twin'].mean():.3f} and the excess "
            f"{per['excess'].mean():.3f}"
        )
        if accuracy is not None:
            per = per.join(accuracy, how="inner")
            rho = spearmanr(per["excess"], per[accuracy.name]).statistic
            part += f", ρ(excess, {accuracy.name}) = {rho:.2f}"
        parts.append(part)
    return (
        f"The stored K/d sensitivity curve (method page) answers it for the {means['run'].nunique()} "
        f"members of {family}, each beside its twin on {int(means['n'].max())} {unit}: "
        + "; ".join(parts)
        + "."
    )
