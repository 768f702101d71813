"""Chart builders: valid Vega-Lite, rendered offline to SVG, drawing the right things."""

from __future__ import annotations

import json
import re

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
    chart = P.coupling_heatmap(df, "layer_j", "layer_i", "value", look=P.Look(title="depth-wise"))
    data = datasets(chart)[0]
    np.testing.assert_allclose(data["1 − m²"], 1 - data["value"] ** 2)
    assert sorted(data["layer_j"].unique()) == [3, 4, 5, 6]  # square: labels_j = labels_i
    render(chart)
    raw = P.coupling_heatmap(df, "layer_j", "layer_i", "value", show="m")
    assert raw.to_dict()["layer"][1]["encoding"]["color"]["scale"]["reverse"] is True
    faceted = P.coupling_heatmap(
        pd.concat([df.assign(step=s) for s in (1, 143000)]),
        "layer_j",
        "layer_i",
        "value",
        facet="step",
        look=P.Look(title="t"),
    )
    facet = faceted.to_dict()["facet"]
    assert facet["field"] == "step" and facet["title"] is None  # headers: the values only
    render(faceted)
    with pytest.raises(ValueError, match="show must be"):
        P.coupling_heatmap(df, "layer_j", "layer_i", "value", show="log")
    with pytest.raises(ValueError, match="diagonal"):
        P.coupling_heatmap(df, "layer_j", "layer_i", "value", diagonal="hide")


def test_coupling_heatmap_keeps_the_diagonal_out_of_the_colour_scale(coupled):
    """The diagonal (m = 0, 1 − m² = 1) gets its own grey; the scale spans the rest."""
    _, M = coupled
    df = A.matrix_frame(M, [3, 4, 5, 6])
    spec = P.coupling_heatmap(df, "layer_j", "layer_i", "value").to_dict()
    diag, off = spec["layer"]
    assert diag["transform"][0]["filter"] == "datum['layer_j'] == datum['layer_i']"
    assert diag["mark"]["color"] == P.DIAGONAL_COLOUR and "color" not in diag["encoding"]
    assert off["transform"][0]["filter"] == "datum['layer_j'] != datum['layer_i']"
    assert "domain" not in off["encoding"]["color"]["scale"]  # from the off-diagonal data
    assert off["encoding"]["x"]["title"] == "layer j" and off["encoding"]["y"]["title"] == "layer i"
    # weakly coupled blocks, as in the paper's finding: 1 − m² of 0.02 to 0.19 off the diagonal
    rng = np.random.default_rng(0)
    weak = pd.DataFrame(
        [(i, j, 0.0 if i == j else rng.uniform(0.9, 0.99)) for i in range(6) for j in range(6)],
        columns=["layer_i", "layer_j", "value"],
    )
    off_max = float((1 - weak[weak.layer_i != weak.layer_j]["value"] ** 2).max())
    svg = render(P.coupling_heatmap(weak, "layer_j", "layer_i", "value"))
    assert P.DIAGONAL_COLOUR in svg and "grey: i = j" in svg
    legend = [float(t) for t in re.findall(r">(0\.\d+|1\.0)</text>", svg)]
    assert legend and max(legend) <= off_max < 0.2, (legend, off_max)  # not stretched to 1
    shared = render(P.coupling_heatmap(weak, "layer_j", "layer_i", "value", diagonal="scale"))
    assert max(float(t) for t in re.findall(r">(0\.\d+|1\.0)</text>", shared)) == 1.0
    whole = P.coupling_heatmap(df, "layer_j", "layer_i", "value", diagonal="scale")
    assert "layer" not in whole.to_dict()


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


def test_layer_coupling_graph_counts_one_edge_in_the_singular():
    """f03's Fig. 31 titled a panel "training step 64 (1 edges)"."""
    M = torch.ones(3, 3)
    M[0, 1] = M[1, 0] = 0.1  # one coupled pair (1 − m² = 0.99); every other pair 0
    df = A.matrix_frame(M)
    text = spec_text(P.layer_coupling_graph(df.assign(step=64), 0.5, facet="step"))
    assert "(1 edge)" in text and "1 edges" not in text
    assert "(1 edge)" in spec_text(P.layer_coupling_graph(df, 0.5))  # one panel: the subtitle
    assert "(0 edges)" in spec_text(P.layer_coupling_graph(df, 2.0))


