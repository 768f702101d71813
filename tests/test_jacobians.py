"""Block Jacobians: the one-sweep token-diagonal method against the authors' per-token method and
against a full autograd Jacobian of the ordinary block, for every architecture in the table."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import (
    ARCHITECTURES,
    find_architecture,
    tiny_model,
    transformer_blocks,
)
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

# torch has no vmap batching rule for SDPA's backward on CPU and says so once per process: a known
# cost of these models' SDPA path (bench/gpu_check.py times it on a GPU), not a failure
SDPA_FALLBACK = "ignore:There is a performance drop because we have not yet implemented the batching rule"


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
    f, X = block_function(model, inputs, layer, token_diagonal=False, plain=True)
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


def _block_output(model, inputs, layer, delta):
    """Block ``layer``'s output hidden states [T, d] with ``delta`` [T, d] added to its input.

    Uses hooks on an ordinary forward pass only (nothing from ``blocks.py``), so finite
    differences of it are an oracle independent of ``block_function``.
    """
    block = transformer_blocks(model)[layer]
    out = {}

    def pre(module, args, kwargs):
        if args:
            return (args[0] + delta, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta}

    def post(module, args, output):
        out["y"] = (output if isinstance(output, torch.Tensor) else output[0])[0].detach()

    handles = [block.register_forward_pre_hook(pre, with_kwargs=True), block.register_forward_hook(post)]
    try:
        with torch.no_grad():
            model(input_ids=inputs)
    finally:
        for h in handles:
            h.remove()
    return out["y"]


def test_identity_subtracted_only_on_the_diagonal():
    """f = block(X) − X: against central finite differences of the block's own output.

    ∂block(X)_{t2}/∂x_{t1} is measured by perturbing the block's input in an ordinary forward
    pass (hooks); the own-token Jacobian must be that minus I, a cross-token one exactly that.
    """
    model = tiny_model("llama").double()
    x = torch.randint(0, 64, (1, 6))
    layer, t2, eps = 1, 4, 1e-3
    T, d = x.shape[1], model.config.hidden_size
    G = torch.zeros(T, d, d, dtype=torch.float64)  # [t1, out, in] = ∂block(X)_{t2} / ∂x_{t1}
    for t1 in (t2, 1):
        for i in range(d):
            D = torch.zeros(T, d, dtype=torch.float64)
            D[t1, i] = eps
            G[t1, :, i] = (_block_output(model, x, layer, D) - _block_output(model, x, layer, -D))[t2] / (
                2 * eps
            )
    eye = torch.eye(d, dtype=torch.float64)
    C = context_jacobians(model, x, layer, t2).double()
    # (the block computes its norms in fp32, so differences are good to ~1e-4; I is of size 1)
    torch.testing.assert_close(C[t2], G[t2] - eye, rtol=0, atol=2e-3)
    torch.testing.assert_close(C[1], G[1], rtol=0, atol=2e-3)
    assert float(G[1].abs().max()) > 0.05, "the cross-token Jacobian is not trivially zero"
    J = token_jacobians(model, x, layer).double()
    torch.testing.assert_close(J[t2], G[t2] - eye, rtol=0, atol=2e-3)
    R = reference_jacobians(model, x, layer, tokens=[t2]).double()
    torch.testing.assert_close(R[0], G[t2] - eye, rtol=0, atol=2e-3)


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


class _Passes(torch.autograd.Function):
    """Identity on a block's output that counts the products through it (a test probe).

    ``backward`` runs once per VJP (per vmapped chunk: one VJP with ``chunk_size=1``), ``jvp``
    once per forward-mode product.
    """

    generate_vmap_rule = True
    counts: dict = {}

    @staticmethod
    def forward(x):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        _Passes.counts["vjp"] += 1
        return g

    @staticmethod
    def jvp(ctx, t):
        _Passes.counts["jvp"] += 1
        return t


def _probe_block(model, layer):
    """Count the block's forward calls and the products through it; record requires_grad at each call."""
    counts = {"forward": 0, "vjp": 0, "jvp": 0, "requires_grad": []}
    _Passes.counts = counts

    def hook(module, args, output):
        counts["forward"] += 1
        counts["requires_grad"].append(sorted({p.requires_grad for p in model.parameters()}))
        if isinstance(output, torch.Tensor):
            return _Passes.apply(output)
        return (_Passes.apply(output[0]), *output[1:])

    return counts, transformer_blocks(model)[layer].register_forward_hook(hook)


