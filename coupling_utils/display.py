"""Show Altair charts as static SVG, so that notebooks and the book render them offline.

Altair's default notebook renderer emits HTML that loads vega/vega-lite/vega-embed from a
CDN: opened from disk without a network, such a chart is blank. Rendering the chart to SVG
with vl-convert (a self-contained Vega engine) stores the picture itself in the notebook
output, which the book then serves as a plain image.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["to_svg", "show", "svg_mimebundle", "use_static_charts"]

RENDERER_NAME = "coupling_svg"


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


def show(chart: Any) -> None:
    """Display the chart as an inline SVG picture (stored in the notebook's output).

    Returns None, so ``show(chart)`` as a cell's last line displays the chart once.
    """
    from IPython.display import SVG, display

    display(SVG(data=to_svg(chart)))


def svg_mimebundle(spec: dict, **metadata: Any) -> dict:
    """Altair renderer: the MIME bundle of a Vega-Lite spec drawn as SVG."""
    return {"image/svg+xml": to_svg(spec), "text/plain": "<static Altair chart (SVG)>"}


def use_static_charts() -> None:
    """Make Altair display every chart (a cell's bare ``chart``) as static SVG too."""
    import altair as alt

    if RENDERER_NAME not in alt.renderers.names():
        alt.renderers.register(RENDERER_NAME, svg_mimebundle)
    alt.renderers.enable(RENDERER_NAME)
