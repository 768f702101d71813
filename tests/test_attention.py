"""attention.py's helpers against hand-built masks and PyTorch's own attention (no model needed)."""

from __future__ import annotations

import types

import pytest
import torch

from coupling_utils.engine.attention import (
    hf_token_diagonal_attention,
    mask_to_bias,
    one_token_attention,
    own_rows,
    plain_attention,
    repeat_kv,
    token_diagonal_attention,
)

NEG = torch.finfo(torch.float32).min


def test_mask_to_bias_builds_the_causal_mask_when_sdpa_left_it_out():
    bias = mask_to_bias(None, 3, 5, causal_if_none=True)
    allowed = torch.tensor(  # query t sees keys up to t + (5 - 3): a cache of 2 earlier keys
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool
    )
    expected = torch.where(allowed, torch.tensor(0.0), torch.tensor(NEG))
    assert bias.dtype == torch.float32 and bias.shape == (3, 5)
    assert torch.equal(bias, expected)
    assert mask_to_bias(None, 1, 5, causal_if_none=True) is None  # one query sees every key
    assert mask_to_bias(None, 3, 3, causal_if_none=False) is None
    meta = mask_to_bias(None, 2, 2, causal_if_none=True, device="meta")
    assert meta.device.type == "meta"


def test_mask_to_bias_boolean_conventions_and_additive_masks():
    keep = torch.tensor([[True, False], [True, True]])
    sdpa = mask_to_bias(keep, 2, 2, causal_if_none=False)
    assert torch.equal(sdpa, torch.tensor([[0.0, NEG], [0.0, 0.0]]))
    mpt = mask_to_bias(~keep, 2, 2, causal_if_none=False, masked_is_true=True)  # True = masked
    assert torch.equal(mpt, sdpa)
    additive = torch.tensor([[0.0, -5.0], [1.0, 0.0]], dtype=torch.float16)
    out = mask_to_bias(additive, 2, 2, causal_if_none=True)
    assert out.dtype == torch.float32 and torch.equal(out, additive.float())


def test_repeat_kv_repeats_each_head_in_place():
    x = torch.arange(2 * 3 * 4).reshape(1, 2, 3, 4).float()
    assert repeat_kv(x, 1) is x
    y = repeat_kv(x, 3)
    assert y.shape == (1, 6, 3, 4)
    for h in range(6):
        assert torch.equal(y[0, h], x[0, h // 3])


def _qkv(B=1, H=2, T=5, e=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, e, generator=g, dtype=dtype) for _ in range(3)]


def test_plain_attention_matches_pytorch_and_keeps_the_value_dtype():
    q, k, v = _qkv()
    out, a = plain_attention(q, k, v, mask_to_bias(None, 5, 5, causal_if_none=True), scaling=0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(out, ref)
    assert torch.allclose(a.sum(-1), torch.ones(1, 2, 5, dtype=a.dtype))
    q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, k, v))
    out16, _ = plain_attention(q16, k16, v16, scaling=0.5)
    assert out16.dtype == torch.bfloat16


def test_token_diagonal_attention_refuses_a_kv_cache():
    q, k, v = _qkv(T=4)
    k5, v5 = _qkv(T=5)[1:]
    with pytest.raises(
        ValueError,
        match=r"^token-diagonal attention needs self-attention without a KV cache \(queries 4, keys 5\); "
        r"call the block with use_cache=False$",
    ):
        token_diagonal_attention(q, k5, v5, scaling=1.0)
    out, _ = token_diagonal_attention(q, k, v, scaling=1.0)
    torch.testing.assert_close(out, plain_attention(q, k, v, scaling=1.0)[0], rtol=0, atol=0)