def test_parameters_frozen_during_and_restored_after():
    """frozen(): every parameter is requires_grad=False while the block runs, restored afterwards."""
    from coupling_utils.engine.spectra import Solver, matrix_free_topk

    model = tiny_model("llama").requires_grad_(True)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)  # one that was already frozen
    attn = model.config._attn_implementation
    x = _inputs(model)
    counts, handle = _probe_block(model, 0)
    try:
        token_jacobians(model, x, 0)
        reference_jacobians(model, x, 0, tokens=[2])
        context_jacobians(model, x, 0, 3)
        matrix_free_topk(model, x, 0, 2, Solver(steps=2))
    finally:
        handle.remove()
    assert counts["forward"] >= 4 and all(seen == [False] for seen in counts["requires_grad"]), counts
    frozen_before = model.model.layers[0].mlp.up_proj.weight
    assert all(p.requires_grad for p in model.parameters() if p is not frozen_before)
    assert not frozen_before.requires_grad, "a parameter frozen before the sweep must stay frozen"
    assert all(p.grad is None for p in model.parameters())
    assert model.config._attn_implementation == attn


def test_nested_frozen_walks_the_parameters_once_and_the_outermost_restores_them(monkeypatch):
    from coupling_utils.engine.jacobians import frozen

    model = tiny_model("llama").requires_grad_(True)
    walks = []
    real = type(model).parameters
    monkeypatch.setattr(
        type(model), "parameters", lambda self, *a, **k: walks.append(1) or real(self, *a, **k)
    )
    with frozen(model):
        with frozen(model), frozen(model):
            pass
        assert len(walks) == 1  # the inner calls walked nothing
        assert not any(p.requires_grad for p in real(model))  # and their exits restored nothing
        token_jacobians(model, _inputs(model), 0)
    assert all(p.requires_grad for p in real(model))
    with frozen(model):  # frozen again afterwards: the marker went with the outer call
        assert not any(p.requires_grad for p in real(model))
    assert all(p.requires_grad for p in real(model))


def test_block_passes_per_sweep():
    """The fast path makes d VJPs through the block for all T tokens; the reference T·d.

    Counted on the block itself (forward calls and the products through its output), with
    ``chunk_size=1`` so that each product is one call; matrix-free solvers make exactly
    ``solver_passes`` products.
    """
    from coupling_utils.engine.spectra import matrix_free_topk, solver_passes

    model = tiny_model("llama")
    T, layer = 7, 1
    x = _inputs(model, T=T)
    d = model.config.hidden_size
    counts, handle = _probe_block(model, layer)
    try:
        token_jacobians(model, x, layer, chunk_size=1)
        assert (counts["forward"], counts["vjp"], counts["jvp"]) == (1, d, 0), counts
        counts.update(forward=0, vjp=0)
        context_jacobians(model, x, layer, 3, chunk_size=1)
        assert (counts["forward"], counts["vjp"]) == (1, d), counts
        counts.update(forward=0, vjp=0)
        reference_jacobians(model, x, layer, chunk_size=1)
        assert (counts["forward"], counts["vjp"]) == (1, T * d), counts
        counts.update(forward=0, vjp=0)
        result = matrix_free_topk(model, x, layer, 4, chunk_size=1)
    finally:
        handle.remove()
    assert counts["jvp"] + counts["vjp"] == result.block_passes == solver_passes(4, d=d), counts
    assert counts["forward"] == counts["jvp"] + 1  # each JVP is a forward pass, plus the VJP's one


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
    ("falcon", "multi_head"),
    ("falcon", "new_decoder"),
    ("llama", None),
    ("bert", None),
]


@pytest.mark.filterwarnings(SDPA_FALLBACK)
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


