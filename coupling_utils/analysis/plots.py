"""Altair chart builders for the book, each named after what it draws.

Every builder takes a tidy long DataFrame (one row per plotted value; see
:mod:`coupling_utils.analysis.coupling_metric` for turning matrices and tiles into such tables) and returns an
Altair chart. Charts are plain Vega-Lite specs, so they render offline as static SVG with
``vl-convert`` (``coupling_utils.analysis.display.show``). Colour schemes are colour-blind safe:
Okabe–Ito for categories, viridis for magnitudes.

Coupling values ``m`` (lower = more coupled) are drawn as ``1 − m²`` by default (higher = more
coupled, about 0 = unrelated), as in the authors' figures; pass ``show="m"`` to draw ``m``.
"""

from __future__ import annotations

import math
import warnings

import altair as alt
import numpy as np
import pandas as pd

__all__ = [
    "OKABE_ITO",
    "tile_grid",
    "coupling_heatmap",
    "training_curve",
    "scatter_fit",
    "layer_coupling_graph",
    "trajectory_pca_chart",
    "layer_profile",
    "bars",
]

# tiles and heatmaps can have many rows; the book embeds data in the spec, rendered offline
alt.data_transformers.disable_max_rows()

#: Okabe & Ito's colour-blind safe categorical palette (black last).
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
SHOWS = ("1-m^2", "m", "raw")
_BIG = 60_000  # rows beyond which a static SVG gets heavy (one element per mark)


# --------------------------------------------------------------------------- helpers
def _need(df: pd.DataFrame, *cols: str | None) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in cols if c is not None and c not in df.columns]
    if missing:
        raise ValueError(f"DataFrame has no column(s) {missing}; it has {list(df.columns)}")
    if df.empty:
        raise ValueError("nothing to plot: the DataFrame is empty")


def _titled(chart, title: str | None, subtitle: str | None = None):
    """Set a chart's title (and subtitle) when there is one."""
    if not title:  # a subtitle alone becomes the title (Vega drops a subtitle without one)
        return chart.properties(title=subtitle) if subtitle else chart
    return chart.properties(title=alt.TitleParams(title, subtitle=subtitle) if subtitle else title)


def _warn_size(df: pd.DataFrame, what: str) -> None:
    if len(df) > _BIG:
        warnings.warn(
            f"{what}: {len(df)} rows make a heavy static figure; use a smaller K, "
            "fewer layers or fewer tokens",
            stacklevel=3,
        )


def _categorical(field: str, title: str | None = None) -> alt.Color:
    return alt.Color(f"{field}:N", title=title or field, scale=alt.Scale(range=OKABE_ITO))


def _show_value(df: pd.DataFrame, value: str, show: str) -> tuple[pd.DataFrame, str, str]:
    """The column to colour by, for coupling values ``m`` drawn as 1 − m², m, or raw."""
    if show not in SHOWS:
        raise ValueError(f"show must be one of {SHOWS}, got {show!r}")
    if show == "1-m^2":
        df = df.assign(**{"1 − m²": 1 - df[value].astype(float) ** 2})
        return df, "1 − m²", "1 − m² (higher = more coupled)"
    if show == "m":
        return df, value, f"{value} (lower = more coupled)"
    return df, value, value


