"""The one-token path (``engine/one_token.py``): each selected token's J_tt against its prefix's
key/value cache equals the all-token token-diagonal sweep, on every causal architecture of the
table (GQA, RoPE, ALiBi, parallel attention/MLP, softcapping, sliding windows), under every
``last_block``; measure() takes it for a few tokens and says so in its provenance."""

from __future__ import annotations

import pytest
import torch
from test_gram import _with_spectrum  # n matrices U diag(sigma) Vᵀ, float32 by default
from test_jacobians import SDPA_FALLBACK  # torch's note on SDPA's backward under vmap

from coupling_utils.engine.architectures import ARCHITECTURES, tiny_model
from coupling_utils.engine.jacobians import token_jacobians
from coupling_utils.engine.one_token import (
    choose_path,
    one_token_function,
    one_token_jacobians,
    one_token_supported,
    one_token_wins,
)

CASES = [(a.model_types[0], None) for a in ARCHITECTURES] + [
    (a.model_types[0], v) for a in ARCHITECTURES for v in a.tiny_variants
]
CAUSAL = [(t, v) for t, v in CASES if t not in ("vit",) and (t, v) != ("bert", None)]


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("model_type,variant", CAUSAL, ids=[f"{t}-{v}" if v else t for t, v in CAUSAL])
def test_one_token_equals_the_all_token_sweep(model_type, variant):
    model = tiny_model(model_type, variant=variant)
    x = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    assert one_token_supported(model, x) is None
    tokens = [9, 0, 6]  # the last, the first (no prefix) and one beyond the sliding windows (4)
    for layer, last_block in ((0, "block"), (1, "final_norm")):
        J = token_jacobians(model, x, layer, tokens=tokens, last_block=last_block)
        O = one_token_jacobians(model, x, layer, tokens, last_block=last_block)
        assert O.shape == J.shape and O.dtype == torch.float32
        assert rel(O, J) <= 1e-5, (model_type, variant, layer, last_block)


@pytest.mark.filterwarnings(SDPA_FALLBACK)
def test_sdpa_models_and_the_cache_left_as_captured():
    """SDPA-loaded models (reverse mode passes fused attention); calling the one-token function
    twice gives the same value (the captured cache is copied per call, never extended)."""
    model = tiny_model("falcon", variant="alibi", attn_implementation="sdpa")
    x = torch.randint(0, 64, (1, 9))
    torch.testing.assert_close(
        one_token_jacobians(model, x, 1, [8]), token_jacobians(model, x, 1, tokens=[8]), rtol=1e-4, atol=1e-6
    )
    llama = tiny_model("llama")
    f, xt = one_token_function(llama, x, 1, 5)
    torch.testing.assert_close(f(xt), f(xt), rtol=0, atol=0)
    assert xt.shape == (1, 32)


def test_each_call_sees_the_cache_as_captured_copied_only_as_deep_as_an_update_writes():
    """A model's own cache (appending layers: an update rebinds keys and values to new tensors)
    is copied one level down, sharing the captured tensors; any other cache (a static layer
    writes into its tensors) is copied deeply."""
    from transformers.cache_utils import Cache, DynamicCache, StaticLayer

    from coupling_utils.engine.blocks import _fresh

    k = torch.randn(1, 2, 3, 4)
    cache = DynamicCache()
    cache.update(k, k + 1, 0)
    cache.update(k, k + 2, 1)
    fresh = _fresh(cache)
    fresh.update(k[:, :, :1], k[:, :, :1], 1)
    assert fresh.layers[1].keys.shape[-2] == 4 and cache.layers[1].keys.shape[-2] == 3
    assert fresh.layers[0].keys is cache.layers[0].keys  # no copy of what no update writes into
    static = Cache(layers=[StaticLayer(max_cache_len=4)])
    static.layers[0].lazy_initialization(k, k)
    deep = _fresh(static)
    assert deep.layers[0].keys.data_ptr() != static.layers[0].keys.data_ptr()
    assert _fresh(k) is k


