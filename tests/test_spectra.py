"""Top-K spectra: exact, randomized (Halko et al.), and matrix-free through model blocks."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.engine.jacobians import token_jacobians
from coupling_utils.engine.metric import SVD, coupling
from coupling_utils.engine.spectra import (
    Solver,
    TokenOperator,
    block_lanczos_svd,
    block_passes,
    lanczos_plan,
    lapack_threads,
    matrix_free_topk,
    operator_topk,
    randomized_svd,
    solver_passes,
    topk_svd,
)


def _with_spectrum(s: torch.Tensor, batch=(), seed=0) -> torch.Tensor:
    """Random matrices [*batch, d, d] (float64) with singular values ``s``."""
    g = torch.Generator().manual_seed(seed)
    d = s.shape[-1]
    U = torch.linalg.qr(torch.randn(*batch, d, d, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(*batch, d, d, generator=g, dtype=torch.float64)).Q
    return (U * s) @ V.transpose(-1, -2)


def _gapped(d=80, k=6, batch=(3,)):
    s = torch.cat([torch.linspace(10, 4, k), 0.05 * torch.rand(d - k)]).double()
    return _with_spectrum(s, batch)


def _same_up_to_sign(A: torch.Tensor, B: torch.Tensor, atol: float):
    """Columns of A and B agree up to one sign per column."""
    signs = torch.sign((A * B).sum(-2, keepdim=True))
    torch.testing.assert_close(A * signs, B, atol=atol, rtol=0)


def test_exact_matches_torch_svd_batched():
    J = torch.randn(2, 3, 20, 20, dtype=torch.float64)
    s = topk_svd(J, 5)
    U, S, Vh = torch.linalg.svd(J)
    assert s.U.shape == (2, 3, 20, 5) and s.S.shape == (2, 3, 5) and s.Vh.shape == (2, 3, 5, 20)
    torch.testing.assert_close(s.S, S[..., :5])
    _same_up_to_sign(s.U, U[..., :5], 1e-10)
    _same_up_to_sign(s.Vh.transpose(-1, -2), Vh[..., :5, :].transpose(-1, -2), 1e-10)


def test_half_precision_is_promoted_to_fp32():
    J = torch.randn(16, 16).half()
    assert topk_svd(J, 3).S.dtype == torch.float32
    assert topk_svd(J, 3, "randomized").S.dtype == torch.float32


def test_randomized_is_accurate_with_a_spectral_gap():
    J = _gapped()
    ex = topk_svd(J, 6)
    r = topk_svd(J, 6, "randomized", oversample=10, n_iter=2, seed=1)
    assert (r.S - ex.S).abs().max() / ex.S.max() < 1e-6
    _same_up_to_sign(r.U, ex.U, 1e-4)
    _same_up_to_sign(r.Vh.transpose(-1, -2), ex.Vh.transpose(-1, -2), 1e-4)
    # and the coupling metric computed from either agrees
    assert abs(coupling(J[0], r._replace(U=r.U[0], S=r.S[0], Vh=r.Vh[0]), 6) - coupling(J[0], J[0], 6)) < 1e-4


def test_power_iterations_reduce_the_error_without_a_gap():
    s = 1.0 / torch.arange(1, 101).double() ** 0.5  # slow decay: hard for a range finder
    J = _with_spectrum(s, (4,), seed=3)
    ex = topk_svd(J, 10)
    errs = [
        (
            (topk_svd(J, 10, "randomized", oversample=5, n_iter=q).S - ex.S).abs().max() / ex.S[..., 0].max()
        ).item()
        for q in (0, 2, 6)
    ]
    assert errs[0] > errs[1] > errs[2]
    assert errs[0] > 1e-2  # the test matrix really is hard without power iterations


def test_randomized_is_deterministic_per_seed():
    J = torch.randn(30, 30)
    a = topk_svd(J, 4, "randomized", seed=5)
    b = topk_svd(J, 4, "randomized", seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_randomized_counts_products():
    J = torch.randn(2, 40, 40)
    calls = {"cols": 0}

    def apply(V):
        calls["cols"] += V.shape[-1]
        return J @ V

    def apply_t(U):
        calls["cols"] += U.shape[-1]
        return J.transpose(-1, -2) @ U

    s, products = randomized_svd(
        apply, apply_t, tuple(J.shape), 5, Solver("subspace", oversample=7, n_iter=3)
    )
    assert products == calls["cols"] == (2 * 3 + 2) * 12 == block_passes(5, oversample=7, n_iter=3)
    assert s.S.shape == (2, 5)
    s_all, _ = randomized_svd(
        apply, apply_t, tuple(J.shape), 5, Solver("subspace", oversample=7, n_iter=3), keep="all"
    )
    assert s_all.S.shape == (2, 12)
    assert block_passes(30, oversample=20, n_iter=1, d=40) == 4 * 40


def test_bad_arguments_raise_clear_errors():
    J = torch.randn(8, 8)
    with pytest.raises(ValueError, match="exceeds the matrix size"):
        topk_svd(J, 9)
    with pytest.raises(ValueError, match="method must be one of"):
        topk_svd(J, 2, "arnoldi")
    with pytest.raises(ValueError, match="NaN"):
        topk_svd(torch.full((4, 4), float("nan")), 2)
    with pytest.raises(ValueError, match="oversample"):
        topk_svd(J, 2, "randomized", oversample=-1)
    with pytest.raises(ValueError, match="n_iter"):
        topk_svd(J, 2, "randomized", n_iter=1.5)


def _counting(J):
    """apply/apply_t for J [..., m, n] that count the columns pushed through them."""
    calls = {"cols": 0}
    Jt = J.transpose(-1, -2)

    def apply(V):
        calls["cols"] += V.shape[-1]
        return J @ V

    def apply_t(U):
        calls["cols"] += U.shape[-1]
        return Jt @ U

    return apply, apply_t, calls


def test_lanczos_is_accurate_with_a_spectral_gap():
    J = _gapped()  # [3, 80, 80], a gap after the 6th value
    ex = topk_svd(J, 6)
    lz = topk_svd(J, 6, "lanczos", seed=1)  # defaults: block 3, 6 steps
    assert (lz.S - ex.S).abs().max() / ex.S.max() < 1e-8
    _same_up_to_sign(lz.U, ex.U, 1e-6)
    _same_up_to_sign(lz.Vh.transpose(-1, -2), ex.Vh.transpose(-1, -2), 1e-6)


def test_lanczos_without_a_gap_beats_subspace_iteration_per_product():
    s = 1.0 / torch.arange(1, 201).double() ** 0.5  # slow decay, no gap: the hard case
    J = _with_spectrum(s, (4,), seed=3)
    ex = topk_svd(J, 10)

    def err(x):
        return ((x.S - ex.S).abs() / ex.S[..., :1]).max().item()

    lz = topk_svd(J, 10, "lanczos", block=5, steps=6)  # 55 products
    sub = topk_svd(J, 10, "randomized", oversample=4, n_iter=1)  # 56 products
    assert (
        solver_passes(10, block=5, steps=6) == 55
        and solver_passes(10, solver="subspace", oversample=4, n_iter=1) == 56
    )
    assert err(lz) < 0.5 * err(sub)
    assert err(lz) < 0.02
    # more steps: a larger Krylov space, a smaller error; all of it (block·steps = d): exact
    assert err(topk_svd(J, 10, "lanczos", block=5, steps=12)) < err(lz)
    full = topk_svd(J, 10, "lanczos", block=20, steps=10)
    assert err(full) < 1e-10
    _same_up_to_sign(full.U[..., :3], ex.U[..., :3], 1e-6)  # the leading values are separated


def test_lanczos_counts_products_and_keeps_all_ritz_triplets():
    J = torch.randn(2, 40, 30, dtype=torch.float64)
    apply, apply_t, calls = _counting(J)
    svd, products = block_lanczos_svd(
        apply, apply_t, tuple(J.shape), 5, Solver(block=3, steps=4), dtype=torch.float64
    )
    assert products == calls["cols"] == (2 * 4 - 1) * 3 == solver_passes(5, block=3, steps=4, d=30)
    assert svd.U.shape == (2, 40, 5) and svd.S.shape == (2, 5) and svd.Vh.shape == (2, 5, 30)
    # the returned bases diagonalise J exactly: Uᵀ J V = diag(S), with no further products
    all_, _ = block_lanczos_svd(
        apply, apply_t, tuple(J.shape), 5, Solver(block=3, steps=4), dtype=torch.float64, keep="all"
    )
    assert all_.S.shape == (2, 12)
    torch.testing.assert_close(
        all_.U.transpose(-1, -2) @ J @ all_.Vh.transpose(-1, -2), torch.diag_embed(all_.S), atol=1e-10, rtol=0
    )
    torch.testing.assert_close(
        all_.U.transpose(-1, -2) @ all_.U, torch.eye(12, dtype=torch.float64).expand(2, 12, 12)
    )
    # block·steps may not exceed min(m, n) = 30: steps is capped at 30 // 4 = 7
    calls["cols"] = 0
    _, products = block_lanczos_svd(
        apply, apply_t, tuple(J.shape), 5, Solver(block=4, steps=20), dtype=torch.float64
    )
    assert lanczos_plan(5, 30, block=4, steps=20) == (4, 7)
    assert products == calls["cols"] == 13 * 4 == solver_passes(5, block=4, steps=20, d=30)
    assert lanczos_plan(10) == (1, 45) and lanczos_plan(7) == (1, 45)  # defaults ceil(k/10), 45
    assert lanczos_plan(30) == (3, 45) and lanczos_plan(50, 64) == (5, 12)  # capped: 64 // 5 = 12


def test_lanczos_is_deterministic_per_seed_and_handles_rank_deficiency():
    J = torch.randn(30, 30)
    a, b = topk_svd(J, 4, "lanczos", seed=5), topk_svd(J, 4, "lanczos", seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # rank 3 < block·steps: the Krylov space is exhausted early, the basis must stay orthonormal
    low = _with_spectrum(torch.cat([torch.tensor([3.0, 2.0, 1.0]), torch.zeros(27)]).double())
    svd, _ = block_lanczos_svd(
        lambda V: low @ V,
        lambda U: low.T @ U,
        (30, 30),
        3,
        Solver(block=2, steps=5),
        dtype=torch.float64,
        keep="all",
    )
    torch.testing.assert_close(svd.S[:3], torch.tensor([3.0, 2.0, 1.0]).double())
    assert svd.S[3:].abs().max() < 1e-10
    torch.testing.assert_close(svd.U.T @ svd.U, torch.eye(10, dtype=torch.float64))


def test_lanczos_bad_arguments_raise_clear_errors():
    J = torch.randn(8, 8)
    with pytest.raises(ValueError, match="block must be a positive integer"):
        topk_svd(J, 2, "lanczos", block=0)
    with pytest.raises(ValueError, match="block must be a positive integer"):
        topk_svd(J, 2, "lanczos", block=1.5)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        topk_svd(J, 2, "lanczos", steps=-1)
    with pytest.raises(ValueError, match="block=9 exceeds the matrix size 8"):
        topk_svd(J, 2, "lanczos", block=9)
    with pytest.raises(ValueError, match="cannot give k=6 triplets"):
        topk_svd(J, 6, "lanczos", block=2, steps=2)
    with pytest.raises(ValueError, match="steps capped at 8 // 5 = 1"):
        topk_svd(J, 6, "lanczos", block=5, steps=3)  # only one block of 5 fits in 8
    with pytest.raises(ValueError, match="exceeds the matrix size"):
        topk_svd(J, 9, "lanczos")
    with pytest.raises(ValueError, match="keep must be"):
        block_lanczos_svd(lambda V: J @ V, lambda U: J.T @ U, (8, 8), 2, keep="some")
    with pytest.raises(ValueError, match="solver must be one of"):
        solver_passes(4, solver="power")


def test_lapack_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with lapack_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _toy_token_diagonal(T=5, d=12):
    g = torch.Generator().manual_seed(0)
    W1, W2 = torch.randn(d, d, generator=g) / d**0.5, torch.randn(d, d, generator=g) / d**0.5
    f = lambda X: torch.tanh(X @ W1) @ W2  # acts on each row alone: J is block-diagonal  # noqa: E731
    X = torch.randn(T, d, generator=g)
    full = torch.func.jacrev(f)(X)  # [T, d, T, d]
    J_tdd = torch.stack([full[t, :, t, :] for t in range(T)])
    return f, X, J_tdd


def test_token_operator_products_equal_explicit_jacobians():
    f, X, J = _toy_token_diagonal()
    op = TokenOperator(f, X, chunk_size=3)
    V = torch.randn(5, 12, 7)
    torch.testing.assert_close(op.matmul(V), J @ V, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(op.rmatmul(V), J.transpose(-1, -2) @ V, atol=1e-5, rtol=1e-5)
    assert op.passes == 14


def test_token_operator_runs_a_bf16_block_in_bf16_and_returns_fp32_products():
    f, X, J = _toy_token_diagonal()
    seen = []

    def f_bf16(Y):  # the block in its own dtype, as a bf16 model would run
        seen.append(Y.dtype)
        return f(Y.float()).to(torch.bfloat16)

    op = TokenOperator(f_bf16, X.to(torch.bfloat16), chunk_size=3)
    assert op.dtype == torch.float32
    V = torch.randn(5, 12, 4)
    out, back = op.matmul(V), op.rmatmul(V)
    assert out.dtype == back.dtype == torch.float32 and set(seen) == {torch.bfloat16}
    torch.testing.assert_close(out, J @ V, atol=0.1, rtol=0.05)  # bf16 rounding of X and products


def test_operator_topk_with_full_rank_probe_is_exact():
    f, X, J = _toy_token_diagonal()
    res = operator_topk(
        TokenOperator(f, X), 4, Solver("subspace", oversample=20, n_iter=1)
    )  # l = min(24, d) = d
    ex = topk_svd(J, 4)
    assert res.rank == 12 and res.block_passes == 4 * 12
    torch.testing.assert_close(res.svd.S, ex.S, atol=1e-5, rtol=1e-5)


def test_operator_lanczos_equals_lanczos_on_the_explicit_jacobians():
    f, X, J = _toy_token_diagonal()  # T = 5, d = 12
    op = TokenOperator(f, X, chunk_size=2)
    res = operator_topk(op, 4, Solver(block=2, steps=3, seed=3), keep="all")
    assert res.solver == "lanczos" and res.settings == {"block": 2, "steps": 3} and res.rank == 6
    assert res.block_passes == op.passes == (2 * 3 - 1) * 2 == solver_passes(4, block=2, steps=3, d=12)
    explicit, _ = block_lanczos_svd(
        lambda V: J @ V,
        lambda U: J.transpose(-1, -2) @ U,
        tuple(J.shape),
        4,
        Solver(block=2, steps=3, seed=3),
        keep="all",
    )
    torch.testing.assert_close(res.svd.S, explicit.S, atol=1e-5, rtol=1e-5)
    _same_up_to_sign(res.svd.U, explicit.U, 1e-4)
    # block·steps = d: the whole space, so the top 4 are exact
    full = operator_topk(TokenOperator(f, X), 4, Solver(block=3, steps=4))
    torch.testing.assert_close(full.svd.S, topk_svd(J, 4).S, atol=1e-5, rtol=1e-5)


def test_operator_topk_detects_nan_products():
    _, X, _ = _toy_token_diagonal()
    op = TokenOperator(lambda Y: Y * torch.log(-Y.abs() - 1), X)  # NaN everywhere
    for solver in ("lanczos", "subspace"):
        with pytest.raises(ValueError, match="NaN or inf"):
            operator_topk(op, 2, Solver(solver))
    with pytest.raises(ValueError, match="solver must be one of"):
        operator_topk(op, 2, Solver("halko"))


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_matrix_free_matches_exact_on_a_tiny_model(arch):
    model = tiny_model(arch)
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))
    J = token_jacobians(model, ids, 1)  # [T, d, d], d = 32
    ex = topk_svd(J, 5)
    # l = d: the range finder sees the whole space, so the result is exact up to rounding
    full = matrix_free_topk(model, ids, 1, 5, Solver("subspace", oversample=27, n_iter=0))
    assert full.block_passes == 2 * 32
    torch.testing.assert_close(full.svd.S, ex.S, atol=1e-4 * ex.S.max().item(), rtol=1e-4)
    # l < d: a truncated sketch with power iterations; the top-5 subspace is close, and the
    # coupling of J with the matrix-free triplets is near that of J with itself (0)
    part = matrix_free_topk(model, ids, 1, 5, Solver("subspace", oversample=10, n_iter=3), keep="all")
    assert part.svd.S.shape == (6, 15) and part.block_passes == 8 * 15
    top = SVD(part.svd.U[..., :5], part.svd.S[..., :5], part.svd.Vh[..., :5, :])
    assert ((top.S - ex.S).abs() / ex.S[..., :1]).max() < 0.05
    for t in range(6):
        m = coupling(J[t], SVD(top.U[t], top.S[t], top.Vh[t]), 5)
        assert m < 0.1, (t, m)
    # block Lanczos (the default solver) over the whole space (block·steps = d) is exact too
    lz = matrix_free_topk(model, ids, 1, 5, Solver(block=4, steps=8))
    assert lz.block_passes == (2 * 8 - 1) * 4 and lz.solver == "lanczos"
    torch.testing.assert_close(lz.svd.S, ex.S, atol=1e-4 * ex.S.max().item(), rtol=1e-4)


def test_matrix_free_topk_measures_the_last_block_as_last_block_says():
    model = tiny_model("llama")  # 2 blocks: block 1 is the last
    ids = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    spectra = {}
    for last_block in ("block", "final_norm"):
        ex = topk_svd(token_jacobians(model, ids, 1, last_block=last_block), 3)
        mf = matrix_free_topk(model, ids, 1, 3, Solver(block=4, steps=8), last_block=last_block)
        torch.testing.assert_close(mf.svd.S, ex.S, atol=1e-4 * ex.S.max().item(), rtol=1e-4)
        spectra[last_block] = ex.S
    assert not torch.allclose(spectra["block"], spectra["final_norm"], rtol=0.01)  # the final norm counts
    with pytest.raises(ValueError, match="last_block='excluded' leaves it out"):
        matrix_free_topk(model, ids, 1, 3, last_block="excluded")


def test_documented_defaults():
    """Defaults the docstrings promise: oversample 10, two power iterations, seed 0, chunks of 64."""
    assert block_passes(5) == (2 * 2 + 2) * 15 == solver_passes(5, solver="subspace")
    assert block_passes(5, d=12) == 6 * 12 == solver_passes(5, solver="subspace", d=12)
    assert solver_passes(5, d=12) == (2 * 12 - 1) * 1  # Lanczos: block 1, steps capped at 12
    assert solver_passes(25) == (2 * 45 - 1) * 3
    J = _gapped(d=30, k=4, batch=())
    for method in ("randomized", "lanczos"):
        a, b = topk_svd(J, 4, method), topk_svd(J, 4, method, seed=0)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        c = topk_svd(J, 4, method, seed=1)
        assert not torch.equal(a.U, c.U)
    explicit = topk_svd(J, 4, "randomized", oversample=10, n_iter=2, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(topk_svd(J, 4, "randomized"), explicit))
    other = topk_svd(J, 4, "randomized", oversample=11, n_iter=2, seed=0)
    assert not torch.equal(other.U, explicit.U)
    fewer = topk_svd(J, 4, "randomized", oversample=10, n_iter=3, seed=0)
    assert not torch.equal(fewer.U, explicit.U)
    lz = topk_svd(J, 4, "lanczos", block=1, steps=30, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(topk_svd(J, 4, "lanczos", block=1, steps=30), lz))
    f, X, _ = _toy_token_diagonal()
    assert TokenOperator(f, X).chunk_size == 64
    res = operator_topk(TokenOperator(f, X), 3, Solver("subspace"))
    assert res.settings == {"oversample": 10, "n_iter": 2} and res.rank == 12 and res.k == 3
    assert res.block_passes == 6 * 12
    again = operator_topk(TokenOperator(f, X), 3, Solver("subspace", oversample=10, n_iter=2, seed=0))
    assert torch.equal(res.svd.S, again.svd.S)
    assert isinstance(res.k, int)


def test_spectra_keep_the_dtype_and_device_of_their_input():
    J = _gapped(d=20, k=3, batch=(2,))
    for method in ("exact", "randomized", "lanczos"):
        s = topk_svd(J, 3, method)
        assert s.U.dtype == s.S.dtype == s.Vh.dtype == torch.float64, method
        assert s.U.shape == (2, 20, 3) and s.Vh.shape == (2, 3, 20)
    s32 = topk_svd(J.float(), 3, "lanczos")
    assert s32.U.dtype == torch.float32
    f, X, Jt = _toy_token_diagonal()
    res = operator_topk(TokenOperator(lambda Y: f(Y.float()).double(), X.double()), 2)
    assert res.svd.U.dtype == res.svd.S.dtype == torch.float64


def test_randomized_on_rectangular_operators_and_keep_all():
    """The sketch holds l = min(k + oversample, m, n) vectors (here n < k + oversample < m)."""
    g = torch.Generator().manual_seed(4)
    A = torch.randn(30, 8, generator=g, dtype=torch.float64)
    s, products = randomized_svd(
        lambda V: A @ V,
        lambda U: A.T @ U,
        (30, 8),
        3,
        Solver("subspace", oversample=10, n_iter=1),
        keep="all",
        dtype=torch.float64,
    )
    assert s.S.shape == (8,) and products == (2 * 1 + 2) * 8
    torch.testing.assert_close(s.S, torch.linalg.svdvals(A), rtol=1e-10, atol=1e-10)
    wide = A.T.contiguous()  # 8 x 30
    s, products = randomized_svd(
        lambda V: wide @ V,
        lambda U: wide.T @ U,
        (8, 30),
        3,
        Solver("subspace", oversample=10),
        keep="all",
        dtype=torch.float64,
    )
    assert s.S.shape == (8,) and products == 6 * 8
    with pytest.raises(ValueError) as info:
        randomized_svd(lambda V: A @ V, lambda U: A.T @ U, (30, 8), 3, keep="some")
    assert str(info.value) == "keep must be 'k' or 'all', got 'some'"
    lz, _ = block_lanczos_svd(
        lambda V: A @ V,
        lambda U: A.T @ U,
        (30, 8),
        3,
        Solver(block=2, steps=4),
        keep="all",
        dtype=torch.float64,
    )
    torch.testing.assert_close(lz.S, torch.linalg.svdvals(A), rtol=1e-10, atol=1e-10)
    assert lz.U.shape == (30, 8) and lz.Vh.shape == (8, 8)


def test_lanczos_plan_edges():
    assert lanczos_plan(10) == (1, 45) and lanczos_plan(11) == (2, 45) and lanczos_plan(10, 10) == (1, 10)
    assert lanczos_plan(4, 8, block=8, steps=1) == (8, 1)  # block = size is allowed
    assert lanczos_plan(6, 12, block=2, steps=3) == (2, 3)  # block·steps = k is enough
    with pytest.raises(ValueError) as info:
        lanczos_plan(0)
    assert str(info.value) == "k must be a positive integer, got 0"
    with pytest.raises(ValueError) as info:
        lanczos_plan(7, block=2, steps=3)
    assert str(info.value) == (
        "block·steps = 2·3 = 6 Lanczos vectors cannot give k=7 triplets; choose block·steps >= k"
    )
    assert lanczos_plan(5, 8, block=5) == (5, 1)
    with pytest.raises(ValueError) as info:
        lanczos_plan(6, 8, block=5)
    assert str(info.value) == (
        "block·steps = 5·1 = 5 Lanczos vectors (steps capped at 8 // 5 = 1 by the matrix size) "
        "cannot give k=6 triplets; choose block·steps >= k"
    )


def test_argument_checks_say_what_is_wrong():
    J = _gapped(d=12, k=2, batch=())
    cases = [
        (
            lambda: topk_svd(J, 2, "qr"),
            "method must be one of ('exact', 'randomized', 'lanczos'), got 'qr' "
            "(for products through a model block use matrix_free_topk)",
        ),
        (
            lambda: topk_svd(J, 2, "randomized", oversample=-1),
            "oversample must be a non-negative integer, got -1",
        ),
        (
            lambda: topk_svd(J, 2, "randomized", oversample=True),
            "oversample must be a non-negative integer, got True",
        ),
        (
            lambda: topk_svd(J, 2, "randomized", oversample=1.0),
            "oversample must be a non-negative integer, got 1.0",
        ),
        (lambda: topk_svd(J, 2, "randomized", n_iter=-1), "n_iter must be a non-negative integer, got -1"),
        (
            lambda: topk_svd(J, 2, "randomized", n_iter=False),
            "n_iter must be a non-negative integer, got False",
        ),
        (lambda: solver_passes(2, solver="qr"), "solver must be one of ('lanczos', 'subspace'), got 'qr'"),
        (lambda: topk_svd(torch.ones(3), 1), "J must be a matrix (or a stack of matrices), got shape (3,)"),
        (
            lambda: TokenOperator(lambda x: x, torch.ones(2, 3, 4)),
            "X must be the block input [T, d], got shape (2, 3, 4)",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == message
    assert topk_svd(J, 2, "randomized", oversample=0).S.shape == (2,)  # zero oversampling is allowed
    f, X, _ = _toy_token_diagonal()
    nan = TokenOperator(lambda Y: Y * torch.log(-Y.abs() - 1), X)
    with pytest.raises(ValueError) as info:
        operator_topk(nan, 2)
    assert str(info.value) == (
        "the matrix-free products returned NaN or inf; the block is not usable at this input "
        "(check the model's dtype: use float32)"
    )


def test_token_operator_chunks_and_single_columns():
    f, X, J = _toy_token_diagonal()  # T = 5, d = 12
    V = torch.randn(5, 12, 5, dtype=torch.float64)  # float64 in: computed in X's dtype
    for chunk in (None, 1, 2, 5, 64):
        op = TokenOperator(f, X, chunk_size=chunk)
        out = op.matmul(V)
        assert out.dtype == X.dtype and out.shape == (5, 12, 5)
        torch.testing.assert_close(out, J @ V.to(X.dtype), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            op.rmatmul(V[..., :1]), J.transpose(-1, -2) @ V[..., :1].to(X.dtype), atol=1e-5, rtol=1e-5
        )
        assert op.passes == 6
    assert not TokenOperator(f, X).X.requires_grad


def test_operator_topk_counts_only_its_own_products():
    f, X, J = _toy_token_diagonal()
    op = TokenOperator(f, X)
    op.matmul(torch.randn(5, 12, 3))  # three products made before
    res = operator_topk(op, 2, Solver(block=1, steps=4))
    assert res.block_passes == 7 and op.passes == 10
    assert res.k == 2 and isinstance(res.k, int)


def test_solvers_work_on_the_device_they_are_given():
    """Random starts are drawn on the CPU (reproducible) and moved to ``device`` ("meta" here)."""
    J = torch.randn(10, 10, device="meta")
    for solver in (block_lanczos_svd, randomized_svd):
        settings = Solver(block=1, steps=4) if solver is block_lanczos_svd else None
        seen = []

        def apply(V, seen=seen):
            seen.append(V.device.type)
            return J @ V

        s, _ = solver(apply, lambda U: J.T @ U, (10, 10), 2, settings, device="meta")
        assert s.U.device.type == s.S.device.type == "meta" and set(seen) == {"meta"}


def test_operator_topk_asks_the_solvers_for_the_operator_device_and_dtype(monkeypatch):
    import coupling_utils.engine.spectra as spectra

    f, X, _ = _toy_token_diagonal()
    asked = []
    for name in ("block_lanczos_svd", "randomized_svd"):
        real = getattr(spectra, name)

        def spy(*args, real=real, **kwargs):
            asked.append((kwargs["device"], kwargs["dtype"]))
            return real(*args, **kwargs)

        monkeypatch.setattr(spectra, name, spy)
    operator_topk(TokenOperator(f, X), 2, Solver(steps=3))
    operator_topk(TokenOperator(f, X), 2, Solver("subspace"))
    assert asked == [(X.device, X.dtype)] * 2


def test_topk_svd_asks_the_solvers_for_the_device_and_dtype_of_j(monkeypatch):
    """The random start must be moved to J's device: a CPU start would fail against a GPU J."""
    import coupling_utils.engine.spectra as spectra

    J = _gapped(d=20, k=3, batch=(2,))
    asked = []
    for name in ("block_lanczos_svd", "randomized_svd"):
        real = getattr(spectra, name)

        def spy(*args, real=real, **kwargs):
            asked.append((kwargs.get("device"), kwargs.get("dtype")))
            return real(*args, **kwargs)

        monkeypatch.setattr(spectra, name, spy)
    topk_svd(J, 3, "lanczos")
    topk_svd(J, 3, "randomized")
    assert asked == [(J.device, J.dtype)] * 2