# --------------------------------------------------------------------------- coupling
def tile_grid(
    tiles_df: pd.DataFrame,
    *,
    layer_i: str = "layer_i",
    layer_j: str = "layer_j",
    row: str = "row",
    col: str = "col",
    value: str = "value",
    normalize: bool = True,
    cell: int = 64,
    title: str | None = "|U_j^T J_i V_j| over a window of layers",
) -> alt.FacetChart:
    """The paper's depth-wise grid of K×K tiles ``|U_{j,K}^T J_i V_{j,K}|``.

    One small heatmap per (layer_i, layer_j): rows are J_i, columns the layer whose singular
    vectors are used. A coupled pair shows a bright diagonal. With ``normalize`` each tile is
    divided by its maximum (scales differ across layers). Input: a long table as
    ``aggregate.tile_frame`` returns (layer_i, layer_j, row, col, value).
    """
    _need(tiles_df, layer_i, layer_j, row, col, value)
    _warn_size(tiles_df, "tile_grid")
    df = tiles_df[[layer_i, layer_j, row, col, value]]
    base = alt.Chart(df)
    shown = value
    if normalize:
        base = base.transform_joinaggregate(
            tile_max=f"max({value})", groupby=[layer_i, layer_j]
        ).transform_calculate(shown=f"datum.tile_max > 0 ? datum['{value}'] / datum.tile_max : 0")
        shown = "shown"
    no_axis = alt.Axis(labels=False, ticks=False, title=None, domain=False)
    heat = (
        base.mark_rect()
        .encode(
            x=alt.X(f"{col}:O", axis=no_axis),
            y=alt.Y(f"{row}:O", axis=no_axis),
            color=alt.Color(
                f"{shown}:Q",
                title="|entry| / tile max" if normalize else "|entry|",
                scale=alt.Scale(scheme="viridis"),
            ),
            tooltip=[
                alt.Tooltip(f"{layer_i}:O", title="J of layer"),
                alt.Tooltip(f"{layer_j}:O", title="vectors of layer"),
                alt.Tooltip(f"{row}:O"),
                alt.Tooltip(f"{col}:O"),
                alt.Tooltip(f"{value}:Q", format=".3g"),
            ],
        )
        .properties(width=cell, height=cell)
    )
    grid = heat.facet(
        row=alt.Row(f"{layer_i}:O", title="Jacobian J_i of layer", header=alt.Header(labelAngle=0)),
        column=alt.Column(f"{layer_j}:O", title="singular vectors U_j, V_j of layer"),
        spacing=3,
    )
    return _titled(grid, title)


def coupling_heatmap(
    df: pd.DataFrame,
    x: str,
    y: str,
    value: str,
    *,
    show: str = "1-m^2",
    facet: str | None = None,
    columns: int = 3,
    size: int = 240,
    title: str | None = None,
    subtitle: str | None = None,
):
    """A coupling matrix as a heatmap: ``x`` and ``y`` index it (layers or tokens).

    ``value`` holds the coupling ``m`` (see ``show``). ``facet`` draws one panel per value of
    a column (e.g. model or training step), ``columns`` per row. The y axis runs top-down
    like a matrix. Returns a Chart (or a FacetChart with ``facet``).
    """
    _need(df, x, y, value, facet)
    _warn_size(df, "coupling_heatmap")
    data, shown, legend = _show_value(df[[c for c in (x, y, value, facet) if c]], value, show)
    if show == "1-m^2":
        scale = alt.Scale(scheme="viridis", domain=[min(0.0, float(data[shown].min())), 1.0])
    elif show == "m":
        scale = alt.Scale(scheme="viridis", reverse=True, domain=[0.0, max(1.0, float(data[shown].max()))])
    else:
        scale = alt.Scale(scheme="viridis")
    chart = (
        alt.Chart(data)
        .mark_rect()
        .encode(
            # many layers: labels that would overlap are dropped (every other one, or more)
            x=alt.X(f"{x}:O", title=x, sort="ascending", axis=alt.Axis(labelAngle=0, labelOverlap="greedy")),
            y=alt.Y(f"{y}:O", title=y, sort="ascending", axis=alt.Axis(labelOverlap="greedy")),
            color=alt.Color(f"{shown}:Q", title=legend, scale=scale),
            tooltip=[alt.Tooltip(f"{x}:O"), alt.Tooltip(f"{y}:O"), alt.Tooltip(f"{value}:Q", format=".3f")]
            + ([alt.Tooltip(f"{shown}:Q", format=".3f")] if shown != value else [])
            + ([alt.Tooltip(f"{facet}:N")] if facet else []),
        )
        .properties(width=size, height=size)
    )
    if facet:
        chart = chart.facet(facet=alt.Facet(f"{facet}:N", title=facet), columns=columns)
    return _titled(chart, title, subtitle)


