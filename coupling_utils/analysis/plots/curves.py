"""Curves over training: a quantity against the training step, one line per run or model."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from coupling_utils.analysis.plots.look import OKABE_ITO, Look, _categorical, _need, _tip, _title, title_of

__all__ = ["training_curve"]


def _step_axis(data: pd.DataFrame, step: str, log_step: bool, x_title: str | None):
    """The step axis's scale and axis: symmetric-log with ticks at 0, 1, 10, 100, ... (step 0 kept),
    or linear from 0."""
    if not log_step:
        return alt.Scale(zero=True), alt.Axis(title=x_title or title_of(step))
    top = max(1.0, float(data[step].max()))
    ticks = [0] + [10**e for e in range(0, int(math.ceil(math.log10(top))) + 1)]
    xscale = alt.Scale(type="symlog", constant=1, domain=[0, ticks[-1]])
    xaxis = alt.Axis(
        values=ticks,
        title=x_title or f"{title_of(step)} (log scale, 0 kept)",
        labelExpr="datum.value >= 1e6 ? datum.value / 1e6 + 'M' : "
        "datum.value >= 1e3 ? datum.value / 1e3 + 'k' : datum.value",
    )
    return xscale, xaxis


def training_curve(
    df: pd.DataFrame,
    step: str,
    value: str,
    color: str | None = None,
    *,
    log_step: bool = True,
    points: bool = True,
    look: Look | None = None,
) -> alt.Chart:
    """A quantity against training step, one line per ``color`` (e.g. model size).

    With ``log_step`` the step axis is logarithmic; step 0 (the initialisation) is kept by
    a symmetric-log scale (linear below 1) with ticks at 0, 1, 10, 100, ... ``look``: default
    size 420 × 260 px; a ``y_title`` that is a column name gets that column's human name.
    """
    look = look if look is not None else Look()
    _need(df, step, value, color)
    data = df[[c for c in (step, value, color) if c]]
    if (data[step] < 0).any():
        raise ValueError(f"column {step!r} has negative steps")
    xscale, xaxis = _step_axis(data, step, log_step, look.x_title)
    y_name = _title(look.y_title) if look.y_title else title_of(value)
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
    width, height = look.size(420, 260)
    return look.titled(chart.properties(width=width, height=height))
