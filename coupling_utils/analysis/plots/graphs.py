"""The paper's circle figures: layers on a circle, an edge where a pair's coupling passes a threshold."""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from coupling_utils.analysis.plots.look import Look, _need, title_of

__all__ = ["GRAPH_TITLE", "layer_coupling_graph"]

GRAPH_TITLE = "Layer coupling graph"


def layer_coupling_graph(
    matrix_df: pd.DataFrame,
    threshold: float,
    *,
    pair: tuple[str, str] = ("layer_i", "layer_j"),
    value: str = "value",
    show: str = "1-m^2",
    symmetrize: str = "mean",
    facet: str | None = None,
    look: Look | None = None,
):
    """The paper's circle figures: layers on a circle, an edge where coupling exceeds ``threshold``.

    ``pair`` names the columns of the two layers (i, j). Pair strength is ``1 − m²``
    (``show="1-m^2"``) or the raw value (``show="raw"``), symmetrised over (i, j) and (j, i) by
    ``symmetrize`` ("mean", "max" or "min"); edges are drawn for pairs above ``threshold``,
    darker for stronger. Layer 0 is at the top, the layers run clockwise. ``facet`` puts one
    circle per value of a column side by side (e.g. training step; ascending, or ``look.order``),
    all with the same threshold. Circles are ``look.width`` square (default 260 px); default
    title :data:`GRAPH_TITLE`; the subtitle states the threshold (after ``look.subtitle``).
    """
    look = look if look is not None else Look(title=GRAPH_TITLE)
    i, j = pair
    _need(matrix_df, i, j, value, facet)
    if show not in ("1-m^2", "raw"):
        raise ValueError(f"show must be '1-m^2' or 'raw' for a coupling graph, got {show!r}")
    if symmetrize not in ("mean", "max", "min"):
        raise ValueError(f"symmetrize must be 'mean', 'max' or 'min', got {symmetrize!r}")
    if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    groups = [(None, matrix_df)] if facet is None else _ordered(matrix_df, facet, look.order)
    legend = "1 − m²" if show == "1-m^2" else title_of(value)
    size = look.size(260)
    panels = []
    for key, g in groups:
        nodes, edges, pairs = _circle(g, pair, value, show, symmetrize, threshold)
        panel = _circle_chart(nodes, edges, pairs, legend, symmetrize, threshold, size)
        if key is not None:
            panel = panel.properties(title=f"{title_of(facet)} {key} ({_edges(len(edges))})")
        panels.append((panel, len(edges)))
    subtitle = "; ".join(filter(None, [look.subtitle, f"edges where {legend} > {threshold:g}"]))
    if facet is None:
        return Look(look.title, f"{subtitle} ({_edges(panels[0][1])})").titled(panels[0][0])
    return Look(look.title, subtitle).titled(alt.hconcat(*(p for p, _ in panels)))


def _edges(n: int) -> str:
    """A count of edges as a title says it: "1 edge", "0 edges", "3 edges"."""
    return f"{n} edge" if n == 1 else f"{n} edges"


def _ordered(df: pd.DataFrame, facet: str, order: tuple | None) -> list:
    """(value, rows) per value of ``facet``: ascending, or the values in ``order`` first."""
    groups = list(df.groupby(facet, sort=True))
    if order is None:
        return groups
    rank = {v: k for k, v in enumerate(order)}
    return sorted(groups, key=lambda kv: rank.get(kv[0], len(rank)))


def _circle(df: pd.DataFrame, pair, value: str, show: str, symmetrize: str, threshold: float):
    """The circle's nodes (layers at their places), its edges (pairs above ``threshold``) and every
    symmetrised pair's strength."""
    i, j = pair
    layers = np.unique(np.concatenate([df[i].to_numpy(), df[j].to_numpy()]))
    n = len(layers)
    angle = {lay: math.pi / 2 - 2 * math.pi * k / n for k, lay in enumerate(layers)}
    pos = {lay: (math.cos(a), math.sin(a)) for lay, a in angle.items()}
    s = df[[i, j, value]].astype({value: float})
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
    return nodes, edges, pairs


def _circle_chart(nodes, edges, pairs, legend: str, symmetrize: str, threshold: float, size):
    """One circle: edges coloured by strength (from ``threshold`` up), the layers as dots, labelled
    unless there are too many to read."""
    scale = alt.Scale(domain=[-1.25, 1.25])
    hidden = alt.Axis(labels=False, ticks=False, grid=False, domain=False, title=None)
    X = lambda f: alt.X(f"{f}:Q", scale=scale, axis=hidden)  # noqa: E731
    Y = lambda f: alt.Y(f"{f}:Q", scale=scale, axis=hidden)  # noqa: E731
    hi = max(float(pairs["strength"].max()), threshold + 1e-9) if len(pairs) else threshold + 1
    colour = alt.Color(
        "strength:Q", title=legend, scale=alt.Scale(scheme="viridis", reverse=True, domain=[threshold, hi])
    )
    tooltip = [
        alt.Tooltip("a:O", title="layer i"),
        alt.Tooltip("b:O", title="layer j"),
        alt.Tooltip("strength:Q", format=".3f", title=f"{legend} ({symmetrize} of i→j, j→i)"),
    ]
    layers = [
        alt.Chart(edges)
        .mark_rule(strokeWidth=2)
        .encode(x=X("x"), y=Y("y"), x2="x2:Q", y2="y2:Q", color=colour, tooltip=tooltip),
        alt.Chart(nodes)
        .mark_circle(size=40, color="#000000")
        .encode(x=X("x"), y=Y("y"), tooltip=[alt.Tooltip("layer:O", title="layer")]),
    ]
    if len(nodes) <= 48:  # label layers unless they would overlap
        layers.append(alt.Chart(nodes).mark_text(fontSize=9).encode(x=X("lx"), y=Y("ly"), text="layer:O"))
    width, height = size
    return alt.layer(*layers).properties(width=width, height=height, view=alt.ViewBackground(stroke=None))
