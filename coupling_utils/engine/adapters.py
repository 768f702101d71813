"""Attention adapters for architectures whose attention does not go through ``AttentionInterface``.

Each adapter reproduces its module's own computation (same weights, same operations) and routes
the attention core through :func:`~coupling_utils.engine.attention.token_diagonal_attention`.
KV caches are refused (Jacobians are taken without them). The architecture table
(``architectures.py``) names an adapter by its key in :data:`ATTENTION_ADAPTERS`;
``architectures.attention_mode`` patches the modules meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from coupling_utils.engine.attention import mask_to_bias, repeat_kv, token_diagonal_attention

__all__ = ["ATTENTION_ADAPTERS"]


def _no_cache(cache, name):
    if cache is not None:
        raise ValueError(
            f"{name}: token-diagonal attention runs without a KV cache; call with use_cache=False"
        )


def _gpt_neo_attn(self, query, key, value, attention_mask=None):
    """GPTNeoSelfAttention._attn: unscaled logits, causal/local mask from the ``bias`` buffer."""
    T, S = query.size(-2), key.size(-2)
    allowed = self.bias[:, :, S - T : S, :S]
    bias = mask_to_bias(allowed, T, S, causal_if_none=True)
    if attention_mask is not None:
        bias = (bias + attention_mask.float()).clamp(min=torch.finfo(torch.float32).min)
    return token_diagonal_attention(query, key, value, bias, scaling=1.0)


def _gpt_neo_forward(
    self,
    hidden_states,
    attention_mask=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    **kwargs,
):
    _no_cache(layer_past, "GPT-Neo")
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

    return GPTNeoSelfAttention.forward(self, hidden_states, attention_mask=attention_mask)


def _falcon_forward(
    self,
    hidden_states,
    alibi,
    attention_mask,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    **kwargs,
):
    """FalconAttention.forward with the attention core replaced (rotary or ALiBi, any KV grouping)."""
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    _no_cache(layer_past, "Falcon")
    q, k, v = self._split_heads(self.query_key_value(hidden_states))
    B, T = q.shape[:2]
    n_kv = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    q = q.transpose(1, 2).reshape(B, self.num_heads, T, self.head_dim)
    k = k.transpose(1, 2).reshape(B, n_kv, T, self.head_dim)
    v = v.transpose(1, 2).reshape(B, n_kv, T, self.head_dim)
    if alibi is None:
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = repeat_kv(k, self.num_heads // n_kv), repeat_kv(v, self.num_heads // n_kv)
    bias = mask_to_bias(attention_mask, T, T, causal_if_none=True, device=q.device)
    sdpa = self.config._attn_implementation == "sdpa" and not output_attentions
    if alibi is not None and not sdpa:
        # eager ALiBi path: softmax((q·k + alibi) · inv_norm + mask)
        bias = alibi.view(B, self.num_heads, 1, -1).float() * self.inv_norm_factor + bias
    out, weights = token_diagonal_attention(q, k, v, bias, scaling=self.inv_norm_factor)
    out = out.permute(0, 2, 1, 3).reshape(B, T, self.num_heads * self.head_dim)
    return self.dense(out), weights


def _mpt_forward(self, hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
    """MptAttention.forward with the attention core replaced (ALiBi bias; boolean mask, True = masked)."""
    _no_cache(cache, "MPT")
    B, T = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (x.reshape(B, T, self.n_heads, self.head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=2))
    bias = torch.zeros(T, T, device=q.device)
    if position_bias is not None:
        pb = position_bias[:, max(0, position_bias.size(1) - T) :, max(0, position_bias.size(2) - T) :]
        bias = bias + pb.float()
    if attention_mask is not None:
        bias = bias.masked_fill(attention_mask, torch.finfo(torch.float32).min)
    out, weights = token_diagonal_attention(q, k, v, bias, scaling=self.softmax_scale)
    out = out.permute(0, 2, 1, 3).reshape(B, T, -1)
    return self.out_proj(out), weights


# adapter key -> (attention module class name, {method name: replacement})
ATTENTION_ADAPTERS: dict[str, tuple[str, dict[str, Callable]]] = {
    "gpt_neo": ("GPTNeoSelfAttention", {"forward": _gpt_neo_forward, "_attn": _gpt_neo_attn}),
    "falcon": ("FalconAttention", {"forward": _falcon_forward}),
    "mpt": ("MptAttention", {"forward": _mpt_forward}),
}
