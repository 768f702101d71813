"""The tidy tables measure() returns: their columns and dtypes, row builders, and the per-model summary.

Every table is long (one row per observation) with ``coupling = 1 − m²`` next to ``m``:
``depthwise``, ``tokenwise``, ``context``, ``singular_values``, ``tiles``, ``prompts`` and
``timings`` (:data:`COLUMNS`). Tensors reach these builders on the host (``.detach().cpu()``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from coupling_utils.files import read_parquet
from coupling_utils.schemas import Schema, check_table

__all__ = [
    "BLOCK_COLUMNS",
    "TABLES",
    "COLUMNS",
    "SCHEMAS",
    "Measurement",
    "coupling_summary",
    "SUMMARY_HOWS",
    "other_map_folder",
]

TABLES = ("depthwise", "tokenwise", "context", "singular_values", "tiles", "prompts", "timings")
SUMMARY_HOWS = ("offdiag", "adjacent")

COLUMNS = {
    "depthwise": ["prompt", "token", "K", "layer_i", "layer_j", "m", "coupling"],
    "tokenwise": ["prompt", "layer", "K", "token_i", "token_j", "m", "coupling"],
    "context": ["prompt", "output_token", "K", "layer_i", "token_i", "layer_j", "token_j", "m", "coupling"],
    "singular_values": ["prompt", "token", "layer", "rank", "value"],
    "tiles": ["prompt", "token", "K", "layer_i", "layer_j", "row", "col", "value"],
    "prompts": ["prompt", "text", "n_tokens", "input_ids"],
    "timings": ["prompt", "layer", "seconds", "block_passes"],
}
BLOCK_COLUMNS = ("layer", "layer_i", "layer_j")  # the columns that name a block (its layer label)
_INT = ("token", "K", "layer", "layer_i", "layer_j", "token_i", "token_j", "row", "col", "rank")
DTYPES = {
    **dict.fromkeys(_INT, "int64"),
    "prompt": "string",
    "text": "string",
    "n_tokens": "int64",
    "output_token": "int64",
    "block_passes": "int64",
    "input_ids": "object",
}
_KINDS = {"int64": "int", "string": "str", "object": "any"}  # float64 columns: "number"
#: the tables as schemas (:func:`coupling_utils.schemas.check_table`), from COLUMNS and DTYPES
SCHEMAS = {
    name: Schema(
        f"the {name} table",
        {c: _KINDS.get(DTYPES.get(c, "float64"), "number") for c in cols},
        fix=f"pass Measurement.{name}",
    )
    for name, cols in COLUMNS.items()
}


# --------------------------------------------------------------------------- frames
Piece = Mapping[str, Any]
"""Rows of a table as columns: a column name -> an array (one value per row) or a scalar (the
same value on every row); a piece's builder (:func:`coupling_pieces`, ...) names every column."""


def frame(name: str, rows: Piece | None = None) -> pd.DataFrame:
    """Table ``name`` from the columns ``rows`` (a :data:`Piece`; an empty table for None), typed."""
    return concat(name, [] if rows is None else [rows])


@functools.cache
def _dtype(name: str):
    """pandas' dtype for ``name``, looked up once (pandas parses a dtype's name on every call, asking
    every registered dtype in turn)."""
    return pd.api.types.pandas_dtype(name)