def layer_coupling_graph(
    matrix_df: pd.DataFrame,
    threshold: float,
    *,
    i: str = "layer_i",
    j: str = "layer_j",
    value: str = "value",
    show: str = "1-m^2",
    symmetrize: str = "mean",
    facet: str | None = None,
    size: int = 260,
    title: str | None = "Layer coupling graph",
):
    """The paper's circle figures: layers on a circle, an edge where coupling exceeds ``threshold``.

    Pair strength is ``1 − m²`` (``show="1-m^2"``) or the raw value (``show="raw"``),
    symmetrised over (i, j) and (j, i) by ``symmetrize`` ("mean", "max" or "min"); edges are
    drawn for pairs above ``threshold``, darker for stronger. Layer 0 is at the top, the
    layers run clockwise. ``facet`` puts one circle per value of a column side by side
    (e.g. training step), all with the same threshold.
    """
    _need(matrix_df, i, j, value, facet)
    if show not in ("1-m^2", "raw"):
        raise ValueError(f"show must be '1-m^2' or 'raw' for a coupling graph, got {show!r}")
    if symmetrize not in ("mean", "max", "min"):
        raise ValueError(f"symmetrize must be 'mean', 'max' or 'min', got {symmetrize!r}")
    if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    groups = [(None, matrix_df)] if facet is None else list(matrix_df.groupby(facet, sort=True))
    panels = [
        _circle_panel(
            g, i, j, value, show, symmetrize, threshold, size, None if key is None else f"{facet} = {key}"
        )
        for key, g in groups
    ]
    subtitle = f"edges where {'1 − m²' if show == '1-m^2' else value} > {threshold:g}"
    if facet is None:
        return _titled(panels[0][0], title, f"{subtitle} ({panels[0][1]} edges)")
    return _titled(alt.hconcat(*(p for p, _ in panels)), title, subtitle)


def _circle_panel(df, i, j, value, show, symmetrize, threshold, size, panel_title):
    layers = np.unique(np.concatenate([df[i].to_numpy(), df[j].to_numpy()]))
    n = len(layers)
    angle = {lay: math.pi / 2 - 2 * math.pi * k / n for k, lay in enumerate(layers)}
    pos = {lay: (math.cos(a), math.sin(a)) for lay, a in angle.items()}
    s = df[[i, j, value]].astype({value: float})
    legend = "1 − m²" if show == "1-m^2" else value
    if show == "1-m^2":
        s = s.assign(**{value: 1 - s[value] ** 2})
    s = s[s[i] != s[j]]
    a = np.minimum(s[i].to_numpy(), s[j].to_numpy())
    b = np.maximum(s[i].to_numpy(), s[j].to_numpy())
    pairs = (
        pd.DataFrame({"a": a, "b": b, "strength": s[value].to_numpy()})
        .groupby(["a", "b"], as_index=False)["strength"]
        .agg(symmetrize)
    )
    edges = pairs[pairs["strength"] > threshold].copy()
    edges["x"] = [pos[v][0] for v in edges["a"]]
    edges["y"] = [pos[v][1] for v in edges["a"]]
    edges["x2"] = [pos[v][0] for v in edges["b"]]
    edges["y2"] = [pos[v][1] for v in edges["b"]]
    nodes = pd.DataFrame(
        {"layer": layers, "x": [pos[v][0] for v in layers], "y": [pos[v][1] for v in layers]}
    )
    nodes["lx"] = nodes["x"] * 1.13
    nodes["ly"] = nodes["y"] * 1.13
    scale = alt.Scale(domain=[-1.25, 1.25])
    hidden = alt.Axis(labels=False, ticks=False, grid=False, domain=False, title=None)
    X = lambda f: alt.X(f"{f}:Q", scale=scale, axis=hidden)  # noqa: E731
    Y = lambda f: alt.Y(f"{f}:Q", scale=scale, axis=hidden)  # noqa: E731
    hi = max(float(pairs["strength"].max()), threshold + 1e-9) if len(pairs) else threshold + 1
    layers_ = [
        alt.Chart(edges)
        .mark_rule(strokeWidth=1.5)
        .encode(
            x=X("x"),
            y=Y("y"),
            x2="x2:Q",
            y2="y2:Q",
            color=alt.Color(
                "strength:Q",
                title=legend,
                scale=alt.Scale(scheme="viridis", reverse=True, domain=[threshold, hi]),
            ),
            tooltip=[
                alt.Tooltip("a:O", title="layer"),
                alt.Tooltip("b:O", title="layer"),
                alt.Tooltip("strength:Q", format=".3f"),
            ],
        ),
        alt.Chart(nodes)
        .mark_circle(size=40, color="#000000")
        .encode(x=X("x"), y=Y("y"), tooltip=[alt.Tooltip("layer:O")]),
    ]
    if n <= 48:  # label layers unless they would overlap
        layers_.append(alt.Chart(nodes).mark_text(fontSize=9).encode(x=X("lx"), y=Y("ly"), text="layer:O"))
    chart = alt.layer(*layers_).properties(width=size, height=size, view=alt.ViewBackground(stroke=None))
    if panel_title:
        chart = chart.properties(title=f"{panel_title} ({len(edges)} edges)")
    return chart, len(edges)


