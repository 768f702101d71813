"""Depth-wise coupling matrices over training, condensed: the mean matrix per checkpoint, the
share of layer pairs at m > 1, the level of 1 − m² against K/d, and the edges of the paper's
layer-coupling graphs (Fig. 1c–e)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from coupling_utils.analysis.training_curves import _groups
from coupling_utils.measurement.tables import SCHEMAS as MEASURED
from coupling_utils.schemas import check_table

__all__ = ["mean_matrices", "share_above_one", "k_levels", "edge_counts"]


def mean_matrices(depthwise: pd.DataFrame, *, by: str | Sequence[str] = "step") -> pd.DataFrame:
    """Depth-wise coupling matrices averaged over prompts and tokens, per group ``by``:
    columns (by..., layer_i, layer_j, m, coupling), ``coupling`` = mean of 1 − m²."""
    by_cols = [by] if isinstance(by, str) else list(by)
    check_table(depthwise, MEASURED["depthwise"].need(*by_cols, "layer_i", "layer_j", "m", "coupling"))
    if "K" in depthwise.columns and depthwise["K"].nunique() > 1 and "K" not in by_cols:
        raise ValueError(f"depthwise mixes K = {sorted(depthwise['K'].unique())}; select one K first")
    return depthwise.groupby([*by_cols, "layer_i", "layer_j"], as_index=False)[["m", "coupling"]].mean()


def share_above_one(
    depthwise: pd.DataFrame, *, by: str | Sequence[str] = ("model", "step", "K")
) -> pd.DataFrame:
    """Per group: how many pair values have m > 1, where ``1 − m²`` is negative (``share_m_above_1``).

    m_K lies in [0, √2], so 1 − m² lies in [−1, 1]. Two unrelated Jacobians give m near 1, and
    above 1 when the K×K block |U₂ᵀ J₁ V₂| carries more off-diagonal energy than its diagonal
    removes, which grows with K/d: a curve of mean 1 − m² below zero is at (or below) the level
    of unrelated matrices, not "anti-coupled". Pairs of a layer with itself are left out.
    """
    by_cols = [by] if isinstance(by, str) else list(by)
    check_table(depthwise, MEASURED["depthwise"].need(*by_cols, "layer_i", "layer_j", "m"))
    off = depthwise[depthwise["layer_i"] != depthwise["layer_j"]]
    return (
        off.assign(share_m_above_1=(off["m"] > 1).astype(float))
        .groupby(by_cols, as_index=False)["share_m_above_1"]
        .mean()
    )


def k_levels(
    summary: pd.DataFrame, depthwise: pd.DataFrame, *, by: str | Sequence[str] = "model"
) -> pd.DataFrame:
    """Per group and K: how the level of 1 − m² depends on K relative to the width.

    Columns: by..., K, d_model, K_over_d, first_step, first (coupling at the first checkpoint,
    for a local run step 0: the random initialisation, where no block is related to another),
    final, lowest (the curve's minimum), share_first and share_final (share of layer pairs
    with m > 1, i.e. 1 − m² < 0, at those checkpoints; :func:`share_above_one`).
    """
    by_cols = [by] if isinstance(by, str) else list(by)
    shares = share_above_one(depthwise, by=[*by_cols, "step", "K"])
    rows = []
    for key, g in summary.groupby([*by_cols, "K"], sort=True):
        curve = g.groupby("step", sort=True)["coupling"].mean()
        share = shares.set_index([*by_cols, "K", "step"])["share_m_above_1"]
        first, last = int(curve.index[0]), int(curve.index[-1])
        d = float(g["d_model"].iloc[0]) if "d_model" in g and g["d_model"].notna().all() else np.nan
        rows.append(
            {
                **dict(zip([*by_cols, "K"], key)),
                "d_model": d,
                "K_over_d": key[-1] / d,
                "first_step": first,
                "first": float(curve.iloc[0]),
                "final": float(curve.iloc[-1]),
                "lowest": float(curve.min()),
                "share_first": float(share.loc[(*key, first)]),
                "share_final": float(share.loc[(*key, last)]),
            }
        )
    return pd.DataFrame(rows)


def edge_counts(
    matrices: pd.DataFrame, threshold: float, *, by: str | Sequence[str] = "step", value: str = "coupling"
) -> pd.DataFrame:
    """Per group: how many unordered layer pairs have (i, j)/(j, i)-averaged ``value`` above
    ``threshold`` (the edges of ``plots.layer_coupling_graph`` with ``symmetrize="mean"``).
    Columns: by..., pairs, edges, density (= edges / pairs)."""
    by_cols = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, g in _groups(matrices, by_cols):
        g = g[g["layer_i"] != g["layer_j"]]
        a = np.minimum(g["layer_i"].to_numpy(), g["layer_j"].to_numpy())
        b = np.maximum(g["layer_i"].to_numpy(), g["layer_j"].to_numpy())
        pairs = (
            pd.DataFrame({"a": a, "b": b, "v": g[value].to_numpy(dtype=float)})
            .groupby(["a", "b"])["v"]
            .mean()
        )
        n_edges = int((pairs > threshold).sum())
        rows.append(
            {
                **dict(zip(by_cols, key)),
                "pairs": int(len(pairs)),
                "edges": n_edges,
                "density": n_edges / len(pairs) if len(pairs) else float("nan"),
            }
        )
    return pd.DataFrame(rows)
