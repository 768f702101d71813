"""Means with their standard errors: per layer (a line with a band) and per category (bars)."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from coupling_utils.analysis.plots.look import OKABE_ITO, Look, _categorical, _need, _tip, _title, title_of

__all__ = ["layer_profile", "bars"]


def _layer_axis(data: pd.DataFrame, layer: str, x_title: str | None) -> alt.X:
    """The layer axis: whole layers only, with explicit ticks for a few layers (tickMinStep alone
    still repeats labels)."""
    layers_seen = np.unique(data[layer].to_numpy())
    whole = len(layers_seen) <= 16 and bool(np.all(layers_seen == np.round(layers_seen)))
    ticks = {"values": [int(v) for v in layers_seen]} if whole else {"tickMinStep": 1}
    return alt.X(f"{layer}:Q", title=x_title or title_of(layer), axis=alt.Axis(format="d", **ticks))


def layer_profile(
    df: pd.DataFrame,
    value: str,
    *,
    layer: str = "layer",
    color: str | None = None,
    log_y: bool = False,
    band: bool = True,
    look: Look | None = None,
):
    """A per-layer quantity (e.g. step size, prefix cosine) averaged over rows, by ``color``.

    Draws the mean per (layer, color) as a line with points and, with ``band`` and more than
    one row per layer, a ±1 standard-error band (e.g. over tokens or prompts). ``look``: default
    size 420 × 260 px; a ``y_title`` that is a column name gets that column's human name.
    """
    look = look if look is not None else Look()
    _need(df, layer, value, color)
    data = df[[c for c in (layer, value, color) if c]]
    if log_y and (data[value] <= 0).any():
        raise ValueError(f"log_y needs positive values, but {value!r} has some <= 0")
    yscale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    y_name = _title(look.y_title) if look.y_title else title_of(value)
    enc_color = _categorical(color) if color else alt.value(OKABE_ITO[0])
    xenc = _layer_axis(data, layer, look.x_title)
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
    width, height = look.size(420, 260)
    return look.titled(alt.layer(*layers).properties(width=width, height=height))


def bars(
    df: pd.DataFrame,
    x: str,
    y: str,
    color: str | None = None,
    *,
    sort: str | None = None,
    look: Look | None = None,
):
    """Bars of ``y`` per category ``x`` (grouped by ``color``); mean ± standard error when a
    category has several rows (e.g. tokens or prompts). ``look``: default 240 px high, 28 px per
    bar (40 without ``color``) unless ``look.width`` fixes the panel's width."""
    look = look if look is not None else Look()
    _need(df, x, y, color)
    data = df[[c for c in dict.fromkeys((x, y, color)) if c]]
    groups = [x, color] if color else [x]
    several = data.groupby(groups)[y].size().max() > 1
    y_name = _title(look.y_title) if look.y_title else title_of(y)
    xenc = alt.X(
        f"{x}:N",
        title=look.x_title or title_of(x),
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
    width = look.width or alt.Step(28 if color else 40)
    return look.titled(alt.layer(*layers).properties(width=width, height=look.height or 240))
