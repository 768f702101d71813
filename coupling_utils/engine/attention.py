"""Token-diagonal attention: the same forward value, gradients that never cross tokens.

Attention is the only operation in a transformer block that mixes tokens. If gradients reach
key and value position ``s`` only from query position ``s``, the Jacobian of the whole block
with respect to its input ``X[T, d]`` is block-diagonal and its diagonal blocks are exactly the
per-token Jacobians ``J_tt``. One vector-Jacobian product with a cotangent that has a row for
every token then returns ``c_tᵀ J_tt`` for all tokens at once (see ``jacobians.py``).

With ``z_ts = q_t·k_s·scale``, ``a_ts = softmax_s(z_ts + bias_ts)`` and ``o_t = Σ_s a_ts v_s``,
the exact same-position derivatives are ``∂o_t/∂v_t = a_tt I`` and
``∂o_t/∂k_t = a_tt (v_t − o_t) (∂z_tt/∂k_t)ᵀ``. With ``sg`` = detach::

    o_t = Σ_s a(q_t, sg(K))_ts sg(v_s)
        + sg(a_tt) [ (v_t − sg(v_t)) + (sg(v_t) − sg(o_t)) · g_tt ⟨sg(q_t), k_t − sg(k_t)⟩ ]

where ``g_tt = ∂z_tt/∂(q_t·k_t)`` (``scale``, times ``1 − tanh²`` under logit soft-capping). The
bracket is exactly zero in value, so the forward output is bit-for-bit the plain one.

Biases that do not depend on the block input (causal/bidirectional/sliding-window masks, ALiBi)
enter as an additive ``bias``. Grouped-query attention repeats keys/values per head first.
The math is eager (no fused SDPA), so forward-mode AD works too.

For architectures that call attention through ``transformers``' ``AttentionInterface`` the
function is registered under :data:`TOKEN_DIAGONAL`; the others (GPT-Neo, Falcon, MPT) get
adapters in ``adapters.py`` that call :func:`token_diagonal_attention` directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

__all__ = [
    "TOKEN_DIAGONAL",
    "token_diagonal_attention",
    "plain_attention",
    "mask_to_bias",
    "repeat_kv",
    "hf_token_diagonal_attention",
    "ONE_TOKEN",
    "one_token_attention",
    "own_rows",
    "registered",
]

TOKEN_DIAGONAL = "coupling_token_diagonal"
"""Name under which the token-diagonal function is registered in ``transformers``."""

ONE_TOKEN = "coupling_one_token"
"""Name under which :func:`one_token_attention` is registered in ``transformers``."""


def mask_to_bias(
    mask: torch.Tensor | None,
    q_len: int,
    kv_len: int,
    *,
    causal_if_none: bool,
    masked_is_true: bool = False,
    device=None,
) -> torch.Tensor | None:
    """Turn an attention mask (additive float, boolean, or None) into an additive fp32 bias.

    Boolean masks follow SDPA (``True`` = may attend) unless ``masked_is_true`` (MPT's
    convention). ``None`` means "no mask", except that ``causal_if_none`` builds the causal one
    (SDPA's ``is_causal`` shortcut leaves the mask out).
    """
    neg = torch.finfo(torch.float32).min
    if mask is None:
        if not causal_if_none or q_len == 1:
            return None
        keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)
        return torch.zeros(q_len, kv_len, device=device).masked_fill(~keep, neg)
    if mask.dtype == torch.bool:
        keep = ~mask if masked_is_true else mask
        return torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, neg)
    return mask.float()


def _up(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (mixed-precision models compute logits and softmax in fp32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _scores(q, k, scaling: float, softcap: float | None):
    """Raw logits ``z = softcap(q·k·scale)`` in fp32 or better."""
    z = torch.matmul(_up(q), _up(k).transpose(-1, -2)) * scaling
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    return z


def plain_attention(query, key, value, bias=None, *, scaling: float, softcap: float | None = None):
    """Ordinary eager attention.

    ``query: Tensor  # [B, H, T, e]``, ``key``, ``value: Tensor  # [B, H, S, e]``, ``bias``
    broadcastable to ``[B, H, T, S]``. Returns ``(output: Tensor  # [B, H, T, e]`` in value's
    dtype, ``weights: Tensor  # [B, H, T, S])``.
    """
    z = _scores(query, key, scaling, softcap)
    if bias is not None:
        z = z + bias
    a = torch.softmax(z, dim=-1).to(value.dtype)
    return torch.matmul(a, value), a


def token_diagonal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scaling: float,
    softcap: float | None = None,
):
    """Attention with the plain forward value whose gradients stay on the diagonal (t to t).

    Shapes as :func:`plain_attention`; self-attention only (``T == S``: no KV cache).
    """
    T, S = query.shape[-2], key.shape[-2]
    if T != S:
        raise ValueError(
            f"token-diagonal attention needs self-attention without a KV cache (queries {T}, keys {S}); "
            "call the block with use_cache=False"
        )
    k_sg, v_sg, q_sg = key.detach(), value.detach(), query.detach()
    # 1. gradient through the queries only
    z = _scores(query, k_sg, scaling, softcap)
    if bias is not None:
        z = z + bias
    a = torch.softmax(z, dim=-1).to(value.dtype)
    out = torch.matmul(a, v_sg)
    # 2. the same-position key/value terms, zero in value
    a_tt = torch.diagonal(a, dim1=-2, dim2=-1).detach().unsqueeze(-1)  # [B,H,T,1]
    dot = (_up(q_sg) * (_up(key) - _up(k_sg))).sum(-1, keepdim=True)  # ⟨sg(q_t), k_t − sg(k_t)⟩ = 0
    gain = torch.full_like(dot, scaling)
    if softcap is not None:
        raw_tt = (_up(q_sg) * _up(k_sg)).sum(-1, keepdim=True) * scaling
        gain = gain * (1.0 - torch.tanh(raw_tt / softcap) ** 2)
    correction = (value - v_sg) + (v_sg - out.detach()) * (gain * dot).to(value.dtype)
    return out + a_tt * correction, a


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``x: Tensor  # [B, Hkv, S, e]`` -> ``Tensor  # [B, Hkv·n_rep, S, e]`` (grouped-query attention)."""
    if n_rep == 1:
        return x
    B, H, S, e = x.shape
    return x[:, :, None].expand(B, H, n_rep, S, e).reshape(B, H * n_rep, S, e)


def hf_token_diagonal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
):
    """``transformers`` AttentionInterface signature around :func:`token_diagonal_attention`.

    q [B,H,T,e], k/v [B,Hkv,S,e]; returns ([B,T,H,e], weights) as the eager functions do.
    Dropout is ignored (Jacobians are taken in eval mode; ``blocks.block_function`` checks).
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention sinks (s_aux) are not supported by token-diagonal attention")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    n_rep = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    bias = mask_to_bias(
        attention_mask,
        query.shape[-2],
        key.shape[-2],
        causal_if_none=bool(getattr(module, "is_causal", False)),
        device=query.device,
    )
    if bias is not None and bias.shape[-1] != key.shape[-2]:
        bias = bias[..., : key.shape[-2]]
    out, weights = token_diagonal_attention(query, key, value, bias, scaling=scaling, softcap=softcap)
    return out.transpose(1, 2).contiguous(), weights


_OWN_ROWS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("own_rows", default=None)


@contextlib.contextmanager
def own_rows(cache):
    """Meanwhile, ``cache.update`` stores detached keys/values and keeps the new (own) ones,
    with their derivatives, for :func:`one_token_attention` (by layer index).

    The cache's concatenation then carries no derivative, so a VJP never forms the zero
    gradient of all S cached rows that slicing the own row out of it would.
    """
    rows: dict = {}
    update = cache.update

    def recording_update(key_states, value_states, layer_idx, *args, **kwargs):
        rows[layer_idx] = (key_states, value_states)
        return update(key_states.detach(), value_states.detach(), layer_idx, *args, **kwargs)

    token = _OWN_ROWS.set(rows)
    cache.update = recording_update
    try:
        yield cache
    finally:
        _OWN_ROWS.reset(token)
        del cache.update


def one_token_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
):
    """Eager attention of the newest token against a key/value cache, for the one-token path.

    q [1,H,1,e]; k/v [1,Hkv,S,e] whose last row is the query's own token (the cache appends it)
    and whose other rows are the prefix, constant in the query's input: they are detached, so
    derivatives never form the S × d key/value gradients of the cache, only those of the own
    key and value (``one_token.py``). Heads are taken one at a time as 2-D products, so a vmapped
    VJP folds its batch into the rows instead of copying the cache once per cotangent (about 30×
    faster at S = 256, d = 576). The value is plain eager attention's. Returns ([1,1,H,e],
    weights [1,H,1,S]) as the eager functions do; dropout is ignored (eval mode).
    """
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("attention sinks (s_aux) are not supported by one-token attention")
    if query.shape[0] != 1 or query.shape[-2] != 1:
        raise ValueError(f"one-token attention takes one query of batch 1, got {tuple(query.shape)}")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    H, S = query.shape[1], key.shape[-2]
    n_rep = H // key.shape[1]
    bias = mask_to_bias(attention_mask, 1, S, causal_if_none=False, device=query.device)
    own = (_OWN_ROWS.get() or {}).get(getattr(module, "layer_idx", None))
    if own is not None and own[0].shape[-2] == 1:  # the own key/value as the cache received them
        k_own, v_own = own[0][0], own[1][0]  # [Hkv, 1, e]
    else:  # sliced once (a slice's derivative spans all S rows)
        k_own, v_own = key[0, :, -1:], value[0, :, -1:]
    k_pre, v_pre = key[0, :, :-1].detach(), value[0, :, :-1].detach()  # [Hkv, S-1, e]
    outs, weights = [], []
    for h in range(H):
        g, q = h // n_rep, query[0, h]  # q: [1, e]
        z = torch.cat([_scores(q, k_pre[g], scaling, softcap), _scores(q, k_own[g], scaling, softcap)], -1)
        if bias is not None:
            z = z + bias[0, h if bias.shape[1] > 1 else 0][..., -S:]
        a = torch.softmax(z, dim=-1).to(value.dtype)  # [1, S]
        outs.append(a[:, :-1] @ v_pre[g] + a[:, -1:] * v_own[g])
        weights.append(a)
    out = torch.stack(outs, 1).unsqueeze(0)  # [1, 1, H, e]
    return out, torch.stack(weights).unsqueeze(0)


@functools.cache
def registered() -> None:
    """Register the functions (and the eager mask builder) under :data:`TOKEN_DIAGONAL` and
    :data:`ONE_TOKEN`, once, at the first switch (``attention_modes.attention_mode``): importing
    ``transformers``' model code for it at import time cost every chapter's import seconds."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(TOKEN_DIAGONAL, hf_token_diagonal_attention)
    AttentionMaskInterface.register(TOKEN_DIAGONAL, eager_mask)
    AttentionInterface.register(ONE_TOKEN, one_token_attention)
    AttentionMaskInterface.register(ONE_TOKEN, eager_mask)
