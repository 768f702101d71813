"""A chart rendered as the book shows it: its final Vega-Lite spec, its static pictures, plain values.

:func:`chart_spec` is the spec ``display.show`` embeds (floats cut, alt text as its description,
wrapped to the book's column, ``FIT_WIDTH``) with its static SVG; :func:`to_svg` and
:func:`to_png` draw a chart offline (vl-convert); :func:`plain` writes a value as a reader should
see it, and :func:`repr_problems` finds Python/numpy reprs that must never reach a reader. Both
``display`` (which shows charts) and ``layout`` (which reads where each panel of the final spec
is) build on this module.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "FIT_WIDTH",
    "SIGNIFICANT_DIGITS",
    "REPRS",
    "chart_spec",
    "to_svg",
    "to_png",
    "plain",
    "repr_problems",
]

FIT_WIDTH = 680  # px: the book's text column at a 1280 px wide window (measured: 688)
SIGNIFICANT_DIGITS = 6  # floats in a chart's inline data (the spec's size, not its look)
_SVG_SIZE = re.compile(r'<svg[^>]*?\bwidth="([\d.]+)"[^>]*?\bheight="([\d.]+)"')


def _vegalite_version() -> str | None:
    """The Vega-Lite version the installed Altair writes, as vl-convert names it ("6.4")."""
    import altair as alt
    import vl_convert as vlc

    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vlc.get_vegalite_versions() else None


def _spec(chart: Any) -> dict:
    """A Vega-Lite spec (dict) from an Altair chart, a spec dict or its JSON text."""
    if isinstance(chart, dict):
        return chart
    if isinstance(chart, str):
        return json.loads(chart)
    to_dict = getattr(chart, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected an Altair chart or a Vega-Lite spec, got {type(chart).__name__}")
    import altair as alt

    # the book embeds each chart's data in its spec: K x K tiles at the paper's K = 50 and
    # layer heatmaps of deep models exceed Altair's default 5000-row guard
    with alt.data_transformers.disable_max_rows():
        return to_dict()


def to_svg(chart: Any) -> str:
    """The chart drawn as a standalone SVG document (text)."""
    import vl_convert as vlc

    svg = vlc.vegalite_to_svg(_spec(chart), vl_version=_vegalite_version())
    if "<svg" not in svg:
        raise RuntimeError("vl-convert returned no SVG for this chart")
    return svg


def to_png(chart: Any, scale: float = 2.0) -> bytes:
    """The chart drawn as PNG bytes, ``scale`` pixels per CSS pixel (2: sharp on high-DPI screens)."""
    import vl_convert as vlc

    png = vlc.vegalite_to_png(_spec(chart), vl_version=_vegalite_version(), scale=scale)
    if not png.startswith(b"\x89PNG"):
        raise RuntimeError("vl-convert returned no PNG for this chart")
    return png


def svg_width(svg: str) -> float | None:
    """The width an SVG document declares, in CSS pixels (None if it declares none)."""
    m = _SVG_SIZE.search(svg)
    return float(m.group(1)) if m else None


def _round_floats(value: Any) -> Any:
    """Floats in nested data cut to ``SIGNIFICANT_DIGITS`` (a smaller spec, the same chart)."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if math.isfinite(value) else value
    if isinstance(value, list):
        return [_round_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _round_floats(v) for k, v in value.items()}
    return value


#: Python and numpy reprs that must never reach a reader (alt text, captions, the built pages).
REPRS = re.compile(
    r"\bnp\.[A-Za-z_]\w*\(|\bnumpy\.[A-Za-z_]\w*\(|\barray\(|<[\w.]+ object at 0x[0-9a-fA-F]+>"
    r"|\bTimestamp\(|\bdtype[=(]"
    r"|[\[(,=]\s*(?:None|True|False)\s*[\]),]|(?<=[a-z,:=] )(?:None|True|False)\b"
)


