"""A trained model beside its random-init twin: coupling across depth and tokens, side by side.

The paper's first finding is a contrast: block Jacobians of a trained model are coupled across
depth and tokens, those of the same architecture with random weights are not. :func:`measure_twins`
measures both with :func:`coupling_utils.measurement.measure` (depth-wise coupling of the last token,
raw tiles over a window of layers, token-wise self and context coupling at one block) and returns
the tables with a ``weights`` column ("trained" / "random init"). The helpers below condense
them for the figures: mean matrices, coupling against the distance between blocks, how diagonal
the tiles are, token labels for axes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "WEIGHTS",
    "TwinMeasurement",
    "measure_twins",
    "mean_depthwise",
    "coupling_by_distance",
    "tile_diagonality",
    "offdiag_mean",
    "label_tokens",
]

WEIGHTS = ("trained", "random init")


@dataclass
class TwinMeasurement:
    """Tables of one model and its random-init twin (each with ``model`` and ``weights`` columns).

    ``depthwise``, ``tiles``, ``singular_values``: last token over the measured blocks;
    ``tokenwise``, ``context``: all tokens at block ``token_layer``; ``summary``: one row per
    (model, weights, K) with the scalar coupling; ``tokens``: prompt id -> token strings.
    """

    model: str
    n_layers: int
    d_model: int
    token_layer: int
    depthwise: pd.DataFrame
    tiles: pd.DataFrame
    singular_values: pd.DataFrame
    tokenwise: pd.DataFrame
    context: pd.DataFrame
    summary: pd.DataFrame
    tokens: dict[str, list[str]] = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def _key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _check_block(name: str, value: int, n_layers: int, model: str) -> int:
    if not -n_layers <= value < n_layers:
        raise ValueError(f"{name}={value} does not exist: {model} has {n_layers} blocks (0..{n_layers - 1})")
    return value % n_layers


def measure_twins(
    model: str,
    prompts: Any,
    *,
    k: int | Sequence[int] = (10, 30, 50),
    layers: Sequence[int] | None = None,
    tile_layers: Sequence[int] | None = None,
    tile_k: int | None = None,
    token_layer: int | None = None,
    how: str = "offdiag",
    dtype: str = "float32",
    seed: int = 0,
    method: str = "exact",
    max_tokens: int | None = None,
    out: str | Path | None = None,
    load: Callable[..., Any] | None = None,
) -> TwinMeasurement:
    """Measure ``model`` and its random-init twin (``load_model(..., random_init=True, seed=seed)``).

    Depth-wise coupling of the last token over ``layers`` (default all) for K in ``k``; with
    ``tile_layers`` (added to ``layers``) also the raw ``tile_k`` × ``tile_k`` tiles of that
    window (measured at K = max(k) and cropped); with ``token_layer`` also token-wise self
    coupling (all tokens) and context coupling
    (output token: the last) at that block. ``out``: a cache directory; measurements are stored
    under ``out/<model>/<weights>/<settings hash>`` and reused. ``load`` replaces
    ``loading.load_model`` (tests).
    """
    from coupling_utils.measurement import coupling_summary, measure

    if load is None:
        from coupling_utils.models.loading import load_model as load
    ks = sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})
    if tile_layers is not None and len(tile_layers) and tile_k is None:
        tile_k = min(ks)
    if tile_k is not None and not 1 <= int(tile_k) <= max(ks):
        raise ValueError(f"tile_k={tile_k} must be between 1 and max(k) = {max(ks)}")
    frames: dict[str, list[pd.DataFrame]] = {
        n: [] for n in ("depthwise", "tiles", "singular_values", "tokenwise", "context")
    }
    summary, tokens, prov = [], {}, {}
    info = None
    for weights in WEIGHTS:
        lm = load(model, dtype=dtype, random_init=weights != "trained", seed=seed)
        L = int(lm.n_layers)
        block_list = (
            list(range(L))
            if layers is None or not len(layers)
            else sorted({_check_block("layers", int(l), L, model) for l in layers})
        )
        window = None
        if tile_layers is not None and len(tile_layers):
            window = sorted({_check_block("tile_layers", int(l), L, model) for l in tile_layers})
            block_list = sorted(set(block_list) | set(window))
        if len(block_list) < 2:
            raise ValueError(f"depth-wise coupling needs at least two blocks, got layers={block_list}")
        tl = None if token_layer is None else _check_block("token_layer", int(token_layer), L, model)
        info = (L, int(lm.d_model))
        tag = {"model": model, "weights": weights}
        base = None if out is None else Path(out) / _slug(model) / _slug(weights)
        # tiles are stored at K = max(k); a smaller tile_k is their top-left corner (the bases are
        # nested), so changing tile_k needs no new measurement
        depth_settings = {
            "what": "depth",
            "layers": block_list,
            "k": ks,
            "tiles": max(ks) if window else None,
            "tile_layers": window,
            "method": method,
            "dtype": dtype,
            "seed": seed,
            "max_tokens": max_tokens,
        }
        m = measure(
            lm,
            prompts,
            layers=block_list,
            tokens="last",
            k=ks,
            method=method,
            tiles=max(ks) if window else None,
            tile_layers=window,
            max_tokens=max_tokens,
            out=None if base is None else base / f"depth-{_key(depth_settings)}",
        )
        frames["depthwise"].append(m.depthwise.assign(**tag))
        tiles = m.tiles
        if window:
            tiles = tiles[(tiles["row"] < tile_k) & (tiles["col"] < tile_k)].assign(K=tile_k)
        frames["tiles"].append(tiles.assign(**tag))
        frames["singular_values"].append(m.singular_values.assign(**tag))
        for K in ks:
            summary.append({**tag, "K": K, "coupling": coupling_summary(m.depthwise, how=how, k=K)})
        if tl is not None:
            token_settings = {
                "what": "tokens",
                "layer": tl,
                "k": ks,
                "method": method,
                "dtype": dtype,
                "seed": seed,
                "max_tokens": max_tokens,
            }
            mt = measure(
                lm,
                prompts,
                layers=[tl],
                tokens="all",
                k=ks,
                method=method,
                context="last",
                max_tokens=max_tokens,
                out=None if base is None else base / f"tokens-{_key(token_settings)}",
            )
            frames["tokenwise"].append(mt.tokenwise.assign(**tag))
            frames["context"].append(mt.context.assign(**tag))
        if weights == "trained":
            tok = getattr(lm, "tokenizer", None)
            for pid, ids in zip(m.prompts["prompt"], m.prompts["input_ids"]):
                ids = [int(i) for i in ids]
                conv = getattr(tok, "convert_ids_to_tokens", None)
                tokens[str(pid)] = list(conv(ids)) if conv else [str(i) for i in ids]
        prov[weights] = m.provenance
        del lm
    tables = {}
    for name, fs in frames.items():
        df = pd.concat(fs, ignore_index=True) if fs else pd.DataFrame()
        tables[name] = (
            df[["model", "weights", *[c for c in df.columns if c not in ("model", "weights")]]]
            if not df.empty
            else df
        )
    return TwinMeasurement(
        model,
        info[0],
        info[1],
        token_layer if token_layer is None else int(token_layer) % info[0],
        summary=pd.DataFrame(summary),
        tokens=tokens,
        provenance=prov,
        **tables,
    )


# --------------------------------------------------------------------------- condensing
def _need(df: pd.DataFrame, *cols: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"table lacks column(s) {missing}; it has {list(df.columns)}")


def mean_depthwise(depthwise: pd.DataFrame) -> pd.DataFrame:
    """Depth-wise matrices averaged over prompts and tokens, per (model, weights, K).

    ``coupling`` is the mean of 1 − m²; ``m`` is the root mean square of m, so that
    ``1 − m²`` of the result equals that mean coupling exactly (figures draw 1 − m²).
    """
    _need(depthwise, "K", "layer_i", "layer_j", "m", "coupling")
    keys = [c for c in ("model", "weights") if c in depthwise.columns] + ["K", "layer_i", "layer_j"]
    out = depthwise.assign(m2=depthwise["m"] ** 2).groupby(keys, as_index=False)[["m2", "coupling"]].mean()
    out["m"] = np.sqrt(out.pop("m2"))
    return out


def coupling_by_distance(depthwise: pd.DataFrame) -> pd.DataFrame:
    """Mean 1 − m² of pairs of different blocks against their distance ``|i − j|`` (in blocks),
    per (model, weights, K): how far along depth coupling reaches."""
    _need(depthwise, "K", "layer_i", "layer_j", "coupling")
    keys = [c for c in ("model", "weights") if c in depthwise.columns] + ["K"]
    df = depthwise[depthwise["layer_i"] != depthwise["layer_j"]]
    df = df.assign(distance=(df["layer_i"] - df["layer_j"]).abs())
    return df.groupby([*keys, "distance"], as_index=False)["coupling"].mean()


def tile_diagonality(tiles: pd.DataFrame) -> pd.DataFrame:
    """For each tile, the share of its squared entries on the diagonal (1 = perfectly diagonal,
    about 1/K for a tile with no structure). Columns: the tile's keys, layer_i, layer_j,
    diagonal_share; averaged over prompts and tokens."""
    _need(tiles, "layer_i", "layer_j", "row", "col", "value")
    keys = [c for c in ("model", "weights", "prompt", "token", "K") if c in tiles.columns]
    sq = tiles.assign(sq=tiles["value"].astype(float) ** 2, on=tiles["row"] == tiles["col"])
    sq["diag_sq"] = sq["sq"].where(sq["on"], 0.0)
    per = sq.groupby([*keys, "layer_i", "layer_j"], as_index=False)[["diag_sq", "sq"]].sum()
    per["diagonal_share"] = per["diag_sq"] / per["sq"].where(per["sq"] > 0)
    outer = [c for c in keys if c not in ("prompt", "token")]
    return per.groupby([*outer, "layer_i", "layer_j"], as_index=False)["diagonal_share"].mean()


def offdiag_mean(
    df: pd.DataFrame, i: str, j: str, value: str = "coupling", by: str = "weights", *, how: str = "mean"
) -> pd.Series:
    """Mean (or, with ``how="std"``, the standard deviation) of ``value`` over rows with
    ``i != j`` (e.g. pairs of different tokens), per ``by``: a Series."""
    _need(df, i, j, value, by)
    if how not in ("mean", "std"):
        raise ValueError(f"how must be 'mean' or 'std', got {how!r}")
    sub = df[df[i] != df[j]]
    if sub.empty:
        raise ValueError(f"no rows with {i} != {j}: the prompt needs at least two tokens")
    return sub.groupby(by, sort=False)[value].agg(how)


def label_tokens(df: pd.DataFrame, tokens: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """Replace token positions in ``columns`` by labels ``"03 Paris"`` (position, then the token
    text), which sort in position order on a chart axis."""
    width = len(str(max(len(tokens) - 1, 0)))
    labels = [f"{t:0{width}d} {_clean(s)}" for t, s in enumerate(tokens)]
    out = df.copy()
    for c in columns:
        _need(out, c)
        pos = out[c].to_numpy()
        if len(pos) and (pos.max() >= len(tokens) or pos.min() < 0):
            raise ValueError(f"column {c!r} has positions outside the {len(tokens)} tokens given")
        out[c] = [labels[p] for p in pos]
    return out


def _clean(token: str) -> str:
    """A token's text for an axis label: byte-level BPE markers made readable."""
    s = str(token).replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "⏎")
    return s if s.strip() else repr(s)