def test_token_diagonal_attention_batched_and_multi_head_derivatives():
    """Batch of 2, 2 heads: ∂o_t/∂v_s is a_tt I for s = t and 0 otherwise, in every batch and head."""
    q, k, v = _qkv(B=2, T=4)
    v = v.requires_grad_(True)
    out, a = token_diagonal_attention(q, k, v, scaling=0.5)
    for b, h, t in ((0, 0, 1), (1, 1, 3), (1, 0, 0)):
        (g,) = torch.autograd.grad(out[b, h, t, 0], v, retain_graph=True)
        expected = torch.zeros_like(v)
        expected[b, h, t, 0] = a[b, h, t, t]
        torch.testing.assert_close(g, expected)


class _Module(types.SimpleNamespace):
    pass


def test_hf_wrapper_matches_sdpa_with_grouped_heads_and_its_masks():
    """The AttentionInterface signature: GQA, default scaling, causal when the mask is left out."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 5, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, repeat_kv(k, 2), repeat_kv(v, 2), is_causal=True
    ).transpose(1, 2)
    out, weights = hf_token_diagonal_attention(_Module(is_causal=True), q, k, v, None)
    assert out.shape == (1, 5, 4, 8) and out.is_contiguous()
    torch.testing.assert_close(out, ref)
    assert weights.shape == (1, 4, 5, 5) and float(weights[0, 0, 0, 1]) == 0.0
    # not causal (an encoder): every key is seen
    full = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 2), repeat_kv(v, 2)).transpose(
        1, 2
    )
    torch.testing.assert_close(hf_token_diagonal_attention(_Module(), q, k, v, None)[0], full)
    torch.testing.assert_close(hf_token_diagonal_attention(_Module(is_causal=False), q, k, v, None)[0], full)
    # an explicit scaling, and a mask longer than the keys (cut to them)
    mask = torch.zeros(1, 1, 5, 7, dtype=torch.float64)
    mask[..., 2] = NEG
    got = hf_token_diagonal_attention(_Module(is_causal=True), q, k, v, mask, scaling=0.3)[0]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask[..., :5], scale=0.3
    ).transpose(1, 2)
    torch.testing.assert_close(got, want)
    with pytest.raises(
        NotImplementedError,
        match=r"^attention sinks \(s_aux\) are not supported by token-diagonal attention$",
    ):
        hf_token_diagonal_attention(_Module(), q, k, v, None, s_aux=torch.zeros(4))
    hf_token_diagonal_attention(_Module(), q, k, v, None, s_aux=None)  # None: no sinks


REGISTERED_AT_FIRST_SWITCH = """
import sys
from coupling_utils.chapters import NAMES, chapter
for name in NAMES:
    chapter(name)
assert "transformers" not in sys.modules, "importing a chapter imported transformers"
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.engine.attention import (
    ONE_TOKEN, TOKEN_DIAGONAL, hf_token_diagonal_attention, one_token_attention,
)
from coupling_utils.engine.attention_modes import attention_mode
assert TOKEN_DIAGONAL not in AttentionInterface._global_mapping
with attention_mode(tiny_model("llama"), token_diagonal=True):
    pass
assert AttentionInterface._global_mapping[TOKEN_DIAGONAL] is hf_token_diagonal_attention
assert AttentionMaskInterface._global_mapping[TOKEN_DIAGONAL] is eager_mask
assert AttentionInterface._global_mapping[ONE_TOKEN] is one_token_attention
assert AttentionMaskInterface._global_mapping[ONE_TOKEN] is eager_mask
"""


def test_a_chapter_imports_no_transformers_and_the_first_switch_registers_the_functions():
    """Every papermill kernel imports its chapter: ``transformers``' model code (seconds) waits
    until a model is switched, which registers the attention functions under their names."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", REGISTERED_AT_FIRST_SWITCH], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_low_precision_scores_are_computed_in_fp32():
    """bf16 queries and keys: logits and softmax in fp32, then cast to the value dtype."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(seed=3))
    out, a = plain_attention(q, k, v, scaling=0.5)
    z = (q.float() @ k.float().transpose(-1, -2)) * 0.5
    want = torch.softmax(z, dim=-1).to(torch.bfloat16)
    assert torch.equal(a, want) and torch.equal(out, want @ v)
    td, _ = token_diagonal_attention(q, k, v, scaling=0.5)
    assert td.dtype == torch.bfloat16 and torch.equal(td, out)


def test_masks_stay_on_the_device_of_their_input():
    keep = torch.ones(2, 2, dtype=torch.bool, device="meta")
    assert mask_to_bias(keep, 2, 2, causal_if_none=False).device.type == "meta"
    q, k, v = (t.to("meta") for t in _qkv())
    out, _ = hf_token_diagonal_attention(_Module(is_causal=True), q, k, v, None)
    assert out.device.type == "meta"


def test_hf_wrapper_cuts_a_mask_as_long_as_the_head_count():
    """A mask longer than the keys is cut to the keys even when its length equals the heads."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 3, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 3, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
    mask[..., 1] = NEG
    got = hf_token_diagonal_attention(_Module(), q, k, v, mask)[0]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, repeat_kv(k, 2), repeat_kv(v, 2), attn_mask=mask[..., :3]
    ).transpose(1, 2)
    torch.testing.assert_close(got, want)


