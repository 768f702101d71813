"""Tidy tables from coupling matrices and tiles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

# imported at collection, before any test runs autograd: the emulated device must be registered
# before the autograd engine makes its per-device queues
from emulated_device import emulated_device

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


def test_energy_share():
    S = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert A.energy_share(S, 1) == pytest.approx(9 / 14)
    assert A.energy_share(S, 3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="all zero"):
        A.energy_share(torch.zeros(3), 1)
    G = torch.randn(400, 400, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    share = A.energy_share(torch.linalg.svdvals(G), 10)  # a spread spectrum: about 4k/d
    assert 0.5 * 40 / 400 < share < 1.5 * 40 / 400


def test_noise_sweep_and_its_reading():
    J = torch.randn(48, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    J[:4, :4] += 20 * torch.eye(4, dtype=torch.float64)  # a few strong directions
    sweep = A.noise_sweep(J, [0.0, 0.1, 1.0, 30.0], 4, seed=3)
    assert list(sweep.columns) == ["noise", "m_K", "coupling"]
    assert sweep.m_K.iloc[0] == pytest.approx(0, abs=1e-9)
    assert sweep.m_K.iloc[-1] > sweep.m_K.iloc[1] and sweep.m_K.iloc[-1] > 0.5
    R = A.random_reference(J, seed=3)
    assert sweep.m_K.iloc[2] == pytest.approx(coupling(J, J + R, 4))
    eps = A.noise_equivalent(sweep, float(sweep.m_K.iloc[2]))
    assert eps == pytest.approx(1.0)
    half = (sweep.m_K.iloc[2] + sweep.m_K.iloc[3]) / 2
    assert 1.0 < A.noise_equivalent(sweep, half) < 30.0
    assert np.isnan(A.noise_equivalent(sweep, 10.0))
    with pytest.raises(ValueError, match="noise levels"):
        A.noise_sweep(J, [-1.0], 4)


def test_toy_properties_and_variants():
    toy = A.toy_properties(16, 4, 30, seed=0)
    value = dict(zip(toy.table.case, toy.table.value))
    assert value["m(J, J)"] == pytest.approx(0, abs=1e-9)
    assert value["m(J, J with flipped singular-pair signs) − m(J, J)"] == pytest.approx(0, abs=1e-9)
    assert value["m(cyclic shift of diag(s), diag(s)), K = d"] == pytest.approx(np.sqrt(2))
    assert len(toy.random_pairs) == 30 and (toy.random_pairs.m_K <= np.sqrt(2)).all()
    assert 0.8 < toy.random_pairs.m_K.mean() < 1.2
    g = torch.Generator().manual_seed(2)
    J1, J2 = torch.randn(12, 12, generator=g), torch.randn(12, 12, generator=g)
    v = A.metric_variants(J1, J2, [3, 1, 3])
    assert list(v.K.unique()) == [1, 3] and len(v) == 8
    row = v.query("K == 3 and normalize == 'trace' and orientation == 'vju'").m_K.item()
    assert row == pytest.approx(coupling(J1, J2, 3, normalize="trace", orientation="vju"))


def test_f00_helpers_on_an_emulated_device():
    """f00's noise sweep, spectrum share, variants and random bases with J on a (CPU-emulated)
    accelerator."""
    from emulated_device import DEVICE

    g = torch.Generator().manual_seed(4)
    J_cpu, J2_cpu = torch.randn(24, 24, generator=g), torch.randn(24, 24, generator=g)
    ref = (A.noise_sweep(J_cpu, [0.0, 0.5, 2.0], 3, seed=1), A.metric_variants(J_cpu, J2_cpu, [1, 3]))
    with emulated_device():
        J, J2 = J_cpu.to(DEVICE), J2_cpu.to(DEVICE)
        got = (A.noise_sweep(J, [0.0, 0.5, 2.0], 3, seed=1), A.metric_variants(J, J2, [1, 3]))
        from coupling_utils.engine.metric import svd

        share = A.energy_share(svd(J).S, 3)
        null = A.random_bases(J, 3, 4, seed=2)  # frames drawn on the host, moved to J's device
    for a, b in zip(got, ref):
        assert np.allclose(a.select_dtypes("number"), b.select_dtypes("number"), atol=1e-5)
    assert share == pytest.approx(A.energy_share(torch.linalg.svdvals(J_cpu), 3), rel=1e-5)
    assert null == pytest.approx(A.random_bases(J_cpu, 3, 4, seed=2), rel=1e-5)


def test_block_jacobians_are_stored_exactly_and_read_back(standin_hub, tmp_path):
    """f00's extra: the last token's Jacobians of two blocks, flat float32 columns that survive Parquet."""
    from coupling_utils import load_model, token_jacobians

    lm = load_model("Qwen/Qwen1.5-0.5B")
    tables = A.block_jacobians(lm, ["Paris is the capital of"], layer=2)
    ids = lm.tokenizer("Paris is the capital of", return_tensors="pt").input_ids
    facts = tables["facts"].iloc[0]
    got = (facts["n_layers"], facts["d_model"], facts["T"], facts["layer"])
    assert got == (lm.n_layers, lm.d_model, ids.shape[1], 2)
    assert list(tables["jacobians"].columns) == ["J", "J_next"] and len(tables["jacobians"]) == lm.d_model**2
    assert tables["jacobians"].dtypes.tolist() == [np.float32, np.float32]
    for name, df in tables.items():
        df.to_parquet(tmp_path / f"{name}.parquet")
    back = {name: pd.read_parquet(tmp_path / f"{name}.parquet") for name in tables}
    J, J_next = A.jacobian_matrices(back)
    assert torch.equal(J, token_jacobians(lm, ids, 2)[-1])
    assert torch.equal(J_next, token_jacobians(lm, ids, 3)[-1])
    assert A.jacobian_passes(24, 64) == 130
    with pytest.raises(ValueError, match="one prompt"):
        A.block_jacobians(lm, ["a", "b"], layer=2)


def test_block_jacobians_leave_an_emulated_device_for_the_host(standin_hub):
    """The model on a (CPU-emulated) accelerator: f00's extra gives host tables, the host run's numbers."""
    from coupling_utils import load_model

    ref = A.block_jacobians(load_model("Qwen/Qwen1.5-0.5B", device="cpu"), ["Paris is"], layer=1)
    with emulated_device() as dev:
        got = A.block_jacobians(load_model("Qwen/Qwen1.5-0.5B", device=dev), ["Paris is"], layer=1)
    pd.testing.assert_frame_equal(got["facts"], ref["facts"])
    assert np.allclose(got["jacobians"], ref["jacobians"], atol=1e-6)


def test_block_jacobians_cut_a_prompt_longer_than_the_context(standin_hub, capsys):
    """f00's extra, like measure(): a prompt past the model's context is cut to it, with a notice."""
    from coupling_utils import load_model, token_jacobians

    lm = load_model("Qwen/Qwen1.5-0.5B")
    context = lm.model.config.max_position_embeddings
    text = " ".join(["Paris is the capital of France."] * 100)
    ids = lm.tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] > context
    tables = A.block_jacobians(lm, [text], layer=1)
    assert tables["facts"].iloc[0]["T"] == context
    err = capsys.readouterr().err
    assert f"has {ids.shape[1]} tokens, more than this model's context of {context}" in err
    J, _ = A.jacobian_matrices(tables)
    assert torch.equal(J, token_jacobians(lm, ids[:, :context], 1, tokens=[-1])[0])


def test_random_bases_are_the_metric_in_random_orthonormal_frames():
    """random_bases: m_K of J in frames drawn from seed, seed + 1, ... (QR of Gaussian [d, K], the
    left frame then the right from one stream), the engine's metric on those frames; a longer run
    keeps the first draws."""
    from coupling_utils.analysis.coupling_metric import random_bases
    from coupling_utils.engine.metric import SVD

    J = torch.randn(20, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = random_bases(J, 4, 5, seed=7)

    def frames(seed):
        g = torch.Generator().manual_seed(seed)
        a, b = (torch.randn(rows, 4, generator=g, dtype=torch.float64) for rows in (20, 16))
        return torch.linalg.qr(a).Q, torch.linalg.qr(b).Q

    want = []
    for i in range(5):
        left, right = frames(7 + i)
        want.append(coupling(J, SVD(left, torch.ones(4, dtype=torch.float64), right.T), 4))
    assert got == pytest.approx(want, rel=1e-12)
    assert random_bases(J, 4, 2, seed=7) == pytest.approx(got[:2], rel=1e-12)
    known = torch.linalg.svdvals(J)
    assert random_bases(J, 4, 5, seed=7, singular_values=known) == pytest.approx(got, rel=1e-12)


def test_random_bases_follow_the_random_references_distribution():
    """The top-K singular vectors of random_reference's Gaussian matrix are independent Haar frames,
    left and right, so m_K in random_bases' frames has the distribution m_K in random references
    has (over 300 draws each: means within 4 standard errors, spreads within 25%), on a Jacobian
    near the identity as a block's is: one frame on both sides would make it look coupled (the
    default book read m_K 0.77 so, against 0.998 in the figure's random matrix)."""
    from coupling_utils.analysis.coupling_metric import random_bases, random_reference

    g = torch.Generator().manual_seed(1)
    J = (
        torch.eye(24, dtype=torch.float64)
        + 0.3 * torch.randn(24, 24, generator=g, dtype=torch.float64) / 24**0.5
    )
    frames = random_bases(J, 4, 300, seed=0)
    references = np.array([coupling(J, random_reference(J, seed=1000 + i), 4) for i in range(300)])
    se = np.sqrt(frames.var() / 300 + references.var() / 300)
    assert abs(frames.mean() - references.mean()) < 4 * se
    assert 0.75 < frames.std() / references.std() < 1.25
