"""Altair chart builders for the book, each named after what it draws.

Every builder takes a tidy long DataFrame (one row per plotted value; see
:mod:`coupling_utils.analysis.coupling_metric` for turning matrices and tiles into such tables) and
returns an Altair chart. Charts are plain Vega-Lite specs: ``coupling_utils.analysis.display.show``
makes them live views in the built book, with a static SVG/PNG for print and for Jupyter.
Colour schemes are colour-blind safe: Okabe–Ito for categories, viridis for magnitudes.

So that a figure reads at a glance, every builder follows the same conventions:

- axis, legend, facet and tooltip titles are human names (:func:`title_of` looks a column up in
  :data:`TITLES`), never raw column names; ``x_title=`` / ``y_title=`` override them;
- every mark has a tooltip naming what it is (layers i and j, K and the value; model, step,
  accuracy);
- scatters pan and zoom (drag, mouse wheel; double-click resets), and scatters concatenated side
  by side (``a | b``) that label their points with the same column highlight the same point in
  every panel on hover (a linked selection);
- point labels never overlap: a label that has no free place next to its point is left out
  (its name stays in the tooltip) and the subtitle says how many were;
- heatmaps of a coupling matrix draw the diagonal (a block with itself, m = 0) in grey, outside
  the colour scale, so that the scale spans the off-diagonal values, the finding itself;
- facet headers show the values only (``trained``, ``random init``), not the column name.

Coupling values ``m`` (lower = more coupled) are drawn as ``1 − m²`` by default (higher = more
coupled, about 0 = unrelated), as in the authors' figures; pass ``show="m"`` to draw ``m``.
"""

from __future__ import annotations

import itertools
import math
import re
import warnings

import altair as alt
import numpy as np
import pandas as pd

from coupling_utils.schemas import Schema, check_table

__all__ = [
    "OKABE_ITO",
    "TITLES",
    "title_of",
    "tile_grid",
    "coupling_heatmap",
    "training_curve",
    "scatter_fit",
    "layer_coupling_graph",
    "trajectory_pca_chart",
    "layer_profile",
    "bars",
    "place_labels",
]

# Scatters put into one figure share their hover selection on purpose (that is the link);
# Altair merges the identical parameters and would warn about it in every notebook output.
warnings.filterwarnings(
    "ignore", message="Automatically deduplicated selection parameter", category=UserWarning
)

#: Okabe & Ito's colour-blind safe categorical palette (black last).
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
SHOWS = ("1-m^2", "m", "raw")
DIAGONAL_COLOUR = "#c8c8c8"
_BIG = 60_000  # rows beyond which a figure gets heavy (one element per mark)
# Pan/zoom selections need their own names: Altair merges identical unnamed ones across views.
_ZOOMS = itertools.count(1)

#: Human names of the columns the book's tables use: titles of axes, legends and tooltips.
TITLES = {
    "layer": "layer",
    "layer_i": "layer i",
    "layer_j": "layer j",
    "token": "token",
    "token_i": "token i",
    "token_j": "token j",
    "position": "position",
    "row": "row",
    "col": "column",
    "K": "K",
    "k": "K",
    "m": "m_K",
    "m_K": "m_K",
    "1 − m²": "1 − m²",
    "coupling": "coupling (mean 1 − m²)",
    "paper_coupling": "the paper's coupling",
    "normalized_coupling": "normalised coupling",
    "relative": "coupling / its final value",
    "training_fraction": "fraction of training",
    "step": "training step",
    "model": "model",
    "model_id": "model",
    "run": "run",
    "label": "model",
    "series": "series",
    "quantity": "quantity",
    "state": "weights",
    "weights": "weights",
    "panel": "panel",
    "case": "case",
    "prompt": "prompt",
    "val_acc": "held-out accuracy",
    "val_loss": "held-out loss (nats/token)",
    "test_acc": "test accuracy",
    "average": "leaderboard average",
    "score": "leaderboard score",
    "nats": "cross-entropy (nats/token)",
    "n_params": "parameters",
    "step_norm": "step size ‖xˡ − xˡ⁻¹‖",
    "lss": "line-shape score",
    "expodistance": "expodistance",
    "expodistance_ratio_cv": "expodistance (CV of step ratios)",
    "expodistance_log_linear_r2": "expodistance (1 − R² of log step size vs layer)",
    "growth_log_linear_r2": "growth factor of the steps per layer",
    "reconstruction": "reconstruction",
    "cosine": "cosine",
    "distance": "distance |i − j|",
    "pc1": "PC1",
    "pc2": "PC2",
    "pc3": "PC3",
    "strength": "1 − m²",
    "value": "value",
}