# --------------------------------------------------------------------------- curves and fits
def training_curve(
    df: pd.DataFrame,
    step: str,
    value: str,
    color: str | None = None,
    *,
    log_step: bool = True,
    points: bool = True,
    title: str | None = None,
    y_title: str | None = None,
    x_title: str | None = None,
) -> alt.Chart:
    """A quantity against training step, one line per ``color`` (e.g. model size).

    With ``log_step`` the step axis is logarithmic; step 0 (the initialisation) is kept by
    a symmetric-log scale (linear below 1) with ticks at 0, 1, 10, 100, ...
    """
    _need(df, step, value, color)
    data = df[[c for c in (step, value, color) if c]]
    if (data[step] < 0).any():
        raise ValueError(f"column {step!r} has negative steps")
    if log_step:
        top = max(1.0, float(data[step].max()))
        ticks = [0] + [10**e for e in range(0, int(math.ceil(math.log10(top))) + 1)]
        xscale = alt.Scale(type="symlog", constant=1, domain=[0, ticks[-1]])
        xaxis = alt.Axis(
            values=ticks,
            title=x_title or f"{step} (log scale, 0 kept)",
            labelExpr="datum.value >= 1e6 ? datum.value / 1e6 + 'M' : "
            "datum.value >= 1e3 ? datum.value / 1e3 + 'k' : datum.value",
        )
    else:
        xscale = alt.Scale(zero=True)
        xaxis = alt.Axis(title=x_title or step)
    enc = dict(
        x=alt.X(f"{step}:Q", scale=xscale, axis=xaxis),
        y=alt.Y(f"{value}:Q", title=y_title or value, scale=alt.Scale(zero=False)),
        tooltip=[alt.Tooltip(f"{step}:Q"), alt.Tooltip(f"{value}:Q", format=".4g")]
        + ([alt.Tooltip(f"{color}:N")] if color else []),
    )
    if color:
        enc["color"] = _categorical(color)
    else:
        enc["color"] = alt.value(OKABE_ITO[0])
    chart = alt.Chart(data).mark_line(point=points).encode(**enc)
    return _titled(chart.properties(width=420, height=260), title)