def test_errors_name_the_problem_and_the_fix():
    from coupling_utils.engine.blocks import model_inputs

    model = tiny_model("llama")  # 2 blocks
    x = _inputs(model, T=6)
    cases = [
        (
            lambda: token_jacobians(model, x, 2),
            IndexError,
            "layer 2 out of range: the model has 2 blocks (0..1)",
        ),
        (
            lambda: token_jacobians(model, x, -3),
            IndexError,
            "layer -3 out of range: the model has 2 blocks (0..1)",
        ),
        (
            lambda: token_jacobians(model, x, 0, tokens=[6]),
            IndexError,
            "token 6 out of range for a sequence of 6 tokens",
        ),
        (
            lambda: context_jacobians(model, x, 0, -7),
            IndexError,
            "token -7 out of range for a sequence of 6 tokens",
        ),
        (
            lambda: token_jacobians(model, x.float(), 0),
            TypeError,
            "token ids must be an integer tensor, got torch.float32; pass a dict for other inputs",
        ),
        (
            lambda: token_jacobians(model, [1, 2, 3], 0),
            TypeError,
            "inputs must be a LongTensor [1, T] of token ids or a dict of model inputs, got <class 'list'>",
        ),
        (
            lambda: model_inputs(model, {"input_ids": torch.zeros(2, 3, dtype=torch.long)}),
            ValueError,
            "inputs must have batch size 1, got input_ids of shape (2, 3)",
        ),
        (lambda: token_jacobians(model, x, 0, chunk_size=0), ValueError, "chunk_size must be >= 1, got 0"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value) == message
    model.train()
    with pytest.raises(ValueError) as info:
        token_jacobians(model, x, 0)
    assert str(info.value) == (
        "the model is in training mode (dropout would make Jacobians random); call model.eval()"
    )


def test_negative_layers_and_tokens_count_from_the_end():
    model = tiny_model("gpt2")
    x = _inputs(model, T=6)
    J = token_jacobians(model, x, 0)
    torch.testing.assert_close(token_jacobians(model, x, -2), J)  # -n is the first block
    torch.testing.assert_close(token_jacobians(model, x, 0, tokens=[-6, 5]), J[[0, 5]])
    torch.testing.assert_close(context_jacobians(model, x, 0, -6)[0], J[0], rtol=1e-5, atol=1e-6)


def test_model_inputs_forms():
    """1-D ids become a batch of one; float inputs take the model's dtype; use_cache is turned off."""
    from coupling_utils.engine.blocks import model_inputs

    model = tiny_model("llama")
    ids = torch.tensor([3, 1, 4, 1, 5], dtype=torch.int32)
    kw = model_inputs(model, ids)
    assert kw["input_ids"].shape == (1, 5) and kw["input_ids"].dtype == torch.int64
    assert kw["use_cache"] is False
    torch.testing.assert_close(token_jacobians(model, ids, 1), token_jacobians(model, ids[None].long(), 1))
    two_d = torch.tensor([[3, 1, 4]])
    assert model_inputs(model, two_d)["input_ids"] is two_d
    assert model_inputs(model, {"input_ids": two_d, "use_cache": True})["use_cache"] is True
    vit = tiny_model("vit").to(torch.float64)
    pixels = _inputs(vit)["pixel_values"]  # float32 in, the model's float64 out
    assert model_inputs(vit, {"pixel_values": pixels})["pixel_values"].dtype == torch.float64
    assert "use_cache" not in model_inputs(vit, {"pixel_values": pixels})
    meta = tiny_model("llama").to("meta")
    assert model_inputs(meta, two_d)["input_ids"].device.type == "meta"
    assert model_inputs(meta, {"x": pixels})["x"].device.type == "meta"


def test_double_precision_models_give_double_accurate_jacobians():
    """Cotangents follow the model's dtype: in float64 the fast path and the oracle agree to 1e-12."""
    model = tiny_model("gpt2").double()
    x = _inputs(model, T=5)
    J, R = token_jacobians(model, x, 1), reference_jacobians(model, x, 1)
    assert J.dtype == R.dtype == torch.float32  # returned in fp32 as documented
    f, X = block_function(model, x, 1, token_diagonal=False)
    F = torch.autograd.functional.jacobian(f, X)
    C = context_jacobians(model, x, 1, 4)
    torch.testing.assert_close(C.double(), F[4].permute(1, 0, 2), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(J[2].double(), F[2, :, 2, :], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(R[3].double(), F[3, :, 3, :], rtol=1e-6, atol=1e-7)


def test_blocks_called_with_keyword_hidden_states():
    """A model that passes hidden_states by keyword (no positional args) is captured the same way."""
    from coupling_utils.engine.blocks import residual_stream

    model = tiny_model("llama")
    x = _inputs(model, T=6)
    J, R = token_jacobians(model, x, 1), residual_stream(model, x)

    def by_keyword(module, args, kwargs):
        if args:
            return (), {"hidden_states": args[0], **kwargs}
        return None

    handles = [
        b.register_forward_pre_hook(by_keyword, with_kwargs=True, prepend=True) for b in model.model.layers
    ]
    try:
        torch.testing.assert_close(token_jacobians(model, x, 1), J)
        torch.testing.assert_close(residual_stream(model, x), R)
        f, X = block_function(model, x, 1)
        assert f._key == "hidden_states" and "hidden_states" not in f._kwargs and f._args == ()
        torch.testing.assert_close(X, R[1])
    finally:
        for h in handles:
            h.remove()


def test_residual_stream_stops_after_the_last_block_and_cleans_up():
    from coupling_utils.engine.blocks import residual_stream

    model = tiny_model("llama")
    calls = []
    handle = model.model.norm.register_forward_hook(lambda *a: calls.append("final norm"))
    try:
        residual_stream(model, _inputs(model))
    finally:
        handle.remove()
    assert calls == [], "the forward pass went on past the last block"
    for block in model.model.layers:
        assert not block._forward_hooks and not block._forward_pre_hooks


def test_progress_bars_only_when_asked(capsys):
    model = tiny_model("gpt2")
    x = _inputs(model, T=4)
    for fn, args, desc in (
        (token_jacobians, (0,), "J_tt layer 0"),
        (reference_jacobians, (1,), "reference J_tt layer 1"),
        (context_jacobians, (1, 2), "J_(t1,2) layer 1"),
    ):
        fn(model, x, *args, progress=False)
        fn(model, x, *args)  # None: only on a terminal (pytest's capture is not one)
        assert capsys.readouterr().err == ""
        fn(model, x, *args, progress=True, chunk_size=8)
        err = capsys.readouterr().err
        assert desc in err and err.endswith("\r"), (desc, err[-80:])  # leave=False: the bar is cleared


def test_a_block_the_forward_pass_skips_is_reported():
    """The config says 1 block, the list holds 2: block 1 is never called."""
    from coupling_utils.engine.blocks import residual_stream

    model = tiny_model("llama")
    model.config.num_hidden_layers = 1
    x = _inputs(model)
    with pytest.raises(RuntimeError) as info:
        block_function(model, x, 1)
    assert str(info.value) == "block 1 was not called during the forward pass"
    with pytest.raises(RuntimeError) as info:
        residual_stream(model, x)
    assert str(info.value) == "not every block was called during the forward pass"


def test_block_function_object():
    from coupling_utils.engine.blocks import BlockFunction

    model = tiny_model("llama")
    x = _inputs(model, T=5)
    f, X = block_function(model, x, 1)
    assert f.layer == 1 and f.token_diagonal
    torch.testing.assert_close(f(X[None]), f(X)[None])  # a batch [1, T, d] as well as [T, d]
    J = torch.autograd.functional.jacobian(f, X)  # default: token-diagonal derivatives
    assert J[3, :, 1, :].abs().max() == 0 and J[3, :, 3, :].abs().max() > 0
    with pytest.raises(RuntimeError) as info:
        BlockFunction(model, model.model.layers[1], (), {"attention_mask": None}, True, 7)
    assert str(info.value) == "could not find the hidden states among block 7's arguments"


def test_default_chunks_bound_the_cotangents_to_2_to_the_20_numbers_on_a_cpu_2_to_the_24_elsewhere():
    from coupling_utils.engine.jacobians import _default_chunk

    assert _default_chunk(576, 64, None) == (1 << 20) // (64 * 576) == 28
    assert _default_chunk(576, 64, None, torch.device("cpu")) == 28
    assert _default_chunk(576, 64, None, "cuda") == (1 << 24) // (64 * 576) == 455
    assert _default_chunk(4096, 4096, None) == 1
    assert _default_chunk(4096, 8192, None, "cuda") == 1  # never below one
    assert _default_chunk(32, 10, None) == 32  # never above d
    assert _default_chunk(32, 10, 7) == 7
    assert all(isinstance(_default_chunk(d, T, None), int) for d, T in ((576, 64), (32, 10)))


def test_reference_and_context_name_the_layer_of_a_nan():
    model = tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 7, 4, 5]])
    with torch.no_grad():
        model.model.embed_tokens.weight[7] = float("nan")
    with pytest.raises(ValueError) as info:
        reference_jacobians(model, ids, 0, tokens=[3, 5])
    assert str(info.value) == (
        "NaN/inf in the block Jacobian at layer 0, token(s) [3, 5]. The block's output is not finite "
        "there: check the model weights, or use dtype='float32' if the model runs in float16/bfloat16."
    )
    with pytest.raises(ValueError, match=r"^NaN/inf in the context Jacobian \(output token 4\) at layer 0, "):
        context_jacobians(model, ids, 0, 4)


