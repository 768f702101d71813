"""Trajectory geometry on synthetic trajectories with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import linearization as lin
from coupling_utils.analysis import trajectories as tr


def straight_line(L=8, T=3, d=16, growth=1.0, seed=0):
    """Trajectories x^l = x^0 + (sum of steps) * direction, steps growing geometrically."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(T, d, generator=g, dtype=torch.float64)
    u = torch.randn(T, d, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    sizes = torch.tensor([growth**l for l in range(L)], dtype=torch.float64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.float64), sizes.cumsum(0)])  # [L+1]
    return x0 + offsets[:, None, None] * u  # [L+1, T, d]


def random_walk(L=8, T=3, d=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(L + 1, T, d, generator=g, dtype=torch.float64).cumsum(0)


# --------------------------------------------------------------------------- step norms
def test_step_norms_are_tidy_and_exact():
    traj = straight_line(L=5, T=2, growth=2.0)
    df = tr.step_norms(traj, relative=True)
    assert list(df.columns) == ["token", "layer", "step_norm", "relative_step"]
    assert len(df) == 5 * 2
    assert df["layer"].min() == 1 and df["layer"].max() == 5
    got = df[df.token == 1].sort_values("layer")["step_norm"].to_numpy()
    np.testing.assert_allclose(got, [1, 2, 4, 8, 16], rtol=1e-12)
    # relative step of layer 1 = ||x^1 - x^0|| / ||x^0||
    row = df[(df.token == 0) & (df.layer == 1)].iloc[0]
    assert row.relative_step == pytest.approx(1.0 / traj[0, 0].norm().item())


# --------------------------------------------------------------------------- line shape
def test_lss_straight_line_is_one_even_with_uneven_steps():
    df = tr.line_shape_score(straight_line(growth=1.7))
    np.testing.assert_allclose(df["lss"], 1.0, rtol=1e-12)
    assert (df["n_steps"] == 8).all()


def test_lss_right_angle_and_back_and_forth():
    # two unit steps at a right angle: chord sqrt(2), LSS = 2/sqrt(2)
    traj = torch.tensor([[0.0, 0.0], [5.0, 0.0], [5.0, 0.1]])  # sizes differ, directions matter
    assert tr.line_shape_score(traj)["lss"].item() == pytest.approx(math.sqrt(2))
    # out, back, out: unit path length 3, chord 1
    traj = torch.tensor([[0.0], [1.0], [0.5], [3.0]])
    assert tr.line_shape_score(traj)["lss"].item() == pytest.approx(3.0)


def test_lss_random_walk_is_larger_than_one_and_window_works():
    walk = random_walk()
    lss = tr.line_shape_score(walk)["lss"]
    assert (lss > 1.2).all()
    # a straight segment inside a bent path: the window sees only the straight part
    line = straight_line(L=4, T=1, d=4)
    bent = torch.cat(
        [
            line,
            line[-1:]
            + torch.tensor([0.0, 0, 0, 1], dtype=torch.float64).expand(1, 1, 4)
            * torch.arange(1, 4, dtype=torch.float64)[:, None, None],
        ]
    )
    assert tr.line_shape_score(bent, layers=(0, 4))["lss"].item() == pytest.approx(1.0)
    assert tr.line_shape_score(bent)["lss"].item() > 1.05
    assert tr.line_shape_score(bent, layers=(4, -1))["n_steps"].item() == 3


def test_lss_skips_zero_steps_and_rejects_static_tokens():
    traj = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    df = tr.line_shape_score(traj)
    assert df["lss"].item() == pytest.approx(1.0) and df["n_steps"].item() == 2
    with pytest.raises(ValueError, match="never moves"):
        tr.line_shape_score(torch.zeros(4, 2, 3))


# --------------------------------------------------------------------------- expodistance
@pytest.mark.parametrize("growth", [1.0, 1.3, 0.7])
def test_expodistance_zero_for_exact_geometric_growth(growth):
    traj = straight_line(L=10, growth=growth)
    cv = tr.expodistance(traj, "ratio_cv")
    np.testing.assert_allclose(cv["expodistance"], 0.0, atol=1e-10)
    np.testing.assert_allclose(cv["growth"], growth, rtol=1e-10)
    r2 = tr.expodistance(traj, "log_linear_r2")
    np.testing.assert_allclose(r2["r2"], 1.0, atol=1e-10)
    np.testing.assert_allclose(r2["expodistance"], 0.0, atol=1e-10)
    np.testing.assert_allclose(r2["growth"], growth, rtol=1e-10)
    assert set(r2.columns) == {"token", "expodistance", "growth", "how", "r2"}


def test_expodistance_positive_for_irregular_steps():
    # steps 1, 4, 2, 8, 4: ratios 4, .5, 4, .5; R² from the correlation of log steps with l
    sizes = [1.0, 4.0, 2.0, 8.0, 4.0]
    x = torch.tensor([0.0] + list(np.cumsum(sizes)))[:, None]
    cv = tr.expodistance(x, "ratio_cv")["expodistance"].item()
    ratios = np.array([4, 0.5, 4, 0.5])
    assert cv == pytest.approx(ratios.std() / ratios.mean())
    r2 = tr.expodistance(x, "log_linear_r2")
    logs = np.log(sizes)
    expected = np.corrcoef(np.arange(5), logs)[0, 1] ** 2
    assert r2["r2"].item() == pytest.approx(expected)
    assert r2["expodistance"].item() == pytest.approx(1 - expected)


def test_expodistance_input_errors():
    with pytest.raises(ValueError, match="how must be one of"):
        tr.expodistance(straight_line(), "gaps")
    with pytest.raises(ValueError, match="at least 3 steps"):
        tr.expodistance(straight_line(L=2))
    traj = torch.tensor([[0.0], [1.0], [1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="zero step at layer 2"):
        tr.expodistance(traj)


# --------------------------------------------------------------------------- linearisation
def linear_blocks(n=4, T=3, d=6, seed=0):
    """A residual stream whose blocks are linear, f^l(x) = A_l x, and its Jacobians."""
    g = torch.Generator().manual_seed(seed)
    A = 0.3 * torch.randn(n, d, d, generator=g, dtype=torch.float64)
    x = [torch.randn(T, d, generator=g, dtype=torch.float64)]
    for l in range(n):
        x.append(x[-1] + x[-1] @ A[l].T)
    return torch.stack(x), A[:, None].expand(n, T, d, d)


def test_linearization_cosine_is_one_for_linear_blocks():
    traj, J = linear_blocks()
    df = lin.linearization_cosine(J, traj)
    assert list(df.columns) == ["token", "layer", "cosine"]
    assert (df["layer"] == 4).all()
    np.testing.assert_allclose(df["cosine"], 1.0, atol=1e-12)
    pre = lin.linearization_cosine(list(J), traj, prefix=True)
    assert len(pre) == 5 * 3 and set(pre["layer"]) == {0, 1, 2, 3, 4}
    np.testing.assert_allclose(pre["cosine"], 1.0, atol=1e-12)
    np.testing.assert_allclose(pre["norm_ratio"], 1.0, atol=1e-12)


def test_linearization_cosine_detects_nonlinearity_and_windows():
    traj, J = linear_blocks()
    wrong = J.clone()
    wrong[1] = -wrong[1]  # one block's Jacobian is not how the block acted
    cos = lin.linearization_cosine(wrong, traj)["cosine"]
    assert (cos < 0.999).all()
    pre = lin.linearization_cosine(wrong, traj, prefix=True)
    first = pre[pre.layer == 1]["cosine"].to_numpy()
    np.testing.assert_allclose(first, 1.0, atol=1e-12)  # still exact after the first block
    # blocks 3..4 only, from x^2; a dict of blocks; only the last token
    win = lin.linearization_cosine({3: J[2, -1:], 4: J[3, -1:]}, traj, start=2)
    assert win["token"].tolist() == [2] and win["layer"].tolist() == [4]
    assert win["cosine"].item() == pytest.approx(1.0, abs=1e-12)


def test_linearization_cosine_input_errors():
    traj, J = linear_blocks()
    with pytest.raises(ValueError, match="width"):
        lin.linearization_cosine(J[..., :5, :5], traj)
    with pytest.raises(ValueError, match="need states"):
        lin.linearization_cosine(J, traj, start=1)
    with pytest.raises(ValueError, match="pass tokens"):
        lin.linearization_cosine(J[:, :2], traj)
    bad = J.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        lin.linearization_cosine(bad, traj)
    with pytest.raises(ValueError, match="consecutive"):
        lin.linearization_cosine({1: J[0], 3: J[2]}, traj)


# --------------------------------------------------------------------------- PCA
def test_pca_recovers_planar_trajectories():
    g = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(20, 2, generator=g, dtype=torch.float64))  # [d, 2]
    coords = torch.randn(7, 4, 2, generator=g, dtype=torch.float64) * torch.tensor(
        [5.0, 1.0], dtype=torch.float64
    )
    traj = coords @ basis.T + 3.0  # [L+1=7, T=4, d=20], in an affine plane
    df = tr.trajectory_pca(traj, 3)
    assert list(df.columns) == ["token", "layer", "pc1", "pc2", "pc3"]
    assert len(df) == 7 * 4
    evr = df.attrs["explained_variance_ratio"]
    assert sum(evr[:2]) == pytest.approx(1.0) and evr[2] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(df["pc3"], 0.0, atol=1e-10)
    # distances within the plane are preserved by the projection
    pts = df[["pc1", "pc2"]].to_numpy()
    orig = coords.transpose(0, 1).reshape(-1, 2).numpy()  # token-major rows
    d_pca = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    d_orig = np.linalg.norm(orig[:, None] - orig[None], axis=-1)
    np.testing.assert_allclose(d_pca, d_orig, atol=1e-9)
    row = df[(df.token == 2) & (df.layer == 5)]
    assert len(row) == 1


def test_pca_per_token_and_sign_convention():
    traj = straight_line(L=6, T=2, d=8, growth=1.2)
    df = tr.trajectory_pca(traj, 2, fit="per_token", tokens=[-1])
    assert df["token"].unique().tolist() == [1]
    assert df.attrs["explained_variance_ratio"][1][0] == pytest.approx(1.0)
    np.testing.assert_allclose(df["pc2"], 0.0, atol=1e-10)
    again = tr.trajectory_pca(-traj, 2, fit="per_token", tokens=[1])
    np.testing.assert_allclose(np.abs(df["pc1"]), np.abs(again["pc1"]), atol=1e-10)
    with pytest.raises(ValueError, match="n_components"):
        tr.trajectory_pca(traj, 4)
    with pytest.raises(ValueError, match="fit must be"):
        tr.trajectory_pca(traj, fit="each")


# --------------------------------------------------------------------------- validation, summary
def test_input_validation_messages():
    with pytest.raises(ValueError, match=r"\[L\+1, T, d\]"):
        tr.step_norms(torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="at least two residual states"):
        tr.line_shape_score(torch.zeros(1, 2, 3))
    bad = straight_line()
    bad[3, 1, 0] = float("inf")
    with pytest.raises(ValueError, match="layer 3, token 1"):
        tr.line_shape_score(bad)
    with pytest.raises(TypeError, match="torch.Tensor or numpy"):
        tr.step_norms([[1.0, 2.0]])
    with pytest.raises(ValueError, match="layers="):
        tr.line_shape_score(straight_line(L=4), layers=(3, 2))
    # numpy and float32 inputs are accepted (computed in float64)
    df = tr.line_shape_score(straight_line().numpy().astype(np.float32))
    np.testing.assert_allclose(df["lss"], 1.0, rtol=1e-5)


def test_trajectory_metrics_table():
    df = tr.trajectory_metrics(straight_line(L=6, growth=1.5))
    assert isinstance(df, pd.DataFrame) and len(df) == 3
    assert {"lss", "expodistance_ratio_cv", "expodistance_log_linear_r2", "growth_ratio_cv"} <= set(
        df.columns
    )
    np.testing.assert_allclose(df["lss"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(df["growth_log_linear_r2"], 1.5, rtol=1e-10)


# --------------------------------------------------------------------------- on a real (tiny) model
@pytest.fixture(scope="module")
def tiny_llama():
    from coupling_utils.engine.architectures import tiny_model

    model = tiny_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    return model, ids


def test_forward_mode_linearisation_matches_the_jacobians(tiny_llama):
    from coupling_utils.engine.blocks import residual_stream
    from coupling_utils.engine.jacobians import token_jacobians

    model, ids = tiny_llama
    traj = residual_stream(model, ids)
    J = torch.stack([token_jacobians(model, ids, b, progress=False) for b in range(traj.shape[0] - 1)])
    want = lin.linearization_cosine(J, traj, prefix=True)
    got = lin.model_linearization_cosine(model, ids, prefix=True)
    np.testing.assert_allclose(got["cosine"], want["cosine"], atol=1e-5)
    np.testing.assert_allclose(got["norm_ratio"], want["norm_ratio"], rtol=1e-5)
    assert got["cosine"].min() < 0.999  # a random block is not linear: the test can fail
    Y = lin.linearized_stream(model, ids, start=1)
    assert Y.shape == (traj.shape[0] - 1, 6, traj.shape[-1])
    torch.testing.assert_close(Y[0], traj[1].double())
    with pytest.raises(ValueError, match="start < stop"):
        lin.linearized_stream(model, ids, start=2, stop=2)


def test_the_tangents_power_of_two_scaling_changes_no_bit(tiny_llama):
    """_propagate scales each token's tangent by a power of two (so a float16 run cannot overflow
    on a growing y); in float32 the result is bit for bit the unscaled propagation."""
    from coupling_utils.engine.jacobians import frozen

    model, ids = tiny_llama
    traj, fns = lin._stream_and_blocks(model, ids)
    y, want = traj[0].double(), [traj[0].double()]
    with frozen(model):
        for layer in range(len(fns)):
            _, Jy = torch.func.jvp(fns[layer], (traj[layer],), (y.float(),))
            y = y + Jy.double()
            want.append(y)
    got = lin.linearized_stream(model, ids)
    assert torch.equal(got, torch.stack(want))
    assert got.abs().amax(dim=-1).max() < 0.5  # every tangent was scaled up (by 2 or more): the test can fail


def test_trajectory_tables_over_prompts(tiny_llama):
    model, ids = tiny_llama
    with pytest.warns(UserWarning, match="only 2 steps"):  # the tiny model has 2 blocks
        res = tr.trajectory_tables(model, [ids, ids[:, :4]], label="tiny", skip_first_token=True)
    assert res.metrics["expodistance_ratio_cv"].isna().all() and res.metrics["lss"].notna().all()
    assert len(res.streams) == 2 and res.streams[1].shape[1] == 4
    assert list(res.metrics.columns[:3]) == ["model", "prompt", "token"]
    assert (res.metrics["token"] > 0).all() and len(res.metrics) == 5 + 3
    assert set(res.steps["layer"]) == {1, 2} and (res.steps["model"] == "tiny").all()
    assert set(res.linearization["layer"]) == {0, 1, 2}
    with pytest.warns(UserWarning):
        off = tr.trajectory_tables(model, [ids], linearization=False)
    assert off.linearization.empty and (off.metrics["token"] == 0).any()


def test_growth_intervals_resample_prompts_of_both_models():
    import pandas as pd

    from coupling_utils.analysis.trajectories import growth_contrast, growth_intervals

    rng = np.random.default_rng(0)
    rows = [
        {"model": m, "prompt": p, "token": t, "growth_log_linear_r2": 1.1 + 0.1 * rng.random(),
         "expodistance_log_linear_r2": (0.2 if m == "trained" else 0.4) + 0.1 * rng.random(),
         "expodistance_ratio_cv": (0.3 if m == "trained" else 0.5) + 0.1 * rng.random()}
        for m in ("trained", "random init") for p in "abcd" for t in range(3 + "abcd".index(p))
    ]  # fmt: skip
    metrics = pd.DataFrame(rows)
    point, out = growth_contrast(metrics), growth_intervals(metrics, n_resamples=200)
    assert set(out) == {"growth", "log_linear_r2_ratio", "ratio_cv_ratio"}
    for key, iv in out.items():
        assert iv.estimate == pytest.approx(point[key]) and iv.low <= iv.estimate <= iv.high
        assert iv.over == "4 prompts" and iv.high > iv.low
    assert growth_intervals(metrics[metrics.model == "trained"]) == {}  # no twin, nothing to judge
    one = growth_intervals(metrics[metrics.prompt == "a"])
    assert one["growth"].low == -np.inf and one["growth"].over == "1 prompt"


def test_token_texts_decode_each_id_alone_and_keep_a_word_s_leading_space():
    from coupling_utils.analysis.depth_and_tokens import token_label

    class SentencePiece:  # decodes one token without its leading space, as SentencePiece does
        vocab = ["▁The", "▁capital", "é", "\n"]

        def convert_ids_to_tokens(self, ids):
            return [self.vocab[i] for i in ids]

        def decode(self, ids):
            return "".join(self.vocab[i] for i in ids).replace("▁", " ").lstrip(" ")

    texts = tr.token_texts(SentencePiece(), [0, 1, 2, 3])
    assert texts == [" The", " capital", "é", "\n"]
    assert [token_label(t) for t in texts] == ["␣The", "␣capital", "é", "⏎"]
