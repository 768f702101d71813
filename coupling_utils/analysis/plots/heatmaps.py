"""Heatmaps of coupling: the paper's tile grid and coupling matrices over layers or tokens."""

from __future__ import annotations

import altair as alt
import pandas as pd

from coupling_utils.analysis.plots.look import Look, _facet_header, _need, _tip, _warn_size, title_of

__all__ = ["SHOWS", "DIAGONAL_COLOUR", "tile_grid", "coupling_heatmap"]

SHOWS = ("1-m^2", "m", "raw")
DIAGONAL_COLOUR = "#c8c8c8"
TILE_TITLE = "|U_jᵀ J_i V_j| over a window of layers"


def tile_grid(
    tiles_df: pd.DataFrame,
    *,
    layer_i: str = "layer_i",
    layer_j: str = "layer_j",
    row: str = "row",
    col: str = "col",
    value: str = "value",
    normalize: bool = True,
    look: Look | None = None,
) -> alt.FacetChart:
    """The paper's depth-wise grid of K×K tiles ``|U_{j,K}^T J_i V_{j,K}|``.

    One small heatmap per (layer_i, layer_j): rows are J_i, columns the layer whose singular
    vectors are used. A coupled pair shows a bright diagonal. With ``normalize`` each tile is
    divided by its maximum (scales differ across layers). Input: a long table as
    ``coupling_metric.tile_frame`` returns (layer_i, layer_j, row, col, value). ``look``: its
    width is one tile's (default 64 px); default title :data:`TILE_TITLE`.
    """
    look = look if look is not None else Look(title=TILE_TITLE)
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
    width, height = look.size(64)
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
        .properties(width=width, height=height)
    )
    grid = heat.facet(
        row=alt.Row(f"{layer_i}:O", title="Jacobian J_i of layer", header=alt.Header(labelAngle=0)),
        column=alt.Column(f"{layer_j}:O", title="singular vectors U_j, V_j of layer"),
        spacing=3,
    )
    return look.titled(grid)


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


def _matrix_axes(x: str, y: str, look: Look) -> dict:
    """The x and y encodings of a matrix: ordered indices, the y axis top-down, labels that would
    overlap dropped (every other one, or more, for many layers)."""
    return dict(
        x=alt.X(
            f"{x}:O",
            title=look.x_title or title_of(x),
            sort="ascending",
            axis=alt.Axis(labelAngle=0, labelOverlap="greedy"),
        ),
        y=alt.Y(
            f"{y}:O",
            title=look.y_title or title_of(y),
            sort="ascending",
            axis=alt.Axis(labelOverlap="greedy"),
        ),
    )


def _grey_diagonal(data, x: str, y: str, colour, tooltip: list, enc: dict, facet: str | None):
    """Off-diagonal cells coloured, the diagonal (x = y: m = 0 by definition) grey, outside the scale."""
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
    return alt.layer(diag, off, data=data)


def coupling_heatmap(
    df: pd.DataFrame,
    x: str,
    y: str,
    value: str,
    *,
    show: str = "1-m^2",
    facet: str | None = None,
    diagonal: str = "grey",
    look: Look | None = None,
):
    """A coupling matrix as a heatmap: ``x`` and ``y`` index it (layers or tokens).

    ``value`` holds the coupling ``m`` (see ``show``). ``facet`` draws one panel per value of
    a column (e.g. model or training step), ``look.columns`` per row (default 3), headed by the
    values alone, in ``look.order``. The y axis runs top-down like a matrix. With
    ``diagonal="grey"`` (default) the cells with x = y (a block or token with itself: m = 0 by
    definition) are grey and left out of the colour scale, which then spans the off-diagonal
    values; ``diagonal="scale"`` colours them like the rest. Panels are ``look.width`` square
    (default 240 px). Returns a layered Chart (or a FacetChart with ``facet``).
    """
    look = look if look is not None else Look()
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
    enc = _matrix_axes(x, y, look)
    if diagonal == "grey":
        colour = alt.Color(f"{shown}:Q", title=[legend, "(grey: i = j, m = 0)"], scale=scale)
        chart = _grey_diagonal(data, x, y, colour, tooltip, enc, facet)
    else:
        colour = alt.Color(f"{shown}:Q", title=legend, scale=scale)
        chart = alt.Chart(data).mark_rect().encode(color=colour, tooltip=tooltip, **enc)
    width, height = look.size(240)
    chart = chart.properties(width=width, height=height)
    if facet:
        header = alt.Facet(f"{facet}:N", title=None, header=_facet_header(), sort=look.facet_sort())
        chart = chart.facet(facet=header, columns=look.columns or 3)
    return look.titled(chart)