def columnwise(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each column in its own block, as a frame built column by column is.

    pandas sums a multi-column aggregate (``groupby(...)[["m", "coupling"]].mean()``) in a
    different order, so differently in the last bit, when columns of one dtype share a block,
    as they do in a frame read from Parquet. Tables read back are laid out like fresh ones, so
    a rerun from stored results gives the very numbers of the first run.
    """
    df = df.copy()
    for c in df.columns:
        df[c] = df[c].copy()
    return df


def concat(name: str, pieces: Sequence[Piece | pd.DataFrame]) -> pd.DataFrame:
    """The pieces of table ``name`` (:data:`Piece` columns, or frames: a table read back from its
    file, the prompts' tables of a run) joined in order into one table with its documented
    columns, in order, and dtypes, each column in a block of its own (the layout
    :func:`columnwise` gives; empty for no pieces). Columns are joined as arrays and the frame is
    made once: a frame per piece, joined and then typed, cost more than the measurement on a
    small model. The one way a table is typed: a table read back is ``concat(name, [frame])``."""
    parts = [_columns(name, piece) for piece in pieces]
    columns = {}
    for c in COLUMNS[name]:
        want = DTYPES.get(c, "float64")
        values = [part[c] for part in parts]
        if want == "object":  # one Python object per row (a prompt's token ids)
            joined = np.empty(sum(len(v) for v in values), dtype=object)
            joined[:] = [x for v in values for x in v] if values else []
            columns[c] = joined
        elif want == "string":
            joined = np.concatenate(values) if values else np.empty(0, dtype=object)
            columns[c] = pd.array(joined, dtype=_dtype(want))
        else:
            joined = np.concatenate(values) if values else np.empty(0)
            columns[c] = joined.astype(want)
    return pd.DataFrame(columns, copy=False)


def _columns(name: str, piece: Piece | pd.DataFrame) -> dict[str, Any]:
    """A piece's columns of table ``name`` as arrays of its length (a scalar repeated; a frame's
    columns as they are), each in the piece's own dtype."""
    if isinstance(piece, pd.DataFrame):
        missing = [c for c in COLUMNS[name] if c not in piece.columns]
        if missing:  # a file written by other code, or damaged: the caller measures it again
            raise ValueError(f"the {name} table read back has no column {', '.join(missing)}")
        return {c: piece[c].to_numpy() for c in COLUMNS[name]}
    sized = [v for v in piece.values() if not _scalar(v)]
    if not sized:
        raise ValueError(f"a piece of the {name} table holds no column of values, only scalars")
    n = len(sized[0])
    out = {}
    for c in COLUMNS[name]:
        v = piece[c]
        if _scalar(v):
            out[c] = np.full(n, v, dtype=object if isinstance(v, str) else None)
        elif DTYPES.get(c) == "object":
            out[c] = list(v)
        else:
            out[c] = np.asarray(v)
        if len(out[c]) != n:
            raise ValueError(f"a piece of the {name} table has columns of {n} and {len(out[c])} rows")
    return out


def _scalar(v) -> bool:
    return isinstance(v, (str, bytes)) or np.ndim(v) == 0


def host(t: torch.Tensor) -> torch.Tensor:
    """A tensor leaving the computation for numpy or pandas: detached, on the host."""
    return t.detach().cpu()


def in_window(layer_i, layer_j, window: int | None):
    """Whether layer pairs are within ``depth_window`` (element-wise for arrays)."""
    if window is None:
        return np.ones(np.broadcast(np.asarray(layer_i), np.asarray(layer_j)).shape, dtype=bool)
    return np.abs(np.asarray(layer_i) - np.asarray(layer_j)) <= window


def pair_rows(
    M: torch.Tensor,  # [n, n]
    labels: Sequence[int],  # n
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # label_i, label_j, value: [n·n] each
    """Rows (label_i, label_j, value) of a matrix over ``labels``, row-major, on the host."""
    n = len(labels)
    lab = np.asarray(labels, dtype=np.int64)
    return np.repeat(lab, n), np.tile(lab, n), host(M).double().reshape(-1).numpy()


def coupling_pieces(
    name: str,
    ms: Mapping[int, torch.Tensor],  # K -> m_K [n, n]
    labels: Sequence[int],
    pair: tuple[str, str],
    keep=None,
    **fixed,
) -> list[Piece]:
    """One piece per K of a coupling table from matrices ``ms[K]`` [n, n] over ``labels``.

    ``pair`` names the label columns (e.g. ``("layer_i", "layer_j")``); ``keep(li, lj)`` picks
    rows (e.g. a depth window); ``fixed`` are the other columns (prompt, token, layer, ...).
    """
    out = []
    for k, M in ms.items():
        li, lj, m = pair_rows(M, labels)
        if keep is not None:
            sel = keep(li, lj)
            li, lj, m = li[sel], lj[sel], m[sel]
        out.append({**fixed, "K": k, pair[0]: li, pair[1]: lj, "m": m, "coupling": 1 - m**2})
    return out


def singular_value_piece(
    pid: str,
    layer: int,
    tokens: Sequence[int],  # n
    S: torch.Tensor,  # [n, n_singular]
) -> Piece:
    """The singular values of the selected tokens at one layer."""
    n_s = S.shape[-1]
    rows = {
        "prompt": pid,
        "token": np.repeat(tokens, n_s),
        "layer": layer,
        "rank": np.tile(np.arange(1, n_s + 1), len(tokens)),
        "value": host(S).double().reshape(-1).numpy(),
    }
    return rows


def tiles_piece(
    pid: str,
    token: int,
    tiles: torch.Tensor,  # [L, L, kmax, kmax] over ``layers``
    layers: list[int],  # L
    tile_layers: list[int],
    K: int,
    window: int | None,
) -> Piece:
    """Raw K×K tiles of one token over ``tile_layers`` (pairs within ``window``)."""
    idx = [layers.index(l) for l in tile_layers]
    sub = host(tiles)[idx][:, idx, :K, :K]  # [W, W, K, K]
    W = len(idx)
    grid = np.indices((W, W, K, K)).reshape(4, -1)
    lab = np.asarray(tile_layers)
    keep = in_window(lab[grid[0]], lab[grid[1]], window)
    rows = {
        "prompt": pid,
        "token": token,
        "K": K,
        "layer_i": lab[grid[0]][keep],
        "layer_j": lab[grid[1]][keep],
        "row": grid[2][keep],
        "col": grid[3][keep],
        "value": sub.double().reshape(-1).numpy()[keep],
    }
    return rows


# --------------------------------------------------------------------------- the result
@dataclass
class Measurement:
    """The tables of one :func:`measure` call (pandas DataFrames) and their provenance.

    ``provenance["code"]`` is the fingerprint of the code that made the numbers
    (:func:`coupling_utils.provenance.code_fingerprint`); ``stale`` says it is not today's code
    (a stored result reused with ``reuse_stale=True``).
    """

    depthwise: pd.DataFrame
    tokenwise: pd.DataFrame
    context: pd.DataFrame
    singular_values: pd.DataFrame
    tiles: pd.DataFrame
    prompts: pd.DataFrame
    timings: pd.DataFrame
    provenance: dict = field(default_factory=dict)
    out: Path | None = None
    other_map: Measurement | None = None  # the last block under ``last_block_also``, from the same run

    @property
    def last_block(self) -> str | None:
        """The map of the last block these tables hold (None: not recorded)."""
        return (self.provenance.get("last_block") or {}).get("convention")

    def under(self, last_block: str) -> Measurement:
        """These tables with the last block under ``last_block``: this measurement, or the second map
        the same run measured (``Settings.last_block_also``); a ValueError names the maps held."""
        for m in (self, self.other_map):
            if m is not None and m.last_block == last_block:
                return m
        held = [m.last_block for m in (self, self.other_map) if m is not None]
        raise ValueError(
            f"this measurement holds the last block under {held}, not {last_block!r}; measure it with "
            f"last_block={last_block!r}, or last_block_also={last_block!r} beside another map"
        )

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in TABLES}

    @property
    def fingerprint(self) -> str | None:
        """The fingerprint of the code that made these numbers (None: stored before fingerprints)."""
        return (self.provenance.get("code") or {}).get("fingerprint")

    @property
    def stale(self) -> bool:
        """Whether other code than today's made these numbers (reused with reuse_stale=True)."""
        return bool(self.provenance.get("stale", False))

    def summary(self, how: str = "offdiag", k: int | None = None, *, per_prompt: bool = False):
        """The scalar coupling summary of :func:`coupling_summary` for this measurement."""
        return coupling_summary(self.depthwise, how=how, k=k, per_prompt=per_prompt)

    @classmethod
    def load(cls, out: str | Path) -> Measurement:
        """Read a finished measurement back from its ``out`` directory."""
        out = Path(out)
        prov_path = out / "provenance.json"
        if not prov_path.exists():
            raise FileNotFoundError(
                f"{out} holds no finished measurement (no provenance.json); "
                "run measure(..., out=...) to completion first"
            )
        tables = {name: concat(name, [read_parquet(out / f"{name}.parquet")]) for name in TABLES}
        provenance = json.loads(prov_path.read_text())
        also = (provenance.get("settings") or {}).get("last_block_also")
        other = cls.load(out / other_map_folder(also)) if also else None
        return cls(**tables, provenance=provenance, out=out, other_map=other)


def other_map_folder(last_block: str) -> str:
    """Where a finished measurement keeps its tables under its second map of the last block."""
    return f"last_block-{last_block}"


def coupling_summary(
    depthwise: pd.DataFrame, how: str = "offdiag", k: int | None = None, *, per_prompt: bool = False
):
    """One number per model: mean of ``1 − m_K²`` over layer pairs, averaged over prompts.

    The paper's per-model aggregation is not published; this is the project's choice, made
    a parameter. ``how="offdiag"``: all ordered pairs of different measured layers;
    ``how="adjacent"``: consecutive measured layers (both orders). Within a prompt the mean
    runs over pairs and tokens; prompts then count equally. ``k`` defaults to the largest K
    in the table (the authors' demo plots ``1 − m_50²``). ``per_prompt=True`` returns a
    Series indexed by prompt instead of the mean over prompts.

    Every pair the summary averages must be in the table: a table measured with
    ``depth_window`` (or filtered) that lacks some of them raises a ValueError instead of
    averaging a different set of pairs. With ``depth_window=1`` and consecutive layers,
    ``how="adjacent"`` works; ``how="offdiag"`` needs the full matrix (no window).
    """
    if how not in SUMMARY_HOWS:
        raise ValueError(f"how must be one of {SUMMARY_HOWS}, got {how!r}")
    check_table(depthwise, SCHEMAS["depthwise"].need("prompt", "K", "layer_i", "layer_j", "coupling"))
    if depthwise.empty:
        raise ValueError("the depthwise table is empty (measure at least two layers)")
    ks = sorted(depthwise["K"].unique())
    if k is None:
        k = int(ks[-1])
    if k not in ks:
        raise ValueError(f"K={k} is not in the table; measured K values are {[int(x) for x in ks]}")
    df = depthwise[depthwise["K"] == k]
    layers = np.sort(np.unique(np.concatenate([df["layer_i"].to_numpy(), df["layer_j"].to_numpy()])))
    n = len(layers)
    if how == "offdiag":
        df = df[df["layer_i"] != df["layer_j"]]
        expected = n * (n - 1)
    else:
        pos = {int(l): i for i, l in enumerate(layers)}
        gap = (df["layer_i"].map(pos) - df["layer_j"].map(pos)).abs()
        df = df[gap == 1]
        expected = 2 * (n - 1)
    if df.empty or n < 2:
        raise ValueError("no layer pairs to average (measure at least two layers)")
    keys = [c for c in ("prompt", "token") if c in df.columns]
    counts = df.drop_duplicates(keys + ["layer_i", "layer_j"]).groupby(keys, sort=False).size()
    if (counts < expected).any():
        what = "all ordered pairs of different layers" if how == "offdiag" else "all consecutive layer pairs"
        raise ValueError(
            f"how={how!r} averages {what} of layers {[int(l) for l in layers]} ({expected} "
            f"per token), but the depthwise table holds only {int(counts.min())} for some "
            "token (measured with depth_window?); use how='adjacent' with depth_window >= "
            "the gap between measured layers, or measure without depth_window"
        )
    by_prompt = df.groupby("prompt", sort=True)["coupling"].mean()
    return by_prompt if per_prompt else float(by_prompt.mean())
