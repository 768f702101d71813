"""The one-token path: ``J^l_tt`` of a few tokens at a cost that does not grow with T.

A causal block's output at t depends on x_t through q_t, k_t, v_t and row t of attention;
every other token enters only through its keys and values, which do not depend on x_t. So
``J_tt`` is the Jacobian of the block run on the single token t against the prefix's key/value
cache: the model's own forward pass fills the cache with tokens 0..t−1 (stopped after block
``l``), a second pass on token t alone is stopped when block ``l`` is called, and that call,
``x_t -> block(x_t; cache) − x_t``, is differentiated by d VJPs of one token (reverse mode:
it passes fused SDPA and fp16 norms, which forward mode does not). Positions (RoPE, learned),
ALiBi, sliding windows and grouped-query attention are the model's own code; 4-bit layers run
dequantized as in ``blocks.BlockFunction``, which also copies the cache per call so the block's
own cache update never leaks between calls. LLM.int8 (8-bit) layers keep the all-token path: the
prefix's cache would come from int8's rounded activations, which the dequantized block lacks.

Cost per token: d × (one token's backward through the block + t·d for attention), against
d × (a backward pass over all T tokens) for the all-token sweep of ``jacobians.token_jacobians``;
:func:`one_token_wins` says when the path is cheaper. Only causal blocks fed token ids
(``input_ids``, optionally an all-ones ``attention_mask``) take it; :func:`one_token_supported`
says why not otherwise, and the caller keeps the exact all-token path.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import torch

from coupling_utils.engine.architectures import (
    find_architecture,
    transformer_blocks,
    unwrap_model,
)
from coupling_utils.engine.attention_modes import attention_mode
from coupling_utils.engine.blocks import (
    BlockFunction,
    _fresh,
    _is_cache,
    _quantized_layers,
    last_block_norm,
    model_inputs,
)
from coupling_utils.engine.hooks import capture_blocks

__all__ = [
    "one_token_jacobians",
    "one_token_function",
    "OneTokenCalls",
    "one_token_supported",
    "one_token_wins",
    "choose_path",
    "PATHS",
]

PATHS = ("one_token", "all_tokens")
"""How token Jacobians were formed: per selected token against the prefix's KV cache, or one
token-diagonal sweep over all T tokens (``jacobians.token_jacobians``)."""


def one_token_supported(model, inputs) -> str | None:
    """None if the one-token path applies to ``model`` and ``inputs``; otherwise why not."""
    model = unwrap_model(model)
    row = find_architecture(model)
    causal = row.causal == "causal" or (
        row.causal == "bidirectional or causal" and bool(getattr(model.config, "is_decoder", False))
    )
    if not causal:
        return f"{row.name} blocks are not (only) causal: every token's output depends on later tokens"
    if any(type(model.get_submodule(n)).__name__ == "Linear8bitLt" for n in _quantized_layers(model)):
        return (
            "LLM.int8 (8-bit) layers round the activations: the prefix's key/value cache would hold "
            "int8's keys and values, not those of the dequantized block the Jacobian differentiates"
        )
    if not isinstance(inputs, torch.Tensor):
        if not isinstance(inputs, Mapping) or "input_ids" not in inputs:
            return "the inputs are not token ids"
        extra = set(inputs) - {"input_ids", "attention_mask"}
        mask = inputs.get("attention_mask")
        if extra or (mask is not None and not bool((mask == 1).all())):
            return "the inputs carry more than token ids (or a padding mask)"
    return None


def one_token_wins(n_tokens: int, T: int, device: torch.device | str = "cpu") -> bool:
    """Whether ``n_tokens`` one-token Jacobians cost less than one all-token sweep over T.

    On a CPU each costs about 1/T of the sweep's block work (plus a prefix pass without
    gradients), so the path wins below T/2 tokens (the measured ratios are in
    ``bench/bench_engine.py``). On an accelerator the d products of one token are too small to
    fill it: one token took as long at T = 128 as at T = 16 (0.11 s a block, against the sweep's
    0.13 s and 0.76 s, ``data/benchmarks/gpu_check.csv``: an H200, a bfloat16 Llama-7B-shaped
    block), so there it wins below T/16 tokens.
    """
    share = 2 if torch.device(device).type == "cpu" else 16
    return share * n_tokens <= T


def choose_path(model, inputs, n_tokens: int, T: int) -> tuple[str, str]:
    """``(path, why)``: how to form ``n_tokens`` of the T token Jacobians (one of :data:`PATHS`).

    "one_token" where it applies (:func:`one_token_supported`) and is cheaper
    (:func:`one_token_wins`); "all_tokens" otherwise. ``why`` says which rule decided, for the
    run's provenance.
    """
    why = one_token_supported(model, inputs)
    if why is not None:
        return "all_tokens", why
    device = next(unwrap_model(model).parameters()).device
    if not one_token_wins(n_tokens, T, device):
        return (
            "all_tokens",
            f"{n_tokens} of {T} tokens on {device.type}: one sweep over all tokens is cheaper",
        )
    return "one_token", f"{n_tokens} of {T} tokens, each against its prefix's key/value cache"


def _cache_argument(model) -> str:
    """The name under which the model's forward takes a key/value cache (``cache`` from
    transformers 5 on, ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _ids(model, inputs) -> torch.Tensor:
    ids = model_inputs(model, inputs)["input_ids"]
    return ids.reshape(1, -1)


