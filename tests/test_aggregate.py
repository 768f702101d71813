"""Tidy tables, per-model coupling scalars and OLS fits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling_utils import aggregate as A
from coupling_utils.metric import coupling, coupling_tile


def test_matrix_frame_round_trip():
    M = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    df = A.matrix_frame(M, ["a", "b"], [10, 11, 12], names=("model", "layer"), value="m")
    assert list(df.columns) == ["model", "layer", "m"] and len(df) == 6
    assert df.set_index(["model", "layer"]).loc[("b", 11), "m"] == 4.0
    sq = A.matrix_frame(np.eye(2), [5, 6])
    assert sq["layer_j"].tolist() == [5, 6, 5, 6]
    with pytest.raises(ValueError, match="labels must match"):
        A.matrix_frame(M, ["a"])
    with pytest.raises(ValueError, match="2-D"):
        A.matrix_frame(np.zeros(3))


def test_coupling_tiles_match_the_metric_and_frame():
    g = torch.Generator().manual_seed(0)
    Js = torch.randn(3, 8, 8, generator=g, dtype=torch.float64)
    tiles = A.coupling_tiles(Js, 4)
    assert tiles.shape == (3, 3, 4, 4)
    torch.testing.assert_close(tiles[2, 0], coupling_tile(Js[2], Js[0], 4))
    # the diagonal tile of a matrix with itself is diag(S_K)
    S = torch.linalg.svdvals(Js[1])[:4]
    torch.testing.assert_close(tiles[1, 1], torch.diag(S), atol=1e-10, rtol=0)
    df = A.tile_frame(tiles, layers=[4, 5, 6])
    assert len(df) == 3 * 3 * 16
    row = df[(df.layer_i == 6) & (df.layer_j == 4) & (df.row == 1) & (df.col == 3)]
    assert row["value"].item() == pytest.approx(tiles[2, 0, 1, 3].item())
    with pytest.raises(ValueError, match="exceeds"):
        A.coupling_tiles(Js, 9)


def test_coupling_scalar_candidates():
    M = np.array([[0.0, 0.2, 0.9], [0.4, 0.0, 0.6], [1.0, 0.8, 0.0]])
    off = [0.2, 0.9, 0.4, 0.6, 1.0, 0.8]
    adj = [0.2, 0.4, 0.6, 0.8]
    assert A.coupling_scalar(M) == pytest.approx(np.mean(1 - np.square(off)))
    assert A.coupling_scalar(M, "adjacent") == pytest.approx(np.mean(1 - np.square(adj)))
    assert A.coupling_scalar(M, as_strength=False) == pytest.approx(np.mean(off))
    with pytest.raises(ValueError, match="how must be"):
        A.coupling_scalar(M, "diag")
    with pytest.raises(ValueError, match="square"):
        A.coupling_scalar(M[:2])
    assert A.strength(0.5) == pytest.approx(0.75)
    # consistent with the metric: a matrix with itself is perfectly coupled
    J = torch.randn(6, 6, dtype=torch.float64)
    assert A.strength(coupling(J, J, 3)) == pytest.approx(1.0)


def test_ols_fit():
    x = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    fit = A.ols_fit(x, 3 * x - 1)
    assert fit["slope"] == pytest.approx(3) and fit["intercept"] == pytest.approx(-1)
    assert fit["r2"] == pytest.approx(1) and fit["n"] == 4
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = x + rng.normal(size=50)
    fit = A.ols_fit(x, y)
    assert fit["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    assert fit["p_value"] < 1e-3
    # the p-value agrees with scipy.stats.linregress (value computed with scipy 1.x)
    rng = np.random.default_rng(1)
    x = rng.normal(size=20)
    fit = A.ols_fit(x, 0.3 * x + rng.normal(size=20))
    assert fit["p_value"] == pytest.approx(0.39980987141145213, rel=1e-9)
    assert fit["slope"] == pytest.approx(-0.3913492361896578, rel=1e-12)
    with pytest.raises(ValueError, match="at least 3"):
        A.ols_fit([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="constant"):
        A.ols_fit([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
