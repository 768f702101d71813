"""engine/gram.py's rules that the accuracy tests of tests/test_one_token.py do not see: which path
each matrix takes (float32 Gram, float64 Gram, full SVD) at and around its floors, non-square
matrices, the dtypes and shapes returned, the error messages, the subspace and power steps of
the refinement, and how gram_topk shares matrices among threads."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from threadpoolctl import threadpool_info

from coupling_utils.engine import gram


def _with_spectrum(sigma, n: int = 1, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """n matrices U diag(sigma) Vᵀ (random orthogonal U, V), in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    d = sigma.numel()
    out = []
    for _ in range(n):
        U = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
        V = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64)).Q
        out.append((U * sigma) @ V.T)
    return torch.stack(out).to(dtype)


def _count_svds(monkeypatch) -> list:
    """Record each torch.linalg.svd call (gram.py looks it up at call time)."""
    calls, real = [], torch.linalg.svd

    def svd(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", svd)
    return calls


def test_float64_gram_path_and_its_full_svd_fallback(monkeypatch):
    """Float64 input (or mixed=False) takes the top eigenpairs of the float64 Gram, with no SVD at
    all, unless σ_r ≤ 1e-6·σ_1 (U = J V / S would lose accuracy): then one full SVD per matrix.
    The floor is relative to σ_1, on σ_r (not σ_2 nor σ_{r-1}), and strict: σ_r = 1e-6·σ_1
    exactly (a diagonal matrix, whose Gram eigenvalues are exact) already falls back."""
    calls = _count_svds(monkeypatch)
    good = _with_spectrum(torch.linspace(1, 0.5, 24), 2, seed=1, dtype=torch.float64)
    top = gram.gram_topk(good, 4)
    assert calls == []  # eigenpairs of the Gram only
    exact = torch.linalg.svdvals(good)[:, :4]
    torch.testing.assert_close(top.S, exact, rtol=1e-12, atol=0)
    same = gram.gram_topk(good.float(), 4, mixed=False)  # float32 input, mixed=False: the same path
    assert same.S.dtype == torch.float32 and calls == []
    # σ_1 = 1e3, σ_2 = 10, σ_3 = 1e-4 < 1e-6·σ_1 = 1e-3 (but > 1e-6·σ_2 and > 1e-6 / σ_1)
    steep = _with_spectrum([1e3, 10, 1e-4] + [1e-5] * 21, 1, seed=2, dtype=torch.float64)
    gram.gram_topk(steep, 3)
    assert len(calls) == 1
    calls.clear()
    edge = torch.diag(torch.tensor([1e6, 10.0, 1.0] + [0.5] * 21, dtype=torch.float64))
    s = gram.gram_topk(edge, 3)
    assert len(calls) == 1 and s.S.tolist() == [1e6, 10.0, 1.0]


def test_float64_gram_of_a_rank_deficient_matrix_falls_back_silently():
    """Beyond J's rank the float64 Gram's eigenvalues are rounding, some negative (here 4 of the
    top 6 of a rank-2 matrix): they are clipped to 0 before the square root, so no NaN and no
    numpy "invalid value" warning, and the matrix gets the full SVD."""
    import warnings

    g = torch.Generator().manual_seed(3)
    low = torch.randn(16, 2, generator=g, dtype=torch.float64) @ torch.randn(
        2, 16, generator=g, dtype=torch.float64
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        top = gram.gram_topk(low, 6)
    U, S, Vh = torch.linalg.svd(low, full_matrices=False)
    assert torch.equal(top.S, S[:6]) and torch.equal(top.U, U[:, :6])


def test_float32_gram_floor_on_sigma_r(monkeypatch):
    """The float32 Gram is kept while σ_r > MIXED_FLOOR·σ_1 (σ_r, not σ_{r-1}; times σ_1, not
    divided by it; strictly): σ_1 = 10, σ_{r-1} = 5, σ_r = 0.05 falls back to the float64 Gram,
    bit for bit gram_topk(mixed=False), and so does σ_r = MIXED_FLOOR·σ_1 exactly (a diagonal
    matrix, S = [100, 50, 1] to the bit)."""
    r = 3
    J = _with_spectrum([10, 8, 5, 0.05] + [0.04] * 36, 2, seed=3)
    top, f64 = gram.gram_topk(J, r + 1), gram.gram_topk(J, r + 1, mixed=False)
    assert all(torch.equal(a, b) for a, b in zip(top, f64))
    top = gram.gram_topk(J, r)  # σ_3 = 5 is well above the floor: the float32 Gram, refined
    assert not torch.equal(top.U, gram.gram_topk(J, r, mixed=False).U)

    calls, real = [], gram._float64_gram_topk
    monkeypatch.setattr(gram, "_float64_gram_topk", lambda A, r: calls.append(1) or real(A, r))
    edge = torch.diag(torch.tensor([100.0, 50.0, 1.0] + [0.5] * 37))
    s = gram.gram_topk(edge, 3)
    assert s.S.tolist() == [100.0, 50.0, 1.0] and calls == [1]


@pytest.mark.parametrize("shape", [(40, 8), (8, 40), (30, 50)])
def test_gram_topk_on_non_square_matrices(shape):
    """Tall and wide matrices (the subspace holds at most n = J.shape[-1] vectors, whatever m
    is), 2-D and batched, by gram_topk (mixed and float64), gram_topk_batched and exact_topk, against
    the full SVD; gram_wins takes min(m, n) of the last two dimensions."""
    m, n = shape
    g = torch.Generator().manual_seed(m * n)
    J = torch.randn(3, m, n, generator=g)
    r = 2
    want = torch.linalg.svdvals(J.double())[:, :r]
    for top in (
        gram.gram_topk(J, r),
        gram.gram_topk(J, r, mixed=False),
        gram.gram_topk_batched(J, r),
        gram.exact_topk(J, r)[0],
    ):
        assert top.U.shape == (3, m, r) and top.S.shape == (3, r) and top.Vh.shape == (3, r, n)
        torch.testing.assert_close(top.S.double(), want, rtol=1e-5, atol=0)
        rebuilt = (top.U * top.S.unsqueeze(-2)) @ top.Vh
        best = (J.double() - rebuilt.double()).norm(dim=(-2, -1))
        U, S, Vh = torch.linalg.svd(J.double(), full_matrices=False)
        floor = (J.double() - (U[..., :r] * S[..., None, :r]) @ Vh[..., :r, :]).norm(dim=(-2, -1))
        torch.testing.assert_close(best, floor, rtol=1e-4, atol=0)
    one = gram.gram_topk(J[0], r)
    assert one.U.shape == (m, r) and one.Vh.shape == (r, n)
    small = min(m, n)
    assert gram.gram_wins(J[0], small // 4) and not gram.gram_wins(J[0], small // 4 + 1)
    assert gram.gram_wins(J, small // 4) and not gram.gram_wins(J, small // 4 + 1)


def test_exact_topk_full_svd_path_returns_the_truncated_svd():
    """exact_topk's "full_svd" branch (r > min(m, n)/4): U, S and Vh are the first r of
    torch.linalg.svd's, contiguous."""
    J = torch.randn(2, 12, 12, generator=torch.Generator().manual_seed(5))
    (U, S, Vh), how = gram.exact_topk(J, 5)
    assert how == "full_svd"
    U0, S0, Vh0 = torch.linalg.svd(J, full_matrices=False)
    assert torch.equal(U, U0[..., :5]) and torch.equal(S, S0[..., :5]) and torch.equal(Vh, Vh0[..., :5, :])
    assert U.is_contiguous() and Vh.is_contiguous()


def test_gram_topk_batched_floor_subspace_steps_and_dtypes(monkeypatch):
    """gram_topk_batched: the top 2·(r + 10) eigenvectors of the float32 Gram, two power steps;
    a matrix whose σ_r ≤ MIXED_FLOOR·σ_1 (σ_r, times σ_1) gets the full float64 SVD, bit for
    bit, while the others of the batch keep the refinement; U, S and Vh all in float32."""
    r, d = 4, 60
    ok = _with_spectrum(torch.linspace(10, 5, d), 1, seed=6)
    low = _with_spectrum([10, 8, 6, 5, 0.05] + [0.04] * (d - 5), 1, seed=7)
    J = torch.cat([ok, low])
    seen, real = [], gram._refined
    monkeypatch.setattr(
        gram, "_refined", lambda A, Q, r, steps: seen.append((Q.shape[-1], steps)) or real(A, Q, r, steps)
    )
    top = gram.gram_topk_batched(J, r + 1)
    assert seen == [(min(d, 2 * (r + 1 + gram.GRAM_OVERSAMPLE)), 2)]
    assert top.U.dtype == top.S.dtype == top.Vh.dtype == torch.float32
    U, S, Vh = torch.linalg.svd(low[0].double(), full_matrices=False)
    assert torch.equal(top.S[1], S[: r + 1].float()) and torch.equal(top.U[1], U[:, : r + 1].float())
    assert torch.equal(top.Vh[1], Vh[: r + 1].float())
    U, S, Vh = torch.linalg.svd(ok[0].double(), full_matrices=False)
    assert not torch.equal(top.S[0], S[: r + 1].float()) or not torch.equal(top.U[0], U[:, : r + 1].float())
    seen.clear()
    gram.gram_topk(J, r)  # gram_topk: r + 10 vectors, one step
    assert seen == [(r + gram.GRAM_OVERSAMPLE, 1)] * 2
    monkeypatch.setattr(gram, "_refined", real)
    calls = _count_svds(monkeypatch)  # σ_r = MIXED_FLOOR·σ_1 to the bit: the full SVD too
    gram.gram_topk_batched(torch.diag(torch.tensor([100.0, 50.0, 1.0] + [0.5] * 37)), 3)
    assert len(calls) == 2  # the Rayleigh–Ritz SVD, then the full one


@pytest.mark.parametrize("fn", [gram.gram_topk, gram.gram_topk_batched, gram.exact_topk])
def test_non_finite_jacobians_are_refused_by_name(fn):
    """A NaN in J is refused with the message naming J."""
    J = torch.zeros(2, 8, 8)
    J[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"^J contains NaN or inf; the Jacobian it came from is not usable$"):
        fn(J, 1)


def test_gram_topk_threads(monkeypatch):
    """Threads: with workers=1 (or a single matrix) every matrix runs on the calling thread; with
    workers=w a pool of min(w, matrices) threads (default: torch's thread count), each with one
    torch thread; every factorization runs with BLAS on one thread."""
    seen, real = [], gram._float32_gram_topk

    def spy(A, r):
        blas = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
        seen.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads(), blas))
        return real(A, r)

    pools, Pool = [], gram.ThreadPoolExecutor

    def pool(*args, **kwargs):
        pools.append(args[0] if args else kwargs.get("max_workers"))
        return Pool(*args, **kwargs)

    monkeypatch.setattr(gram, "_float32_gram_topk", spy)
    monkeypatch.setattr(gram, "ThreadPoolExecutor", pool)
    J = torch.randn(3, 24, 24, generator=torch.Generator().manual_seed(9))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gram.gram_topk(J, 2, workers=1)
        assert pools == [] and seen == [(True, 1, {1})] * 3  # lapack_threads: torch on one thread
        seen.clear()
        gram.gram_topk(J[:1], 2, workers=4)
        assert pools == [] and seen == [(True, 1, {1})]
        seen.clear()
        gram.gram_topk(J, 2)  # default: torch's thread count, 2
        assert pools == [2] and [s[0] for s in seen] == [False] * 3
        assert all(s[1:] == (1, {1}) for s in seen)
        seen.clear()
        pools.clear()
        torch.set_num_threads(1)
        gram.gram_topk(J, 2, workers=3)
        assert pools == [3] and [s[0] for s in seen] == [False] * 3
        assert all(s[1:] == (1, {1}) for s in seen)
        seen.clear()
        # each worker sets its own torch thread count to one, not only the caller (lapack_threads)
        monkeypatch.setattr(gram, "lapack_threads", contextlib.nullcontext)
        torch.set_num_threads(2)
        gram.gram_topk(J, 2, workers=2)
        assert [s[:2] for s in seen] == [(False, 1)] * 3
    finally:
        torch.set_num_threads(before)