def test_hf_wrapper_cuts_a_per_head_mask_as_long_as_it_is_wide():
    """A per-head mask [B, H, T, S + 2] with H = S is still cut to the S keys."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 3, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(1, 3, 3, 5, dtype=torch.float64)
    mask[0, 1, :, 0] = NEG
    got = hf_token_diagonal_attention(_Module(), q, k, v, mask)[0]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[..., :3]).transpose(1, 2)
    torch.testing.assert_close(got, want)


def _one_token_qkv(H=4, Hkv=2, S=6, e=8, dtype=torch.float64, seed=7):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, 1, e, generator=g, dtype=dtype)
    k, v = (torch.randn(1, Hkv, S, e, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v


def _eager(q, k, v, bias=None, *, scaling, softcap=None):
    """Plain eager attention over the repeated keys/values, in one_token_attention's [1, 1, H, e] layout."""
    n_rep = q.shape[1] // k.shape[1]
    out, a = plain_attention(
        q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), bias, scaling=scaling, softcap=softcap
    )
    return out.transpose(1, 2), a


def test_one_token_attention_is_plain_attention_with_grouped_heads_and_default_scaling():
    """GQA (4 query heads on 2 key/value heads), scaling 1/sqrt(e) when left out, no layer_idx."""
    q, k, v = _one_token_qkv()
    out, weights = one_token_attention(_Module(), q, k, v, None)
    want, want_weights = _eager(q, k, v, scaling=8**-0.5)
    assert out.shape == (1, 1, 4, 8) and weights.shape == (1, 4, 1, 6)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)
    # an explicit scaling and logit soft-capping (Gemma 2), multi-query attention (one key/value head)
    q, k, v = _one_token_qkv(H=3, Hkv=1, seed=8)
    out, weights = one_token_attention(_Module(), q, k, v, None, scaling=0.9, softcap=1.5)
    want, want_weights = _eager(q, k, v, scaling=0.9, softcap=1.5)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)


def test_one_token_attention_keeps_the_value_dtype():
    """bf16 inputs: softmax in fp32, weights and output in bf16 as plain eager attention gives them."""
    q, k, v = (t.to(torch.bfloat16) for t in _one_token_qkv(seed=9))
    out, weights = one_token_attention(_Module(), q, k, v, None, scaling=0.5)
    want, want_weights = _eager(q, k, v, scaling=0.5)
    assert out.dtype == weights.dtype == torch.bfloat16
    torch.testing.assert_close(out, want, atol=1e-2, rtol=1e-2)  # bf16 sums in another order
    torch.testing.assert_close(weights, want_weights)


