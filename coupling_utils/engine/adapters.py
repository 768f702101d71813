"""Attention adapters for architectures whose attention does not go through ``AttentionInterface``.

Each adapter reproduces its module's own computation (same weights, same operations) and routes
the attention core through :func:`~coupling_utils.engine.attention.token_diagonal_attention`.
KV caches are refused (Jacobians are taken without them). The architecture table
(``architectures.py``) names an adapter by its key in :data:`ATTENTION_ADAPTERS`;
``attention_modes.attention_mode`` patches the modules meanwhile.
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


def _falcon_qkv(self, hidden_states):
    """Queries [B,H,T,e], keys and values [B,Hkv,T,e] from the fused projection.

    FalconAttention's own layouts (transformers 5.24's ``_split_heads`` and 5.25's inline split
    take the same elements): new decoder architecture, per KV group its queries then its key and
    value; multi-query, all queries then one key and one value; otherwise q, k, v interleaved per head.
    """
    B, T = hidden_states.shape[:2]
    fused = self.query_key_value(hidden_states).view(B, T, -1, self.head_dim)
    if self.new_decoder_architecture:
        grouped = fused.view(B, T, self.num_kv_heads, -1, self.head_dim)
        q, k, v = grouped[..., :-2, :].flatten(2, 3), grouped[..., -2, :], grouped[..., -1, :]
    elif self.multi_query:
        q, k, v = fused.split([self.num_heads, 1, 1], dim=2)
    else:
        q, k, v = fused.unflatten(2, (self.num_heads, 3)).unbind(3)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _falcon_forward(
    self,
    hidden_states,
    attention_mask=None,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    *,
    alibi=None,
    **kwargs,
):
    """FalconAttention.forward with the attention core replaced (rotary or ALiBi, any KV grouping).

    Exact on transformers 5.24 and 5.25, told apart by the call, not the version: in both,
    FalconModel.forward folds ALiBi (over sqrt(head_dim)) into the 4-D float mask. 5.24's decoder
    layer also passes ``alibi=`` (keyword), and its eager path adds ALiBi to the logits a second
    time, softmax((q·k + alibi)/sqrt(e) + mask); its SDPA path uses the mask alone. 5.25 passes no
    ``alibi`` (dropped from the signature) and both paths use the mask alone. Rotary iff not
    ``config.alibi`` in both (5.24 passes ``alibi`` exactly when ``config.alibi``).
    """
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    _no_cache(layer_past, "Falcon")
    q, k, v = _falcon_qkv(self, hidden_states)
    B, _, T, _ = q.shape
    if not self.config.alibi:
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = repeat_kv(k, self.num_heads // k.shape[1]), repeat_kv(v, self.num_heads // v.shape[1])
    bias = mask_to_bias(attention_mask, T, T, causal_if_none=True, device=q.device)
    sdpa = self.config._attn_implementation == "sdpa" and not output_attentions
    if alibi is not None and not sdpa:
        # 5.24's eager ALiBi path: softmax((q·k + alibi) · inv_norm + mask)
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
