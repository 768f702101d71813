"""Tidy tables from coupling matrices and tiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling_utils.analysis import coupling_metric as A
from coupling_utils.engine.metric import coupling, coupling_tile


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


def test_strength():
    J = torch.randn(6, 6, dtype=torch.float64)
    assert A.strength(0.5) == pytest.approx(0.75)
    assert A.strength(coupling(J, J, 3)) == pytest.approx(1.0)