class OneTokenCalls:
    """The calls of blocks ``layers`` on token ``t`` alone against its prefix's key/value cache.

    Two forward passes without gradients, shared by every block: the prefix (tokens < t, stopped
    after the last block asked for) fills the model's own cache; token t alone then runs against
    a copy of it, and each block's call is captured. The calls are kept with the prefix cache
    as the prefix pass left it (``BlockFunction`` copies it per call).
    """

    def __init__(self, model, inputs, t: int, layers: Sequence[int]):
        model = unwrap_model(model)
        if model.training:
            raise ValueError(
                "the model is in training mode (dropout would make Jacobians random); call model.eval()"
            )
        self.model, self.blocks = model, transformer_blocks(model)
        n = len(self.blocks)
        for layer in layers:
            if not -n <= layer < n:
                raise IndexError(f"layer {layer} out of range: the model has {n} blocks (0..{n - 1})")
        ids = _ids(model, inputs)
        T = ids.shape[1]
        if not -T <= t < T:
            raise IndexError(f"token {t} out of range for a sequence of {T} tokens")
        self.t, wanted = t % T, sorted({int(layer) % n for layer in layers})
        ones = torch.ones(1, self.t + 1, dtype=torch.long, device=ids.device)
        with attention_mode(model, token_diagonal=False):
            self.cache = None
            if self.t > 0:
                prefix = {
                    "input_ids": ids[:, : self.t],
                    "attention_mask": ones[:, : self.t],
                    "use_cache": True,
                }
                got = capture_blocks(model, self.blocks, prefix, calls=[0], outputs=[wanted[-1]])
                call = got.calls[0]
                self.cache = next((v for v in (*call.args, *call.kwargs.values()) if _is_cache(v)), None)
                if self.cache is None:
                    raise RuntimeError(f"{type(model).__name__} made no key/value cache with use_cache=True")
            query = {
                "input_ids": ids[:, self.t : self.t + 1],
                "attention_mask": ones,
                "use_cache": self.t > 0,
            }
            if self.cache is not None:
                query[_cache_argument(model)] = _fresh(self.cache)
            self.calls = capture_blocks(model, self.blocks, query, calls=wanted).calls
        missing = [layer for layer in wanted if layer not in self.calls]
        if missing:
            raise RuntimeError(f"block(s) {missing} were not called during the forward pass")

    def function(self, layer: int, last_block: str = "block"):
        """``(f, x_t)`` for block ``layer`` (see :func:`one_token_function`)."""
        norm = last_block_norm(self.model, layer, last_block)
        layer %= len(self.blocks)
        args, kwargs = self.calls[layer]
        x = args[0] if args else kwargs["hidden_states"]
        prefix = self.cache
        args = tuple(prefix if _is_cache(a) else a for a in args)
        kwargs = {k: prefix if _is_cache(v) else v for k, v in kwargs.items()}
        f = BlockFunction(self.model, self.blocks[layer], args, kwargs, False, layer, norm, one_token=True)
        return f, x[0].detach()


def one_token_function(model, inputs, layer: int, t: int, *, last_block: str = "block"):
    """``(f, x_t)``: block ``layer`` at token ``t`` as a function of ``x_t`` alone.

    ``f(x: Tensor  # [1, d]) -> Tensor  # [1, d]`` is ``block(x; cache of tokens < t) − x``
    (with the final norm folded in under ``last_block="final_norm"``); ``x_t: Tensor  # [1, d]``
    is the hidden state entering the block at t. Its Jacobian is ``J^l_tt − I`` exactly.
    """
    return OneTokenCalls(model, inputs, t, [layer]).function(layer, last_block)


def one_token_jacobians(
    model,
    inputs,
    layer: int,
    tokens: Sequence[int],
    *,
    chunk_size: int | None = None,
    last_block: str = "block",
    calls: Mapping[int, OneTokenCalls] | None = None,
) -> torch.Tensor:
    """``J^l_tt − I`` for each listed token, one token at a time against its prefix's KV cache.

    Returns ``J: Tensor  # [n, d_out, d_in]`` (fp32; n = len(tokens), in their order). Equal to
    ``jacobians.token_jacobians(model, inputs, layer, tokens=tokens)`` up to rounding.
    ``calls``: :class:`OneTokenCalls` by token, made once for all the blocks a run measures
    (otherwise made here for this block).
    """
    from coupling_utils.engine.jacobians import _default_chunk, _vjp_rows, check_finite, frozen

    why = one_token_supported(model, inputs)
    if why is not None:
        raise ValueError(f"the one-token path does not apply here: {why}; use jacobians.token_jacobians")
    out, kept = [], []
    with frozen(model):
        for t in tokens:
            got = (calls or {}).get(int(t)) or OneTokenCalls(model, inputs, int(t), [layer])
            f, x = got.function(layer, last_block)
            d = x.shape[-1]
            _, vjp_fn = torch.func.vjp(f, x)

            def cotangents(i0, i1, x=x, d=d):
                return torch.eye(d, dtype=x.dtype, device=x.device)[i0:i1, None, :]  # [c, 1, d]

            rows = _vjp_rows(vjp_fn, cotangents, d, _default_chunk(d, 1, chunk_size, x.device), False, "")
            out.append(rows[:, 0, :].float())
            kept.append(got.t)
    J = torch.stack(out)
    check_finite(J, layer, kept)
    return J