def test_one_token_attention_applies_shared_and_per_head_masks():
    """A boolean padding mask, a sliding-window mask longer than the keys (its last S columns are the
    keys'), and an ALiBi-like per-head additive bias on 2 heads."""
    q, k, v = _one_token_qkv(H=2, Hkv=1, S=5, seed=10)
    keep = torch.tensor([[[[False, True, True, False, True]]]])  # [1, 1, 1, S]
    out, weights = one_token_attention(_Module(), q, k, v, keep, scaling=0.5)
    want, want_weights = _eager(q, k, v, mask_to_bias(keep, 1, 5, causal_if_none=False), scaling=0.5)
    torch.testing.assert_close(out, want)
    assert torch.all(weights[..., 0] == 0) and torch.all(weights[..., 3] == 0)
    torch.testing.assert_close(weights, want_weights)
    window = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    window[..., :5] = NEG  # 8 columns, the first 5 (3 before the keys, 2 of them) outside the window
    out, _ = one_token_attention(_Module(), q, k, v, window, scaling=0.5)
    torch.testing.assert_close(out, _eager(q, k, v, window[..., -5:], scaling=0.5)[0])
    slopes = torch.tensor([0.5, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    alibi = slopes * (torch.arange(5, dtype=torch.float64) - 4)  # [1, 2, 1, S]: each head its own bias
    out, weights = one_token_attention(_Module(), q, k, v, alibi, scaling=0.5)
    want, want_weights = _eager(q, k, v, alibi, scaling=0.5)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)


def test_one_token_attention_refuses_more_than_one_query_and_attention_sinks():
    q, k, v = _one_token_qkv()
    for shape in ((2, 4, 1, 8), (1, 4, 2, 8)):
        with pytest.raises(
            ValueError,
            match=rf"^one-token attention takes one query of batch 1, got \({shape[0]}, 4, {shape[2]}, 8\)$",
        ):
            one_token_attention(_Module(), torch.zeros(shape, dtype=q.dtype), k, v, None)
    with pytest.raises(
        NotImplementedError,
        match=r"^attention sinks \(s_aux\) are not supported by one-token attention$",
    ):
        one_token_attention(_Module(), q, k, v, None, s_aux=torch.zeros(4))
    one_token_attention(_Module(), q, k, v, None, s_aux=None)  # None: no sinks


class _Cache:
    """A one-layer key/value cache whose update appends the new rows, as ``transformers``' caches do."""

    def __init__(self, key, value):
        self.key, self.value = key, value

    def update(self, key_states, value_states, layer_idx):
        self.key = torch.cat([self.key, key_states], -2)
        self.value = torch.cat([self.value, value_states], -2)
        return self.key, self.value


def test_one_token_attention_gives_plain_attentions_derivatives_for_the_own_key_and_value():
    """With and without own_rows: the value is plain attention's, the own key/value get plain attention's
    gradient, and the cached prefix none (it is constant in the query's input)."""
    q, k, v = _one_token_qkv(S=5, seed=11)
    k_own, v_own = (t[:, :, -1:].clone().requires_grad_(True) for t in (k, v))
    k_pre, v_pre = (t[:, :, :-1].clone().requires_grad_(True) for t in (k, v))
    cot = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    want = _eager(q, torch.cat([k_pre, k_own], -2), torch.cat([v_pre, v_own], -2), scaling=0.5)[0]
    want_grads = torch.autograd.grad((want * cot).sum(), (k_own, v_own))
    cache = _Cache(k_pre.detach(), v_pre.detach())  # the prefix as the cache holds it
    with own_rows(cache):
        key, value = cache.update(k_own, v_own, 3)
        assert not key.requires_grad  # the cache holds detached rows ...
        out, _ = one_token_attention(_Module(layer_idx=3), q, key, value, None, scaling=0.5)
    assert "update" not in vars(cache)  # ... only while own_rows lasts
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(torch.autograd.grad((out * cot).sum(), (k_own, v_own)), want_grads)
    # outside own_rows the own row is sliced from the keys/values it is given
    key, value = torch.cat([k_pre, k_own], -2), torch.cat([v_pre, v_own], -2)
    out, _ = one_token_attention(_Module(layer_idx=3), q, key, value, None, scaling=0.5)
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad((out * cot).sum(), (k_own, v_own, k_pre, v_pre), allow_unused=True)
    torch.testing.assert_close(grads[:2], want_grads)
    assert all(g is None or not g.any() for g in grads[2:])
