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
    K' in ``ks`` (columns: weights, K', layer_i, layer_j); tokens averaged."""
    off = tiles[tiles["layer_i"] != tiles["layer_j"]]
    keys = [c for c in ("weights", "prompt", "token") if c in off.columns] + ["layer_i", "layer_j"]
    # each tile numbered once, in the sorted order of its keys (grouping by the text keys again for
    # every K' cost seconds); the sums below add the same rows in the same order as grouping by them
    tile = off.groupby(keys, sort=True).ngroup().to_numpy()
    firsts = np.unique(tile, return_index=True)[1]
    named = off[keys].iloc[firsts].reset_index(drop=True)  # each tile's keys, by its number
    row, col = off["row"].to_numpy(), off["col"].to_numpy()
    squares = pd.DataFrame({"sq": off["value"].to_numpy(dtype=float) ** 2})
    squares.insert(0, "diag_sq", squares["sq"].where(row == col, 0.0))
    frames = []
    for kk in ks:
        inside = (row < kk) & (col < kk)
        sums = squares[inside].groupby(tile[inside], sort=True)[["diag_sq", "sq"]].sum()
        share = sums["diag_sq"] / sums["sq"].where(sums["sq"] > 0)
        frames.append(named.iloc[sums.index].assign(share=share.to_numpy(), K=kk))
    per = pd.concat(frames, ignore_index=True)
    if "prompt" not in per:
        per = per.assign(prompt="")
    return per.pivot_table(index="prompt", columns=["weights", "K", "layer_i", "layer_j"], values="share")


def _visible_extremes(shares: Mapping[tuple, np.ndarray]) -> dict[str, np.ndarray]:
    """From per-prompt corner shares, every resample at once (``shares``: column (weights, K',
    layer_i, layer_j) of :func:`_corner_shares` -> ``[n_resamples, n]``): the smallest (over K')
    share of the trained model's tiles with a visible diagonal (prompt-mean share ≥ 2/K'), and the
    largest of the twin's (NaN for a model without tiles)."""
    from coupling_utils.analysis.stats import resampled_means

    visible: dict[tuple, list[np.ndarray]] = {}
    for (weights, k, *_), a in shares.items():
        mean = resampled_means(a, "left_to_right")  # a column of the pivot table's block
        visible.setdefault((weights, k), []).append(mean >= 2 / k)
    n = len(next(iter(shares.values())))
    by = {w: [np.mean(v, axis=0) for (ww, _), v in visible.items() if ww == w] for w in WEIGHTS}
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
