"""Token trajectories drawn in principal-component space."""

from __future__ import annotations

import altair as alt
import pandas as pd

from coupling_utils.analysis.plots.look import Look, _facet_header, _need, _tip, _zoom, title_of

__all__ = ["trajectory_pca_chart"]


def _last_points(x: str, y: str, token: str, layer: str, facet: str | None):
    """Each token's name at its last layer's point (per panel)."""
    return (
        alt.Chart()
        .transform_joinaggregate(last=f"max({layer})", groupby=[token] + ([facet] if facet else []))
        .transform_filter(f"datum['{layer}'] == datum.last")
        .mark_text(align="left", dx=4, fontSize=9, color="#333333")
        .encode(x=f"{x}:Q", y=f"{y}:Q", text=f"{token}:N")
    )


def trajectory_pca_chart(
    pca_df: pd.DataFrame,
    *,
    x: str = "pc1",
    y: str = "pc2",
    token: str = "token",
    layer: str = "layer",
    facet: str | None = None,
    look: Look | None = None,
):
    """Token trajectories in principal-component space (``trajectories.trajectory_pca``).

    One grey path per token through its layers, points coloured by layer (viridis), the
    last layer's point labelled with the token. ``facet`` (e.g. "model": trained vs random
    init) gives one panel per value (``look.columns`` per row, default 2; ``look.order``) with
    independent axes (their scales differ); without ``facet`` the chart pans and zooms.
    Panels are ``look.width`` square (default 280 px).
    """
    look = look if look is not None else Look()
    _need(pca_df, x, y, token, layer, facet)
    cols = list(dict.fromkeys(c for c in (token, layer, x, y, facet) if c))
    data = pca_df[cols]
    by_facet = [_tip(facet, "N")] if facet else []
    path = (
        alt.Chart()
        .mark_line(color="#999999", strokeWidth=1, opacity=0.7)
        .encode(
            x=alt.X(f"{x}:Q", title=look.x_title or title_of(x)),
            y=alt.Y(f"{y}:Q", title=look.y_title or title_of(y)),
            detail=f"{token}:N",
            order=f"{layer}:Q",
            tooltip=by_facet + [_tip(token, "N", title="trajectory of token")],
        )
    )
    dots = (
        alt.Chart()
        .mark_circle(size=30, opacity=0.9)
        .encode(
            x=f"{x}:Q",
            y=f"{y}:Q",
            color=alt.Color(f"{layer}:Q", title=title_of(layer), scale=alt.Scale(scheme="viridis")),
            tooltip=by_facet + [_tip(token, "N"), _tip(layer, "Q"), _tip(x, "Q", ".3g"), _tip(y, "Q", ".3g")],
        )
    )
    if facet is None:
        dots = dots.add_params(_zoom())
    width, height = look.size(280)
    chart = alt.layer(path, dots, _last_points(x, y, token, layer, facet), data=data).properties(
        width=width, height=height
    )
    if facet:
        header = alt.Facet(f"{facet}:N", title=None, header=_facet_header(), sort=look.facet_sort())
        chart = chart.facet(facet=header, columns=look.columns or 2).resolve_scale(
            x="independent", y="independent"
        )
    return look.titled(chart)
