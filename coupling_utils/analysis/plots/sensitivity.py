"""Sensitivity curves: a quantity with its interval against a setting, one line per model."""

from __future__ import annotations

import altair as alt
import pandas as pd

from coupling_utils.analysis.plots.look import Look, _categorical, _need, _tip, _title, title_of

__all__ = ["sensitivity_curve"]


def sensitivity_curve(
    df: pd.DataFrame,
    setting: str,
    value: str,
    low: str,
    high: str,
    color: str,
    *,
    chosen: float | None = None,
    look: Look | None = None,
) -> alt.LayerChart:
    """``value`` against ``setting`` (log-2 axis), one line per ``color`` with the interval
    ``[low, high]`` as a bar at each point, a dashed zero line, and (``chosen``) a grey rule at
    the setting that was chosen. ``look``: default size 420 × 260 px."""
    look = look if look is not None else Look()
    _need(df, setting, value, low, high, color)
    data = df[[setting, value, low, high, color]]
    if (data[setting] <= 0).any():
        raise ValueError(f"column {setting!r} must be positive for a log axis")
    y_name = _title(look.y_title) if look.y_title else title_of(value)
    x = alt.X(
        f"{setting}:Q",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(
            values=sorted(data[setting].unique()), format=".3~g", title=look.x_title or title_of(setting)
        ),
    )
    tips = [_tip(color, "N"), _tip(setting, "Q", ".4g"), _tip(value, "Q", ".3f", title=y_name)]
    tips += [_tip(low, "Q", ".3f"), _tip(high, "Q", ".3f")]
    base = alt.Chart(data).encode(x=x, color=_categorical(color), tooltip=tips)
    lines = base.mark_line(point=True).encode(y=alt.Y(f"{value}:Q", title=y_name))
    bars = base.mark_rule(strokeWidth=2, opacity=0.6).encode(y=f"{low}:Q", y2=f"{high}:Q")
    zero = (
        alt.Chart(pd.DataFrame({"zero": [0.0]})).mark_rule(strokeDash=[4, 4], color="#888").encode(y="zero:Q")
    )
    layers = [zero, bars, lines]
    if chosen is not None:
        pick = pd.DataFrame({setting: [float(chosen)]})
        layers.insert(
            1, alt.Chart(pick).mark_rule(color="#999", strokeWidth=3, opacity=0.5).encode(x=f"{setting}:Q")
        )
    width, height = look.size(420, 260)
    return look.titled(alt.layer(*layers).properties(width=width, height=height))