# --------------------------------------------------------------------------- curves
def test_training_curve_keeps_step_zero_on_log_axis():
    df = pd.DataFrame(
        {
            "step": [0, 1, 8, 512, 143000] * 2,
            "coupling": np.linspace(0, 1, 10),
            "model": ["pythia-6.9b"] * 5 + ["pythia-12b"] * 5,
        }
    )
    chart = P.training_curve(df, "step", "coupling", "model", look=P.Look(title="emergence"))
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
    chart = P.scatter_fit(df, "coupling", "score", "model", look=P.Look(title="Fig. 1a"))
    text = spec_text(chart)
    assert "R² = 1.000" in text and "slope 2" in text and "n = 6" in text
    svg = render(chart)
    assert ">f<" in svg or "f</text>" in svg  # point labels are drawn
    noisy = df.assign(score=[1.0, 0.0, 3.0, 2.0, 5.0, 4.0])
    r2 = ols(noisy, "score", "coupling").loc[0, "r2"]
    assert f"R² = {r2:.3f}" in spec_text(P.scatter_fit(noisy, "coupling", "score"))


# pytest resets warning filters per test; notebooks keep the one plots sets for this merge
@pytest.mark.filterwarnings("ignore:Automatically deduplicated selection parameter")
def test_scatter_fit_pans_zooms_and_links_side_by_side_views():
    df = pd.DataFrame(
        {
            "coupling": [0.90, 0.91, 0.93, 0.95],
            "val_acc": [0.30, 0.31, 0.35, 0.40],
            "val_loss": [3.1, 3.0, 2.8, 2.6],
            "run": ["tiny", "small", "medium", "large"],
        }
    )
    acc = P.scatter_fit(df, "coupling", "val_acc", label="run")
    loss = P.scatter_fit(df, "coupling", "val_loss", label="run")
    spec = (acc | loss).to_dict()
    pick = [p for p in spec["params"] if p["name"] == "pick_run"]
    assert len(pick) == 1 and len(pick[0]["views"]) == 2, "one hover selection shared by both views"
    assert pick[0]["select"]["fields"] == ["run"]
    zooms = [p for p in spec["params"] if p.get("bind") == "scales"]
    assert len(zooms) == 2 and len({z["name"] for z in zooms}) == 2, "each view pans and zooms on its own"
    points = spec["hconcat"][0]["layer"][1]
    assert (
        points["mark"]["type"] == "circle" and points["encoding"]["size"]["condition"]["param"] == "pick_run"
    )
    render(acc | loss)


def test_place_labels_never_overlaps_and_leaves_crowded_points_to_the_tooltip():
    rng = np.random.default_rng(1)
    px = np.concatenate([rng.uniform(100, 120, 12), [20.0, 260.0]])  # a crowd and two loners
    py = np.concatenate([rng.uniform(100, 120, 12), [20.0, 200.0]])
    texts = [f"model-{k}" for k in range(14)]
    places = P.place_labels(px, py, texts, 280, 240)
    assert places[12] is not None and places[13] is not None  # isolated points keep their label
    assert any(p is None for p in places[:12])  # the crowd cannot all be labelled
    boxes = []
    for k, place in enumerate(places):
        if place is None:
            continue
        dx, dy, align, baseline = P.LABEL_PLACES[place]
        w, h = 0.6 * 9 * len(texts[k]), 1.2 * 9
        x0 = px[k] + dx - {"left": 0, "center": w / 2, "right": w}[align]
        y0 = py[k] + dy - {"top": 0, "middle": h / 2, "bottom": h}[baseline]
        assert x0 >= 0 and x0 + w <= 280 and y0 >= 0 and y0 + h <= 240
        boxes.append((x0, y0, x0 + w, y0 + h))
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            A_, B_ = boxes[a], boxes[b]
            assert not (A_[0] < B_[2] and B_[0] < A_[2] and A_[1] < B_[3] and B_[1] < A_[3]), (a, b)
    df = pd.DataFrame({"coupling": px, "score": -py, "model": texts})
    chart = P.scatter_fit(df, "coupling", "score", "model", look=P.Look(width=280, height=240))
    hidden = sum(p is None for p in P.place_labels(px, py, texts, 280, 240))
    assert f"{hidden} labels left to the tooltip" in spec_text(chart)
    drawn = sum(len(d) for d in datasets(chart) if set(d.columns) == {"coupling", "score", "model"})
    assert drawn == 14 + (14 - hidden)  # every point, and one text per placed label


