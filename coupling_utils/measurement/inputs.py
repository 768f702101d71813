"""What measure() is given: the model's facts, the prompts, and token positions within them."""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "ModelInfo",
    "model_info",
    "Prompt",
    "prompts",
    "Limits",
    "model_limits",
    "token_positions",
    "check_tokens_spec",
]

INPUT_KEYS = {"input_ids", "pixel_values", "attention_mask", "inputs_embeds"}


@dataclass
class ModelInfo:
    """A model to measure and the facts about it that settings and provenance need."""

    model: Any  # a LoadedModel or a Hugging Face model
    tokenizer: Any
    name: str
    revision: str | None
    dtype: str
    arch: str | None
    n_layers: int
    d_model: int | None
    n_params: int | None
    provenance: dict

    def describe(self) -> dict:
        """The model's entry in a measurement's provenance."""
        return {
            "name": self.name,
            "revision": self.revision,
            "dtype": self.dtype,
            "arch": self.arch,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_params": self.n_params,
            "provenance": self.provenance,
        }


def _n_params(module) -> int | None:
    return sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else None


def model_info(model) -> ModelInfo:
    """Name, revision, size and tokenizer of a LoadedModel or a bare Hugging Face model."""
    if hasattr(model, "model") and hasattr(model, "n_layers"):  # a LoadedModel
        return ModelInfo(
            model,
            getattr(model, "tokenizer", None),
            str(model.name),
            getattr(model, "revision", None),
            str(getattr(model, "dtype", "")),
            getattr(model, "arch", None),
            int(model.n_layers),
            getattr(model, "d_model", None),
            _n_params(model.model),
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
    arch = getattr(cfg, "model_type", None)
    return ModelInfo(model, None, name, None, dtype, arch, int(n_layers), d_model, _n_params(model), {})


@dataclass
class Prompt:
    """One prompt: its id, text, model inputs (ids [1, T] or a dict with batch size 1) and digest."""

    pid: str
    text: str
    inputs: Any  # ids: LongTensor [1, T], or a dict of model inputs with batch size 1
    input_ids: list[int]
    digest: str
    tokens: list[str] | None = None  # the tokenizer's token strings, when it has them


@dataclass(frozen=True)
class Limits:
    """What a model accepts: ``context`` positions and token ids below ``vocab`` (None: unknown)."""

    context: int | None = None
    vocab: int | None = None


def model_limits(info: ModelInfo) -> Limits:
    """The context length and vocabulary size its config declares (a LoadedModel or a bare model)."""
    module = getattr(info.model, "model", info.model)
    cfg = getattr(module, "config", None) or getattr(info.model, "config", None)
    if cfg is not None and hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config()

    def first(*names):
        vals = [getattr(cfg, n, None) for n in names]
        return next((int(v) for v in vals if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)

    return Limits(first("max_position_embeddings", "n_positions", "n_ctx"), first("vocab_size"))


def _bounded(pid: str, ids: torch.Tensor, limits: Limits) -> torch.Tensor:
    """Token ids checked against the vocabulary and cut, with a notice, to the model's context.

    A prompt longer than the context cannot be measured as a whole (positions past it do not
    exist); its first ``context`` tokens are, and stderr says so. An id outside the vocabulary
    is refused: the embedding would fail, or read another token's row."""
    if limits.vocab is not None and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limits.vocab):
        bad = [int(i) for i in ids[0].tolist() if not 0 <= i < limits.vocab][:5]
        raise ValueError(
            f"prompt {pid!r}: token ids {bad} are outside this model's vocabulary (0..{limits.vocab - 1}); "
            "give ids the model's tokenizer makes, or text"
        )
    if limits.context is not None and ids.shape[1] > limits.context:
        print(
            f"notice: prompt {pid!r} has {ids.shape[1]} tokens, more than this model's context of "
            f"{limits.context}; its first {limits.context} tokens are measured (max_tokens cuts it shorter)",
            file=sys.stderr,
            flush=True,
        )
        ids = ids[:, : limits.context]
    return ids


def prompts(given, tokenizer, max_tokens: int | None, limits: Limits | None = None) -> list[Prompt]:
    """Normalise prompts (strings, token tensors or input dicts; a list or an id -> prompt map).

    ``limits`` (:func:`model_limits`): token ids are checked against the model's vocabulary and
    prompts cut to its context, saying so (see :func:`_bounded`)."""
    if isinstance(given, (str, torch.Tensor)) or (isinstance(given, Mapping) and set(given) & INPUT_KEYS):
        given = [given]  # one prompt
    items = list(given.items()) if isinstance(given, Mapping) else list(enumerate(given))
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
        if isinstance(p, Mapping):
            out.append(_input_dict(pid, p, tokenizer, max_tokens))
            continue
        ids, text = _token_ids(pid, p, tokenizer)
        if max_tokens is not None:
            ids = ids[:, :max_tokens]
        ids = _bounded(pid, ids, limits or Limits())
        if ids.shape[1] < 1:
            raise ValueError(f"prompt {pid!r} has no tokens")
        input_ids = ids[0].tolist()
        out.append(Prompt(pid, text, ids, input_ids, digest(ids), _tokens(tokenizer, input_ids)))
    return out


def _token_ids(pid: str, p, tokenizer) -> tuple[torch.Tensor, str]:
    """ids: LongTensor [1, T] and the text of a string or token-tensor prompt."""
    if isinstance(p, str):
        if tokenizer is None or not callable(tokenizer):
            raise ValueError(
                "string prompts need a tokenizer: pass a LoadedModel from "
                "coupling_utils.load_model, or token id tensors [1, T]"
            )
        return tokenizer(p, return_tensors="pt")["input_ids"], p
    if isinstance(p, torch.Tensor):
        ids = p if p.ndim == 2 else p.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"prompt {pid!r}: token ids must be an integer tensor [1, T], got {p.dtype} {tuple(p.shape)}"
            )
        ids = ids.long()
        return ids, _decode(tokenizer, ids)
    raise TypeError(
        f"prompt {pid!r}: expected a string, a LongTensor [1, T] or a dict of "
        f"model inputs, got {type(p).__name__}"
    )


def _input_dict(pid: str, p: Mapping, tokenizer, max_tokens: int | None) -> Prompt:
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
    input_ids = [] if ids is None else ids[0].tolist()
    tokens = _tokens(tokenizer, input_ids) if input_ids else None
    return Prompt(pid, text, dict(p), input_ids, digest(p), tokens)


def digest(inputs) -> str:
    """The identity of a prompt's inputs (ids or an input dict), stored in its completion marker.

    Kept byte for byte as earlier versions computed it, so stored measurements stay resumable.
    """
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


def _decode(tokenizer, ids: torch.Tensor) -> str:
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        with contextlib.suppress(Exception):
            return tokenizer.decode(ids[0].tolist())
    return ""


def _tokens(tokenizer, input_ids: list[int]) -> list[str] | None:
    """The token strings of ``input_ids`` (for axis labels), or None without a tokenizer."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is None:
        return None
    with contextlib.suppress(Exception):
        return [str(t) for t in convert(input_ids)]
    return None


def token_positions(tokens, T: int, what: str = "tokens") -> list[int]:
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


def check_tokens_spec(tokens) -> str | list[int]:
    """Validate a token selection without a prompt: "last", "all" or a list of integers."""
    if isinstance(tokens, str):
        token_positions(tokens, 1)
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