def test_non_causal_blocks_and_other_inputs_keep_the_exact_path():
    x = torch.randint(0, 64, (1, 8))
    assert "not (only) causal" in one_token_supported(tiny_model("bert"), x)
    assert one_token_supported(tiny_model("bert", variant="decoder"), x) is None
    vit = tiny_model("vit")
    assert "not (only) causal" in one_token_supported(vit, {"pixel_values": torch.randn(1, 1, 8, 8)})
    llama = tiny_model("llama")
    assert one_token_supported(llama, {"input_ids": x, "attention_mask": torch.ones(1, 8)}) is None
    padded = {"input_ids": x, "attention_mask": torch.tensor([[0] + [1] * 7])}
    assert one_token_supported(llama, padded) == "the inputs carry more than token ids (or a padding mask)"
    extra = {"input_ids": x, "position_ids": torch.arange(8)[None]}
    assert one_token_supported(llama, extra) == "the inputs carry more than token ids (or a padding mask)"
    assert (
        one_token_supported(llama, {"inputs_embeds": torch.randn(1, 8, 32)}) == "the inputs are not token ids"
    )
    assert one_token_supported(llama, [x]) == "the inputs are not token ids"
    with pytest.raises(ValueError, match="does not apply here.*token_jacobians"):
        one_token_jacobians(llama, padded, 0, [7])
    assert choose_path(llama, x, 1, 8)[0] == "one_token"
    assert choose_path(llama, x, 5, 8)[0] == "all_tokens"
    assert choose_path(llama, padded, 1, 8)[0] == "all_tokens"
    assert one_token_wins(8, 16) and not one_token_wins(9, 16)
    # on an accelerator a token's d small products cost as much at T = 128 as at T = 16
    assert one_token_wins(1, 16, "cuda") and not one_token_wins(2, 16, "cuda")
    assert one_token_wins(8, 128, "cuda:0") and not one_token_wins(9, 128, torch.device("cuda"))
    with pytest.raises(IndexError, match="out of range"):
        one_token_function(llama, x, 0, 8)


def test_measure_takes_the_path_and_says_so(tmp_path):
    from coupling_utils.measurement import measure

    model = tiny_model("qwen2")
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    kw = dict(k=(4, 8), layers=[0, 1], tokens=[3, 11])
    one = measure(model, x, **kw)
    assert one.provenance["jacobian_paths"]["layers"] == {"one_token": 2}
    assert one.provenance["jacobian_paths"]["spectra"].startswith("gram_topk: top 8")
    every = measure(model, x, **{**kw, "tokens": "all"})
    assert every.provenance["jacobian_paths"]["layers"] == {"all_tokens": 2}
    a = one.tokenwise.sort_values(["layer", "K", "token_i", "token_j"])["m"].to_numpy()
    b = every.tokenwise.query("token_i in (3, 11) and token_j in (3, 11)")
    b = b.sort_values(["layer", "K", "token_i", "token_j"])["m"].to_numpy()
    assert len(a) == len(b) == 2 * 2 * 4
    assert abs(a - b).max() <= 1e-5
    da = one.depthwise.query("token == 11").sort_values(["K", "layer_i", "layer_j"])["m"].to_numpy()
    db = every.depthwise.query("token == 11").sort_values(["K", "layer_i", "layer_j"])["m"].to_numpy()
    assert len(da) > 0 and abs(da - db).max() <= 1e-5