def _units(spec: dict):
    """Every single-view spec (one with a mark) inside a chart spec."""
    if "mark" in spec:
        yield spec
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for child in spec.get(key, []):
            yield from _units(child)
    if isinstance(spec.get("spec"), dict):
        yield from _units(spec["spec"])


def test_every_builder_names_its_marks_in_tooltips_and_titles(coupled):
    """Each data mark has a tooltip; no axis, legend or tooltip shows a raw column name."""
    Js, M = coupled
    mat = A.matrix_frame(M, [3, 4, 5, 6])
    traj = torch.randn(6, 4, 10, dtype=torch.float64).cumsum(0)
    steps = T.step_norms(traj).assign(model="trained")
    curve = pd.DataFrame(
        {"step": [0, 10, 100] * 2, "val_loss": [3, 2, 1.5, 3.2, 2.4, 2], "model_id": list("aaabbb")}
    )
    fam = pd.DataFrame({"coupling": [0.9, 0.92, 0.95], "val_acc": [0.3, 0.35, 0.4], "run": ["s", "m", "l"]})
    charts = {
        "tile_grid": P.tile_grid(A.tile_frame(A.coupling_tiles(Js, 4), layers=[0, 1, 2, 3])),
        "coupling_heatmap": P.coupling_heatmap(
            mat.assign(model="x"), "layer_j", "layer_i", "value", facet="model"
        ),
        "layer_coupling_graph": P.layer_coupling_graph(mat, 0.1),
        "training_curve": P.training_curve(curve, "step", "val_loss", "model_id"),
        "scatter_fit": P.scatter_fit(fam, "coupling", "val_acc", label="run"),
        "layer_profile": P.layer_profile(steps, "step_norm", color="model"),
        "bars": P.bars(steps, "model", "step_norm"),
        "trajectory_pca_chart": P.trajectory_pca_chart(T.trajectory_pca(traj)),
    }
    for name, chart in charts.items():
        spec = chart.to_dict()
        units = list(_units(spec))
        data_units = [
            u
            for u in units
            if (u["mark"] if isinstance(u["mark"], str) else u["mark"]["type"])
            not in ("text", "errorband", "errorbar")
            and "x" in u.get("encoding", {})
        ]
        assert data_units, name
        for u in data_units:
            assert "tooltip" in u["encoding"], f"{name}: a {u['mark']} mark without a tooltip"
        for u in units:
            for channel, enc in u.get("encoding", {}).items():
                entries = enc if isinstance(enc, list) else [enc]
                for e in entries:
                    if not isinstance(e, dict) or "_" not in str(e.get("field", "")):
                        continue
                    title = e.get(
                        "title",
                        (e.get("axis") or {}).get("title") if isinstance(e.get("axis"), dict) else None,
                    )
                    shown_axis = not (isinstance(e.get("axis"), dict) and e["axis"].get("labels") is False)
                    if channel in ("x", "y", "color", "tooltip") and shown_axis:
                        assert title and title != e["field"], (
                            f"{name}: {channel} shows the raw name {e['field']!r}"
                        )
        render(chart)
    assert P.title_of("val_acc") == "held-out accuracy" and P.title_of("some_column") == "some column"


