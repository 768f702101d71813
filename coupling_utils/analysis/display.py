"""Show Altair charts as static pictures, so that notebooks and the book render them offline.

Altair's default notebook renderer emits HTML that loads vega/vega-lite/vega-embed from a
CDN: opened from disk without a network, such a chart is blank. Rendering the chart with
vl-convert (a self-contained Vega engine) stores the picture itself in the notebook output,
which the book then serves as a plain image: SVG (sharp at any zoom), or PNG at twice the
resolution for charts with so many marks that their SVG would be large (grids of heatmap
tiles: about 1.5 MB of SVG against a few hundred kB of PNG).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["to_svg", "to_png", "show", "svg_mimebundle", "use_static_charts", "MAX_SVG_BYTES"]

RENDERER_NAME = "coupling_svg"
MAX_SVG_BYTES = 400_000  # larger charts are shown as PNG


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


def show(chart: Any, *, max_svg_bytes: int = MAX_SVG_BYTES) -> None:
    """Display the chart as an inline picture stored in the notebook's output.

    SVG, unless its text exceeds ``max_svg_bytes``: then PNG at twice the resolution, shown at
    the chart's own size. Returns None, so ``show(chart)`` as a cell's last line displays the
    chart once.
    """
    from IPython.display import SVG, Image, display

    spec = _spec(chart)
    svg = to_svg(spec)
    if len(svg.encode()) <= max_svg_bytes:
        display(SVG(data=svg))
        return
    scale = 2.0
    png = to_png(spec, scale=scale)
    width = int.from_bytes(png[16:20], "big")  # the IHDR width, in device pixels
    display(Image(data=png, format="png", width=int(width / scale)))


def svg_mimebundle(spec: dict, **metadata: Any) -> dict:
    """Altair renderer: the MIME bundle of a Vega-Lite spec drawn as SVG."""
    return {"image/svg+xml": to_svg(spec), "text/plain": "<static Altair chart (SVG)>"}


def use_static_charts() -> None:
    """Make Altair display every chart (a cell's bare ``chart``) as static SVG too."""
    import altair as alt

    if RENDERER_NAME not in alt.renderers.names():
        alt.renderers.register(RENDERER_NAME, svg_mimebundle)
    alt.renderers.enable(RENDERER_NAME)