def test_top_k_from_the_gram_matrix_equals_the_full_svd_on_every_metric_value():
    """gram.gram_topk (the top eigenpairs of JᵀJ) against the full SVD: every coupling
    value within 1e-5, on trained-like flat spectra (a tiny model's Jacobians) and a rank-deficient
    matrix (which falls back to the full SVD)."""
    from coupling_utils.engine.gram import exact_topk, gram_topk, gram_wins
    from coupling_utils.engine.metric import coupling_matrix, svd

    model = tiny_model("llama")
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    J = torch.cat([token_jacobians(model, x, layer) for layer in (0, 1)])  # [24, 32, 32]
    full = svd(J)
    top = gram_topk(J, 8)
    torch.testing.assert_close(top.S, full.S[:, :8], rtol=1e-5, atol=1e-6)
    for k in (2, 5, 8):
        exact = coupling_matrix(J, k, svds=full)
        assert (coupling_matrix(J, k, svds=top) - exact).abs().max() <= 1e-5
    low = torch.randn(32, 3) @ torch.randn(3, 32)  # rank 3: the 8th singular value is 0
    s = gram_topk(low, 8)
    torch.testing.assert_close((s.U * s.S.unsqueeze(-2)) @ s.Vh, low, rtol=1e-4, atol=1e-4)
    one = gram_topk(J, 1)  # K = 1 (smoke widths give K of 1-2): a reversed (n, 1) eigenvector block
    torch.testing.assert_close(one.S, full.S[:, :1], rtol=1e-5, atol=1e-6)
    assert (coupling_matrix(J, 1, svds=one) - coupling_matrix(J, 1, svds=full)).abs().max() <= 1e-5
    assert gram_wins(J, 8) and not gram_wins(J, 9)
    assert exact_topk(J, 8)[1] == "gram_topk" and exact_topk(J, 20)[1] == "full_svd"


@pytest.mark.parametrize("batched", [False, True], ids=["gram_topk", "gram_topk_batched"])
@pytest.mark.parametrize("spectrum", ["flat", "outlier_then_flat", "geometric_to_0.01", "below_the_floor"])
def test_the_float32_gram_refined_in_float64_matches_the_float64_svd_on_every_metric_value(spectrum, batched):
    """The float32 Gram refined by a float64 power step and Rayleigh–Ritz (gram_topk with LAPACK's
    partial solver, gram_topk_batched with torch's full eigh) against a float64 SVD on spectra
    chosen to be hard for it: flat (gaps of 0.2 %), one outlier over a flat bulk at 3 % of it
    (float32's rounding of JᵀJ is then large against σ_r²), and geometric down to σ_r = 0.01·σ_1.
    Below MIXED_FLOOR gram_topk must take the float64 Gram path, bit for bit, and
    gram_topk_batched the full SVD. Measured: at most 2.1e-6 (outlier over flat); a float32 full
    SVD is off by 7.7e-6 on the flat spectrum."""
    from coupling_utils.engine.gram import MIXED_FLOOR, gram_topk, gram_topk_batched
    from coupling_utils.engine.metric import SVD, coupling_matrix

    d, r = 120, 24
    i = torch.arange(d, dtype=torch.float64)
    sigma = {
        "flat": 1 - 0.002 * i,
        "outlier_then_flat": torch.cat([torch.ones(1), 0.03 * (1 - 0.002 * i[1:])]),
        "geometric_to_0.01": 0.01 ** (i / (r - 1)),
        "below_the_floor": torch.cat([torch.ones(1), 0.5 * MIXED_FLOOR * (1 - 0.002 * i[1:])]),
    }[spectrum]
    J = _with_spectrum(sigma, 4, seed=7)
    U, S, Vh = torch.linalg.svd(J.double())
    exact = SVD(U[..., :r], S[..., :r], Vh[..., :r, :])
    top = gram_topk_batched(J, r) if batched else gram_topk(J, r)
    assert top.U.dtype == torch.float32 and top.U.shape == (4, d, r) and top.Vh.shape == (4, r, d)
    torch.testing.assert_close(top.S.double(), exact.S, rtol=2e-6, atol=0)
    for k in (1, 8, r):
        want = coupling_matrix(J.double(), k, svds=exact)
        assert (coupling_matrix(J.double(), k, svds=top) - want).abs().max() <= 5e-6
    if not batched:
        f64 = gram_topk(J, r, mixed=False)
        same = all(torch.equal(a, b) for a, b in zip(top, f64))
        assert same == (spectrum == "below_the_floor")


def test_gram_topk_on_several_workers_gives_the_same_bits():
    """gram_topk shares the matrices among threads, each matrix on one BLAS thread: the result is
    bit for bit the one-worker result, and torch's thread count is restored."""
    from coupling_utils.engine.gram import gram_topk

    J = torch.randn(5, 64, 64, generator=torch.Generator().manual_seed(8))
    before = torch.get_num_threads()
    one, two = gram_topk(J, 10, workers=1), gram_topk(J, 10, workers=2)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n,l", [(1, 1), (7, 1), (40, 13), (40, 40)])
