"""The tile grid of f01: how diagonal block i's Jacobian is in block j's top-K singular bases.

A tile is the K × K matrix ``|U_{j,K}^T J_i V_{j,K}|`` (``Settings.tiles``); the paper reads a
bright diagonal in a tile as the two blocks sharing their top singular directions. Because the
singular vectors come in order, the tile measured at K holds the tile of every smaller K as its
top-left corner, so one measured tile answers for every K up to its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from coupling_utils.measurement.jobs import WEIGHTS
from coupling_utils.measurement.tables import SCHEMAS as MEASURED
from coupling_utils.schemas import check_table

__all__ = ["tile_diagonality", "nested_tile_ks", "tile_contrast"]


def tile_diagonality(tiles: pd.DataFrame) -> pd.DataFrame:
    """For each tile, the share of its squared entries on the diagonal (1 = perfectly diagonal,
    about 1/K for a tile with no structure). Columns: the tile's keys, layer_i, layer_j,
    diagonal_share; averaged over prompts and tokens."""
    check_table(tiles, MEASURED["tiles"].need("layer_i", "layer_j", "row", "col", "value"))
    keys = [c for c in ("model", "weights", "prompt", "token", "K") if c in tiles.columns]
    sq = tiles.assign(sq=tiles["value"].astype(float) ** 2, on=tiles["row"] == tiles["col"])
    sq["diag_sq"] = sq["sq"].where(sq["on"], 0.0)
    per = sq.groupby([*keys, "layer_i", "layer_j"], as_index=False)[["diag_sq", "sq"]].sum()
    per["diagonal_share"] = per["diag_sq"] / per["sq"].where(per["sq"] > 0)
    outer = [c for c in keys if c not in ("prompt", "token")]
    return per.groupby([*outer, "layer_i", "layer_j"], as_index=False)["diagonal_share"].mean()


def nested_tile_ks(k: int) -> list[int]:
    """The K values a tile measured at K = ``k`` holds: its top-left K' × K' corner is the tile at
    K' (the singular vectors come in order), for every K' from 3 (below it a visible diagonal,
    ``2/K'`` of the squared mass, cannot be told from chance) to ``k``."""
    return list(range(3, int(k) + 1)) if k >= 3 else [int(k)]


def _corner_shares(tiles: pd.DataFrame, ks: Sequence[int]) -> pd.DataFrame:
    """Per prompt (rows) the diagonal share of every off-diagonal tile's K' × K' corner, for each
    K' in ``ks`` (columns: weights, K', layer_i, layer_j); tokens averaged.

    Every corner of every tile at once: the squared entries laid out as ``[tile, row, col]`` and
    summed over rows and columns cumulatively, so the corner K' of a tile is one element of the
    running sums (the diagonal's likewise), where grouping the table again for each K' took seconds
    per K'. A sum is the same as adding the corner's entries, up to rounding (the last bits)."""
    off = tiles[tiles["layer_i"] != tiles["layer_j"]]
    keys = [c for c in ("weights", "prompt", "token") if c in off.columns] + ["layer_i", "layer_j"]
    tile = off.groupby(keys, sort=True).ngroup().to_numpy()  # each tile numbered once
    firsts = np.unique(tile, return_index=True)[1]
    named = off[keys].iloc[firsts].reset_index(drop=True)  # each tile's keys, by its number
    row, col = off["row"].to_numpy(dtype=np.int64), off["col"].to_numpy(dtype=np.int64)
    n, size = len(firsts), int(max(row.max(), col.max())) + 1 if len(off) else 0
    flat = (tile * size + row) * size + col

    def laid_out(weights: np.ndarray | None) -> np.ndarray:  # [tile, row, col], entries added
        return np.bincount(flat, weights=weights, minlength=n * size * size).reshape(n, size, size)

    squares = laid_out(off["value"].to_numpy(dtype=float) ** 2)
    total = squares.cumsum(axis=1).cumsum(axis=2)  # total[t, r, c]: the rows <= r, columns <= c
    diagonal = np.diagonal(squares, axis1=1, axis2=2).cumsum(axis=1)  # [tile, K' - 1]
    present = laid_out(None).cumsum(axis=1).cumsum(axis=2) > 0  # a measured entry in the corner
    frames = []
    for kk in ks:
        last = min(int(kk), size) - 1
        sq, inside = total[:, last, last], present[:, last, last]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(sq > 0, diagonal[:, last] / sq, np.nan)
        frames.append(named[inside].assign(share=share[inside], K=kk))
    per = pd.concat(frames, ignore_index=True)
    if "prompt" not in per:
        per = per.assign(prompt="")
    return per.pivot_table(index="prompt", columns=["weights", "K", "layer_i", "layer_j"], values="share")


def _visible_extremes(shares: Mapping[tuple, np.ndarray]) -> dict[str, np.ndarray]:
    """From per-prompt corner shares, every resample at once (``shares``: column (weights, K',
    layer_i, layer_j) of :func:`_corner_shares` -> ``[n_resamples, n]``): the smallest (over K')
    share of the trained model's tiles with a visible diagonal (prompt-mean share ≥ 2/K'), and the
    largest of the twin's (NaN for a model without tiles). The tiles of one (weights, K') are
    averaged as one stack (each row summed left to right, as column by column)."""
    from coupling_utils.analysis.stats import resampled_means

    columns: dict[tuple, list[np.ndarray]] = {}
    for (weights, k, *_), a in shares.items():
        columns.setdefault((weights, k), []).append(a)
    visible = {
        (weights, k): np.mean(resampled_means(np.stack(a), "left_to_right") >= 2 / k, axis=0)
        for (weights, k), a in columns.items()
    }
    n = len(next(iter(shares.values())))
    by = {w: [v for (ww, _), v in visible.items() if ww == w] for w in WEIGHTS}
    extreme = {"diagonal_trained": (WEIGHTS[0], np.min), "diagonal_twin": (WEIGHTS[1], np.max)}
    return {
        name: fn(np.stack(by[w]), axis=0) if by[w] else np.full(n, np.nan)
        for name, (w, fn) in extreme.items()
    }


def tile_contrast(tiles: pd.DataFrame, k: int) -> dict:
    """How diagonal the off-diagonal tiles (i ≠ j) are, trained against twin, judged on every
    tile, every prompt and every K the tiles hold (:func:`nested_tile_ks`).

    ``trained``, ``twin``: the mean share of a tile's squared mass on its diagonal at K = ``k``
    (prompts and tokens averaged); ``chance`` = 1/``k`` (a tile with no structure);
    ``diagonal_trained``: the smallest, over K', share of the trained model's tiles whose
    prompt-mean diagonal holds at least twice the chance share (2/K', a visible diagonal), and
    ``diagonal_twin`` the largest such share of the twin's, each an
    :class:`~coupling_utils.analysis.verdicts.Interval` (95% bootstrap over prompts).
    """
    from coupling_utils.analysis.stats import bootstrap_intervals

    diag = tile_diagonality(tiles)
    off = diag[diag["layer_i"] != diag["layer_j"]]
    if off.empty:
        raise ValueError("no tiles with layer_i != layer_j: the tile window needs at least two blocks")
    by = off.groupby("weights")["diagonal_share"]
    ks = nested_tile_ks(k)
    shares = _corner_shares(tiles, ks)
    out = {
        "trained": float(by.mean().get("trained", np.nan)),
        "twin": float(by.mean().get("random init", np.nan)),
        "chance": 1 / k,
    }
    detail = f", K = {ks[0]}–{ks[-1]}"
    return out | bootstrap_intervals(
        shares, _visible_extremes, "prompt", detail=detail, n_resamples=1000, vectorized=True
    )