def scatter_fit(
    df: pd.DataFrame,
    x: str,
    y: str,
    label: str | None = None,
    *,
    color: str | None = None,
    fit: bool = True,
    title: str | None = None,
    x_title: str | None = None,
    y_title: str | None = None,
):
    """Points, their OLS line, and text labels: the paper's correlation plots (Fig. 1a).

    The fit (``stats.ols``) is stated in the subtitle: slope, R², p, n.
    """
    _need(df, x, y, label, color)
    data = df[[c for c in dict.fromkeys((x, y, label, color)) if c]].dropna(subset=[x, y])
    tooltip = [alt.Tooltip(f"{x}:Q", format=".4g"), alt.Tooltip(f"{y}:Q", format=".4g")]
    if label:
        tooltip.insert(0, alt.Tooltip(f"{label}:N"))
    xs = alt.X(f"{x}:Q", title=x_title or x, scale=alt.Scale(zero=False))
    ys = alt.Y(f"{y}:Q", title=y_title or y, scale=alt.Scale(zero=False))
    enc = dict(x=xs, y=ys, tooltip=tooltip)
    enc["color"] = _categorical(color) if color else alt.value(OKABE_ITO[0])
    layers = [alt.Chart(data).mark_circle(size=55, opacity=0.85).encode(**enc)]
    subtitle = None
    if fit:
        from coupling_utils.analysis.stats import ols

        f = ols(data, y, x).iloc[0]
        lo, hi = float(data[x].min()), float(data[x].max())
        line = pd.DataFrame(
            {x: [lo, hi], y: [f["intercept"] + f["slope"] * lo, f["intercept"] + f["slope"] * hi]}
        )
        layers.insert(0, alt.Chart(line).mark_line(color="#555555", strokeDash=[5, 3]).encode(x=xs, y=ys))
        subtitle = f"OLS: slope {f['slope']:.3g}, R² = {f['r2']:.3f}, p = {f['p']:.2g}, n = {int(f['n'])}"
    if label:
        layers.append(
            alt.Chart(data)
            .mark_text(align="left", dx=5, dy=-4, fontSize=9, color="#333333")
            .encode(x=xs, y=ys, text=f"{label}:N")
        )
    return _titled(alt.layer(*layers).properties(width=420, height=300), title, subtitle)


def layer_profile(
    df: pd.DataFrame,
    value: str,
    *,
    layer: str = "layer",
    color: str | None = None,
    log_y: bool = False,
    band: bool = True,
    title: str | None = None,
    y_title: str | None = None,
):
    """A per-layer quantity (e.g. step size, prefix cosine) averaged over rows, by ``color``.

    Draws the mean per (layer, color) as a line with points and, with ``band`` and more than
    one row per layer, a ±1 standard-error band (e.g. over tokens or prompts).
    """
    _need(df, layer, value, color)
    data = df[[c for c in (layer, value, color) if c]]
    if log_y and (data[value] <= 0).any():
        raise ValueError(f"log_y needs positive values, but {value!r} has some <= 0")
    yscale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    enc_color = _categorical(color) if color else alt.value(OKABE_ITO[0])
    xenc = alt.X(f"{layer}:Q", title=layer, axis=alt.Axis(tickMinStep=1, format="d"))
    line = (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(
            x=xenc,
            y=alt.Y(f"mean({value}):Q", title=y_title or value, scale=yscale),
            color=enc_color,
            tooltip=[alt.Tooltip(f"{layer}:Q"), alt.Tooltip(f"mean({value}):Q", format=".4g")]
            + ([alt.Tooltip(f"{color}:N")] if color else []),
        )
    )
    layers = [line]
    groups = [layer, color] if color else [layer]
    if band and data.groupby(groups)[value].size().max() > 1:
        layers.insert(
            0,
            alt.Chart(data)
            .mark_errorband(extent="stderr", opacity=0.25)
            .encode(x=xenc, y=alt.Y(f"{value}:Q", scale=yscale, title=y_title or value), color=enc_color),
        )
    return _titled(alt.layer(*layers).properties(width=420, height=260), title)