def test_lapack_called_without_the_gil_gives_scipys_bits(dtype, n, l):
    """gram_topk calls BLAS ssyrk and LAPACK ?syevr through ctypes, which releases the GIL (scipy's
    own wrappers hold it, so threads ran one at a time); the arguments travel by address, easy to
    get wrong: the result is bit for bit scipy's, for either triangle, and the calls are C calls."""
    import ctypes

    import numpy as np
    from scipy.linalg import eigh
    from scipy.linalg.blas import ssyrk

    from coupling_utils.engine import gram

    rng = np.random.default_rng(n * 100 + l)
    a = rng.standard_normal((n + 3, n)).astype(dtype)
    G = a.T @ a + np.triu(rng.standard_normal((n, n)), 1).astype(dtype)  # each triangle its own matrix
    for uplo, lower in ((b"U", False), (b"L", True)):
        want_w, want_V = eigh(G, lower=lower, subset_by_index=[n - l, n - 1], driver="evr")
        w, V = gram._syevr_top(np.asfortranarray(G), l, uplo)
        assert w.dtype == V.dtype == np.dtype(dtype) and V.shape == (n, l)
        assert np.array_equal(w, want_w) and np.array_equal(V, want_V)
    if dtype == "float32":
        assert np.array_equal(np.triu(gram._gram_upper(a)), np.triu(ssyrk(1.0, a.T)))
    for routine in [*gram._SYRK.values(), *gram._SYEVR.values()]:
        assert not routine._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # CFUNCTYPE: the GIL is released


