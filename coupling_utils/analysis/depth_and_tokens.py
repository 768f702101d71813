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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.measurement import Job, Settings, collect, coupling_summary, plan

__all__ = [
    "WEIGHTS",
    "TwinMeasurement",
    "measure_twins",
    "twin_jobs",
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
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)  # twins not measured, with the reason


def _check_block(name: str, value: int, n_layers: int, model: str) -> int:
    if not -n_layers <= value < n_layers:
        raise ValueError(f"{name}={value} does not exist: {model} has {n_layers} blocks (0..{n_layers - 1})")
    return value % n_layers


def _check_twin(lm, *, model: str, layers, tile_layers, token_layer) -> None:
    """The blocks asked for exist in the loaded model, named in measure_twins' terms."""
    L = int(lm.n_layers)
    blocks = set(range(L)) if not layers else {_check_block("layers", int(l), L, model) for l in layers}
    blocks |= {_check_block("tile_layers", int(l), L, model) for l in tile_layers or ()}
    if len(blocks) < 2:
        raise ValueError(f"depth-wise coupling needs at least two blocks, got layers={sorted(blocks)}")
    if token_layer is not None:
        _check_block("token_layer", int(token_layer), L, model)


def twin_jobs(
    model: str,
    prompts: Any,
    *,
    k: int | Sequence[int] = (10, 30, 50),
    layers: Sequence[int] | None = None,
    tile_layers: Sequence[int] | None = None,
    token_layer: int | None = None,
    dtype: str = "float32",
    seed: int = 0,
    method: str = "exact",
    max_tokens: int | None = None,
    out: str | Path | None = None,
) -> list[Job]:
    """The two jobs of :func:`measure_twins` (trained, random init), each with a "depth" and,
    with ``token_layer``, a "tokens" measurement; stored under ``out`` (see
    :mod:`coupling_utils.measurement.jobs`)."""
    ks = sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})
    window = [int(l) for l in tile_layers] if tile_layers is not None and len(tile_layers) else None
    block_list = None if layers is None or not len(layers) else [int(l) for l in layers] + (window or [])
    # tiles are stored at K = max(k); a smaller tile_k is their top-left corner (the bases are
    # nested), so changing tile_k needs no new measurement
    common = dict(k=ks, method=method, max_tokens=max_tokens)
    parts = {
        "depth": Settings(
            layers=block_list, tokens="last", tiles=max(ks) if window else None, tile_layers=window, **common
        )
    }
    if token_layer is not None:
        parts["tokens"] = Settings(layers=[int(token_layer)], tokens="all", context="last", **common)
    check = functools.partial(
        _check_twin, model=model, layers=layers, tile_layers=window, token_layer=token_layer
    )
    return plan([model], prompts, parts, weights=WEIGHTS, seed=seed, dtype=dtype, root=out, check=check)


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
    on_error: str = "raise",
    reuse_stale: bool = False,
) -> TwinMeasurement:
    """Measure ``model`` and its random-init twin (``load_model(..., random_init=True, seed=seed)``).

    Depth-wise coupling of the last token over ``layers`` (default all) for K in ``k``; with
    ``tile_layers`` (added to ``layers``) also the raw ``tile_k`` × ``tile_k`` tiles of that
    window (measured at K = max(k) and cropped); with ``token_layer`` also token-wise self
    coupling (all tokens) and context coupling (output token: the last) at that block.
    ``out``: a cache directory; measurements are stored under
    ``out/<model>/main/<weights>/<part>-<key>`` and reused without loading the model
    (:func:`twin_jobs`, :func:`coupling_utils.measurement.collect`). ``load`` replaces
    ``loading.load_model`` (tests). ``on_error="record"``: a twin that cannot be loaded or
    measured is listed in ``failures`` instead of raising; ``reuse_stale``: reuse measurements
    made by other code (see ``measure``).
    """
    ks = sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})
    if tile_layers is not None and len(tile_layers) and tile_k is None:
        tile_k = min(ks)
    if tile_k is not None and not 1 <= int(tile_k) <= max(ks):
        raise ValueError(f"tile_k={tile_k} must be between 1 and max(k) = {max(ks)}")
    jobs = twin_jobs(
        model, prompts, k=ks, layers=layers, tile_layers=tile_layers, token_layer=token_layer,
        dtype=dtype, seed=seed, method=method, max_tokens=max_tokens, out=out,
    )  # fmt: skip
    done = collect(jobs, load=load, on_error=on_error, reuse_stale=reuse_stale)
    if not done.ok:
        raise RuntimeError(f"{model}: no twin could be measured\n{done.report()}")
    names = ("depthwise", "tiles", "singular_values", "tokenwise", "context")
    frames: dict[str, list[pd.DataFrame]] = {n: [] for n in names}
    summary, tokens, prov = [], {}, {}
    for r in done.ok:
        m, weights = r.measurements["depth"], r.job.weights
        frames["depthwise"].append(r.labelled("depthwise", "depth"))
        tiles = r.labelled("tiles", "depth")
        if tile_layers is not None and len(tile_layers):
            tiles = tiles[(tiles["row"] < tile_k) & (tiles["col"] < tile_k)].assign(K=tile_k)
        frames["tiles"].append(tiles)
        frames["singular_values"].append(r.labelled("singular_values", "depth"))
        for K in ks:
            summary.append({**r.job.labels, "K": K, "coupling": coupling_summary(m.depthwise, how=how, k=K)})
        if "tokens" in r.measurements:
            frames["tokenwise"].append(r.labelled("tokenwise", "tokens"))
            frames["context"].append(r.labelled("context", "tokens"))
        if weights == "trained":
            for entry, ids in zip(m.provenance["prompts"], m.prompts["input_ids"]):
                tokens[str(entry["prompt"])] = entry.get("tokens") or [str(int(i)) for i in ids]
        prov[weights] = m.provenance
    tables = {n: pd.concat(fs, ignore_index=True) if fs else pd.DataFrame() for n, fs in frames.items()}
    facts = done.ok[0].model
    L = int(facts["n_layers"])
    return TwinMeasurement(
        model,
        L,
        int(facts["d_model"]),
        token_layer if token_layer is None else int(token_layer) % L,
        summary=pd.DataFrame(summary),
        tokens=tokens,
        provenance=prov,
        failures=done.failures,
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
