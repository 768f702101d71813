"""Scatters with their least-squares line and labels that never overlap (the paper's Fig. 1a).

Scatters pan and zoom (drag, mouse wheel; double-click resets), and scatters concatenated side
by side (``a | b``) that label their points with the same column highlight the same point in
every panel on hover (a linked selection). A label with no free place next to its point is left
out (its name stays in the tooltip) and the subtitle says how many were.
"""

from __future__ import annotations

import warnings

import altair as alt
import numpy as np
import pandas as pd

from coupling_utils.analysis.plots.look import (
    OKABE_ITO,
    Look,
    _categorical,
    _need,
    _param_name,
    _tip,
    _zoom,
    title_of,
)

__all__ = ["LABEL_PLACES", "place_labels", "scatter_fit"]

# Scatters put into one figure share their hover selection on purpose (that is the link);
# Altair merges the identical parameters and would warn about it in every notebook output.
warnings.filterwarnings(
    "ignore", message="Automatically deduplicated selection parameter", category=UserWarning
)

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


def _points(data: pd.DataFrame, x: str, y: str, label: str | None, color: str | None, enc: dict):
    """The points: coloured by ``color``, zooming, and with a ``label`` highlighted on hover in
    every view that labels by the same column."""
    tooltip = list(enc["tooltip"])
    if color and color != label:
        tooltip.insert(0, _tip(color, "N"))
    if label:
        tooltip.insert(0, _tip(label, "N"))
    enc = dict(enc, tooltip=tooltip)
    enc["color"] = _categorical(color) if color else alt.value(OKABE_ITO[0])
    params = [_zoom()]  # each view its own
    if label:
        pick = alt.selection_point(
            name=_param_name("pick", label), fields=[label], on="pointerover", clear="pointerout", empty=False
        )
        params.append(pick)
        enc["size"] = alt.condition(pick, alt.value(150), alt.value(55))
        enc["stroke"] = alt.condition(pick, alt.value("#000000"), alt.value(None))
    return alt.Chart(data).mark_circle(opacity=0.85).encode(**enc).add_params(*params)


def _fit_line(data: pd.DataFrame, x: str, y: str, xs, ys):
    """The OLS line over the data's x range (``stats.ols``), and the sentence that states it."""
    from coupling_utils.analysis.stats import ols

    f = ols(data, y, x).iloc[0]
    lo, hi = float(data[x].min()), float(data[x].max())
    line = pd.DataFrame(
        {x: [lo, hi], y: [f["intercept"] + f["slope"] * lo, f["intercept"] + f["slope"] * hi]}
    )
    chart = (
        alt.Chart(line)
        .mark_line(color="#555555", strokeDash=[5, 3])
        .encode(x=xs, y=ys, tooltip=[alt.Tooltip(f"{y}:Q", title="OLS fit", format=".4g")])
    )
    return chart, f"OLS: slope {f['slope']:.3g}, R² = {f['r2']:.3f}, p = {f['p']:.2g}, n = {int(f['n'])}"


def _labels(data: pd.DataFrame, x: str, y: str, label: str, xs, ys, frame) -> tuple[list, int]:
    """Text layers of the labels that fit (:func:`place_labels`) and how many were left out;
    ``frame`` is (x domain, y domain, width, height)."""
    xdom, ydom, width, height = frame
    px = (data[x].to_numpy(float) - xdom[0]) / (xdom[1] - xdom[0]) * width
    py = (1 - (data[y].to_numpy(float) - ydom[0]) / (ydom[1] - ydom[0])) * height
    placed = data.assign(_place=place_labels(px, py, data[label].astype(str).tolist(), width, height))
    layers = []
    for place, (dx, dy, align, baseline) in enumerate(LABEL_PLACES):
        rows = placed[placed["_place"] == place][[x, y, label]]
        if len(rows):
            layers.append(
                alt.Chart(rows)
                .mark_text(align=align, baseline=baseline, dx=dx, dy=dy, fontSize=9, color="#333333")
                .encode(x=xs, y=ys, text=f"{label}:N")
            )
    return layers, int(placed["_place"].isna().sum())


def scatter_fit(
    df: pd.DataFrame,
    x: str,
    y: str,
    label: str | None = None,
    *,
    color: str | None = None,
    fit: bool = True,
    look: Look | None = None,
):
    """Points, their OLS line, and text labels: the paper's correlation plots (Fig. 1a).

    The fit (``stats.ols``) is stated in the subtitle: slope, R², p, n. The points pan and
    zoom; hovering one highlights it, and the point with the same ``label`` in any scatter
    concatenated with this one (``scatter_fit(...) | scatter_fit(...)``: the same runs seen
    two ways). Labels are placed where they overlap nothing (:func:`place_labels`); the others
    are left to the tooltip, and the subtitle says how many. ``look``: default 400 × 280 px;
    two side by side fit the book's column at ``width=280``; at the default, ``show`` stacks them.
    """
    look = look if look is not None else Look()
    _need(df, x, y, label, color)
    data = df[[c for c in dict.fromkeys((x, y, label, color)) if c]].dropna(subset=[x, y]).copy()
    x_name, y_name = look.x_title or title_of(x), look.y_title or title_of(y)
    width, height = look.size(400, 280)
    xdom, ydom = _padded(data[x]), _padded(data[y])
    xs = alt.X(f"{x}:Q", title=x_name, scale=alt.Scale(domain=xdom, nice=False, zero=False))
    ys = alt.Y(f"{y}:Q", title=y_name, scale=alt.Scale(domain=ydom, nice=False, zero=False))
    tooltip = [_tip(x, "Q", ".4g", title=x_name), _tip(y, "Q", ".4g", title=y_name)]
    layers = [_points(data, x, y, label, color, dict(x=xs, y=ys, tooltip=tooltip))]
    notes = [look.subtitle] if look.subtitle else []
    if fit:
        line, sentence = _fit_line(data, x, y, xs, ys)
        layers.insert(0, line)
        notes.append(sentence)
    if label:
        texts, hidden = _labels(data, x, y, label, xs, ys, (xdom, ydom, width, height))
        layers += texts
        if hidden:
            notes.append(f"{hidden} label{'s' if hidden > 1 else ''} left to the tooltip")
    subtitle = "; ".join(notes) or None
    return Look(look.title, subtitle).titled(alt.layer(*layers).properties(width=width, height=height))