def test_pair_tiles_in_chunks_of_partners_are_the_same():
    """measure()'s token-wise tiles are made a chunk of partner tokens at a time (bounded memory)."""
    from coupling_utils.engine.metric import coupling_tile, svd
    from coupling_utils.measurement.compute import pair_tiles

    J = torch.randn(7, 12, 12, generator=torch.Generator().manual_seed(4))
    s = svd(J)
    for orientation in ("ujv", "vju"):
        whole = pair_tiles(J, s, 5, orientation)
        torch.testing.assert_close(
            pair_tiles(J, s, 5, orientation, max_numbers=1), whole, rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(whole[2, 5], coupling_tile(J[2], J[5], 5, orientation=orientation))


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_one_token_on_a_bitsandbytes_quantized_block(monkeypatch, tmp_path, quantization):
    """bitsandbytes' layers (their CPU backend, the CUDA-only guard widened). 4-bit: the one-token
    path equals the all-token sweep, both through the dequantized weights. 8-bit (LLM.int8 rounds
    the activations, so the prefix's cache is not the dequantized block's; forced, the path
    differed from the sweep by 7e-4): the path declines and says why."""
    pytest.importorskip("bitsandbytes", reason="the gpu extra (make venv installs it)")
    from support.wide_models import wide_model

    from coupling_utils.models import loading

    monkeypatch.setattr(loading, "QUANTIZATION_DEVICES", ("cuda", "cpu"))
    q = loading.load_model(
        wide_model(tmp_path, "Llama", n_layers=2), quantization=quantization, dtype="float32", device="cpu"
    )
    layers = {type(m).__name__ for m in q.model.modules()}
    assert {"4bit": "Linear4bit", "8bit": "Linear8bitLt"}[quantization] in layers
    for module in q.model.modules():  # dequantize, then multiply (as on a GPU), not the repacked
        if type(module).__name__ == "Linear4bit":  # bf16 kernels of an AVX512-BF16 CPU
            module.support_avx512bf16_for_cpu = False
    x = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    if quantization == "8bit":
        assert one_token_supported(q, x) == (
            "LLM.int8 (8-bit) layers round the activations: the prefix's key/value cache would hold "
            "int8's keys and values, not those of the dequantized block the Jacobian differentiates"
        )
        assert choose_path(q, x, 1, 9)[0] == "all_tokens"
        with pytest.raises(ValueError, match="LLM.int8"):
            one_token_jacobians(q, x, 0, [8])
        return
    assert one_token_supported(q, x) is None
    for layer, last_block in ((0, "block"), (1, "final_norm")):
        J = token_jacobians(q, x, layer, tokens=[8, 0, 4], last_block=last_block)
        O = one_token_jacobians(q, x, layer, [8, 0, 4], last_block=last_block)
        assert O.dtype == torch.float32 and float(J.abs().max()) > 0
        assert rel(O, J) <= 1e-5, (quantization, layer, last_block)


def test_cache_argument_follows_the_forward_signature():
    """The prefix's cache goes in under the name the model's forward takes: ``cache`` (transformers
    5) or ``past_key_values`` (before; the installed transformers cannot show it)."""
    from coupling_utils.engine.one_token import _cache_argument

    class New:
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    class Old:
        def forward(self, input_ids=None, past_key_values=None, **kwargs): ...

    assert _cache_argument(New()) == "cache"
    assert _cache_argument(Old()) == "past_key_values"


def test_one_token_calls_pass_exactly_these_inputs(monkeypatch):
    """The two forward passes get the token ids, an all-ones int64 mask and use_cache: the prefix
    pass (tokens < t; only for t > 0, t = 1 included) with use_cache=True, the query pass (token t
    alone) with a copy of the prefix's cache under the forward's name and use_cache = t > 0."""
    from coupling_utils.engine import one_token

    passes, real = [], one_token.capture_blocks
    monkeypatch.setattr(
        one_token, "capture_blocks", lambda m, b, kw, **k: passes.append(dict(kw)) or real(m, b, kw, **k)
    )
    llama = tiny_model("llama")
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(11))
    for t in (0, 1, 3):
        passes.clear()
        one_token.OneTokenCalls(llama, x, t, [1])
        *prefix, query = passes
        assert len(prefix) == (t > 0)
        if t:
            assert (
                set(prefix[0]) == {"input_ids", "attention_mask", "use_cache"}
                and prefix[0]["use_cache"] is True
            )
            assert torch.equal(prefix[0]["input_ids"], x[:, :t])
            mask = prefix[0]["attention_mask"]
            assert mask.dtype == torch.long and torch.equal(mask, torch.ones(1, t, dtype=torch.long))
        assert set(query) == {"input_ids", "attention_mask", "use_cache"} | ({"cache"} if t else set())
        assert query["use_cache"] is (t > 0) and torch.equal(query["input_ids"], x[:, t : t + 1])
        mask = query["attention_mask"]
        assert mask.dtype == torch.long and torch.equal(mask, torch.ones(1, t + 1, dtype=torch.long))
    torch.testing.assert_close(
        one_token_jacobians(llama, x, 1, [1]), token_jacobians(llama, x, 1, tokens=[1]), rtol=1e-5, atol=1e-6
    )


def test_one_token_calls_range_checks_and_errors(monkeypatch):
    """Layers in -n..n-1 and tokens in -T..T-1 (negative ones count from the end, as everywhere),
    and the messages for a model in training mode, a model that makes no cache and a block the
    pass never reached."""
    from coupling_utils.engine import one_token
    from coupling_utils.engine.one_token import OneTokenCalls

    llama = tiny_model("llama")  # 2 blocks
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(12))
    f, xt = OneTokenCalls(llama, x, 5, [-2]).function(-2)
    g, _ = OneTokenCalls(llama, x, 5, [0]).function(0)
    torch.testing.assert_close(f(xt), g(xt), rtol=0, atol=0)
    with pytest.raises(IndexError, match=r"^layer 2 out of range: the model has 2 blocks \(0\.\.1\)$"):
        OneTokenCalls(llama, x, 5, [2])
    with pytest.raises(IndexError, match=r"^layer -3 out of range"):
        OneTokenCalls(llama, x, 5, [-3])
    f, xt = one_token_function(llama, x, 1, -8)
    g, x0 = one_token_function(llama, x, 1, 0)
    assert torch.equal(xt, x0) and torch.equal(f(xt), g(x0))
    llama.train()
    try:
        with pytest.raises(
            ValueError,
            match=r"^the model is in training mode \(dropout would make Jacobians random\); "
            r"call model\.eval\(\)$",
        ):
            OneTokenCalls(llama, x, 5, [0])
    finally:
        llama.eval()
    with monkeypatch.context() as m:
        m.setattr(one_token, "_is_cache", lambda v: False)
        with pytest.raises(
            RuntimeError, match=rf"^{type(llama).__name__} made no key/value cache with use_cache=True$"
        ):
            OneTokenCalls(llama, x, 5, [0])
    real = one_token.capture_blocks

    def lose_the_calls(*args, **kwargs):
        got = real(*args, **kwargs)
        if not kwargs.get("outputs"):  # the query pass
            got.calls.clear()
        return got

    monkeypatch.setattr(one_token, "capture_blocks", lose_the_calls)
    with pytest.raises(RuntimeError, match=r"^block\(s\) \[1\] were not called during the forward pass$"):
        OneTokenCalls(llama, x, 5, [1])


