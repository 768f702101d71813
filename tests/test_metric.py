"""Unit tests of the coupling metric's properties (paper_method.md, "Coupling metric")."""

import math

import numpy as np
import pytest
import torch

from coupling_utils.engine.metric import SVD, coupling, coupling_matrix, coupling_tile, k_for_width, svd


def _rand(d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d, d, generator=g, dtype=torch.float64)


def test_zero_on_itself():
    J = _rand()
    for k in (1, 5, 32):
        assert coupling(J, J, k) < 1e-12


def test_bounded_by_sqrt2_and_reached():
    # random pairs stay below sqrt(2)
    for seed in range(20):
        assert coupling(_rand(seed=seed), _rand(seed=100 + seed), 8) <= math.sqrt(2) + 1e-12
    # a cyclic shift of singular directions reaches the bound: |U2^T J1 V2| has s on the off-diagonal
    d = 6
    s = torch.linspace(3, 1, d, dtype=torch.float64)
    J1 = torch.roll(torch.eye(d, dtype=torch.float64), 1, dims=0) @ torch.diag(s)
    J2 = torch.diag(torch.linspace(6, 1, d, dtype=torch.float64))
    assert coupling(J1, J2, d) == pytest.approx(math.sqrt(2), abs=1e-12)


def test_unrelated_random_matrices_near_one():
    vals = [coupling(_rand(64, s), _rand(64, 1000 + s), 10) for s in range(30)]
    assert 0.85 < float(np.mean(vals)) < 1.1


def test_sign_invariance_of_singular_pairs():
    J1, J2 = _rand(seed=1), _rand(seed=2)
    s = svd(J2)
    flip = torch.ones(s.S.shape[0], dtype=torch.float64)
    flip[::3] = -1
    flipped = SVD(s.U * flip, s.S, s.Vh * flip[:, None])
    assert torch.allclose((flipped.U * flipped.S) @ flipped.Vh, J2)
    assert coupling(J1, flipped, 7) == pytest.approx(coupling(J1, J2, 7), abs=1e-12)


def test_sign_flipped_twin_is_perfectly_coupled():
    """m(−J, J) = 0, and m(J', J) = 0 for J' = J with the signs of single singular pairs flipped.

    The element-wise |·| removes the sign of each singular pair; without it m(−J, J) = 2.
    """
    J = _rand(12, seed=11)
    U, S, Vh = torch.linalg.svd(J)
    flip = torch.ones(12, dtype=torch.float64)
    flip[[0, 3, 4]] = -1
    J_flipped = (U * (S * flip)) @ Vh  # u_i s_i v_iᵀ -> −u_i s_i v_iᵀ for i in {0, 3, 4}
    assert not torch.allclose(J_flipped, J) and not torch.allclose(J_flipped, -J)
    Js = torch.stack([J, -J, J_flipped])
    for k in (1, 5, 12):
        assert coupling(-J, J, k) < 1e-12 and coupling(J, -J, k) < 1e-12
        assert coupling(J_flipped, J, k) < 1e-12 and coupling(J, J_flipped, k) < 1e-12
        assert coupling_matrix(Js, k).abs().max() < 1e-12
        torch.testing.assert_close(coupling_tile(-J, J, k), torch.diag(S[:k]), rtol=0, atol=1e-12)
    assert coupling(J, J.T, 5) > 0.1  # a matrix that differs by more than signs is not coupled


def test_precomputed_svd_and_numpy_inputs_agree():
    J1, J2 = _rand(seed=3), _rand(seed=4)
    ref = coupling(J1, J2, 5)
    assert coupling(svd(J1), svd(J2), 5) == pytest.approx(ref, abs=1e-12)
    assert coupling(J1.numpy(), J2.numpy(), 5) == pytest.approx(ref, abs=1e-12)


def test_definition_by_hand():
    J1, J2 = _rand(seed=5), _rand(seed=6)
    k = 4
    U, S, Vh = torch.linalg.svd(J2)
    s1 = torch.linalg.svdvals(J1)[:k]
    tile = (U[:, :k].T @ J1 @ Vh[:k].T).abs()
    expected = torch.linalg.norm(tile - torch.diag(s1)) / torch.linalg.norm(s1)
    assert coupling(J1, J2, k) == pytest.approx(float(expected), rel=1e-12)
    assert torch.allclose(coupling_tile(J1, J2, k), tile)
    # trace normalisation and the vju orientation
    assert coupling(J1, J2, k, normalize="trace") == pytest.approx(
        float(torch.linalg.norm(tile - torch.diag(s1)) / s1.sum()), rel=1e-12
    )
    tile_vju = (Vh[:k] @ J1 @ U[:, :k]).abs()
    assert coupling(J1, J2, k, orientation="vju") == pytest.approx(
        float(torch.linalg.norm(tile_vju - torch.diag(s1)) / torch.linalg.norm(s1)), rel=1e-12
    )
    # p changes only the denominator
    assert coupling(J1, J2, k, p=1) == pytest.approx(coupling(J1, J2, k, normalize="trace"), rel=1e-12)