def test_context_jacobians_in_chunks():
    model = tiny_model("gpt2")
    x = _inputs(model, T=5)
    C = context_jacobians(model, x, 1, 3)
    for chunk in (1, 5, 7):
        torch.testing.assert_close(
            context_jacobians(model, x, 1, 3, chunk_size=chunk), C, rtol=1e-6, atol=1e-6
        )


class _Terminal:
    """A stderr that says it is a terminal (tqdm then shows bars when ``disable=None``)."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


def test_progress_none_means_on_a_terminal(monkeypatch):
    model = tiny_model("gpt2")
    x = _inputs(model, T=4)
    for fn, args, desc in (
        (token_jacobians, (0,), "J_tt layer 0"),
        (reference_jacobians, (1,), "reference J_tt layer 1"),
        (context_jacobians, (1, 2), "J_(t1,2) layer 1"),
    ):
        term = _Terminal()
        monkeypatch.setattr("sys.stderr", term)
        fn(model, x, *args)
        assert desc in term.text, desc
        term.text = ""
        fn(model, x, *args, progress=False)
        assert term.text == ""


def test_the_sweep_cut_at_the_residual_outputs_gives_the_uncut_numbers(monkeypatch):
    """token_jacobians feeds the MLP's output projection its cotangent rows directly (the table's
    residual_outputs) instead of multiplying all T tokens by its weight: the same J as the uncut
    sweep, the cut's rows taken once per sweep (not per chunk), and not under a final norm (which
    comes after it)."""
    import dataclasses

    from coupling_utils.engine import jacobians
    from coupling_utils.engine.blocks import BlockFunction

    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(3))
    row = find_architecture(model)
    assert row.residual_outputs == ("mlp.down_proj",)
    calls = []
    original = BlockFunction.row_products
    monkeypatch.setattr(BlockFunction, "row_products", lambda *a: calls.append(a[1]) or original(*a))
    cut = token_jacobians(model, x, 1, chunk_size=8)
    assert calls == ["mlp.down_proj"]  # d = 32 in chunks of 8: the rows of all 32 at once
    monkeypatch.setattr(
        jacobians, "find_architecture", lambda m: dataclasses.replace(row, residual_outputs=())
    )
    torch.testing.assert_close(token_jacobians(model, x, 1, chunk_size=8), cut, rtol=1e-6, atol=1e-6)
    assert len(calls) == 1
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(BlockFunction, "row_products", lambda *a: calls.append(a[1]) or original(*a))
    token_jacobians(model, x, 1, last_block="final_norm")
    assert calls == []


def test_parallel_blocks_also_cut_at_the_attention_output_where_their_config_says_so():
    """Architecture.cut adds residual_outputs_when's paths where the config sets the flag: GPT-NeoX
    and Falcon with parallel attention and MLP cut at the attention output too, their sequential
    variants (attention output into the MLP's norm) do not (the oracle test of the sequential
    variants fails if they do: checked)."""
    cut = lambda t, v=None: find_architecture(m := tiny_model(t, variant=v)).cut(m.config)  # noqa: E731
    assert cut("gpt_neox") == ("mlp.dense_4h_to_h", "attention.dense")
    assert cut("gpt_neox", "sequential") == ("mlp.dense_4h_to_h",)
    assert cut("falcon") == ("mlp.dense_4h_to_h", "self_attention.dense")
    assert cut("falcon", "new_decoder") == ("mlp.dense_4h_to_h", "self_attention.dense")
    assert cut("falcon", "sequential") == ("mlp.dense_4h_to_h",)
    assert cut("llama") == ("mlp.down_proj",)
    assert cut("gptj") == ("attn.out_proj", "mlp.fc_out")


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox", "gpt2"])
def test_pointwise_activations_hold_their_slopes(model_type):
    """In every block function but the oracle's (plain=True), the block's pointwise activation
    modules hold their slopes: the same forward values bit for bit, the same products both ways
    (VJP and JVP) up to rounding, through the held slope; the module is itself again after."""
    from coupling_utils.engine import blocks

    model = tiny_model(model_type)
    x = _inputs(model)
    f, X = block_function(model, x, 1, token_diagonal=False)
    plain, _ = block_function(model, x, 1, token_diagonal=False, plain=True)
    acts = blocks.pointwise_activations(f.block)
    assert len(acts) == 1 and plain._activations == [] and f._activations == acts
    torch.testing.assert_close(f(X), plain(X), rtol=0, atol=0)
    C = torch.randn(3, *X.shape, generator=torch.Generator().manual_seed(0))
    (held,) = torch.func.vmap(torch.func.vjp(f, X)[1])(C)
    (exact,) = torch.func.vmap(torch.func.vjp(plain, X)[1])(C)
    torch.testing.assert_close(held, exact, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        torch.func.jvp(f, (X,), (C[0],))[1], torch.func.jvp(plain, (X,), (C[0],))[1], rtol=1e-5, atol=1e-6
    )
    calls = []
    original = blocks._HeldSlope.apply
    blocks._HeldSlope.apply = lambda *a: calls.append(a) or original(*a)
    try:
        f(X)
        plain(X)
    finally:
        blocks._HeldSlope.apply = original
    assert len(calls) == 1 and "forward" not in vars(acts[0])


def test_held_slopes_keep_a_float64_block_in_float64():
    """A float64 block's slopes are taken in float64 (only half precision is widened, to float32):
    its held-slope products equal autograd's to float64 rounding, and the one-token path's block
    functions hold slopes too (BlockFunction's default)."""
    from coupling_utils.engine.one_token import OneTokenCalls

    model = tiny_model("gpt_neox").double()
    x = _inputs(model)
    f, X = block_function(model, x, 1, token_diagonal=False)
    plain, _ = block_function(model, x, 1, token_diagonal=False, plain=True)
    C = torch.randn(2, *X.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (held,) = torch.func.vmap(torch.func.vjp(f, X)[1])(C)
    (exact,) = torch.func.vmap(torch.func.vjp(plain, X)[1])(C)
    torch.testing.assert_close(held, exact, rtol=1e-12, atol=1e-12)
    g, _ = OneTokenCalls(model, x, 3, [1]).function(1)
    assert len(g._activations) == 1


def test_the_oracle_runs_the_plain_block_and_the_sweep_cuts_where_the_config_says(monkeypatch):
    """reference_jacobians (the oracle) takes the block exactly as transformers runs it (plain:
    no held slopes; their values agree to rounding, so only the call can show it), and the sweep
    reads the cut from the model's own config: a parallel GPT-NeoX block is cut at its
    attention output too."""
    from coupling_utils.engine import jacobians
    from coupling_utils.engine.blocks import BlockFunction

    seen = []
    original = jacobians.block_function
    monkeypatch.setattr(jacobians, "block_function", lambda *a, **k: seen.append(k) or original(*a, **k))
    model = tiny_model("gpt_neox")
    x = _inputs(model)
    reference_jacobians(model, x, 1, tokens=[2])
    assert seen[-1]["plain"] is True and seen[-1]["token_diagonal"] is False
    calls = []
    rows = BlockFunction.row_products
    monkeypatch.setattr(BlockFunction, "row_products", lambda *a: calls.append(a[1]) or rows(*a))
    token_jacobians(model, x, 1)
    assert calls == ["mlp.dense_4h_to_h", "attention.dense"] and seen[-1].get("plain", False) is False


def test_a_held_slope_of_a_half_precision_input_is_taken_in_float32():
    """The slope of a bfloat16 input is computed in float32 (as autograd's kernels do) and the
    products come back in the cotangent's dtype, equal to autograd's to bfloat16 rounding."""
    from coupling_utils.engine.blocks import _HeldSlope

    act = torch.nn.GELU()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    y, slope = _HeldSlope.apply(x, act)
    assert slope.dtype == torch.float32 and torch.equal(y, act(x))
    g = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    (held,) = torch.func.vjp(lambda v: _HeldSlope.apply(v, act)[0], x)[1](g)
    (exact,) = torch.func.vjp(act, x)[1](g)
    assert held.dtype == torch.bfloat16
    torch.testing.assert_close(held, exact, rtol=1e-2, atol=1e-2)
    # forward mode does not cast a tangent to its primal's dtype: the rule itself must
    (_, tangent) = torch.func.jvp(lambda v: _HeldSlope.apply(v, act)[0], (x,), (g,))
    assert tangent.dtype == torch.bfloat16
    torch.testing.assert_close(tangent, held, rtol=0, atol=0)
    torch.testing.assert_close(held.float(), (g.float() * slope).bfloat16().float(), rtol=0, atol=0)


def test_the_block_output_without_minus_input_is_f_plus_x():
    """f(X, minus_input=False) is the block's output itself: token_jacobians subtracts the
    identity from J_tt's diagonal instead of differentiating − X."""
    model = tiny_model("llama")
    f, X = block_function(model, _inputs(model), 1)
    torch.testing.assert_close(f(X, minus_input=False) - X, f(X), rtol=0, atol=0)
    y, (z,) = f(X, ("mlp.down_proj",), minus_input=False)
    torch.testing.assert_close(y - X, f(X), rtol=0, atol=0)


def test_check_finite_passes_a_finite_j_whose_sum_overflows_and_names_bad_tokens():
    """The one-pass shortcut sums in J's own dtype; a finite J whose sum overflows to inf takes
    the exact per-token check and passes it; NaN or inf are reported with layer and token."""
    J = torch.full((3, 4, 4), 3e38)
    check_finite(J, 2, [5, 6, 7])
    J[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"layer 2, token\(s\) \[6\]"):
        check_finite(J, 2, [5, 6, 7])


def test_a_cut_module_that_does_not_run_once_is_a_table_error(monkeypatch):
    """A residual_outputs entry naming a module the block does not call once is refused, naming
    the table, rather than giving a Jacobian without that module's part."""
    import dataclasses

    from coupling_utils.engine import jacobians

    model = tiny_model("llama")
    model.model.layers[0].unused = torch.nn.Linear(32, 32)  # in the block, never called
    x = torch.randint(0, 64, (1, 6))
    row = find_architecture(model)
    wrong = dataclasses.replace(row, residual_outputs=("mlp.down_proj", "unused"))
    monkeypatch.setattr(jacobians, "find_architecture", lambda m: wrong)
    with pytest.raises(RuntimeError, match="not once each.*residual_outputs in the architecture table"):
        token_jacobians(model, x, 0)


def test_a_cut_block_returns_what_entered_the_cut_modules_and_the_same_output():
    """f(X, cut) is (f(X), inputs): the inputs the cut modules received (one per path, in the
    order of cut, still connected to X), with the block's output unchanged; a module that runs
    twice or never is refused with a message naming the table."""
    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    f, X = block_function(model, x, 1)
    seen = {}
    for path in ("mlp.down_proj", "self_attn.o_proj"):
        h = f.block.get_submodule(path).register_forward_pre_hook(
            lambda m, a, p=path: seen.__setitem__(p, a[0])
        )
        f(X)
        h.remove()
    Xg = X.clone().requires_grad_(True)
    y, entered = f(Xg, ("mlp.down_proj", "self_attn.o_proj"))
    torch.testing.assert_close(y, f(X), rtol=0, atol=0)
    assert len(entered) == 2 and all(z.requires_grad for z in entered)
    torch.testing.assert_close(entered[0], seen["mlp.down_proj"], rtol=0, atol=0)
    torch.testing.assert_close(entered[1], seen["self_attn.o_proj"], rtol=0, atol=0)
    y2, (z,) = f(X[None], ("mlp.down_proj",))  # a batch [1, T, d]: no squeeze
    assert y2.shape == (1, 5, 32) and z.shape == seen["mlp.down_proj"].shape
    # the block's output does not depend on X through the cut module's input any more
    (g,) = torch.autograd.grad(f(Xg, ("mlp.down_proj",))[0].sum(), Xg)
    (g_full,) = torch.autograd.grad(f(Xg).sum(), Xg)
    assert float((g - g_full).abs().max()) > 1e-6
    model.model.layers[1].unused = torch.nn.Linear(32, 32)
    with pytest.raises(RuntimeError) as info:
        f(X, ("mlp.down_proj", "unused"))
    assert str(info.value) == (
        "block 1: the modules to cut at ran as ['mlp.down_proj'], not once each as "
        "['mlp.down_proj', 'unused']; fix residual_outputs in the architecture table"
    )


def test_row_products_are_the_rows_c_transposed_times_the_modules_jacobian():
    """row_products(path, z, C) = cᵀ ∂m(z)/∂z for each row c of C: for a linear module the rows
    of C W, for another module those of its autograd Jacobian; C is cast to the module's dtype."""
    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(2))
    f, X = block_function(model, x, 0)
    g = torch.Generator().manual_seed(5)
    lin = f.block.mlp.down_proj
    z = torch.randn(1, 1, lin.in_features, generator=g)
    C = torch.randn(3, lin.out_features, generator=g)
    rows = f.row_products("mlp.down_proj", z, C)
    assert rows.shape == (3, 1, 1, lin.in_features)
    torch.testing.assert_close(rows[:, 0, 0], C @ lin.weight, rtol=1e-5, atol=1e-6)
    zm = torch.randn(1, 1, 32, generator=g)
    Cm = torch.randn(32, 32, generator=g)
    Jm = torch.autograd.functional.jacobian(lambda v: f.block.mlp(v).reshape(-1), zm).reshape(32, 32)
    torch.testing.assert_close(f.row_products("mlp", zm, Cm)[:, 0, 0], Cm @ Jm, rtol=1e-5, atol=1e-6)
    double = tiny_model("llama").double()
    fd, _ = block_function(double, x, 0)
    rd = fd.row_products("mlp.down_proj", z.double(), C)  # float32 rows on a float64 module
    assert rd.dtype == torch.float64
    torch.testing.assert_close(rd[:, 0, 0], C.double() @ fd.block.mlp.down_proj.weight)


@pytest.mark.parametrize("T", [1, 3])
def test_the_cut_sweep_on_one_token_and_on_few(T):
    """The cut sweep reads the cut modules' input on the first token and the cotangent row of
    the first token: it holds for a sequence of one token too, against the oracle."""
    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(4))
    for chunk in (None, 5):
        torch.testing.assert_close(
            token_jacobians(model, x, 1, chunk_size=chunk),
            reference_jacobians(model, x, 1),
            rtol=1e-5,
            atol=1e-6,
        )


