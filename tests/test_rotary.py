"""The rotary map's transpose (engine/rotary.py) against autograd on each library's own function."""

import importlib

import pytest
import torch

from coupling_utils.engine import rotary
from coupling_utils.engine.rotary import ROTATE_HALF_ROTARY, _LinearRotary, linear_rotary


def _tables(T: int, r: int, dtype=torch.float64):
    angles = torch.rand(1, T, r // 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 6
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _qk(e: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(5)
    return (torch.randn(1, H, 6, e, dtype=dtype, generator=g) for H in (4, 2))


def _widths(apply, e: int):
    """Full width, and half width where the library's function takes a partial table."""
    out = [e]
    q, k = _qk(e)
    try:
        if apply(q, k, *_tables(6, e // 2))[0].shape == q.shape:
            out.append(e // 2)
    except RuntimeError:
        pass
    return out


def _agrees_with_autograd(module, apply, r: int, e: int = 8) -> None:
    q, k = _qk(e)
    cos, sin = _tables(6, r)
    gq, gk = _qk(e)
    gq, gk = gq * 3, gk - 1
    want, back = torch.func.vjp(lambda a, b: apply(a, b, cos, sin), q, k)
    want_t = torch.func.jvp(lambda a, b: apply(a, b, cos, sin), (q, k), (gq, gk))[1]
    with linear_rotary([module]):
        held = module.apply_rotary_pos_emb
        assert held is not apply
        got, held_back = torch.func.vjp(lambda a, b: held(a, b, cos, sin), q, k)
        tangents = torch.func.jvp(lambda a, b: held(a, b, cos, sin), (q, k), (gq, gk))[1]
    assert module.apply_rotary_pos_emb is apply  # restored
    for a, b in zip(got, want):
        assert torch.equal(a, b)  # values are the library's own
    for a, b in zip((*held_back((gq, gk)), *tangents), (*back((gq, gk)), *want_t)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ROTATE_HALF_ROTARY)
def test_the_transpose_is_autograds_on_the_librarys_own_function(name):
    module = importlib.import_module(name)
    apply = module.apply_rotary_pos_emb
    widths = _widths(apply, 8)
    for r in widths:
        _agrees_with_autograd(module, apply, r)
    assert len(widths) == (2 if name.endswith(("gpt_neox", "phi3")) else 1)


def test_products_come_back_in_each_inputs_dtype_rounded_once():
    # OLMo casts its result back to the input's dtype: a bfloat16 query with float32 tables. The
    # transpose rounds each product once, where autograd rounds both terms to bfloat16 and adds
    module = importlib.import_module("transformers.models.olmo.modeling_olmo")
    q, k = (x.to(torch.bfloat16) for x in _qk(8))
    cos, sin = _tables(6, 8, torch.float32)
    g = tuple(x.to(torch.bfloat16) for x in _qk(8))

    def products(a, b, c, s, cotangents):
        return torch.func.vjp(lambda x, y: module.apply_rotary_pos_emb(x, y, c, s), a, b)[1](cotangents)

    truth = products(q.double(), k.double(), cos.double(), sin.double(), tuple(x.double() for x in g))
    want = products(q, k, cos, sin, g)
    with linear_rotary([module]):
        got = products(q, k, cos, sin, g)
    for a, b, t in zip(got, want, truth):
        assert a.dtype == b.dtype == torch.bfloat16
        assert (a.double() - t).abs().max() <= (b.double() - t).abs().max()
        torch.testing.assert_close(a, b, atol=1e-2, rtol=1e-1)


@pytest.mark.parametrize("depends", ["cos", "sin"])
def test_tables_that_depend_on_the_input_keep_autograds_rule(depends):
    module = importlib.import_module("transformers.models.llama.modeling_llama")
    q, k = _qk(8)
    tables = dict(zip(("cos", "sin"), _tables(6, 8)))
    tables[depends].requires_grad_()
    calls = []
    original = _LinearRotary.apply
    _LinearRotary.apply = lambda *a: calls.append(a) or original(*a)
    try:
        with linear_rotary([module]):
            out = module.apply_rotary_pos_emb(q, k, **tables)
            assert sum(o.sum() for o in out).backward() is None
            assert calls == [] and tables[depends].grad is not None
            module.apply_rotary_pos_emb(q, k, *(t.detach() for t in tables.values()))
            assert len(calls) == 1
    finally:
        _LinearRotary.apply = original


def test_heads_after_tokens_unsqueeze_the_tables_where_the_caller_says():
    # unsqueeze_dim=2: q and k laid out [B, T, H, e] (the tables [B, T, r] then broadcast over H)
    module = importlib.import_module("transformers.models.gpt_neox.modeling_gpt_neox")
    apply = module.apply_rotary_pos_emb
    q, k = (x.transpose(1, 2) for x in _qk(8))
    cos, sin = _tables(6, 4)
    g = tuple(x.transpose(1, 2) for x in _qk(8))
    want = apply(q, k, cos, sin, 2)
    with linear_rotary([module]):
        held = module.apply_rotary_pos_emb
        got, back = torch.func.vjp(lambda a, b: held(a, b, cos, sin, 2), q, k)
        tangents = torch.func.jvp(lambda a, b: held(a, b, cos, sin, 2), (q, k), g)[1]
        cos.requires_grad_()
        assert all(torch.equal(a, b) for a, b in zip(held(q, k, cos, sin, 2), want))
    cos.requires_grad_(False)
    want_back = torch.func.vjp(lambda a, b: apply(a, b, cos, sin, 2), q, k)[1](g)
    want_t = torch.func.jvp(lambda a, b: apply(a, b, cos, sin, 2), (q, k), g)[1]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for a, b in zip((*back(g), *tangents), (*want_back, *want_t)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_sweep_uses_it_and_the_oracle_does_not():
    from coupling_utils.engine.architectures import tiny_model
    from coupling_utils.engine.jacobians import reference_jacobians, token_jacobians

    model = tiny_model("gpt_neox")
    ids = torch.arange(1, 7).unsqueeze(0)
    calls = []
    original = _LinearRotary.apply
    _LinearRotary.apply = lambda *a: calls.append(a) or original(*a)
    try:
        reference_jacobians(model, ids, 0, tokens=[5])
        assert calls == []
        token_jacobians(model, ids, 0)
        assert calls
    finally:
        _LinearRotary.apply = original


def test_a_replaced_function_is_restored_after_an_error_and_not_wrapped_twice():
    module = importlib.import_module("transformers.models.gpt_neox.modeling_gpt_neox")
    apply = module.apply_rotary_pos_emb
    with pytest.raises(KeyError), linear_rotary([module]):
        held = module.apply_rotary_pos_emb
        with linear_rotary([module]):
            assert module.apply_rotary_pos_emb is held
        assert module.apply_rotary_pos_emb is held
        raise KeyError
    assert module.apply_rotary_pos_emb is apply


def test_only_the_blocks_own_library_is_named():
    from coupling_utils.engine.architectures import tiny_model

    block = tiny_model("gpt_neox").gpt_neox.layers[0]
    assert rotary.rotary_modules(block) == [importlib.import_module(ROTATE_HALF_ROTARY[-3])]
    assert rotary.rotary_modules(tiny_model("gpt2").transformer.h[0]) == []