def test_layer_profile_and_bars():
    traj = torch.randn(7, 5, 16, dtype=torch.float64).cumsum(0)
    steps = pd.concat([T.step_norms(traj).assign(model=m) for m in ("trained", "random init")])
    prof = P.layer_profile(steps, "step_norm", color="model", log_y=True)
    assert prof.to_dict()["layer"][0]["mark"]["type"] == "errorband"  # 5 tokens per layer
    render(prof)
    with pytest.raises(ValueError, match="log_y"):
        P.layer_profile(steps.assign(step_norm=0.0), "step_norm", log_y=True)
    lss = pd.concat([T.line_shape_score(traj).assign(model=m) for m in ("trained", "random init")])
    b = P.bars(lss, "model", "lss", look=P.Look(title="LSS"))
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
    chart = P.trajectory_pca_chart(pca, facet="model", look=P.Look(title="PCA"))
    spec = chart.to_dict()
    assert spec["resolve"]["scale"] == {"x": "independent", "y": "independent"}
    assert [layer["mark"]["type"] for layer in spec["spec"]["layer"]] == ["line", "circle", "text"]
    render(chart)
    render(P.trajectory_pca_chart(T.trajectory_pca(traj, 3), y="pc3"))


def test_missing_columns_and_empty_frames_are_clear():
    with pytest.raises(ValueError, match=r"DataFrame: missing column\(s\) \['value'\]"):
        P.coupling_heatmap(pd.DataFrame({"a": [1], "b": [1]}), "a", "b", "value")
    with pytest.raises(ValueError, match="empty"):
        P.bars(pd.DataFrame({"x": [], "y": []}), "x", "y")
    with pytest.raises(TypeError, match="DataFrame"):
        P.scatter_fit({"x": [1]}, "x", "y")


def test_one_look_presents_every_builder(coupled):
    """Look names the presentation once for all builders: titles, a panel's size, facet columns
    and order; a builder given no look keeps its defaults, and a bad look is refused."""
    _, M = coupled
    mat = A.matrix_frame(M, [3, 4, 5, 6])
    steps = pd.concat([mat.assign(step=s) for s in (1, 10, 100)])
    look = P.Look(title="T", subtitle="S", width=150, columns=2, order=(100, 1))
    heat = P.coupling_heatmap(steps, "layer_j", "layer_i", "value", facet="step", look=look).to_dict()
    assert heat["title"] == {"text": "T", "subtitle": "S"} and heat["columns"] == 2
    assert heat["facet"]["sort"] == [100, 1] and heat["spec"]["width"] == heat["spec"]["height"] == 150
    ascending = P.coupling_heatmap(steps, "layer_j", "layer_i", "value", facet="step").to_dict()
    assert "sort" not in ascending["facet"] and ascending["columns"] == 3
    graph = P.layer_coupling_graph(steps, 0.1, facet="step", look=P.Look(title="G", order=[100])).to_dict()
    heads = [c["title"].split(" (")[0] for c in graph["hconcat"]]
    assert heads == ["training step 100", "training step 1", "training step 10"]
    assert P.layer_coupling_graph(mat, 0.1).to_dict()["title"]["text"] == P.graphs.GRAPH_TITLE
    tiles = A.tile_frame(A.coupling_tiles(coupled[0], 3), layers=[0, 1, 2, 3])
    assert P.tile_grid(tiles).to_dict()["title"] == P.heatmaps.TILE_TITLE
    fam = pd.DataFrame({"coupling": [0.9, 0.92, 0.95], "val_acc": [0.3, 0.35, 0.4], "run": ["s", "m", "l"]})
    scatter = P.scatter_fit(fam, "coupling", "val_acc", look=P.Look(subtitle="ours", height=200)).to_dict()
    assert scatter["title"].startswith("ours; OLS: slope")  # a subtitle alone is the title
    assert (scatter["width"], scatter["height"]) == (400, 200)
    curve = P.training_curve(fam.assign(step=[0, 10, 100]), "step", "val_acc", look=P.Look(x_title="steps"))
    assert curve.to_dict()["encoding"]["x"]["axis"]["title"] == "steps"
    for bad in (dict(width=0), dict(height=2.5), dict(columns=-1), dict(order="trained")):
        with pytest.raises(ValueError, match="Look"):
            P.Look(**bad)