def title_of(column: str | None) -> str | None:
    """The human name of a column (:data:`TITLES`); other names come back with spaces for ``_``."""
    if column is None:
        return None
    return TITLES.get(column, str(column).replace("_", " "))


def _title(text: str) -> str:
    """A title given by the caller: a known column name becomes its human name, text stays."""
    return TITLES.get(text, text)


# --------------------------------------------------------------------------- helpers
def _need(df: pd.DataFrame, *cols: str | None) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    check_table(df, Schema("DataFrame", dict.fromkeys((c for c in cols if c is not None), "any")))
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
            f"{what}: {len(df)} rows make a heavy figure; use a smaller K, fewer layers or fewer tokens",
            stacklevel=3,
        )


def _tip(field: str, kind: str, fmt: str | None = None, title: str | None = None) -> alt.Tooltip:
    """A tooltip entry titled with the column's human name."""
    kw = {"format": fmt} if fmt else {}
    return alt.Tooltip(f"{field}:{kind}", title=title or title_of(field), **kw)


def _categorical(field: str, title: str | None = None) -> alt.Color:
    return alt.Color(f"{field}:N", title=title or title_of(field), scale=alt.Scale(range=OKABE_ITO))


def _facet_header() -> alt.Header:
    return alt.Header(labelFontSize=12, labelFontWeight="bold")


def _show_value(df: pd.DataFrame, value: str, show: str) -> tuple[pd.DataFrame, str, str]:
    """The column to colour by, for coupling values ``m`` drawn as 1 − m², m, or raw."""
    if show not in SHOWS:
        raise ValueError(f"show must be one of {SHOWS}, got {show!r}")
    if show == "1-m^2":
        df = df.assign(**{"1 − m²": 1 - df[value].astype(float) ** 2})
        return df, "1 − m²", "1 − m² (higher = more coupled)"
    if show == "m":
        return df, value, f"{title_of(value)} (lower = more coupled)"
    return df, value, title_of(value)