def bars(
    df: pd.DataFrame,
    x: str,
    y: str,
    color: str | None = None,
    *,
    title: str | None = None,
    y_title: str | None = None,
    x_title: str | None = None,
    sort: str | None = None,
):
    """Bars of ``y`` per category ``x`` (grouped by ``color``); mean ± standard error when a
    category has several rows (e.g. tokens or prompts)."""
    _need(df, x, y, color)
    data = df[[c for c in dict.fromkeys((x, y, color)) if c]]
    groups = [x, color] if color else [x]
    several = data.groupby(groups)[y].size().max() > 1
    xenc = alt.X(
        f"{x}:N",
        title=x_title or x,
        sort=sort,
        axis=alt.Axis(labelAngle=-30 if data[x].astype(str).str.len().max() > 6 else 0),
    )
    enc_color = _categorical(color) if color else alt.value(OKABE_ITO[0])
    extra = {"xOffset": alt.XOffset(f"{color}:N")} if color and color != x else {}
    bar = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=xenc,
            y=alt.Y(f"mean({y}):Q", title=y_title or y),
            color=enc_color,
            tooltip=[alt.Tooltip(f"{x}:N"), alt.Tooltip(f"mean({y}):Q", format=".4g", title=y)]
            + ([alt.Tooltip(f"{color}:N")] if color else [])
            + ([alt.Tooltip(f"count({y}):Q", title="n")] if several else []),
            **extra,
        )
    )
    layers = [bar]
    if several:
        layers.append(
            alt.Chart(data)
            .mark_errorbar(extent="stderr", color="#333333")
            .encode(x=xenc, y=alt.Y(f"{y}:Q", title=y_title or y), **extra)
        )
    return _titled(alt.layer(*layers).properties(width=alt.Step(28 if color else 40), height=240), title)


# --------------------------------------------------------------------------- trajectories
def trajectory_pca_chart(
    pca_df: pd.DataFrame,
    *,
    x: str = "pc1",
    y: str = "pc2",
    token: str = "token",
    layer: str = "layer",
    facet: str | None = None,
    columns: int = 2,
    size: int = 280,
    title: str | None = None,
    subtitle: str | None = None,
):
    """Token trajectories in principal-component space (``trajectories.trajectory_pca``).

    One grey path per token through its layers, points coloured by layer (viridis), the
    last layer's point labelled with the token. ``facet`` (e.g. "model": trained vs random
    init) gives one panel per value with independent axes (their scales differ).
    """
    _need(pca_df, x, y, token, layer, facet)
    cols = list(dict.fromkeys(c for c in (token, layer, x, y, facet) if c))
    data = pca_df[cols]
    path = (
        alt.Chart()
        .mark_line(color="#999999", strokeWidth=1, opacity=0.7)
        .encode(
            x=alt.X(f"{x}:Q", title=x.upper()),
            y=alt.Y(f"{y}:Q", title=y.upper()),
            detail=f"{token}:N",
            order=f"{layer}:Q",
        )
    )
    dots = (
        alt.Chart()
        .mark_circle(size=30, opacity=0.9)
        .encode(
            x=f"{x}:Q",
            y=f"{y}:Q",
            color=alt.Color(f"{layer}:Q", title="layer", scale=alt.Scale(scheme="viridis")),
            tooltip=[
                alt.Tooltip(f"{token}:N"),
                alt.Tooltip(f"{layer}:Q"),
                alt.Tooltip(f"{x}:Q", format=".3g"),
                alt.Tooltip(f"{y}:Q", format=".3g"),
            ],
        )
    )
    end = (
        alt.Chart()
        .transform_joinaggregate(last=f"max({layer})", groupby=[token] + ([facet] if facet else []))
        .transform_filter(f"datum['{layer}'] == datum.last")
        .mark_text(align="left", dx=4, fontSize=9, color="#333333")
        .encode(x=f"{x}:Q", y=f"{y}:Q", text=f"{token}:N")
    )
    chart = alt.layer(path, dots, end, data=data).properties(width=size, height=size)
    if facet:
        chart = chart.facet(facet=alt.Facet(f"{facet}:N", title=facet), columns=columns).resolve_scale(
            x="independent", y="independent"
        )
    return _titled(chart, title, subtitle)