def test_direct_solver_defaults():
    J = _gapped(d=24, k=3, batch=())
    apply, apply_t = (lambda V: J @ V), (lambda U: J.T @ U)
    a, n = randomized_svd(apply, apply_t, (24, 24), 3, dtype=torch.float64)
    b, _ = randomized_svd(
        apply, apply_t, (24, 24), 3, Solver("subspace", oversample=10, n_iter=2, seed=0), dtype=torch.float64
    )
    assert n == 6 * 13 and all(torch.equal(x, y) for x, y in zip(a, b))
    c, _ = block_lanczos_svd(apply, apply_t, (24, 24), 3, Solver(block=1, steps=6), dtype=torch.float64)
    d, _ = block_lanczos_svd(
        apply, apply_t, (24, 24), 3, Solver(block=1, steps=6, seed=0), dtype=torch.float64
    )
    e, _ = block_lanczos_svd(
        apply, apply_t, (24, 24), 3, Solver(block=1, steps=6, seed=1), dtype=torch.float64
    )
    assert all(torch.equal(x, y) for x, y in zip(c, d)) and not torch.equal(c.U, e.U)
    with pytest.raises(ValueError) as info:
        lanczos_plan(9, 8)
    assert str(info.value) == "k=9 exceeds the matrix size d=8; choose k <= 8"


