"""The architecture table, token-diagonal attention and block capture (tiny random models, CPU)."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import (
    ARCHITECTURES,
    UnsupportedArchitectureError,
    find_architecture,
    supported_architectures,
    tiny_model,
    transformer_blocks,
)
from coupling_utils.engine.attention import TOKEN_DIAGONAL, plain_attention, token_diagonal_attention
from coupling_utils.engine.attention_modes import attention_mode
from coupling_utils.engine.blocks import block_function, residual_stream


def inputs_for(row, T=10):
    if row.modality == "vision":
        return {
            "pixel_values": torch.randn(
                1, row.tiny["num_channels"], row.tiny["image_size"], row.tiny["image_size"]
            )
        }
    return torch.randint(0, 64, (1, T))


def test_table_dataframe_has_one_row_per_architecture():
    df = supported_architectures()
    assert list(df["name"]) == [a.name for a in ARCHITECTURES]
    assert {"name", "model_types", "examples", "attention", "notes"} <= set(df.columns)
    for name in [
        "GPT-2",
        "GPT-Neo",
        "GPT-J",
        "GPT-NeoX (Pythia)",
        "OPT",
        "Llama",
        "Mistral",
        "Gemma",
        "Gemma-2",
        "Gemma-3 (text)",
        "Qwen2 (Qwen1.5)",
        "Phi",
        "Phi-3",
        "Falcon",
        "OLMo",
        "OLMo-2",
        "MPT",
        "BERT",
        "ViT",
    ]:
        assert name in set(df["name"]), name
    assert set(df.loc[df.name == "BERT", "attention"]) == {"bidirectional or causal"}
    assert set(df.loc[df.name == "Llama", "attention"]) == {"causal"}
    types = [t for a in ARCHITECTURES for t in a.model_types]
    assert len(types) == len(set(types)), "a model_type appears in two rows"


def test_unsupported_architecture_lists_the_supported_ones():
    from transformers import T5Config

    with pytest.raises(UnsupportedArchitectureError) as e:
        find_architecture(T5Config(d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=16, vocab_size=32))
    msg = str(e.value)
    assert "'t5'" in msg and "GPT-2" in msg and "Llama" in msg and "ViT" in msg


@pytest.mark.parametrize("row", ARCHITECTURES, ids=[a.model_types[0] for a in ARCHITECTURES])
def test_every_row_finds_its_blocks_and_restores_attention(row):
    model = tiny_model(row.model_types[0])
    assert find_architecture(model) is row
    blocks = transformer_blocks(model)
    assert len(blocks) == 2 and type(blocks[0]).__name__ == row.block_class
    before = model.config._attn_implementation
    forwards = {id(m): dict(m.__dict__) for m in model.modules()}
    with pytest.raises(RuntimeError, match="boom"), attention_mode(model, token_diagonal=True):
        if row.attention == "interface":
            assert model.config._attn_implementation == TOKEN_DIAGONAL
        else:  # the adapter patched the attention modules
            assert any("forward" in m.__dict__ for m in model.modules())
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert all(set(m.__dict__) == set(forwards[id(m)]) for m in model.modules())


def test_the_configs_switched_are_found_once_and_again_after_the_config_is_replaced():
    import copy

    model = tiny_model("llama")
    with attention_mode(model, token_diagonal=True):
        assert model.config._attn_implementation == TOKEN_DIAGONAL
    model.config = copy.deepcopy(model.config)  # the walk found the old one
    for m in model.modules():
        if hasattr(m, "config"):
            m.config = model.config
    with attention_mode(model, token_diagonal=True):
        assert model.config._attn_implementation == TOKEN_DIAGONAL
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("row", ARCHITECTURES, ids=[a.model_types[0] for a in ARCHITECTURES])
def test_token_diagonal_block_has_the_same_forward_value(row):
    model = tiny_model(row.model_types[0])
    x = inputs_for(row)
    f_plain, X = block_function(model, x, 1, token_diagonal=False)
    f_diag, X2 = block_function(model, x, 1, token_diagonal=True)
    torch.testing.assert_close(X, X2, rtol=1e-6, atol=1e-6)
    y = f_plain(X)
    assert y.shape == X.shape and y.abs().max() > 0
    # exact for the interface (same eager math); adapters reorder a few fp32 operations
    tol = 0 if row.attention == "interface" else 1e-5
    torch.testing.assert_close(f_diag(X), y, rtol=tol, atol=tol)


def _attention_cases():
    B, H, T, e = 1, 2, 6, 4
    q, k, v = (torch.randn(B, H, T, e, dtype=torch.float64) for _ in range(3))
    causal = torch.zeros(T, T, dtype=torch.float64).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), -1e30
    )
    alibi = -0.5 * (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().double()
    return (
        q,
        k,
        v,
        [
            ("bidirectional", None, None),
            ("causal", causal, None),
            ("causal+alibi", causal + alibi, None),
            ("softcap", causal, 1.5),
        ],
    )


@pytest.mark.parametrize("case", range(4))
def test_token_diagonal_attention_keeps_exactly_the_diagonal_derivatives(case):
    q, k, v, cases = _attention_cases()
    name, bias, softcap = cases[case]
    T = q.shape[-2]

    def plain(q, k, v):
        return plain_attention(q, k, v, bias, scaling=0.7, softcap=softcap)[0]

    def diag(q, k, v):
        return token_diagonal_attention(q, k, v, bias, scaling=0.7, softcap=softcap)[0]

    assert torch.equal(plain(q, k, v), diag(q, k, v)), "forward values differ"
    Jp = torch.autograd.functional.jacobian(plain, (q, k, v))  # each [B,H,T,e, B,H,T,e]
    Jd = torch.autograd.functional.jacobian(diag, (q, k, v))
    for which in range(3):
        P, D = Jp[which][0, :, :, :, 0], Jd[which][0, :, :, :, 0]  # [H,T,e, H,T,e]
        for t in range(T):
            for s in range(T):
                if t == s or which == 0:  # queries: only the same position matters anyway
                    torch.testing.assert_close(D[:, t, :, :, s], P[:, t, :, :, s], rtol=1e-10, atol=1e-12)
                else:
                    assert D[:, t, :, :, s].abs().max() == 0, (name, which, t, s)


def test_residual_stream_is_taken_at_block_boundaries():
    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 9))
    R = residual_stream(model, x)
    assert R.shape == (3, 9, 32)
    hs = model(x, output_hidden_states=True).hidden_states
    torch.testing.assert_close(R[0], hs[0][0])
    torch.testing.assert_close(R[1], hs[1][0])
    assert not torch.allclose(R[2], hs[2][0]), "hidden_states[-1] includes the final norm; x^L must not"
    for layer in range(2):
        f, X = block_function(model, x, layer)
        torch.testing.assert_close(X, R[layer])
        torch.testing.assert_close(X + f(X), R[layer + 1], rtol=1e-5, atol=1e-5)


def test_residual_stream_vit_takes_pixel_values():
    row = find_architecture(tiny_model("vit"))
    R = residual_stream(tiny_model("vit"), inputs_for(row))
    assert R.shape == (3, 17, 32) and torch.isfinite(R).all()


def test_block_function_refuses_training_mode_and_bad_layers():
    model = tiny_model("gpt2")
    x = torch.randint(0, 64, (1, 8))
    with pytest.raises(IndexError, match="out of range"):
        block_function(model, x, 5)
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        block_function(model, x, 0)