def test_symmetric_matrices_vju_equals_ujv():
    A = _rand(seed=7)
    B = _rand(seed=8)
    A, B = A + A.T, B + B.T
    # for symmetric J2, U and V agree up to signs, which |.| removes
    assert coupling(A, B, 6, orientation="vju") == pytest.approx(coupling(A, B, 6), abs=1e-10)


def test_coupling_matrix_matches_pairwise():
    Js = torch.stack([_rand(16, s) for s in range(4)])
    Js[1] = Js[0] + 0.05 * Js[1]
    M = coupling_matrix(Js, 5)
    for i in range(4):
        for j in range(4):
            assert M[i, j] == pytest.approx(coupling(Js[i], Js[j], 5), abs=1e-12)
    assert M[0, 1] < 0.2 and M[0, 2] > 0.5
    assert torch.all(M.diagonal() < 1e-12)


def test_low_precision_inputs_use_fp32():
    J = _rand(seed=9).to(torch.bfloat16)
    assert coupling(J, J, 5) < 1e-5


@pytest.mark.parametrize(
    "bad_k, err", [(0, ValueError), (33, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_bad_k(bad_k, err):
    J = _rand()
    with pytest.raises(err, match="k"):
        coupling(J, J, bad_k)


def test_bad_inputs():
    J = _rand()
    with pytest.raises(ValueError, match="NaN"):
        coupling(J * float("nan"), J, 3)
    with pytest.raises(ValueError, match="same shape"):
        coupling(J, _rand(16), 3)
    with pytest.raises(ValueError, match="normalize"):
        coupling(J, J, 3, normalize="max")
    with pytest.raises(ValueError, match="orientation"):
        coupling(J, J, 3, orientation="uvj")
    with pytest.raises(ValueError, match="zero"):
        coupling(torch.zeros(4, 4), J[:4, :4], 2)


def test_k_for_width_keeps_k_over_d_and_stays_within_1_and_d():
    assert [k_for_width(d, 0.25) for d in (32, 64, 128)] == [8, 16, 32]  # K/d fixed across widths
    assert k_for_width(10, 1.0) == 10 and k_for_width(1, 1.0) == 1  # K/d = 1 is the whole width
    assert k_for_width(4, 0.01) == 1 and k_for_width(1, 0.5) == 1  # never K = 0
    assert k_for_width(64.0, 0.5) == 32 and isinstance(k_for_width(64.0, 0.5), int)
    for bad_d in (0, -4, 2.5, True):
        with pytest.raises(ValueError) as info:
            k_for_width(bad_d, 0.5)
        assert str(info.value) == f"d_model must be a positive integer, got {bad_d!r}"
    for bad_ratio in (0, -0.1, 1.5):
        with pytest.raises(ValueError) as info:
            k_for_width(64, bad_ratio)
        assert str(info.value) == f"k_over_d (K/d) must lie in (0, 1], got {bad_ratio!r}"


def test_error_messages_name_the_argument_and_the_problem():
    J = _rand(6)
    cases = [
        (
            lambda: coupling([[1.0]], J, 1),
            TypeError,
            "J1 must be a torch.Tensor, numpy array or SVD, got list",
        ),
        (
            lambda: coupling(J, torch.ones(6), 1),
            ValueError,
            "J2 must be a matrix (or a stack of matrices), got shape (6,)",
        ),
        (
            lambda: svd(torch.ones(3)),
            ValueError,
            "J must be a matrix (or a stack of matrices), got shape (3,)",
        ),
        (
            lambda: coupling_tile(J, "x", 2),
            TypeError,
            "J2 must be a torch.Tensor, numpy array or SVD, got str",
        ),
        (
            lambda: coupling_tile(torch.ones(4), J, 2),
            ValueError,
            "J1 must be a matrix (or a stack of matrices), got shape (4,)",
        ),
        (
            lambda: coupling(J, J * float("inf"), 1),
            ValueError,
            "J2 contains NaN or inf; the Jacobian it came from is not usable",
        ),
        (lambda: coupling(J, J, 1, p=0), ValueError, "p must be a positive number, got 0"),
        (lambda: coupling(J, J, 1, p="2"), ValueError, "p must be a positive number, got '2'"),
        (
            lambda: coupling(J, J, 2, normalize="max"),
            ValueError,
            "normalize must be one of ('norm', 'trace'), got 'max'",
        ),
        (
            lambda: coupling(J, J, 2, orientation="x"),
            ValueError,
            "orientation must be one of ('ujv', 'vju'), got 'x'",
        ),
        (
            lambda: coupling(J, _rand(5), 2),
            ValueError,
            "J1 and J2 must have the same shape, got (6, 6) and (5, 5)",
        ),
        (
            lambda: coupling(J[:, :4], J[:4], 2),
            ValueError,
            "J1 and J2 must have the same shape, got (6, 4) and (4, 6)",
        ),
        (
            lambda: coupling(J[:, :4], J[:, :4], 2, orientation="vju"),
            ValueError,
            "the 'vju' orientation needs square matrices",
        ),
        (lambda: coupling(J, J, 7), ValueError, "k=7 exceeds the matrix size d=6; choose k <= 6"),
        (lambda: coupling(J, J, 0), ValueError, "k must be at least 1, got 0"),
        (lambda: coupling(J, J, 1.0), TypeError, "k must be a positive integer, got 1.0"),
        (
            lambda: coupling(torch.zeros(4, 4), J[:4, :4], 2),
            ValueError,
            "J1 has zero top-K singular values (a zero Jacobian); coupling is undefined",
        ),
        (
            lambda: coupling_matrix(torch.ones(2, 3), 1),
            ValueError,
            "Js must be a stack [N, d_out, d_in], got shape (2, 3)",
        ),
        (
            lambda: coupling_matrix([J, "x"], 1),
            TypeError,
            "Js[i] must be a torch.Tensor, numpy array or SVD, got str",
        ),
        (
            lambda: coupling_matrix(torch.ones(2, 3, 3, 3), 1),
            ValueError,
            "Js must be a stack [N, d_out, d_in], got shape (2, 3, 3, 3)",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as info:
            call()
        assert str(info.value) == message


def test_small_jacobians_rectangular_matrices_and_batches():
    """Values below 1 are fine (only an all-zero J1 is refused); rectangular J; batched calls."""
    J1, J2 = 1e-3 * _rand(8, seed=1), 1e-3 * _rand(8, seed=2)
    assert coupling(J1, J2, 3) == pytest.approx(coupling(1e3 * J1, 1e3 * J2, 3), rel=1e-9)
    A = torch.randn(7, 4, dtype=torch.float64)
    B = A + 0.01 * torch.randn(7, 4, dtype=torch.float64)
    m = coupling(A, B, 4)
    assert isinstance(m, float) and 0 < m < 0.05
    U, S, Vh = torch.linalg.svd(B, full_matrices=False)
    tile = (U[:, :4].T @ A @ Vh[:4].T).abs()
    sA = torch.linalg.svdvals(A)
    assert m == pytest.approx(float(torch.linalg.norm(tile - torch.diag(sA)) / sA.norm()), rel=1e-12)
    with pytest.raises(ValueError, match="k=5 exceeds the matrix size d=4"):
        coupling_tile(A, B, 5)
    torch.testing.assert_close(coupling_tile(svd(A), B, 4), tile)  # J1 given as its SVD
    batch1 = torch.stack([_rand(6, seed=s) for s in range(3)])
    batch2 = torch.stack([_rand(6, seed=10 + s) for s in range(3)])
    values = coupling(batch1, batch2, 2)
    assert isinstance(values, torch.Tensor) and values.shape == (3,)
    for i in range(3):
        assert float(values[i]) == pytest.approx(coupling(batch1[i], batch2[i], 2), rel=1e-12)


def test_coupling_matrix_takes_lists_precomputed_svds_and_float32():
    Js = [_rand(10, seed=s) for s in range(3)]
    ref = torch.tensor([[coupling(a, b, 4) for b in Js] for a in Js], dtype=torch.float64)
    from_list = coupling_matrix(Js, 4)
    torch.testing.assert_close(from_list, ref, rtol=1e-12, atol=1e-12)
    stacked = torch.stack(Js)
    wrong = svd(torch.stack([_rand(10, seed=20 + s) for s in range(3)]))
    assert not torch.allclose(coupling_matrix(stacked, 4, svds=wrong), ref)  # the given SVDs are used
    torch.testing.assert_close(coupling_matrix(stacked, 4, svds=svd(stacked)), ref, rtol=1e-12, atol=1e-12)
    M32 = coupling_matrix(stacked.float(), 4)
    assert M32.dtype == torch.float32 and M32.shape == (3, 3)
    torch.testing.assert_close(M32.double(), ref, rtol=1e-4, atol=1e-5)
    mixed = coupling_matrix(stacked.float(), 4, svds=svd(stacked))  # float32 Jacobians, float64 SVDs
    assert mixed.dtype == torch.float64
    torch.testing.assert_close(mixed, ref, rtol=1e-5, atol=1e-6)
    trace = coupling_matrix(stacked, 4, normalize="trace")
    assert float(trace[0, 1]) == pytest.approx(coupling(Js[0], Js[1], 4, normalize="trace"), rel=1e-12)
    vju = coupling_matrix(stacked, 4, orientation="vju")
    assert float(vju[2, 0]) == pytest.approx(coupling(Js[2], Js[0], 4, orientation="vju"), rel=1e-12)
    p1 = coupling_matrix(stacked, 4, p=1)
    assert float(p1[1, 2]) == pytest.approx(coupling(Js[1], Js[2], 4, p=1), rel=1e-12)


def test_svd_is_thin_and_integer_matrices_are_promoted():
    s = svd(torch.ones(5, 3, dtype=torch.float64))
    assert s.U.shape == (5, 3) and s.S.shape == (3,) and s.Vh.shape == (3, 3)
    ints = svd(torch.eye(3, dtype=torch.int64))
    assert ints.S.dtype == torch.float64 and torch.equal(ints.S, torch.ones(3, dtype=torch.float64))
    assert coupling(torch.eye(3, dtype=torch.int64), torch.eye(3), 2) < 1e-7
    half = coupling_tile(_rand(6).half(), _rand(6, seed=1), 2)
    assert half.dtype == torch.float64


def test_precomputed_svds_are_checked_and_truncated_ones_bound_k():
    from coupling_utils.engine.spectra import topk_svd

    J1, J2 = _rand(6, seed=1), _rand(6, seed=2)
    s = svd(J2)
    bad = SVD(s.U * float("nan"), s.S, s.Vh)
    with pytest.raises(ValueError) as info:
        coupling(J1, bad, 2)
    assert str(info.value) == "J2 contains NaN or inf; the Jacobian it came from is not usable"
    half = SVD(s.U.half(), s.S.half(), s.Vh.half())  # promoted to fp32 like a matrix would be
    assert coupling(J1, half, 3) == pytest.approx(coupling(J1, J2, 3), abs=1e-2)
    three = topk_svd(J2, 3)  # only 3 triplets: K cannot exceed them
    with pytest.raises(ValueError, match="k=4 exceeds the matrix size d=3"):
        coupling_tile(J1, three, 4)
    torch.testing.assert_close(coupling_tile(J1, three, 3), coupling_tile(J1, J2, 3))
    batch = torch.stack([J1, J2])  # [2, 6, 6]: K is bounded by 6, not by the batch size 2
    assert coupling_tile(batch, J2, 4).shape == (2, 4, 4)
    NaNs = torch.stack([J1, J2 * float("nan")])
    with pytest.raises(ValueError) as info:
        coupling_matrix(NaNs, 2)
    assert str(info.value) == "Js contains NaN or inf; the Jacobian it came from is not usable"


def test_batched_wide_matrices():
    """[B, m, n] with m < n: shapes are compared on the last two dimensions."""
    g = torch.Generator().manual_seed(3)
    A = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    values = coupling(A, A + 0.01 * torch.randn(2, 3, 5, generator=g, dtype=torch.float64), 3)
    assert values.shape == (2,) and float(values.max()) < 0.05
    with pytest.raises(ValueError) as info:
        coupling(A, torch.randn(2, 3, 4, dtype=torch.float64), 2)
    assert str(info.value) == "J1 and J2 must have the same shape, got (2, 3, 5) and (3, 4)"
    with pytest.raises(ValueError) as info:
        coupling(A, A, 2, orientation="vju")
    assert str(info.value) == "the 'vju' orientation needs square matrices"


def test_coupling_matrix_with_lower_precision_svds():
    Js = torch.stack([_rand(8, seed=s) for s in range(3)])
    ref = coupling_matrix(Js, 3)
    got = coupling_matrix(Js, 3, svds=svd(Js.float()))  # float64 Jacobians, float32 bases
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_mixed_precision_is_computed_in_the_higher_one():
    """J1 in float32, J2 in float64: the whole formula (the norm of s1 included) runs in float64."""
    J1, J2, k = _rand(8, seed=4).float(), _rand(8, seed=5), 3
    U, S, Vh = torch.linalg.svd(J2)
    s1k = svd(J1).S[:k].double()  # J1's own (float32) singular values, then float64 arithmetic
    tile = (U[:, :k].T @ J1.double() @ Vh[:k].T).abs()
    expected = torch.linalg.norm(tile - torch.diag(s1k)) / torch.linalg.vector_norm(s1k)
    assert coupling(J1, J2, k) == pytest.approx(float(expected), rel=1e-13, abs=0)
