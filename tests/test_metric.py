"""Unit tests of the coupling metric's properties (paper_method.md, "Coupling metric")."""

import math

import numpy as np
import pytest
import torch

from coupling_utils.engine.metric import SVD, coupling, coupling_matrix, coupling_tile, svd


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
