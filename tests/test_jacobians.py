"""Block Jacobians: the one-sweep token-diagonal method against the authors' per-token method and
against a full autograd Jacobian of the ordinary block, for every architecture in the table."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import ARCHITECTURES, find_architecture, tiny_model
from coupling_utils.engine.blocks import block_function
from coupling_utils.engine.jacobians import (
    check_finite,
    context_jacobians,
    reference_jacobians,
    token_jacobians,
)

CASES = [(a.model_types[0], None) for a in ARCHITECTURES] + [
    (a.model_types[0], v) for a in ARCHITECTURES for v in a.tiny_variants
]


def _inputs(model, T=10):
    row = find_architecture(model)
    if row.modality == "vision":
        c = row.tiny
        return {"pixel_values": torch.randn(1, c["num_channels"], c["image_size"], c["image_size"])}
    return torch.randint(0, 64, (1, T))


def rel(a, b):
    return float((a - b).norm() / b.norm())


def full_jacobian(model, inputs, layer):
    """[T, d, T, d] = ∂f(X)_{t2} / ∂x_{t1} of the ordinary block (autograd), indexed [t2, :, t1, :]."""
    f, X = block_function(model, inputs, layer, token_diagonal=False)
    return torch.autograd.functional.jacobian(f, X, vectorize=True)


@pytest.mark.parametrize("model_type,variant", CASES, ids=[f"{t}-{v}" if v else t for t, v in CASES])
def test_token_context_and_reference_jacobians_agree(model_type, variant):
    model = tiny_model(model_type, variant=variant)
    x = _inputs(model)
    layer = 1
    J = token_jacobians(model, x, layer)
    R = reference_jacobians(model, x, layer)
    F = full_jacobian(model, x, layer)
    T, d = J.shape[:2]
    assert J.shape == (T, d, d) and J.dtype == torch.float32 and T >= 8
    diag = torch.stack([F[t, :, t, :] for t in range(T)])
    assert rel(R, diag) <= 1e-5
    assert rel(J, R) <= 1e-5, "token-diagonal sweep differs from the per-token reference"
    assert float(R.norm()) > 1e-3
    t2 = T - 3
    C = context_jacobians(model, x, layer, t2)
    assert C.shape == (T, d, d)
    assert rel(C, F[t2].permute(1, 0, 2)) <= 1e-5
    torch.testing.assert_close(C[t2], J[t2], rtol=1e-4, atol=1e-5)
    later = C[t2 + 1 :].abs().max()
    causal = find_architecture(model).causal == "causal" or variant == "decoder"
    if causal:
        assert later == 0, "a causal block's output cannot depend on later tokens"
    else:
        assert later > 0, "a bidirectional block's output depends on later tokens"


def test_identity_subtracted_only_on_the_diagonal():
    """f = block(X) − X: the own-token Jacobian is ∂F/∂x − I, cross-token ones carry no identity."""
    model = tiny_model("llama")
    x = _inputs(model)
    f, X = block_function(model, x, 0, token_diagonal=False)
    block = lambda X: f(X) + X  # noqa: E731  (the block itself, F(X))
    G = torch.autograd.functional.jacobian(block, X, vectorize=True)
    C = context_jacobians(model, x, 0, 5)
    eye = torch.eye(X.shape[1])
    torch.testing.assert_close(C[5], G[5, :, 5, :] - eye, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(C[2], G[5, :, 2, :], rtol=1e-5, atol=1e-5)


def test_chunking_token_subsets_and_negative_indices():
    model = tiny_model("gpt_neox")
    x = _inputs(model, T=9)
    J = token_jacobians(model, x, -1)
    for chunk in (1, 5, 64):
        torch.testing.assert_close(token_jacobians(model, x, 1, chunk_size=chunk), J, rtol=1e-6, atol=1e-6)
    sub = token_jacobians(model, x, 1, tokens=[-1, 0])
    torch.testing.assert_close(sub, J[[8, 0]])
    torch.testing.assert_close(
        reference_jacobians(model, x, 1, tokens=-1, chunk_size=7)[0], J[8], rtol=1e-5, atol=1e-6
    )
    with pytest.raises(IndexError):
        token_jacobians(model, x, 1, tokens=[9])
    with pytest.raises(ValueError, match="chunk_size"):
        token_jacobians(model, x, 1, chunk_size=0)


def test_forward_mode_products_through_token_diagonal_blocks():
    """A JVP with a tangent on every token returns J_tt v_t for all t at once."""
    model = tiny_model("qwen2")
    x = _inputs(model)
    f, X = block_function(model, x, 1, token_diagonal=True)
    V = torch.randn_like(X)
    _, jv = torch.func.jvp(f, (X,), (V,))
    J = token_jacobians(model, x, 1)
    torch.testing.assert_close(jv, torch.einsum("tij,tj->ti", J, V), rtol=1e-4, atol=1e-5)


def test_parameters_frozen_during_and_restored_after():
    model = tiny_model("llama").requires_grad_(True)
    attn = model.config._attn_implementation
    token_jacobians(model, _inputs(model), 0)
    context_jacobians(model, _inputs(model), 0, 3)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert model.config._attn_implementation == attn


def test_nan_is_reported_with_layer_and_tokens():
    model = tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 7, 4, 5, 6, 8]])
    with torch.no_grad():
        model.model.embed_tokens.weight[7] = float("nan")
    # (a NaN key reaches every query through the masked logits, so every token is named)
    with pytest.raises(
        ValueError, match=r"NaN/inf in the block Jacobian at layer 0, token\(s\) \[0, 1, 2, 3"
    ):
        token_jacobians(model, ids, 0)
    with pytest.raises(ValueError, match="NaN/inf in the context Jacobian"):
        context_jacobians(model, ids, 0, 6)


def test_check_finite_names_the_bad_tokens():
    J = torch.zeros(3, 4, 4)
    check_finite(J, 2, [5, 6, 7])
    J[1, 0, 3] = float("inf")
    with pytest.raises(ValueError, match=r"layer 2, token\(s\) \[6\]"):
        check_finite(J, 2, [5, 6, 7])


def test_bfloat16_model_gives_fp32_jacobians_close_to_fp32():
    model = tiny_model("llama")
    x = _inputs(model)
    J32 = token_jacobians(model, x, 1)
    model16 = tiny_model("llama").to(torch.bfloat16)
    J16 = token_jacobians(model16, x, 1)
    R16 = reference_jacobians(model16, x, 1)
    assert J16.dtype == torch.float32 and torch.isfinite(J16).all()
    assert rel(J16, J32) < 5e-2
    assert rel(J16, R16) < 2e-2


def test_accepts_a_loaded_model(tmp_path):
    from coupling_utils.models.loading import load_model

    model = tiny_model("phi")
    model.save_pretrained(tmp_path)
    lm = load_model(tmp_path, device="cpu")
    x = _inputs(model)
    torch.testing.assert_close(token_jacobians(lm, x, 0), token_jacobians(model, x, 0), rtol=1e-5, atol=1e-6)
    from coupling_utils.engine.architectures import transformer_blocks
    from coupling_utils.engine.blocks import residual_stream

    assert transformer_blocks(lm) is lm.model.model.layers
    torch.testing.assert_close(residual_stream(lm, x), residual_stream(model, x))


SDPA_CASES = [
    ("falcon", None),
    ("falcon", "alibi"),
    ("falcon", "new_decoder"),
    ("llama", None),
    ("bert", None),
]


@pytest.mark.parametrize(
    "model_type,variant", SDPA_CASES, ids=[f"{t}-{v}" if v else t for t, v in SDPA_CASES]
)
def test_models_loaded_with_sdpa_attention(model_type, variant):
    """load_model keeps the default (SDPA) implementation: masks then come in SDPA's format."""
    model = tiny_model(model_type, variant=variant, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"
    x = _inputs(model)
    J = token_jacobians(model, x, 1, tokens=[0, 4, 9])
    R = reference_jacobians(model, x, 1, tokens=[0, 4, 9])
    assert rel(J, R) <= 1e-5
    assert model.config._attn_implementation == "sdpa"


def test_multimodal_gemma3_uses_its_language_model_blocks():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from coupling_utils.engine.architectures import transformer_blocks

    row = find_architecture(tiny_model("gemma3_text"))
    config = Gemma3Config(
        text_config=dict(row.tiny),
        vision_config=dict(
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
    )
    config._attn_implementation_internal = "eager"
    model = Gemma3ForConditionalGeneration(config).eval().requires_grad_(False)
    assert find_architecture(model) is row and len(transformer_blocks(model)) == 2
    x = torch.randint(0, 64, (1, 10))
    assert rel(token_jacobians(model, x, 1), reference_jacobians(model, x, 1)) <= 1e-5