def _param_name(prefix: str, field: str) -> str:
    """A Vega signal name for a selection on ``field`` (letters, digits and _ only)."""
    return f"{prefix}_" + re.sub(r"\W", "_", field)


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
    title: str | None = "|U_jᵀ J_i V_j| over a window of layers",
) -> alt.FacetChart:
    """The paper's depth-wise grid of K×K tiles ``|U_{j,K}^T J_i V_{j,K}|``.

    One small heatmap per (layer_i, layer_j): rows are J_i, columns the layer whose singular
    vectors are used. A coupled pair shows a bright diagonal. With ``normalize`` each tile is
    divided by its maximum (scales differ across layers). Input: a long table as
    ``coupling_metric.tile_frame`` returns (layer_i, layer_j, row, col, value).
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
                _tip(layer_i, "O", title="Jacobian J_i of layer"),
                _tip(layer_j, "O", title="singular vectors of layer"),
                _tip(row, "O", title="row (u_j index)"),
                _tip(col, "O", title="column (v_j index)"),
                _tip(value, "Q", ".3g", title="|entry|"),
            ]
            + ([_tip(shown, "Q", ".3f", title="|entry| / tile max")] if normalize else []),
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
    diagonal: str = "grey",
    title: str | None = None,
    subtitle: str | None = None,
    x_title: str | None = None,
    y_title: str | None = None,
):
    """A coupling matrix as a heatmap: ``x`` and ``y`` index it (layers or tokens).

    ``value`` holds the coupling ``m`` (see ``show``). ``facet`` draws one panel per value of
    a column (e.g. model or training step), ``columns`` per row, headed by the values alone.
    The y axis runs top-down like a matrix. With ``diagonal="grey"`` (default) the cells with
    x = y (a block or token with itself: m = 0 by definition) are grey and left out of the
    colour scale, which then spans the off-diagonal values; ``diagonal="scale"`` colours them
    like the rest. Returns a layered Chart (or a FacetChart with ``facet``).
    """
    _need(df, x, y, value, facet)
    if diagonal not in ("grey", "scale"):
        raise ValueError(f"diagonal must be 'grey' or 'scale', got {diagonal!r}")
    _warn_size(df, "coupling_heatmap")
    data, shown, legend = _show_value(df[[c for c in dict.fromkeys((x, y, value, facet)) if c]], value, show)
    if show == "m":
        scale = alt.Scale(scheme="viridis", reverse=True, zero=False)
    else:
        scale = alt.Scale(scheme="viridis", zero=False)
    tooltip = [_tip(y, "O"), _tip(x, "O"), _tip(value, "Q", ".3f")]
    if shown != value:
        tooltip.append(_tip(shown, "Q", ".3f"))
    if facet:
        tooltip.insert(0, _tip(facet, "N"))
    # many layers: labels that would overlap are dropped (every other one, or more)
    enc = dict(
        x=alt.X(
            f"{x}:O",
            title=x_title or title_of(x),
            sort="ascending",
            axis=alt.Axis(labelAngle=0, labelOverlap="greedy"),
        ),
        y=alt.Y(
            f"{y}:O", title=y_title or title_of(y), sort="ascending", axis=alt.Axis(labelOverlap="greedy")
        ),
    )
    colour = alt.Color(f"{shown}:Q", title=legend, scale=scale)
    if diagonal == "grey":
        colour = alt.Color(f"{shown}:Q", title=[legend, "(grey: i = j, m = 0)"], scale=scale)
        off = (
            alt.Chart()
            .transform_filter(f"datum['{x}'] != datum['{y}']")
            .mark_rect()
            .encode(color=colour, tooltip=tooltip, **enc)
        )
        diag = (
            alt.Chart()
            .transform_filter(f"datum['{x}'] == datum['{y}']")
            .transform_calculate(what="'itself: m = 0 by definition'")
            .mark_rect(color=DIAGONAL_COLOUR)
            .encode(tooltip=[*tooltip[: 3 if facet else 2], alt.Tooltip("what:N", title="diagonal")], **enc)
        )
        chart = alt.layer(diag, off, data=data)
    else:
        chart = alt.Chart(data).mark_rect().encode(color=colour, tooltip=tooltip, **enc)
    chart = chart.properties(width=size, height=size)
    if facet:
        chart = chart.facet(
            facet=alt.Facet(f"{facet}:N", title=None, header=_facet_header()), columns=columns
        )
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
            g,
            i,
            j,
            value,
            show,
            symmetrize,
            threshold,
            size,
            None if key is None else f"{title_of(facet)} {key}",
        )
        for key, g in groups
    ]
    subtitle = f"edges where {'1 − m²' if show == '1-m^2' else title_of(value)} > {threshold:g}"
    if facet is None:
        return _titled(panels[0][0], title, f"{subtitle} ({panels[0][1]} edges)")
    return _titled(alt.hconcat(*(p for p, _ in panels)), title, subtitle)


def _circle_panel(df, i, j, value, show, symmetrize, threshold, size, panel_title):
    layers = np.unique(np.concatenate([df[i].to_numpy(), df[j].to_numpy()]))
    n = len(layers)
    angle = {lay: math.pi / 2 - 2 * math.pi * k / n for k, lay in enumerate(layers)}
    pos = {lay: (math.cos(a), math.sin(a)) for lay, a in angle.items()}
    s = df[[i, j, value]].astype({value: float})
    legend = "1 − m²" if show == "1-m^2" else title_of(value)
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
        .mark_rule(strokeWidth=2)
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
                alt.Tooltip("a:O", title="layer i"),
                alt.Tooltip("b:O", title="layer j"),
                alt.Tooltip("strength:Q", format=".3f", title=f"{legend} ({symmetrize} of i→j, j→i)"),
            ],
        ),
        alt.Chart(nodes)
        .mark_circle(size=40, color="#000000")
        .encode(x=X("x"), y=Y("y"), tooltip=[alt.Tooltip("layer:O", title="layer")]),
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
            title=x_title or f"{title_of(step)} (log scale, 0 kept)",
            labelExpr="datum.value >= 1e6 ? datum.value / 1e6 + 'M' : "
            "datum.value >= 1e3 ? datum.value / 1e3 + 'k' : datum.value",
        )
    else:
        xscale = alt.Scale(zero=True)
        xaxis = alt.Axis(title=x_title or title_of(step))
    y_name = _title(y_title) if y_title else title_of(value)
    enc = dict(
        x=alt.X(f"{step}:Q", scale=xscale, axis=xaxis),
        y=alt.Y(f"{value}:Q", title=y_name, scale=alt.Scale(zero=False)),
        tooltip=([_tip(color, "N")] if color else [])
        + [_tip(step, "Q", ",d"), _tip(value, "Q", ".4g", title=y_name)],
    )
    if color:
        enc["color"] = _categorical(color)
    else:
        enc["color"] = alt.value(OKABE_ITO[0])
    chart = alt.Chart(data).mark_line(point=points).encode(**enc)
    return _titled(chart.properties(width=420, height=260), title)


#: Where a point's label may go: (dx, dy, align, baseline) in pixels from the point, in order
#: of preference (right, left, above, below, then the corners).
LABEL_PLACES = (
    (6, 0, "left", "middle"),
    (-6, 0, "right", "middle"),
    (0, -7, "center", "bottom"),
    (0, 7, "center", "top"),
    (5, -5, "left", "bottom"),
    (5, 5, "left", "top"),
    (-5, -5, "right", "bottom"),
    (-5, 5, "right", "top"),
)


def place_labels(
    px: np.ndarray,
    py: np.ndarray,
    texts: list[str],
    width: float,
    height: float,
    *,
    font_size: float = 9.0,
    point_radius: float = 4.0,
) -> list[int | None]:
    """Greedy label placement: for each point (pixel ``px``, ``py``), the index into
    :data:`LABEL_PLACES` of the first place where its text box overlaps no other label, no
    point and stays inside the ``width`` × ``height`` plot; None where there is no such place.

    Text boxes are estimated (0.6 × font size per character, 1.2 × font size high); points are
    taken in order of how crowded they are (fewest neighbours first, so isolated points keep
    their label and crowded ones give way).
    """
    px, py = np.asarray(px, float), np.asarray(py, float)
    n = len(texts)
    boxes: list[tuple[float, float, float, float]] = []
    h = 1.2 * font_size
    r = point_radius
    dots = [(px[k] - r, py[k] - r, px[k] + r, py[k] + r) for k in range(n)]

    def overlaps(a, b) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    dist = np.hypot(px[:, None] - px[None, :], py[:, None] - py[None, :])
    crowd = (dist < 40).sum(axis=1)
    chosen: list[int | None] = [None] * n
    for k in sorted(range(n), key=lambda k: (crowd[k], k)):
        w = 0.6 * font_size * len(str(texts[k]))
        for place, (dx, dy, align, baseline) in enumerate(LABEL_PLACES):
            x0 = px[k] + dx - {"left": 0, "center": w / 2, "right": w}[align]
            y0 = py[k] + dy - {"top": 0, "middle": h / 2, "bottom": h}[baseline]
            box = (x0, y0, x0 + w, y0 + h)
            if box[0] < 0 or box[1] < 0 or box[2] > width or box[3] > height:
                continue
            if any(overlaps(box, b) for b in boxes):
                continue
            if any(overlaps(box, d) for m, d in enumerate(dots) if m != k):
                continue
            boxes.append(box)
            chosen[k] = place
            break
    return chosen


def _padded(values: pd.Series, pad: float = 0.06) -> list[float]:
    lo, hi = float(values.min()), float(values.max())
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    return [lo - pad * span, hi + pad * span]


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
    width: int = 400,
    height: int = 280,
):
    """Points, their OLS line, and text labels: the paper's correlation plots (Fig. 1a).

    The fit (``stats.ols``) is stated in the subtitle: slope, R², p, n. The points pan and
    zoom; hovering one highlights it, and the point with the same ``label`` in any scatter
    concatenated with this one (``scatter_fit(...) | scatter_fit(...)``: the same runs seen
    two ways). Labels are placed where they overlap nothing (:func:`place_labels`); the others
    are left to the tooltip, and the subtitle says how many. ``width`` × ``height`` in pixels:
    two side by side fit the book's column at ``width=280``; at the default, ``show`` stacks them.
    """
    _need(df, x, y, label, color)
    data = df[[c for c in dict.fromkeys((x, y, label, color)) if c]].dropna(subset=[x, y]).copy()
    x_name, y_name = x_title or title_of(x), y_title or title_of(y)
    xdom, ydom = _padded(data[x]), _padded(data[y])
    xs = alt.X(f"{x}:Q", title=x_name, scale=alt.Scale(domain=xdom, nice=False, zero=False))
    ys = alt.Y(f"{y}:Q", title=y_name, scale=alt.Scale(domain=ydom, nice=False, zero=False))
    tooltip = [_tip(x, "Q", ".4g", title=x_name), _tip(y, "Q", ".4g", title=y_name)]
    if color and color != label:
        tooltip.insert(0, _tip(color, "N"))
    if label:
        tooltip.insert(0, _tip(label, "N"))
    zoom = alt.selection_interval(bind="scales", name=f"zoom_{next(_ZOOMS)}")  # each view its own
    enc = dict(x=xs, y=ys, tooltip=tooltip)
    enc["color"] = _categorical(color) if color else alt.value(OKABE_ITO[0])
    params = [zoom]
    if label:
        pick = alt.selection_point(
            name=_param_name("pick", label), fields=[label], on="pointerover", clear="pointerout", empty=False
        )
        params.append(pick)
        enc["size"] = alt.condition(pick, alt.value(150), alt.value(55))
        enc["stroke"] = alt.condition(pick, alt.value("#000000"), alt.value(None))
    points = alt.Chart(data).mark_circle(opacity=0.85).encode(**enc).add_params(*params)
    layers = [points]
    notes = []
    if fit:
        from coupling_utils.analysis.stats import ols

        f = ols(data, y, x).iloc[0]
        lo, hi = float(data[x].min()), float(data[x].max())
        line = pd.DataFrame(
            {x: [lo, hi], y: [f["intercept"] + f["slope"] * lo, f["intercept"] + f["slope"] * hi]}
        )
        layers.insert(
            0,
            alt.Chart(line)
            .mark_line(color="#555555", strokeDash=[5, 3])
            .encode(x=xs, y=ys, tooltip=[alt.Tooltip(f"{y}:Q", title="OLS fit", format=".4g")]),
        )
        notes.append(f"OLS: slope {f['slope']:.3g}, R² = {f['r2']:.3f}, p = {f['p']:.2g}, n = {int(f['n'])}")
    if label:
        px = (data[x].to_numpy(float) - xdom[0]) / (xdom[1] - xdom[0]) * width
        py = (1 - (data[y].to_numpy(float) - ydom[0]) / (ydom[1] - ydom[0])) * height
        placed = data.assign(_place=place_labels(px, py, data[label].astype(str).tolist(), width, height))
        for place, (dx, dy, align, baseline) in enumerate(LABEL_PLACES):
            rows = placed[placed["_place"] == place][[x, y, label]]
            if len(rows):
                layers.append(
                    alt.Chart(rows)
                    .mark_text(align=align, baseline=baseline, dx=dx, dy=dy, fontSize=9, color="#333333")
                    .encode(x=xs, y=ys, text=f"{label}:N")
                )
        hidden = int(placed["_place"].isna().sum())
        if hidden:
            notes.append(f"{hidden} label{'s' if hidden > 1 else ''} left to the tooltip")
    subtitle = "; ".join(notes) or None
    return _titled(alt.layer(*layers).properties(width=width, height=height), title, subtitle)


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
    x_title: str | None = None,
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
    y_name = _title(y_title) if y_title else title_of(value)
    enc_color = _categorical(color) if color else alt.value(OKABE_ITO[0])
    layers_seen = np.unique(data[layer].to_numpy())
    # whole layers only: explicit ticks for a few layers (tickMinStep alone still repeats labels)
    whole = len(layers_seen) <= 16 and bool(np.all(layers_seen == np.round(layers_seen)))
    ticks = {"values": [int(v) for v in layers_seen]} if whole else {"tickMinStep": 1}
    xenc = alt.X(f"{layer}:Q", title=x_title or title_of(layer), axis=alt.Axis(format="d", **ticks))
    groups = [layer, color] if color else [layer]
    several = bool(data.groupby(groups)[value].size().max() > 1)
    line = (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(
            x=xenc,
            y=alt.Y(f"mean({value}):Q", title=y_name, scale=yscale),
            color=enc_color,
            tooltip=([_tip(color, "N")] if color else [])
            + [
                _tip(layer, "Q"),
                alt.Tooltip(f"mean({value}):Q", format=".4g", title=f"{y_name}, mean" if several else y_name),
            ]
            + ([alt.Tooltip(f"count({value}):Q", title="n")] if several else []),
        )
    )
    layers = [line]
    if band and several:
        layers.insert(
            0,
            alt.Chart(data)
            .mark_errorband(extent="stderr", opacity=0.25)
            .encode(x=xenc, y=alt.Y(f"{value}:Q", scale=yscale, title=y_name), color=enc_color),
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
    y_name = _title(y_title) if y_title else title_of(y)
    xenc = alt.X(
        f"{x}:N",
        title=x_title or title_of(x),
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
            y=alt.Y(f"mean({y}):Q", title=y_name),
            color=enc_color,
            tooltip=[_tip(x, "N")]
            + ([_tip(color, "N")] if color and color != x else [])
            + [alt.Tooltip(f"mean({y}):Q", format=".4g", title=f"{y_name}, mean" if several else y_name)]
            + ([alt.Tooltip(f"count({y}):Q", title="n")] if several else []),
            **extra,
        )
    )
    layers = [bar]
    if several:
        layers.append(
            alt.Chart(data)
            .mark_errorbar(extent="stderr", color="#333333")
            .encode(x=xenc, y=alt.Y(f"{y}:Q", title=y_name), **extra)
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
    init) gives one panel per value with independent axes (their scales differ); without
    ``facet`` the chart pans and zooms.
    """
    _need(pca_df, x, y, token, layer, facet)
    cols = list(dict.fromkeys(c for c in (token, layer, x, y, facet) if c))
    data = pca_df[cols]
    path = (
        alt.Chart()
        .mark_line(color="#999999", strokeWidth=1, opacity=0.7)
        .encode(
            x=alt.X(f"{x}:Q", title=title_of(x)),
            y=alt.Y(f"{y}:Q", title=title_of(y)),
            detail=f"{token}:N",
            order=f"{layer}:Q",
            tooltip=([_tip(facet, "N")] if facet else []) + [_tip(token, "N", title="trajectory of token")],
        )
    )
    dots = (
        alt.Chart()
        .mark_circle(size=30, opacity=0.9)
        .encode(
            x=f"{x}:Q",
            y=f"{y}:Q",
            color=alt.Color(f"{layer}:Q", title=title_of(layer), scale=alt.Scale(scheme="viridis")),
            tooltip=([_tip(facet, "N")] if facet else [])
            + [_tip(token, "N"), _tip(layer, "Q"), _tip(x, "Q", ".3g"), _tip(y, "Q", ".3g")],
        )
    )
    if facet is None:
        dots = dots.add_params(alt.selection_interval(bind="scales", name=f"zoom_{next(_ZOOMS)}"))
    end = (
        alt.Chart()
        .transform_joinaggregate(last=f"max({layer})", groupby=[token] + ([facet] if facet else []))
        .transform_filter(f"datum['{layer}'] == datum.last")
        .mark_text(align="left", dx=4, fontSize=9, color="#333333")
        .encode(x=f"{x}:Q", y=f"{y}:Q", text=f"{token}:N")
    )
    chart = alt.layer(path, dots, end, data=data).properties(width=size, height=size)
    if facet:
        chart = chart.facet(
            facet=alt.Facet(f"{facet}:N", title=None, header=_facet_header()), columns=columns
        ).resolve_scale(x="independent", y="independent")
    return _titled(chart, title, subtitle)