def plain(value: Any) -> str:
    """A value as a reader should see it: numbers as numbers (``2``, ``0.25``, never
    ``np.int64(2)``), text as it is, lists joined with ", ", None as ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value)
    item = getattr(value, "item", None)  # numpy scalars
    number = item() if callable(item) and getattr(value, "ndim", 0) == 0 else value
    if isinstance(number, bool):
        return "yes" if number else "no"
    if isinstance(number, int):
        return str(number)
    if isinstance(number, float):
        if math.isfinite(number) and number.is_integer() and abs(number) < 1e15:
            return str(int(number))
        return format(number, f".{SIGNIFICANT_DIGITS}g")
    return str(number)


def repr_problems(text: str, where: str) -> list[str]:
    """Sentences naming each Python or numpy repr (:data:`REPRS`) in ``text``, read at ``where``."""
    return [
        f"{where} shows a Python/numpy repr {m.group(0).strip()!r} in "
        f"{text[max(0, m.start() - 40) : m.end() + 20]!r}: format the value as a plain number "
        "(display.plain, or an f-string format such as :.3f)"
        for m in REPRS.finditer(text or "")
    ]


def _describe(spec: dict) -> str:
    """A fallback alt text from the chart's title and axis titles (values as plain text)."""

    def text(t):
        if isinstance(t, dict):
            t = t.get("text")
        return " ".join(plain(x) for x in t) if isinstance(t, list) else plain(t)

    title = text(spec.get("title"))
    axes = []

    def walk(node):
        if not isinstance(node, dict):
            return
        enc = node.get("encoding") or {}
        for ch in ("x", "y"):
            c = enc.get(ch)
            if isinstance(c, dict):
                axis = c.get("axis") if isinstance(c.get("axis"), dict) else {}
                t = text(c.get("title") or axis.get("title") or c.get("field"))
                if t and t not in axes:
                    axes.append(t)
        for key in ("layer", "hconcat", "vconcat", "concat"):
            for child in node.get(key) or []:
                walk(child)
        walk(node.get("spec"))

    walk(spec)
    parts = [f"Chart: {title}" if title else "Chart"]
    if len(axes) >= 2:
        parts.append(f"{axes[1]} against {axes[0]}")
    elif axes:
        parts.append(f"by {axes[0]}")
    return ". ".join(parts) + "."


def _wrapped(spec: dict, columns: int) -> dict | None:
    """The spec laid out with at most ``columns`` panels per row; None if it cannot wrap."""
    spec = dict(spec)
    if "hconcat" in spec:
        spec["concat"] = spec.pop("hconcat")
        spec["columns"] = columns
        return spec
    if "concat" in spec or ("facet" in spec and "spec" in spec and "row" not in spec.get("facet", {})):
        if "column" in spec.get("facet", {}):
            return None
        spec["columns"] = columns
        return spec
    return None


def _panels(spec: dict) -> int:
    if "hconcat" in spec:
        return len(spec["hconcat"])
    if "concat" in spec:
        return min(len(spec["concat"]), spec.get("columns") or len(spec["concat"]))
    return spec.get("columns") or 0


def chart_spec(chart: Any, *, alt: str | None = None, fit: bool = True) -> tuple[dict, str]:
    """The spec ``show`` embeds, and its static SVG.

    Floats in the inline data are cut to ``SIGNIFICANT_DIGITS``; the alt text becomes the
    spec's ``description`` (Vega's ARIA label); marks without a tooltip encoding show their
    encoded fields on hover; with ``fit``, a chart wider than ``FIT_WIDTH`` is re-laid out
    with fewer panels per row until it fits (or cannot wrap further).
    """
    spec = _round_floats(_spec(chart))
    spec["description"] = alt or _describe(spec)
    mark_config = spec.setdefault("config", {}).setdefault("mark", {})
    mark_config.setdefault("tooltip", {"content": "encoding"})
    svg = to_svg(spec)
    width = svg_width(svg) or 0.0
    columns = _panels(spec)
    while fit and width > FIT_WIDTH and columns > 1:
        columns -= 1
        wrapped = _wrapped(spec, columns)
        if wrapped is None:
            break
        spec, svg = wrapped, to_svg(wrapped)
        width = svg_width(svg) or 0.0
    return spec, svg
