"""Coupling against the distance between blocks: how far along depth a model's coupling reaches.

Chapter f01 condenses its depth-wise matrices (one per prompt, K and weights) to the mean coupling
of the block pairs at each distance ``|i − j|`` (:func:`coupling_by_distance`), ranks that profile
against the distance (:func:`distance_trend`: Spearman's ρ, the nearest and the farthest pairs) and
resamples prompts for the intervals its words follow (:func:`distance_intervals`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from coupling_utils.measurement import coupling_summary
from coupling_utils.measurement.jobs import WEIGHTS
from coupling_utils.measurement.tables import SCHEMAS as MEASURED
from coupling_utils.schemas import Schema, check_table

__all__ = ["BY_DISTANCE", "coupling_by_distance", "distance_trend", "distance_intervals"]

#: coupling_by_distance's table, as distance_trend reads it
BY_DISTANCE = Schema(
    "the by-distance table",
    {"weights": "any", "K": "int", "distance": "int", "coupling": "number"},
    fix="pass coupling_by_distance(depthwise)",
)


def coupling_by_distance(depthwise: pd.DataFrame) -> pd.DataFrame:
    """Mean 1 − m² of pairs of different blocks against their distance ``|i − j|`` (in blocks),
    per (model, weights, K): how far along depth coupling reaches."""
    check_table(depthwise, MEASURED["depthwise"].need("K", "layer_i", "layer_j", "coupling"))
    keys = [c for c in ("model", "weights") if c in depthwise.columns] + ["K"]
    df = depthwise[depthwise["layer_i"] != depthwise["layer_j"]]
    df = df.assign(distance=(df["layer_i"] - df["layer_j"]).abs())
    return df.groupby([*keys, "distance"], as_index=False)["coupling"].mean()


def distance_trend(by_distance: pd.DataFrame) -> pd.DataFrame:
    """Per (weights, K): Spearman's ρ of coupling with the distance between blocks (−1: falls
    steadily with distance), coupling at distance 1 and at the largest distance."""
    check_table(by_distance, BY_DISTANCE)
    rows = []
    for (weights, K), g in by_distance.groupby(["weights", "K"], sort=False):
        g = g.sort_values("distance")
        rho = g["distance"].rank().corr(g["coupling"].rank()) if len(g) > 1 else np.nan
        first, last = float(g["coupling"].iloc[0]), float(g["coupling"].iloc[-1])
        rows.append(
            {"weights": weights, "K": int(K), "spearman": float(rho), "adjacent": first, "farthest": last}
        )
    return pd.DataFrame(rows)


def distance_intervals(depthwise: pd.DataFrame, k: int, how: str, *, n_resamples: int = 1000) -> dict:
    """What the words on coupling against the distance between blocks compare, for the trained
    weights at K = ``k``, with 95% intervals over prompts (a prompt resampled with all its tokens
    and block pairs): ``spearman``, :func:`distance_trend`'s ρ of the mean coupling at each
    distance with that distance (absent with one distance: two blocks have no trend), and
    ``adjacent_excess``, its ``adjacent`` (the nearest pairs) minus the per-model coupling
    (:func:`coupling_summary` over the ``how`` pairs, prompts counting equally). Values are
    :class:`~coupling_utils.analysis.verdicts.Interval`; one prompt gives unbounded intervals."""
    from scipy.stats import rankdata

    from coupling_utils.analysis.stats import (
        bootstrap_intervals,
        resampled_means,
        resampled_sums,
        rowwise_pearson,
    )

    check_table(
        depthwise, MEASURED["depthwise"].need("prompt", "weights", "K", "layer_i", "layer_j", "coupling")
    )
    trained = depthwise[(depthwise["weights"] == WEIGHTS[0]) & (depthwise["K"] == k)]
    pairs = trained[trained["layer_i"] != trained["layer_j"]]
    pairs = pairs.assign(distance=(pairs["layer_i"] - pairs["layer_j"]).abs())
    g = pairs.groupby(["prompt", "distance"])["coupling"]
    wide = pd.concat({"sum": g.sum().unstack(), "n": g.count().unstack()}, axis=1).fillna(0.0)
    wide[("overall", -1)] = coupling_summary(trained, how=how, k=k, per_prompt=True)
    distances = sorted(int(x) for x in pairs["distance"].unique())

    def values(columns) -> dict[str, np.ndarray]:  # every resample at once: column -> [R, n prompts]
        sums = np.stack([resampled_sums(columns[("sum", x)]) for x in distances], axis=-1)
        counts = np.stack([resampled_sums(columns[("n", x)]) for x in distances], axis=-1)
        profile = sums / counts  # [R, distances]: coupling_by_distance of each resample
        out = {"adjacent_excess": profile[..., 0] - resampled_means(columns[("overall", -1)])}
        if len(distances) > 1:
            steps = np.broadcast_to(np.arange(len(distances), dtype=float), profile.shape)
            out["spearman"] = rowwise_pearson(rankdata(profile, axis=-1), steps)
        return out

    return bootstrap_intervals(wide, values, "prompt", n_resamples=n_resamples, vectorized=True)