def test_one_token_function_arguments():
    """function(layer) defaults to last_block="block"; one_token_function passes last_block on; a
    block called with hidden_states by keyword gives the same function as one called positionally."""
    from coupling_utils.engine.one_token import OneTokenCalls

    llama = tiny_model("llama")
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(13))
    calls = OneTokenCalls(llama, x, 6, [1])
    f, xt = calls.function(1)
    g, _ = calls.function(1, "block")
    h, _ = calls.function(1, "final_norm")
    assert torch.equal(f(xt), g(xt)) and not torch.allclose(f(xt), h(xt))
    n, _ = one_token_function(llama, x, 1, 6, last_block="final_norm")
    assert torch.equal(n(xt), h(xt))
    args, kwargs = calls.calls[1]
    assert len(args) == 1
    calls.calls[1] = ((), {**kwargs, "hidden_states": args[0]})
    k, xk = calls.function(1)
    assert torch.equal(xk, xt) and torch.equal(k(xt), g(xt))


def test_calls_shared_by_blocks_with_a_positional_cache():
    """GPT-2 hands its blocks the cache positionally: one OneTokenCalls shared by both blocks (as
    measure() shares them) must still give each block the prefix's cache, not the query pass's
    (which block 0 has already extended by token t), and the calls given are used, not remade."""
    from coupling_utils.engine.one_token import OneTokenCalls

    gpt2 = tiny_model("gpt2")
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(14))
    shared = {t: OneTokenCalls(gpt2, x, t, [0, 1]) for t in (4, 7)}
    for layer in (0, 1):
        O = one_token_jacobians(gpt2, x, layer, [4, 7], calls=shared)
        assert rel(O, token_jacobians(gpt2, x, layer, tokens=[4, 7])) <= 1e-5
    y = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(15))
    other = {7: OneTokenCalls(gpt2, y, 7, [1])}
    torch.testing.assert_close(
        one_token_jacobians(gpt2, x, 1, [7], calls=other), one_token_jacobians(gpt2, y, 1, [7])
    )


def test_one_token_jacobians_options_dtype_and_non_finite_blocks(monkeypatch):
    """chunk_size is checked, no progress bar is drawn, a float64 model gives an fp32 result equal
    to its sweep, and a non-finite Jacobian is reported with its layer and its tokens (negative
    ones as positions)."""
    from coupling_utils.engine import jacobians

    llama = tiny_model("llama")
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(16))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        one_token_jacobians(llama, x, 0, [3], chunk_size=0)
    bars, tqdm = [], jacobians.tqdm
    monkeypatch.setattr(jacobians, "tqdm", lambda *a, **k: bars.append(k) or tqdm(*a, **k))
    one_token_jacobians(llama, x, 0, [3], chunk_size=5)
    assert [b["disable"] for b in bars] == [True]
    wide = tiny_model("llama").double()
    O = one_token_jacobians(wide, x, 1, [5])
    assert O.dtype == torch.float32
    assert rel(O, token_jacobians(wide, x, 1, tokens=[5])) <= 1e-6
    with torch.no_grad():
        llama.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN/inf in the block Jacobian at layer 1, token\(s\) \[5, 7\]\."):
        one_token_jacobians(llama, x, 1, [5, -1])
