"""Chart builders: valid Vega-Lite, rendered offline to SVG, drawing the right things."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

alt = pytest.importorskip("altair")
vlc = pytest.importorskip("vl_convert")

from coupling_utils.analysis import coupling_metric as A  # noqa: E402
from coupling_utils.analysis import plots as P  # noqa: E402
from coupling_utils.analysis import trajectories as T  # noqa: E402
from coupling_utils.analysis.stats import ols  # noqa: E402
from coupling_utils.engine.metric import coupling_matrix  # noqa: E402


def render(chart) -> str:
    """Validate (to_dict validates against the schema) and draw the chart offline."""
    spec = chart.to_dict()
    svg = vlc.vegalite_to_svg(json.dumps(spec))
    assert svg.lstrip().startswith("<svg") and "</svg>" in svg
    return svg


def datasets(chart) -> list[pd.DataFrame]:
    return [pd.DataFrame(rows) for rows in chart.to_dict().get("datasets", {}).values()]


def spec_text(chart) -> str:
    return json.dumps(chart.to_dict(), ensure_ascii=False)


@pytest.fixture(scope="module")
def coupled():
    """Jacobians of a 'coupled' window (shared singular vectors) and its coupling matrix."""
    g = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(24, 24, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(24, 24, generator=g, dtype=torch.float64))
    S = torch.linspace(3, 0.1, 24, dtype=torch.float64)
    Js = torch.stack(
        [U @ torch.diag(S * (1 + 0.1 * l)) @ V.T for l in range(3)]
        + [torch.randn(24, 24, generator=g, dtype=torch.float64)]
    )
    return Js, coupling_matrix(Js, 6)


# --------------------------------------------------------------------------- coupling charts
def test_tile_grid_facets_layers_and_normalises(coupled):
    Js, _ = coupled
    tiles = A.coupling_tiles(Js, 6)
    df = A.tile_frame(tiles, layers=[9, 10, 11, 12])
    chart = P.tile_grid(df)
    spec = chart.to_dict()
    assert spec["facet"]["row"]["field"] == "layer_i"
    assert spec["facet"]["column"]["field"] == "layer_j"
    assert "tile_max" in spec_text(chart)
    svg = render(chart)
    assert "singular vectors" in svg
    assert len(datasets(chart)[0]) == 4 * 4 * 6 * 6


def test_tile_grid_warns_when_huge():
    df = pd.DataFrame(
        {
            "layer_i": 0,
            "layer_j": 0,
            "row": np.arange(70_000) % 265,
            "col": np.arange(70_000) // 265,
            "value": 1.0,
        }
    )
    with pytest.warns(UserWarning, match="heavy"):
        P.tile_grid(df)


def test_coupling_heatmap_shows_one_minus_m_squared(coupled):
    _, M = coupled
    df = A.matrix_frame(M, [3, 4, 5, 6])
    chart = P.coupling_heatmap(df, "layer_j", "layer_i", "value", title="depth-wise")
    data = datasets(chart)[0]
    np.testing.assert_allclose(data["1 − m²"], 1 - data["value"] ** 2)
    assert sorted(data["layer_j"].unique()) == [3, 4, 5, 6]  # square: labels_j = labels_i
    render(chart)
    raw = P.coupling_heatmap(df, "layer_j", "layer_i", "value", show="m")
    assert raw.to_dict()["encoding"]["color"]["scale"]["reverse"] is True
    faceted = P.coupling_heatmap(
        pd.concat([df.assign(step=s) for s in (1, 143000)]),
        "layer_j",
        "layer_i",
        "value",
        facet="step",
        title="t",
    )
    assert faceted.to_dict()["facet"]["field"] == "step"
    render(faceted)
    with pytest.raises(ValueError, match="show must be"):
        P.coupling_heatmap(df, "layer_j", "layer_i", "value", show="log")


def test_layer_coupling_graph_draws_edges_above_threshold(coupled):
    _, M = coupled
    df = A.matrix_frame(M)
    strength = 1 - M.numpy() ** 2
    sym = (strength + strength.T) / 2
    expected = int(sum(sym[i, j] > 0.5 for i in range(4) for j in range(i + 1, 4)))
    assert expected == 3  # the three coupled layers, not the random one
    chart = P.layer_coupling_graph(df.assign(step=1), 0.5, facet="step")
    assert f"({expected} edges)" in spec_text(chart)
    edges = [d for d in datasets(chart) if "strength" in d.columns and "x2" in d.columns][0]
    assert len(edges) == expected and (edges["strength"] > 0.5).all()
    assert set(edges["a"]) | set(edges["b"]) == {0, 1, 2}
    render(chart)
    single = P.layer_coupling_graph(df, 2.0)  # nothing passes: an empty, still valid chart
    assert "edges where 1 − m² > 2" in spec_text(single)
    render(single)
    with pytest.raises(ValueError, match="symmetrize"):
        P.layer_coupling_graph(df, 0.5, symmetrize="sum")


# --------------------------------------------------------------------------- curves
def test_training_curve_keeps_step_zero_on_log_axis():
    df = pd.DataFrame(
        {
            "step": [0, 1, 8, 512, 143000] * 2,
            "coupling": np.linspace(0, 1, 10),
            "model": ["pythia-6.9b"] * 5 + ["pythia-12b"] * 5,
        }
    )
    chart = P.training_curve(df, "step", "coupling", "model", title="emergence")
    x = chart.to_dict()["encoding"]["x"]
    assert x["scale"]["type"] == "symlog"
    assert x["axis"]["values"][:2] == [0, 1] and x["axis"]["values"][-1] == 10**6
    assert chart.to_dict()["encoding"]["color"]["scale"]["range"] == P.OKABE_ITO
    render(chart)
    lin = P.training_curve(df, "step", "coupling", log_step=False)
    assert "type" not in lin.to_dict()["encoding"]["x"].get("scale", {})
    with pytest.raises(ValueError, match="negative"):
        P.training_curve(df.assign(step=-1), "step", "coupling")


def test_scatter_fit_reports_ols():
    x = np.arange(6, dtype=float)
    df = pd.DataFrame({"coupling": x, "score": 2 * x + 1, "model": list("abcdef")})
    chart = P.scatter_fit(df, "coupling", "score", "model", title="Fig. 1a")
    text = spec_text(chart)
    assert "R² = 1.000" in text and "slope 2" in text and "n = 6" in text
    svg = render(chart)
    assert ">f<" in svg or "f</text>" in svg  # point labels are drawn
    noisy = df.assign(score=[1.0, 0.0, 3.0, 2.0, 5.0, 4.0])
    r2 = ols(noisy, "score", "coupling").loc[0, "r2"]
    assert f"R² = {r2:.3f}" in spec_text(P.scatter_fit(noisy, "coupling", "score"))


def test_layer_profile_and_bars():
    traj = torch.randn(7, 5, 16, dtype=torch.float64).cumsum(0)
    steps = pd.concat([T.step_norms(traj).assign(model=m) for m in ("trained", "random init")])
    prof = P.layer_profile(steps, "step_norm", color="model", log_y=True)
    assert prof.to_dict()["layer"][0]["mark"]["type"] == "errorband"  # 5 tokens per layer
    render(prof)
    with pytest.raises(ValueError, match="log_y"):
        P.layer_profile(steps.assign(step_norm=0.0), "step_norm", log_y=True)
    lss = pd.concat([T.line_shape_score(traj).assign(model=m) for m in ("trained", "random init")])
    b = P.bars(lss, "model", "lss", title="LSS")
    assert [layer["mark"]["type"] for layer in b.to_dict()["layer"]] == ["bar", "errorbar"]
    render(b)
    one = P.bars(lss.groupby("model", as_index=False)["lss"].mean(), "model", "lss")
    assert len(one.to_dict()["layer"]) == 1  # one row per bar: no error bar


# --------------------------------------------------------------------------- trajectories
def test_trajectory_pca_chart_facets_models():
    traj = torch.randn(6, 4, 10, dtype=torch.float64).cumsum(0)
    pca = pd.concat(
        [
            T.trajectory_pca(traj).assign(model="trained"),
            T.trajectory_pca(2 * traj).assign(model="random init"),
        ]
    )
    chart = P.trajectory_pca_chart(pca, facet="model", title="PCA")
    spec = chart.to_dict()
    assert spec["resolve"]["scale"] == {"x": "independent", "y": "independent"}
    assert [layer["mark"]["type"] for layer in spec["spec"]["layer"]] == ["line", "circle", "text"]
    render(chart)
    render(P.trajectory_pca_chart(T.trajectory_pca(traj, 3), y="pc3"))


def test_missing_columns_and_empty_frames_are_clear():
    with pytest.raises(ValueError, match=r"no column\(s\) \['value'\]"):
        P.coupling_heatmap(pd.DataFrame({"a": [1], "b": [1]}), "a", "b", "value")
    with pytest.raises(ValueError, match="empty"):
        P.bars(pd.DataFrame({"x": [], "y": []}), "x", "y")
    with pytest.raises(TypeError, match="DataFrame"):
        P.scatter_fit({"x": [1]}, "x", "y")
