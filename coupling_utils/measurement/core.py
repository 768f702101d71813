"""Measuring a model: block Jacobians of some prompts, their spectra and coupling, as tidy tables.

:func:`measure` is the one call every notebook uses. For each prompt and each block ``l`` it
computes the token Jacobians ``J^l_tt`` (all tokens in one token-diagonal sweep), their top
singular triplets, and from those

- ``depthwise``: ``m_K(J^i_tt, J^j_tt)`` for every pair of measured layers, per token;
- ``tokenwise``: ``m_K(J^l_tt, J^l_t't')`` for every pair of selected tokens, per layer;
- ``context`` (optional): context Jacobians ``J^l_{t1 t2}`` for a fixed output token t2,
  compared across input tokens (same layer) and across layers (same input token);
- ``singular_values``: the top singular values per (token, layer);
- ``tiles`` (optional): the raw ``|U_{j,K}ᵀ J_i V_{j,K}|`` tiles the paper draws, for a window
  of layers;
- ``prompts`` and ``timings``: what was measured and what it cost.

Every table is long ("tidy", one row per observation) with ``coupling = 1 − m²`` next to
``m``. Each is written as Parquet under ``out/`` beside ``provenance.json`` (model, revision,
dtype, prompts, settings, package and library versions, UTC time).

Memory and resuming: work goes layer by layer. After each (prompt, layer) the layer's
Jacobians of the selected tokens (or, matrix-free, their low-rank factors) and per-layer
tables are written atomically under ``out/_work/<prompt>/`` with a completion marker; when a
prompt's layers are all done, its depth-wise tables are computed one token at a time from
memory-mapped files, written to ``out/prompts/<prompt>/``, and the work files removed. An
interrupted run started again with the same ``out`` (``resume=True``) recomputes nothing that
is stored.

Methods: ``"exact"`` forms J (one token-diagonal sweep of d VJPs per layer) and takes a full
SVD; ``"randomized"`` forms J and takes a top-K SVD with a product-only ``solver``;
``"matrix_free"`` never forms J: per layer it gets the top triplets from JVP/VJP products with
that solver (:mod:`coupling_utils.engine.spectra`), then applies J_i to the partner layers' (and
tokens') top right singular vectors to get the tiles ``|U_jᵀ J_i V_j|`` exactly. The solver is
``"lanczos"`` (default: block Lanczos, ``(2·steps − 1)·block`` passes, ``block`` defaulting to
``ceil(max(k)/10)`` and ``steps`` to 45) or ``"subspace"`` (Halko et al.'s subspace iteration,
``(2·n_iter + 2)(max(k) + oversample)`` passes). Matrix-free cost per layer:

    solver passes + P·max(k)   (+ n·max(k) for token-wise tiles of n ≥ 2 tokens)

where P is the number of partner layers: all other measured layers (P = L − 1), or, with
``depth_window=w``, the measured layers within distance w (P ≤ 2w). P·max(k) is a lower bound
for exact tiles (generic partners' vectors are independent), so the full L × L matrix only pays
off when (L − 1)·max(k) is well below d (large models, few layers, small K); a window of w = 1
(adjacent pairs, ``coupling_summary(how="adjacent")``) costs 2·max(k). Approximating J_i by its
own low-rank factors in the tiles instead would be cheap but is wrong: on SmolLM2-135M it moved
coupling values by up to 0.19.

``depth_window=w`` (any method, so that results stay comparable): the depthwise, tiles and
cross-layer context tables hold only pairs of measured layers with ``|layer_i − layer_j| ≤ w``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.metric import SVD, _basis, _check_options, _metric, check_k
from coupling_utils.engine.spectra import SOLVERS
from coupling_utils.files import atomic_path, atomic_write_parquet, atomic_write_text, file_lock

__all__ = ["measure", "Measurement", "coupling_summary", "TABLES", "MEASURE_METHODS"]

MEASURE_METHODS = ("exact", "randomized", "matrix_free")
TABLES = ("depthwise", "tokenwise", "context", "singular_values", "tiles", "prompts", "timings")
SUMMARY_HOWS = ("offdiag", "adjacent")
_FORMAT = 1  # bump when the stored layout changes

_COLUMNS = {
    "depthwise": ["prompt", "token", "K", "layer_i", "layer_j", "m", "coupling"],
    "tokenwise": ["prompt", "layer", "K", "token_i", "token_j", "m", "coupling"],
    "context": ["prompt", "output_token", "K", "layer_i", "token_i", "layer_j", "token_j", "m", "coupling"],
    "singular_values": ["prompt", "token", "layer", "rank", "value"],
    "tiles": ["prompt", "token", "K", "layer_i", "layer_j", "row", "col", "value"],
    "prompts": ["prompt", "text", "n_tokens", "input_ids"],
    "timings": ["prompt", "layer", "seconds", "block_passes"],
}


# --------------------------------------------------------------------------- the result
@dataclass
class Measurement:
    """The tables of one :func:`measure` call (pandas DataFrames) and their provenance."""

    depthwise: pd.DataFrame
    tokenwise: pd.DataFrame
    context: pd.DataFrame
    singular_values: pd.DataFrame
    tiles: pd.DataFrame
    prompts: pd.DataFrame
    timings: pd.DataFrame
    provenance: dict = field(default_factory=dict)
    out: Path | None = None

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in TABLES}

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
        tables = {name: pd.read_parquet(out / f"{name}.parquet") for name in TABLES}
        return cls(**tables, provenance=json.loads(prov_path.read_text()), out=out)


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
    missing = {"prompt", "K", "layer_i", "layer_j", "coupling"} - set(depthwise.columns)
    if missing:
        raise ValueError(f"depthwise table lacks columns {sorted(missing)}; pass Measurement.depthwise")
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


# --------------------------------------------------------------------------- inputs
@dataclass
class _Model:
    model: Any
    tokenizer: Any
    name: str
    revision: str | None
    dtype: str
    arch: str | None
    n_layers: int
    d_model: int | None
    provenance: dict


def _model_info(model) -> _Model:
    """Name, revision, size and tokenizer of a LoadedModel or a bare Hugging Face model."""
    if hasattr(model, "model") and hasattr(model, "n_layers"):  # a LoadedModel
        return _Model(
            model,
            getattr(model, "tokenizer", None),
            str(model.name),
            getattr(model, "revision", None),
            str(getattr(model, "dtype", "")),
            getattr(model, "arch", None),
            int(model.n_layers),
            getattr(model, "d_model", None),
            dict(getattr(model, "provenance", {}) or {}),
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a LoadedModel (coupling_utils.load_model) or a Hugging Face "
            f"model, got {type(model).__name__}"
        )
    cfg = getattr(model, "config", None)
    n_layers = None
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        n_layers = n_layers or getattr(cfg, attr, None)
    if n_layers is None:
        raise ValueError(
            "cannot tell the number of blocks of this model (its config has no "
            "num_hidden_layers); pass a LoadedModel from coupling_utils.load_model"
        )
    d_model = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    name = getattr(cfg, "_name_or_path", "") or type(model).__name__
    return _Model(
        model, None, name, None, dtype, getattr(cfg, "model_type", None), int(n_layers), d_model, {}
    )


@dataclass
class _Prompt:
    pid: str
    text: str
    inputs: Any  # LongTensor [1, T] or a dict of model inputs with batch size 1
    input_ids: list[int]
    digest: str


def _digest(inputs) -> str:
    h = hashlib.sha256()
    items = sorted(inputs.items()) if isinstance(inputs, Mapping) else [("input_ids", inputs)]
    for key, value in items:
        h.update(str(key).encode())
        if isinstance(value, torch.Tensor):
            v = value.detach().cpu().contiguous()
            h.update(str(tuple(v.shape)).encode() + str(v.dtype).encode())
            h.update(v.view(torch.uint8).numpy().tobytes() if v.dtype != torch.bool else v.numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:16]


_INPUT_KEYS = {"input_ids", "pixel_values", "attention_mask", "inputs_embeds"}


def _prompts(prompts, tokenizer, max_tokens: int | None) -> list[_Prompt]:
    """Normalise prompts (strings, token tensors or input dicts; a list or an id -> prompt map)."""
    if isinstance(prompts, (str, torch.Tensor)) or (
        isinstance(prompts, Mapping) and set(prompts) & _INPUT_KEYS
    ):
        prompts = [prompts]  # one prompt
    items = list(prompts.items()) if isinstance(prompts, Mapping) else list(enumerate(prompts))
    if not items:
        raise ValueError("prompts is empty; pass at least one prompt")
    out, seen = [], set()
    for pid, p in items:
        pid = str(pid)
        if pid in seen:
            raise ValueError(f"prompt id {pid!r} appears twice; prompt ids must be unique")
        if not pid or any(c in pid for c in "/\\") or pid.startswith("."):
            raise ValueError(f"prompt id {pid!r} cannot name a directory; use letters, digits, '-' or '_'")
        seen.add(pid)
        if isinstance(p, str):
            if tokenizer is None or not callable(tokenizer):
                raise ValueError(
                    "string prompts need a tokenizer: pass a LoadedModel from "
                    "coupling_utils.load_model, or token id tensors [1, T]"
                )
            ids = tokenizer(p, return_tensors="pt")["input_ids"]
            text = p
        elif isinstance(p, torch.Tensor):
            ids = p if p.ndim == 2 else p.unsqueeze(0)
            if ids.ndim != 2 or ids.shape[0] != 1 or ids.dtype not in (torch.int64, torch.int32):
                raise ValueError(
                    f"prompt {pid!r}: token ids must be an integer tensor [1, T], got "
                    f"{p.dtype} {tuple(p.shape)}"
                )
            ids = ids.long()
            text = _decode(tokenizer, ids)
        elif isinstance(p, Mapping):
            batch = {key: v.shape[0] for key, v in p.items() if isinstance(v, torch.Tensor)}
            if not batch or any(b != 1 for b in batch.values()):
                raise ValueError(
                    f"prompt {pid!r}: an input dict needs tensors with batch size 1, got batch sizes {batch}"
                )
            if max_tokens is not None:
                raise ValueError("max_tokens applies to token prompts only, not input dicts")
            ids = p.get("input_ids")
            shapes = ", ".join(f"{k_}{list(v.shape)}" for k_, v in p.items() if isinstance(v, torch.Tensor))
            text = f"<inputs {shapes}>"
            if ids is not None:
                text = _decode(tokenizer, ids) or text
            out.append(_Prompt(pid, text, dict(p), [] if ids is None else ids[0].tolist(), _digest(p)))
            continue
        else:
            raise TypeError(
                f"prompt {pid!r}: expected a string, a LongTensor [1, T] or a dict of "
                f"model inputs, got {type(p).__name__}"
            )
        if max_tokens is not None:
            ids = ids[:, :max_tokens]
        if ids.shape[1] < 1:
            raise ValueError(f"prompt {pid!r} has no tokens")
        out.append(_Prompt(pid, text, ids, ids[0].tolist(), _digest(ids)))
    return out


def _decode(tokenizer, ids: torch.Tensor) -> str:
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        with contextlib.suppress(Exception):
            return tokenizer.decode(ids[0].tolist())
    return ""


def _token_positions(tokens, T: int, what: str = "tokens") -> list[int]:
    """Resolve "last" | "all" | [ints] (negative counts from the end) to sorted positions."""
    if isinstance(tokens, str):
        if tokens == "last":
            return [T - 1]
        if tokens == "all":
            return list(range(T))
        raise ValueError(f"{what} must be 'last', 'all' or a list of token positions, got {tokens!r}")
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
        tokens = [tokens]
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what}: token positions must be integers, got {t!r}")
        if not -T <= t < T:
            raise ValueError(
                f"{what}: token position {t} is outside a {T}-token prompt (valid: {-T}..{T - 1})"
            )
        out.append(int(t) % T)
    if not out:
        raise ValueError(f"{what} selects no token")
    return sorted(set(out))


def _check_tokens_spec(tokens) -> Any:
    if isinstance(tokens, str):
        _token_positions(tokens, 1)
        return tokens
    if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, bool):
        return [int(tokens)]
    try:
        spec = [int(t) if isinstance(t, (int, np.integer)) and not isinstance(t, bool) else t for t in tokens]
    except TypeError:
        raise TypeError(
            f"tokens must be 'last', 'all' or a list of token positions, got {tokens!r}"
        ) from None
    for t in spec:
        if not isinstance(t, int):
            raise TypeError(f"tokens: token positions must be integers, got {t!r}")
    if not spec:
        raise ValueError("tokens selects no token")
    return spec


# --------------------------------------------------------------------------- tiles and metric
def _tiles(J_nij: torch.Tensor, s: SVD, kmax: int, orientation: str) -> torch.Tensor:
    """``tiles[i, j] = |left_jᵀ J_i right_j|`` for all pairs, K = kmax: [N, N, kmax, kmax].

    The K-tile of any K ≤ kmax is the top-left K×K corner of the kmax tile, since the bases
    are nested; so one product serves all K.
    """
    left, right = _basis(s, kmax, orientation)  # [N, d, kmax]
    N, d = J_nij.shape[0], J_nij.shape[-1]
    R = right.permute(1, 0, 2).reshape(d, N * kmax)  # all right bases side by side
    JR = (J_nij @ R).reshape(N, J_nij.shape[-2], N, kmax)  # [i, d_out, j, kmax]
    # tiles[i, j] = left_jᵀ (J_i right_j)
    return torch.einsum("jdr,idjc->ijrc", left, JR).abs()


def _couplings(
    tiles: torch.Tensor, S: torch.Tensor, ks: Sequence[int], p: float, normalize: str
) -> dict[int, torch.Tensor]:
    """``m_K[i, j]`` for every K from the kmax tiles [N, N, kmax, kmax] and singular values S [N, ≥kmax]."""
    out = {}
    for k in ks:
        s1k = S[:, :k].unsqueeze(1).expand(-1, tiles.shape[1], -1)  # J_i's own values, per row i
        out[k] = _metric(tiles[..., :k, :k], s1k, p, normalize)
    return out


def _pair_rows(M: torch.Tensor, labels: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(labels)
    lab = np.asarray(labels, dtype=np.int64)
    return np.repeat(lab, n), np.tile(lab, n), M.double().reshape(-1).numpy()


# --------------------------------------------------------------------------- storage helpers
def _save_npy(path: Path, arr: torch.Tensor | np.ndarray) -> None:
    arr = arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else np.asarray(arr)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr))


def _load_npy(path: Path, mmap: bool = True) -> np.ndarray:
    return np.load(path, mmap_mode="r" if mmap else None)


def _write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def _frame(name: str, rows: dict | None = None) -> pd.DataFrame:
    if rows is None:
        return pd.DataFrame({c: pd.Series(dtype=_DTYPES.get(c, "float64")) for c in _COLUMNS[name]})
    return pd.DataFrame(rows, columns=_COLUMNS[name])


_DTYPES = {
    "prompt": "string",
    "text": "string",
    "token": "int64",
    "K": "int64",
    "layer": "int64",
    "layer_i": "int64",
    "layer_j": "int64",
    "token_i": "int64",
    "token_j": "int64",
    "row": "int64",
    "col": "int64",
    "rank": "int64",
    "n_tokens": "int64",
    "output_token": "int64",
    "block_passes": "int64",
    "input_ids": "object",
}


def _typed(name: str, df: pd.DataFrame) -> pd.DataFrame:
    df = df[_COLUMNS[name]].copy()
    for c in df.columns:
        if c in _DTYPES and _DTYPES[c] != "object":
            df[c] = df[c].astype(_DTYPES[c])
        elif c not in _DTYPES:
            df[c] = df[c].astype("float64")
    return df.reset_index(drop=True)


def _versions() -> dict:
    import transformers

    from coupling_utils import __version__

    return {
        "coupling_utils": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "python": platform.python_version(),
    }


# --------------------------------------------------------------------------- the engine calls
def _as_float(J: torch.Tensor) -> torch.Tensor:
    J = J.detach()
    if J.dtype != torch.float64:
        J = J.float()
    if not torch.isfinite(J).all():
        raise ValueError(
            "the block Jacobians contain NaN or inf; measure the model in float32 "
            "(load_model(..., dtype='float32')) or check the prompt"
        )
    return J


def _spectra(
    J: torch.Tensor, kmax: int, n_singular: int, method: str, settings: dict
) -> tuple[SVD, torch.Tensor]:
    """Top-kmax triplets of J [N, d, d] and its top n_singular singular values."""
    from coupling_utils.engine.spectra import block_lanczos_svd, lapack_threads, topk_svd

    if method == "exact":
        with lapack_threads():
            U, S, Vh = torch.linalg.svd(J, full_matrices=False)
        return SVD(U[..., :kmax].contiguous(), S[..., :kmax].contiguous(), Vh[..., :kmax, :].contiguous()), S[
            ..., :n_singular
        ]
    if settings.get("solver") == "lanczos":
        Jt = J.transpose(-1, -2)
        s, _ = block_lanczos_svd(
            lambda V: J @ V,
            lambda U: Jt @ U,
            tuple(J.shape),
            kmax,
            block=settings["block"],
            steps=settings["steps"],
            seed=settings["seed"],
            dtype=J.dtype,
            device=J.device,
            keep="all",
        )
    else:
        s = topk_svd(
            J,
            max(kmax, n_singular),
            "randomized",
            oversample=settings["oversample"],
            n_iter=settings["n_iter"],
            seed=settings["seed"],
        )
    return SVD(
        s.U[..., :kmax].contiguous(), s.S[..., :kmax].contiguous(), s.Vh[..., :kmax, :].contiguous()
    ), s.S[..., :n_singular]


def _in_window(layer_i, layer_j, window: int | None):
    """Whether layer pairs are within ``depth_window`` (element-wise for arrays)."""
    if window is None:
        return np.ones(np.broadcast(np.asarray(layer_i), np.asarray(layer_j)).shape, dtype=bool)
    return np.abs(np.asarray(layer_i) - np.asarray(layer_j)) <= window


class _Run:
    """One measure() call: settings, the out directory, and per-(prompt, layer) work."""

    def __init__(self, info: _Model, settings: dict, out: Path, callback):
        self.info = info
        self.s = settings
        self.out = out
        self.callback = callback
        self.ks = settings["k"]
        self.kmax = max(self.ks)

    # -- paths
    def work(self, p: _Prompt) -> Path:
        return self.out / "_work" / p.pid

    def layer_dir(self, p: _Prompt, layer: int) -> Path:
        return self.work(p) / f"layer_{layer:04d}"

    def done_dir(self, p: _Prompt) -> Path:
        return self.out / "prompts" / p.pid

    def layer_meta(self, p: _Prompt, layer: int, stage: str = "done") -> dict | None:
        path = self.layer_dir(p, layer) / f"{stage}.json"
        return json.loads(path.read_text()) if path.exists() else None

    # -- one layer: Jacobians (or matrix-free spectra), per-layer tables
    def compute_layer(self, p: _Prompt, layer: int) -> dict:
        s = self.s
        t0 = time.perf_counter()
        ldir = self.layer_dir(p, layer)
        ldir.mkdir(parents=True, exist_ok=True)
        if s["method"] == "matrix_free":
            T, sel, basis, S_top, tw_tiles, passes = self._matrix_free_layer(p, layer)
        else:
            T, sel, basis, S_top, tw_tiles, passes = self._formed_layer(p, layer, ldir)
        for name, arr in zip(("U", "S", "Vh"), basis):
            _save_npy(ldir / f"basis_{name}.npy", arr)
        # singular values of every selected token at this layer
        n_s = S_top.shape[-1]
        sv = _frame(
            "singular_values",
            {
                "prompt": p.pid,
                "token": np.repeat(sel, n_s),
                "layer": layer,
                "rank": np.tile(np.arange(1, n_s + 1), len(sel)),
                "value": S_top.double().reshape(-1).numpy(),
            },
        )
        atomic_write_parquet(_typed("singular_values", sv), ldir / "singular_values.parquet")
        # token-wise coupling at this layer
        rows = []
        if tw_tiles is not None:
            for k, M in _couplings(tw_tiles, basis.S, self.ks, s["p"], s["normalize"]).items():
                ti, tj, m = _pair_rows(M, sel)
                rows.append(
                    _frame(
                        "tokenwise",
                        {
                            "prompt": p.pid,
                            "layer": layer,
                            "K": k,
                            "token_i": ti,
                            "token_j": tj,
                            "m": m,
                            "coupling": 1 - m**2,
                        },
                    )
                )
        tw = pd.concat(rows) if rows else _frame("tokenwise")
        atomic_write_parquet(_typed("tokenwise", tw), ldir / "tokenwise.parquet")
        ctx_tokens: list[int] = []
        if s["context"] is not False:
            ctx_tokens, ctx_passes = self._context_layer(p, layer, ldir, T)
            passes += ctx_passes
        meta = {
            "layer": layer,
            "T": T,
            "tokens": sel,
            "context_tokens": ctx_tokens,
            "seconds": time.perf_counter() - t0,
            "block_passes": int(passes),
        }
        _write_json(ldir / "done.json", meta)  # written last: the layer is complete
        return meta

    def _formed_layer(self, p: _Prompt, layer: int, ldir: Path):
        """Exact/randomized: form J_tt with one token-diagonal sweep (d VJPs), then its spectra."""
        from coupling_utils.engine import jacobians

        s = self.s
        J_all = _as_float(jacobians.token_jacobians(self.info.model, p.inputs, layer))
        T = J_all.shape[0]
        sel = _token_positions(s["tokens"], T)
        J = J_all[sel].contiguous()
        del J_all
        check_k(self.kmax, J.shape[-1])
        basis, S_top = _spectra(J, self.kmax, s["n_singular"], s["method"], s)
        _save_npy(ldir / "J.npy", J)
        tw_tiles = _tiles(J, basis, self.kmax, s["orientation"]) if len(sel) >= 2 else None
        return T, sel, basis, S_top, tw_tiles, J.shape[-1]  # one VJP per output coordinate

    def _operator(self, p: _Prompt, layer: int):
        from coupling_utils.engine.blocks import block_function
        from coupling_utils.engine.spectra import TokenOperator

        f, X = block_function(self.info.model, p.inputs, layer, token_diagonal=True)
        return TokenOperator(f, X, chunk_size=self.s["chunk_size"])

    def _matrix_free_layer(self, p: _Prompt, layer: int):
        """Matrix-free: top triplets from JVP/VJP products; token-wise tiles from products too."""
        from coupling_utils.engine.jacobians import frozen
        from coupling_utils.engine.spectra import operator_topk

        s = self.s
        with frozen(self.info.model):
            op = self._operator(p, layer)
            T, d = op.X.shape
            check_k(self.kmax, d)
            sel = _token_positions(s["tokens"], T)
            res = operator_topk(
                op,
                self.kmax,
                solver=s["solver"],
                block=s["block"],
                steps=s["steps"],
                oversample=s["oversample"] if s["oversample"] is not None else 10,
                n_iter=s["n_iter"] if s["n_iter"] is not None else 2,
                seed=s["seed"],
                keep="all",
            )
            U, S, Vh = (x[sel].float() if x.dtype != torch.float64 else x[sel] for x in res.svd)
            basis = SVD(
                U[..., : self.kmax].contiguous(), S.contiguous(), Vh[..., : self.kmax, :].contiguous()
            )
            tw_tiles = None
            if len(sel) >= 2:
                # tiles[a, b] = |U_bᵀ J_a V_b|: token a's Jacobian applied to token b's vectors,
                # all a at once (row a of the tangent carries V_b): n·kmax products
                left, right = _basis(basis, self.kmax, s["orientation"])  # [n, d, kmax]
                n = len(sel)
                tangent = torch.zeros(T, d, n * self.kmax, dtype=op.X.dtype, device=op.X.device)
                tangent[sel] = right.permute(1, 0, 2).reshape(d, n * self.kmax).to(tangent.dtype)
                JV = op.matmul(tangent)[sel].float().reshape(n, d, n, self.kmax)  # [a, d, b, c]
                tw_tiles = torch.einsum("bdr,adbc->abrc", left.float(), JV).abs()
        return T, sel, basis, S[:, : s["n_singular"]], tw_tiles, op.passes

    def compute_cross(self, p: _Prompt, layer: int, metas: list[dict]) -> dict:
        """Matrix-free depth-wise tiles ``|U_jᵀ J_i V_j|`` for block i = ``layer`` and its partners j.

        J_i is applied (JVPs) to the stored top-kmax right vectors of every partner layer (all
        other measured layers, or those within ``depth_window``): P·kmax block passes for all
        tokens at once; the (i, i) tile is diag(S_i) exactly (both solvers diagonalise J_i in
        its own basis; the "vju" orientation needs products for it too). Tiles of pairs outside
        the window stay zero and are never reported.
        """
        from coupling_utils.engine.jacobians import frozen

        s, layers = self.s, self.s["layers"]
        t0 = time.perf_counter()
        sel = metas[0]["tokens"]
        n, kmax = len(sel), self.kmax
        bases = {l: _basis(self._basis(p, l), kmax, s["orientation"]) for l in layers}  # (left, right)
        others = [
            l
            for l in layers
            if (l != layer or s["orientation"] != "ujv") and _in_window(l, layer, s["depth_window"])
        ]
        tiles = torch.zeros(n, len(layers), kmax, kmax)
        i = layers.index(layer)
        if layer not in others:
            tiles[:, i] = torch.diag_embed(self._basis(p, layer).S[:, :kmax])
        with frozen(self.info.model):
            op = self._operator(p, layer)
            T, d = op.X.shape
            if others:
                V = torch.cat([bases[l][1] for l in others], dim=-1)  # [n, d, m·kmax]
                tangent = torch.zeros(T, d, V.shape[-1], dtype=op.X.dtype, device=op.X.device)
                tangent[sel] = V.to(tangent.dtype)
                JV = op.matmul(tangent)[sel].float().reshape(n, d, len(others), kmax)  # [a, d, j, c]
                U = torch.stack([bases[l][0] for l in others], dim=1).float()  # [a, j, d, kmax]
                cross = torch.einsum("ajdr,adjc->ajrc", U, JV).abs()
                for jj, l in enumerate(others):
                    tiles[:, layers.index(l)] = cross[:, jj]
        ldir = self.layer_dir(p, layer)
        _save_npy(ldir / "cross_tiles.npy", tiles)
        meta = {"layer": layer, "seconds": time.perf_counter() - t0, "block_passes": int(op.passes)}
        _write_json(ldir / "cross.json", meta)
        return meta

    def _basis(self, p: _Prompt, layer: int, prefix: str = "", index=None) -> SVD:
        ldir = self.layer_dir(p, layer)
        parts = []
        for name in ("U", "S", "Vh"):
            arr = _load_npy(ldir / f"{prefix}basis_{name}.npy")
            parts.append(torch.from_numpy(np.array(arr if index is None else arr[index])))
        return SVD(*parts)

    def _context_layer(self, p: _Prompt, layer: int, ldir: Path, T: int) -> tuple[list[int], int]:
        """Context Jacobians J_{t1 t2} for the fixed output token (formed: d VJPs)."""
        from coupling_utils.engine import jacobians

        s = self.s
        t2 = _token_positions(s["context"], T, "context")[0]
        Jc = _as_float(jacobians.context_jacobians(self.info.model, p.inputs, layer, t2))
        ctx_tokens = [int(t) for t in (Jc.abs().amax(dim=(-2, -1)) > 0).nonzero().flatten().tolist()]
        Jc = Jc[ctx_tokens].contiguous()
        cbasis, _ = _spectra(Jc, self.kmax, 1, "exact" if s["method"] == "exact" else "randomized", s)
        _save_npy(ldir / "ctx_J.npy", Jc)
        for name, arr in zip(("U", "S", "Vh"), cbasis):
            _save_npy(ldir / f"ctx_basis_{name}.npy", arr)
        rows = []
        if len(ctx_tokens) >= 2:
            tiles = _tiles(Jc, cbasis, self.kmax, s["orientation"])
            for k, M in _couplings(tiles, cbasis.S, self.ks, s["p"], s["normalize"]).items():
                ti, tj, m = _pair_rows(M, ctx_tokens)
                rows.append(
                    _frame(
                        "context",
                        {
                            "prompt": p.pid,
                            "output_token": t2,
                            "K": k,
                            "layer_i": layer,
                            "token_i": ti,
                            "layer_j": layer,
                            "token_j": tj,
                            "m": m,
                            "coupling": 1 - m**2,
                        },
                    )
                )
        ct = pd.concat(rows) if rows else _frame("context")
        atomic_write_parquet(_typed("context", ct), ldir / "context.parquet")
        return ctx_tokens, Jc.shape[-1]  # one VJP per output coordinate

    # -- one prompt, after all its layers
    def finish_prompt(
        self, p: _Prompt, metas: list[dict], cross: list[dict] | None
    ) -> dict[str, pd.DataFrame]:
        s, layers = self.s, self.s["layers"]
        sel = metas[0]["tokens"]
        T = metas[0]["T"]
        tables: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
        for meta in metas:
            ldir = self.layer_dir(p, meta["layer"])
            for name in ("singular_values", "tokenwise") + (
                ("context",) if s["context"] is not False else ()
            ):
                tables[name].append(pd.read_parquet(ldir / f"{name}.parquet"))
        tile_layers = [l for l in layers if l in set(s["tile_layers"])] if s["tiles"] else []
        need_tiles = len(layers) >= 2 or bool(tile_layers)
        for a, t in enumerate(sel):
            if not need_tiles:
                break
            S = torch.stack([self._basis(p, l, index=a).S for l in layers])
            if cross is not None:  # matrix-free: tiles from stored products
                tiles = torch.stack(
                    [
                        torch.from_numpy(np.array(_load_npy(self.layer_dir(p, l) / "cross_tiles.npy")[a]))
                        for l in layers
                    ]
                )
            else:
                J = torch.stack(
                    [torch.from_numpy(np.array(_load_npy(self.layer_dir(p, l) / "J.npy")[a])) for l in layers]
                )
                basis = SVD(*(torch.stack(x) for x in zip(*(self._basis(p, l, index=a) for l in layers))))
                tiles = _tiles(J, basis, self.kmax, s["orientation"])
                del J
            self._depth(tables, p, t, tiles, S, tile_layers)
        if s["context"] is not False and len(layers) >= 2:
            t2 = _token_positions(s["context"], T, "context")[0]
            common = sorted(set.intersection(*(set(m["context_tokens"]) for m in metas)))
            for t1 in common:
                Js, bases = [], []
                for meta in metas:
                    i = meta["context_tokens"].index(t1)
                    Js.append(
                        torch.from_numpy(
                            np.array(_load_npy(self.layer_dir(p, meta["layer"]) / "ctx_J.npy")[i])
                        )
                    )
                    bases.append(self._basis(p, meta["layer"], "ctx_", i))
                basis = SVD(*(torch.stack(x) for x in zip(*bases)))
                tiles = _tiles(torch.stack(Js), basis, self.kmax, s["orientation"])
                for k, M in _couplings(tiles, basis.S, self.ks, s["p"], s["normalize"]).items():
                    li, lj, m = _pair_rows(M, layers)
                    keep = (li != lj) & _in_window(li, lj, s["depth_window"])  # same-layer rows: token slice
                    tables["context"].append(
                        _frame(
                            "context",
                            {
                                "prompt": p.pid,
                                "output_token": t2,
                                "K": k,
                                "layer_i": li[keep],
                                "token_i": t1,
                                "layer_j": lj[keep],
                                "token_j": t1,
                                "m": m[keep],
                                "coupling": 1 - m[keep] ** 2,
                            },
                        )
                    )
        extra = {c["layer"]: c for c in (cross or [])}
        tables["timings"].append(
            _frame(
                "timings",
                {
                    "prompt": p.pid,
                    "layer": [m["layer"] for m in metas],
                    "seconds": [m["seconds"] + extra.get(m["layer"], {}).get("seconds", 0.0) for m in metas],
                    "block_passes": [
                        m["block_passes"] + extra.get(m["layer"], {}).get("block_passes", 0) for m in metas
                    ],
                },
            )
        )
        tables["prompts"].append(
            _frame(
                "prompts", {"prompt": [p.pid], "text": [p.text], "n_tokens": [T], "input_ids": [p.input_ids]}
            )
        )
        result = {}
        for name in TABLES:
            df = pd.concat(tables[name]) if tables[name] else _frame(name)
            result[name] = _typed(name, df)
        return result

    def _depth(
        self, tables, p: _Prompt, t: int, tiles: torch.Tensor, S: torch.Tensor, tile_layers: list[int]
    ) -> None:
        """Depth-wise rows of one token from its kmax tiles [L, L, kmax, kmax] and values S [L, ≥kmax]."""
        s, layers = self.s, self.s["layers"]
        if len(layers) >= 2:
            for k, M in _couplings(tiles, S, self.ks, s["p"], s["normalize"]).items():
                li, lj, m = _pair_rows(M, layers)
                keep = _in_window(li, lj, s["depth_window"])
                li, lj, m = li[keep], lj[keep], m[keep]
                tables["depthwise"].append(
                    _frame(
                        "depthwise",
                        {
                            "prompt": p.pid,
                            "token": t,
                            "K": k,
                            "layer_i": li,
                            "layer_j": lj,
                            "m": m,
                            "coupling": 1 - m**2,
                        },
                    )
                )
        if tile_layers:
            idx = [layers.index(l) for l in tile_layers]
            K = s["tiles"]
            sub = tiles[idx][:, idx, :K, :K]  # [W, W, K, K]
            W = len(idx)
            grid = np.indices((W, W, K, K)).reshape(4, -1)
            lab = np.asarray(tile_layers)
            keep = _in_window(lab[grid[0]], lab[grid[1]], s["depth_window"])
            tables["tiles"].append(
                _frame(
                    "tiles",
                    {
                        "prompt": p.pid,
                        "token": t,
                        "K": K,
                        "layer_i": lab[grid[0]][keep],
                        "layer_j": lab[grid[1]][keep],
                        "row": grid[2][keep],
                        "col": grid[3][keep],
                        "value": sub.double().reshape(-1).numpy()[keep],
                    },
                )
            )


# --------------------------------------------------------------------------- measure
def measure(
    model,
    prompts,
    *,
    layers: Iterable[int] | None = None,
    tokens="last",
    k: int | Sequence[int] = (10, 30, 50),
    method: str = "exact",
    context=False,
    tiles: int | None = None,
    tile_layers: Iterable[int] | None = None,
    out: str | Path | None = None,
    resume: bool = True,
    n_singular: int | None = None,
    solver: str = "lanczos",
    block: int | None = None,
    steps: int | None = None,
    oversample: int = 10,
    n_iter: int = 2,
    seed: int = 0,
    depth_window: int | None = None,
    p: float = 2,
    normalize: str = "norm",
    orientation: str = "ujv",
    max_tokens: int | None = None,
    keep_work: bool = False,
    callback: Callable[[dict], None] | None = None,
    progress: bool = False,
    chunk_size: int | None = 64,
) -> Measurement:
    """Measure block Jacobians, their spectra and coupling for some prompts; see the module doc.

    ``model``: a LoadedModel (``coupling_utils.load_model``) or a Hugging Face model.
    ``prompts``: strings (tokenised with the model's tokenizer), token tensors [1, T], or input
    dicts with batch size 1 (e.g. ``{"pixel_values": ...}``); a list (ids "0", "1", ...) or a
    mapping ``{prompt_id: prompt}``. ``layers``: block indices (0-based, negative from the end;
    default all). ``tokens``: "last", "all" or positions. ``k``: one K or several.
    ``method``: "exact" | "randomized" | "matrix_free". The last two use the top-K ``solver``
    "lanczos" (``block``, ``steps``; defaults ceil(max(k)/10) and 45) or "subspace"
    (``oversample``, ``n_iter``), with random start ``seed``; the resolved settings are stored.
    ``depth_window``: None (all layer pairs), or w ≥ 1: only pairs of measured layers with
    ``|layer_i − layer_j| ≤ w`` in the depthwise, tiles and context tables (matrix-free then
    computes only those tiles: 2w·max(k) passes per layer instead of (L − 1)·max(k)).
    ``context``: False, or the output token t2 ("last" or a position) of the context Jacobians
    ``J_{t1 t2}`` (always formed: d VJPs per layer, whatever the method). ``tiles``: a K for the
    raw tiles table, over
    ``tile_layers`` (default: all measured layers; rows grow as layers² K²).
    ``n_singular``: how many singular values to keep (default max(k)). ``p``, ``normalize``,
    ``orientation``: metric options (see ``metric.coupling``). ``out``: a directory for the
    Parquet tables, provenance and resumable work (default: a temporary one, removed).
    ``callback(info)`` runs after each stored (prompt, layer) (``info["stage"]`` is "layer", or
    "cross" for matrix-free depth-wise products); an exception there interrupts the run, and a
    rerun with the same ``out`` continues from what is stored. ``chunk_size``: columns per
    batched JVP/VJP in the matrix-free method (memory vs speed; not part of the results).
    """
    if method not in MEASURE_METHODS:
        raise ValueError(f"method must be one of {MEASURE_METHODS}, got {method!r}")
    _check_options(p, normalize, orientation)
    info = _model_info(model)
    ks = sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})
    if not ks:
        raise ValueError("k must name at least one K, e.g. k=(10, 30, 50)")
    d = info.d_model
    for kk in ks:
        check_k(kk, d if d else max(ks))
    if isinstance(n_singular, bool) or (
        n_singular is not None and (not isinstance(n_singular, (int, np.integer)) or n_singular < 1)
    ):
        raise ValueError(f"n_singular must be a positive integer or None, got {n_singular!r}")
    n_singular = int(n_singular or max(ks))
    if d and n_singular > d:
        raise ValueError(f"n_singular={n_singular} exceeds the width d={d}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if depth_window is not None and (
        isinstance(depth_window, bool) or not isinstance(depth_window, (int, np.integer)) or depth_window < 1
    ):
        raise ValueError(
            f"depth_window must be a positive integer (the largest |layer_i - layer_j| "
            f"kept) or None for all layer pairs, got {depth_window!r}"
        )
    depth_window = None if depth_window is None else int(depth_window)
    lanczos = method != "exact" and solver == "lanczos"
    subspace = method != "exact" and solver == "subspace"
    if lanczos:
        from coupling_utils.engine.spectra import lanczos_plan

        block, steps = lanczos_plan(max(ks), d or None, block=block, steps=steps)
        if n_singular > block * steps:
            raise ValueError(
                f"the lanczos solver computes block·steps = {block * steps} singular values; "
                f"n_singular={n_singular} is more (raise block or steps)"
            )
    elif subspace:
        from coupling_utils.engine.spectra import _check_randomized

        _check_randomized(oversample, n_iter)
        if method == "matrix_free" and n_singular > max(ks) + oversample:
            raise ValueError(
                f"matrix_free computes max(k) + oversample = {max(ks) + oversample} singular "
                f"values; n_singular={n_singular} is more"
            )
    L = info.n_layers
    layer_list = list(range(L)) if layers is None else [int(l) for l in layers]
    for l in layer_list:
        if not -L <= l < L:
            raise ValueError(f"layer {l} does not exist: the model has {L} blocks (0..{L - 1})")
    layer_list = sorted({l % L for l in layer_list})
    if not layer_list:
        raise ValueError("layers selects no block")
    tokens = _check_tokens_spec(tokens)
    if context is True:
        context = "last"
    if context is not False:
        _check_tokens_spec(context)
        if not isinstance(context, str) and len(_check_tokens_spec(context)) != 1:
            raise ValueError(f"context names one output token ('last' or a position), got {context!r}")
        context = context if isinstance(context, str) else int(_check_tokens_spec(context)[0])
        if context == "all":
            raise ValueError("context names one output token ('last' or a position), not 'all'")
    if tiles is not None:
        tiles = check_k(tiles, d if d else tiles)
        if tiles > max(ks):
            raise ValueError(f"tiles={tiles} exceeds max(k)={max(ks)}; add it to k")
    tile_list = layer_list if tile_layers is None else sorted({int(l) % L for l in tile_layers})
    if tiles is not None and not set(tile_list) <= set(layer_list):
        raise ValueError(
            f"tile_layers {sorted(set(tile_list) - set(layer_list))} are not measured; add them to layers"
        )
    plist = _prompts(prompts, info.tokenizer, max_tokens)
    settings = {
        "model": info.name,
        "revision": info.revision,
        "dtype": info.dtype,
        "method": method,
        "k": ks,
        "layers": layer_list,
        "tokens": tokens,
        "context": context,
        "tiles": tiles,
        "tile_layers": tile_list if tiles is not None else None,
        "n_singular": n_singular,
        "solver": solver if method != "exact" else None,
        "block": block if lanczos else None,
        "steps": steps if lanczos else None,
        "oversample": oversample if subspace else None,
        "n_iter": n_iter if subspace else None,
        "seed": seed if method != "exact" else None,
        "depth_window": depth_window,
        "p": p,
        "normalize": normalize,
        "orientation": orientation,
        "format": _FORMAT,
    }
    settings_runtime = {"chunk_size": chunk_size}
    tmp_out = None
    if out is None:
        tmp_out = Path(tempfile.mkdtemp(prefix="coupling-measure-"))
        out_path = tmp_out
    else:
        out_path = Path(out)
    try:
        # one measurement per folder at a time: a second process waits, then resumes from the results
        with file_lock(out_path / ".lock", f"measure into {out_path}"):
            return _measure(
                info,
                plist,
                settings,
                settings_runtime,
                out_path,
                resume,
                keep_work,
                callback,
                progress,
                persistent=tmp_out is None,
            )
    finally:
        if tmp_out is not None:
            shutil.rmtree(tmp_out, ignore_errors=True)


def _measure(
    info: _Model,
    plist: list[_Prompt],
    settings: dict,
    runtime: dict,
    out: Path,
    resume: bool,
    keep_work: bool,
    callback,
    progress: bool,
    persistent: bool,
) -> Measurement:
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / "settings.json"
    if cfg_path.exists():
        stored = _upgrade_settings(json.loads(cfg_path.read_text()))
        if resume and stored != json.loads(json.dumps(settings, default=str)):
            diff = sorted(
                k_
                for k_ in set(stored) | set(settings)
                if stored.get(k_) != json.loads(json.dumps(settings.get(k_), default=str))
            )
            raise ValueError(
                f"{out} holds a measurement with other settings ({', '.join(diff)}); "
                "use another out directory, or resume=False to replace it"
            )
    if not resume:
        for name in ("_work", "prompts"):
            shutil.rmtree(out / name, ignore_errors=True)
        for name in (*TABLES, "provenance"):
            for suffix in (".parquet", ".json"):
                (out / f"{name}{suffix}").unlink(missing_ok=True)
    _write_json(cfg_path, settings)
    run = _Run(info, {**settings, **runtime}, out, callback)
    results: list[dict[str, pd.DataFrame]] = []
    started = _dt.datetime.now(_dt.timezone.utc)
    bar = _progress(len(plist) * len(settings["layers"]), progress)
    for p in plist:
        ddir = run.done_dir(p)
        marker = ddir / "done.json"
        if marker.exists():
            stored = json.loads(marker.read_text())
            if stored.get("digest") != p.digest:
                raise ValueError(
                    f"{out}: prompt {p.pid!r} was measured with other inputs; use another "
                    "out directory, other prompt ids, or resume=False"
                )
            results.append({name: pd.read_parquet(ddir / f"{name}.parquet") for name in TABLES})
            bar.update(len(settings["layers"]))
            continue
        work = run.work(p)
        wmeta = work / "prompt.json"
        if wmeta.exists() and json.loads(wmeta.read_text()).get("digest") != p.digest:
            shutil.rmtree(work)  # stale work for another input under the same id
        work.mkdir(parents=True, exist_ok=True)
        _write_json(wmeta, {"prompt": p.pid, "digest": p.digest, "text": p.text})
        metas = []
        for layer in settings["layers"]:
            meta = run.layer_meta(p, layer)
            computed = meta is None
            if computed:
                meta = run.compute_layer(p, layer)
            metas.append(meta)
            bar.update(1)
            if callback is not None:
                callback({"prompt": p.pid, "layer": layer, "computed": computed, "stage": "layer", **meta})
        cross = None
        if settings["method"] == "matrix_free" and len(settings["layers"]) >= 2:
            cross = []
            for layer in settings["layers"]:
                cmeta = run.layer_meta(p, layer, "cross")
                computed = cmeta is None
                if computed:
                    cmeta = run.compute_cross(p, layer, metas)
                cross.append(cmeta)
                if callback is not None:
                    callback(
                        {"prompt": p.pid, "layer": layer, "computed": computed, "stage": "cross", **cmeta}
                    )
        tables = run.finish_prompt(p, cross=cross, metas=metas)
        ddir.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            atomic_write_parquet(df, ddir / f"{name}.parquet")
        _write_json(marker, {"prompt": p.pid, "digest": p.digest})
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
        results.append(tables)
    bar.close()
    final = {name: _typed(name, pd.concat([r[name] for r in results])) for name in TABLES}
    provenance = {
        "settings": settings,
        "model": {
            "name": info.name,
            "revision": info.revision,
            "dtype": info.dtype,
            "arch": info.arch,
            "n_layers": info.n_layers,
            "d_model": info.d_model,
            "provenance": info.provenance,
        },
        "prompts": [{"prompt": p.pid, "text": p.text, "digest": p.digest} for p in plist],
        "versions": _versions(),
        "machine": {
            "node": platform.node(),
            "processor": platform.processor(),
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
        },
        "started_utc": started.isoformat(),
        "finished_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "total_block_passes": int(final["timings"]["block_passes"].sum()),
    }
    if persistent:
        for name, df in final.items():
            atomic_write_parquet(df, out / f"{name}.parquet")
        _write_json(out / "provenance.json", provenance)
    return Measurement(**final, provenance=provenance, out=out if persistent else None)


def _upgrade_settings(stored: dict) -> dict:
    """Stored settings from before the solver and depth_window settings, in today's terms.

    Those runs used subspace iteration (for non-exact methods) and all layer pairs, so they
    resume under the equivalent settings ``solver="subspace"``, ``depth_window=None``.
    """
    stored = dict(stored)
    stored.setdefault("depth_window", None)
    if "solver" not in stored:
        stored["solver"] = None if stored.get("method") == "exact" else "subspace"
        stored.setdefault("block", None)
        stored.setdefault("steps", None)
    return stored


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="measure", unit="layer")