def test_token_jacobians_are_float32_whatever_the_default_dtype():
    """J comes back in fp32 even where torch's default dtype is float64 (the model then too)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = tiny_model("llama")
        x = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(6))
        J = token_jacobians(model, x, 0)
    finally:
        torch.set_default_dtype(old)
    assert J.dtype == torch.float32
    assert bool(torch.isfinite(J).all()) and float(J.abs().max()) > 0


def test_reference_and_context_fold_the_final_norm_into_the_last_block():
    """last_block='final_norm' reaches the oracle and the context sweep: the last block's J_tt
    differs from the block alone, and all three methods agree on it."""
    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(7))
    last = len(transformer_blocks(model)) - 1
    token = token_jacobians(model, x, last, last_block="final_norm")
    assert rel(token, token_jacobians(model, x, last)) > 1e-3
    ref = reference_jacobians(model, x, last, last_block="final_norm")
    torch.testing.assert_close(ref, token, rtol=1e-5, atol=1e-6)
    ctx = context_jacobians(model, x, last, 2, last_block="final_norm")
    torch.testing.assert_close(ctx[2], token[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("last_block", ["block", "final_norm"])
def test_half_precision_layer_norms_give_finite_forward_products_close_to_float32(last_block):
    """A float16 LayerNorm's forward-mode product overflows on a CPU where its input is small
    (rstd³ in float16); every LayerNorm the block function runs, the block's own and the final
    norm folded into the last block, runs in float32: finite float16 tangents close to float32's.
    Here the last block adds little to small hidden states, so both norms see a small input."""

    x = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))

    def block(dtype):
        model = tiny_model("gpt2").to(dtype)
        for proj in (model.transformer.h[1].attn.c_proj, model.transformer.h[1].mlp.c_proj):
            proj.weight.mul_(0.01), proj.bias.mul_(0.01)
        return block_function(model, x, 1, token_diagonal=False, last_block=last_block)

    f16, X = block(torch.float16)
    f32, _ = block(torch.float32)
    X = 0.02 * X
    v = torch.randn(X.shape, generator=torch.Generator().manual_seed(1))
    _, t16 = torch.func.jvp(f16, (X,), (v.half(),))
    _, t32 = torch.func.jvp(f32, (X.float(),), (v,))
    assert t16.dtype == torch.float16 and torch.isfinite(t16).all()
    assert rel(t16.float(), t32) < 1e-2


def test_float32_layer_norms_round_a_float32_layer_norm_of_half_inputs_and_leave_others_as_torch_does():
    """In half precision the LayerNorm is float32's, rounded to the input's dtype, with the norm's
    own eps, weight and bias (or none); other inputs get nn.LayerNorm's own call, bit for bit;
    the module is itself again after."""
    from coupling_utils.engine.blocks import float32_layer_norms

    g = torch.Generator().manual_seed(0)
    x = 0.02 * torch.randn(3, 16, generator=g, dtype=torch.float64)
    for affine in (True, False):
        norm = torch.nn.LayerNorm(16, eps=0.1, elementwise_affine=affine, dtype=torch.float64)
        if affine:
            norm.weight.data.normal_(generator=g), norm.bias.data.normal_(generator=g)
        plain = torch.nn.functional.layer_norm(x, (16,), norm.weight, norm.bias, eps=0.1)
        with float32_layer_norms(norm):
            assert torch.equal(norm(x), plain)
            norm.to(torch.bfloat16)
            y = norm(x.bfloat16())
        assert "forward" not in vars(norm)
        w, b = (norm.weight.float(), norm.bias.float()) if affine else (None, None)
        assert y.dtype == torch.bfloat16
        assert torch.equal(
            y, torch.nn.functional.layer_norm(x.bfloat16().float(), (16,), w, b, 0.1).bfloat16()
        )


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_rotary_embeddings_take_their_products_through_the_transpose_except_in_the_oracle(
    model_type, monkeypatch
):
    """Every block function but the oracle's (plain=True) runs its rotary embedding through
    rotary.linear_rotary: the same values bit for bit, the same products up to rounding; the oracle
    runs the library's function as transformers does."""
    from coupling_utils.engine import rotary

    model = tiny_model(model_type)
    x = _inputs(model)
    f, X = block_function(model, x, 1, token_diagonal=False)
    plain, _ = block_function(model, x, 1, token_diagonal=False, plain=True)
    torch.testing.assert_close(f(X), plain(X), rtol=0, atol=0)
    C = torch.randn(2, *X.shape, generator=torch.Generator().manual_seed(0))
    (held,) = torch.func.vmap(torch.func.vjp(f, X)[1])(C)
    (exact,) = torch.func.vmap(torch.func.vjp(plain, X)[1])(C)
    torch.testing.assert_close(held, exact, rtol=1e-5, atol=1e-6)
    calls = []
    original = rotary._LinearRotary.apply
    monkeypatch.setattr(rotary._LinearRotary, "apply", lambda *a: calls.append(a) or original(*a))
    plain(X)
    assert calls == []
    f(X)
    assert len(calls) == 1
