"""The tables of one prompt, assembled from its stored layers once all of them are done.

Depth-wise coupling compares layers, so it waits until every layer of a prompt is stored; it is
then computed one token at a time from memory-mapped files (on the host, each file mapped once),
so the Jacobians of all layers never sit in memory at once. A layer's own tables are taken as
this run computed them where it did (their pieces), else as read back and checked from its stored
files (a resumed layer, :meth:`~coupling_utils.measurement.store.Store.stored_layer`): either way
each of the prompt's tables is made once from its pieces' columns
(:func:`~coupling_utils.measurement.tables.concat`), so both give the same tables.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.metric import SVD
from coupling_utils.measurement.compute import couplings, pair_tiles
from coupling_utils.measurement.inputs import Prompt, token_positions
from coupling_utils.measurement.settings import Settings
from coupling_utils.measurement.store import PromptArrays, Store
from coupling_utils.measurement.tables import TABLES, Piece, concat, coupling_pieces, in_window, tiles_piece

__all__ = ["prompt_tables"]


def prompt_tables(
    store: Store,
    s: Settings,
    p: Prompt,
    metas: list[dict],
    cross: list[dict] | None,
    own: Mapping[int, Mapping[str, list[Piece | pd.DataFrame]]],
    held: Mapping[tuple[int, str], np.ndarray] | None = None,
) -> dict[str, pd.DataFrame]:
    """Every table of prompt ``p`` from its stored layers (``metas``: their markers; ``cross``:
    the matrix-free cross-product markers, None for formed Jacobians; ``own``: each layer's own
    tables (``Settings.layer_tables``), by layer and table: the pieces this run made them of, or
    the table read back from a resumed layer; ``held``: the arrays of layers finished but not
    yet written, by (layer, name), read from memory instead of their files)."""
    layers = list(s.layers)
    tables: dict[str, list[Piece | pd.DataFrame]] = {name: [] for name in TABLES}
    for meta in metas:
        for name in s.layer_tables:
            tables[name] += own[meta["layer"]][name]
    arrays = store.arrays(p.pid, held)
    tile_layers = [l for l in layers if l in set(s.tile_layers)] if s.tiles else []
    if len(layers) >= 2 or tile_layers:
        for a, t in enumerate(metas[0]["tokens"]):
            tiles, S = _token_tiles(arrays, layers, a, cross is not None, s)
            _depth_rows(tables, s, p, t, tiles, S, tile_layers)
    if s.context is not False and len(layers) >= 2:
        tables["context"] += _cross_layer_context(arrays, s, p, metas)
    extra = {c["layer"]: c for c in (cross or [])}
    timings = {
        "prompt": p.pid,
        "layer": [m["layer"] for m in metas],
        "seconds": [m["seconds"] + extra.get(m["layer"], {}).get("seconds", 0.0) for m in metas],
        "block_passes": [m["block_passes"] + extra.get(m["layer"], {}).get("block_passes", 0) for m in metas],
    }
    tables["timings"].append(timings)
    T = metas[0]["T"]
    prompt_row = {"prompt": [p.pid], "text": [p.text], "n_tokens": [T], "input_ids": [p.input_ids]}
    tables["prompts"].append(prompt_row)
    return {name: concat(name, tables[name]) for name in TABLES}


def _token_tiles(
    arrays: PromptArrays, layers: list[int], a: int, matrix_free: bool, s: Settings
) -> tuple[torch.Tensor, torch.Tensor]:  # tiles [L, L, kmax, kmax], S [L, ≥kmax]
    """The kmax tiles and singular values of the a-th selected token over ``layers``."""
    bases = [arrays.basis(l, index=a) for l in layers]
    S = torch.stack([b.S for b in bases])
    if matrix_free:  # tiles from the stored products
        return torch.stack([arrays.array(l, "cross_tiles", a) for l in layers]), S
    J = torch.stack([arrays.array(l, "J", a) for l in layers])  # [L, d_out, d_in]
    basis = SVD(*(torch.stack(x) for x in zip(*bases)))
    return pair_tiles(J, basis, s.kmax, s.orientation), S


def _depth_rows(
    tables,
    s: Settings,
    p: Prompt,
    t: int,
    tiles: torch.Tensor,  # [L, L, kmax, kmax]
    S: torch.Tensor,  # [L, ≥kmax]
    tile_layers: list[int],
) -> None:
    """Depth-wise rows and raw tiles of token t."""
    layers = list(s.layers)
    if len(layers) >= 2:
        ms = couplings(tiles, S, s.k, s.p, s.normalize)
        keep = lambda li, lj: in_window(li, lj, s.depth_window)  # noqa: E731
        tables["depthwise"] += coupling_pieces(
            "depthwise", ms, layers, ("layer_i", "layer_j"), keep, prompt=p.pid, token=t
        )
    if tile_layers:
        tables["tiles"].append(tiles_piece(p.pid, t, tiles, layers, tile_layers, s.tiles, s.depth_window))


def _cross_layer_context(arrays: PromptArrays, s: Settings, p: Prompt, metas: list[dict]) -> list[Piece]:
    """Context coupling across layers, for each input token t1 that every layer sees."""
    layers = list(s.layers)
    t2 = token_positions(s.context, metas[0]["T"], "context")[0]
    common = sorted(set.intersection(*(set(m["context_tokens"]) for m in metas)))
    rows = []
    for t1 in common:
        Js, bases = [], []
        for meta in metas:
            i = meta["context_tokens"].index(t1)
            Js.append(arrays.array(meta["layer"], "ctx_J", i))
            bases.append(arrays.basis(meta["layer"], "ctx_", i))
        basis = SVD(*(torch.stack(x) for x in zip(*bases)))
        tiles = pair_tiles(torch.stack(Js), basis, s.kmax, s.orientation)
        ms = couplings(tiles, basis.S, s.k, s.p, s.normalize)

        def keep(li, lj):  # same-layer rows are the token slice, stored per layer
            return (li != lj) & in_window(li, lj, s.depth_window)

        rows += coupling_pieces(
            "context",
            ms,
            layers,
            ("layer_i", "layer_j"),
            keep,
            prompt=p.pid,
            output_token=t2,
            token_i=t1,
            token_j=t1,
        )
    return rows