def test_operator_topk_caps_lanczos_at_the_operator_size():
    f, X, J = _toy_token_diagonal()  # d = 12: the default 45 steps are capped at 12
    res = operator_topk(TokenOperator(f, X), 2)
    assert res.settings == {"block": 1, "steps": 12} and res.block_passes == 23
    torch.testing.assert_close(res.svd.S, topk_svd(J, 2).S, atol=1e-4, rtol=1e-4)


def test_matrix_free_topk_passes_its_settings_on():
    model = tiny_model("llama")
    ids = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(2))  # T = 3 < k
    res = matrix_free_topk(model, ids, 0, 5, Solver(block=2, steps=3))
    assert res.settings == {"block": 2, "steps": 3} and res.block_passes == 10 and res.svd.S.shape == (3, 5)
    sub = matrix_free_topk(model, ids, 0, 4, Solver("subspace"))
    same = matrix_free_topk(model, ids, 0, 4, Solver("subspace", oversample=10, n_iter=2, seed=0))
    assert sub.settings == {"oversample": 10, "n_iter": 2} and torch.equal(sub.svd.S, same.svd.S)
    other = matrix_free_topk(model, ids, 0, 4, Solver("subspace", seed=1))
    lz0, lz1 = (matrix_free_topk(model, ids, 0, 4, Solver(block=1, steps=5, seed=s)) for s in (0, 1))
    assert not torch.equal(other.svd.U, sub.svd.U) and not torch.equal(lz0.svd.U, lz1.svd.U)
