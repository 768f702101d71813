"""Charts and tables in notebooks and in the book: live, offline, captioned, downloadable.

How a notebook shows a chart (``plots`` builders or any Altair chart)::

    show(chart)                                            # a live chart, no caption
    show(chart, name="fig-f02-family",                     # a numbered figure ...
         caption="Coupling against held-out accuracy: the larger runs sit higher.",
         alt="Scatter of six runs: coupling 0.91 to 0.95 on x, accuracy on y, rising.")

and refers to it from the prose with ``{numref}`Fig. %s <fig-f02-family>``` (or
``{numref}`fig-f02-family```). The caption is MyST markdown (math, ``{term}``, ``{cite}``,
``{glue:text}`` work); ``name`` needs a caption (Sphinx numbers only captioned figures), is
unique in the book and reads ``fig-<chapter>-<what>``. ``alt`` describes what the figure
shows for readers who cannot see it (not its file name); without one a description is made
from the chart's title and axes, which is better than nothing but says nothing about the
finding. A caption or alt text that places panels ("trained (top)") writes the positions with
``layout.where`` / ``layout.position``, which read the figure as ``show`` lays it out; ``show``
refuses positional words the figure contradicts and Python/numpy reprs (``np.float64(...)``) in
a caption or alt text: numbers are written as numbers (:func:`plain`).

How a notebook shows a table that readers can download::

    show_table(per_prompt, "per_prompt", caption="Coupling per member and prompt")

displays the table (text wraps; long tables show their first ``max_rows`` rows) and stores the
whole table as CSV in the output; the book build writes it to ``notebooks/<chapter>/<name>.csv``
and lists it, with the executed notebook, in the chapter's download box. Use it for the tidy
result tables a reader would want to reanalyse; ``name`` is the file name (letters, digits,
``-`` and ``_``), unique within the chapter.

What ``show`` emits is one output whose MIME bundle holds

- ``text/html``: the Vega-Lite spec (data inline) in a ``<script type="application/json">``,
  an empty element the book's chart runtime (Vega-Embed, served by the book itself) draws the
  live view into, and the static picture as a ``data:`` image that stays on screen where no
  runtime runs (Jupyter, Colab, a reader without JavaScript) and in print;
- ``image/svg+xml`` (or ``image/png`` at twice the resolution for charts whose SVG would exceed
  ``MAX_SVG_BYTES``): the same picture for frontends that do not render HTML;
- ``text/plain``: the alt text;

with ``{"coupling_utils": {"chart": {"name", "caption", "alt"}}}`` as output metadata. The
book's Sphinx extension (``coupling_utils.pipeline.book_extension``) turns such an output into a
numbered figure with a caption, the static picture written as an image file, and loads the chart
runtime on the pages that have charts. Charts wider than the book's column (``FIT_WIDTH``) are
wrapped (side-by-side charts become rows; facets get fewer columns), never shrunk.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from coupling_utils.analysis.layout import caption_problems
from coupling_utils.analysis.rendering import (
    FIT_WIDTH,
    REPRS,
    chart_spec,
    plain,
    repr_problems,
    svg_width,
    to_png,
    to_svg,
)

__all__ = [
    "glue_all",
    "FIT_WIDTH",
    "MAX_SVG_BYTES",
    "METADATA_KEY",
    "to_svg",
    "to_png",
    "chart_spec",
    "chart_bundle",
    "show",
    "table_bundle",
    "show_table",
    "use_book_charts",
    "ChartParts",
    "chart_parts",
    "REPRS",
    "plain",
    "repr_problems",
]

RENDERER_NAME = "coupling_book"
MAX_SVG_BYTES = 400_000  # larger charts get a PNG as their static picture (and a canvas live view)
METADATA_KEY = "coupling_utils"  # output metadata: {"chart": {...}} or {"table": {...}}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: every ``<`` escaped, so nothing can close it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _check_figure(name: str | None, caption: str | None) -> None:
    if name is not None and not (isinstance(name, str) and _NAME.match(name)):
        raise ValueError(
            f"figure name must start with a letter and hold only letters, digits, '-' and '_' "
            f"(e.g. 'fig-f02-family'), got {name!r}"
        )
    if name and not caption:
        raise ValueError(
            f"figure {name!r} has a name but no caption: Sphinx numbers (and {{numref}} finds) "
            "only captioned figures; pass caption='what to see in it'"
        )
    if caption is not None and not (isinstance(caption, str) and caption.strip()):
        raise ValueError("caption must be non-empty text (MyST markdown)")


def _check_text(spec: dict, caption: str | None, name: str | None) -> None:
    """Refuse alt text or a caption with Python/numpy reprs, and a caption whose positional
    words contradict the figure as shown (``layout.caption_problems``)."""
    problems = repr_problems(spec["description"], "the alt text")
    problems += repr_problems(caption or "", "the caption")
    problems += [f"the caption: {p}" for p in caption_problems(caption or "", spec)]
    if problems:
        raise ValueError(f"figure {name or '(unnamed)'}: " + "; ".join(problems))


def chart_bundle(
    chart: Any,
    *,
    caption: str | None = None,
    alt: str | None = None,
    name: str | None = None,
    max_svg_bytes: int = MAX_SVG_BYTES,
    fit: bool = True,
) -> tuple[dict, dict]:
    """The (MIME bundle, output metadata) that :func:`show` displays (see the module docstring)."""
    _check_figure(name, caption)
    spec, svg = chart_spec(chart, alt=alt, fit=fit)
    alt_text = spec["description"]
    _check_text(spec, caption, name)
    metadata: dict = {}
    if len(svg.encode()) <= max_svg_bytes:
        static_mime, renderer = "image/svg+xml", "svg"
        static = svg
        src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
        declared = svg_width(svg)
        width = round(declared) if declared is not None else None
    else:
        static_mime, renderer = "image/png", "canvas"
        scale = 2.0
        png = to_png(spec, scale=scale)
        width = int(int.from_bytes(png[16:20], "big") / scale)  # the IHDR width, in device pixels
        static = base64.b64encode(png).decode()
        src = f"data:image/png;base64,{static}"
        metadata["image/png"] = {"width": width}
    size = f' width="{width}"' if width else ""
    page = (
        '<div class="coupling-chart">'
        '<div class="coupling-chart-view"></div>'
        f'<script type="application/json" class="coupling-chart-spec" data-renderer="{renderer}">'
        f"{_json_for_script(spec)}</script>"
        f'<img class="coupling-chart-static" alt="{html.escape(alt_text)}"{size} src="{src}">'
        "</div>"
    )
    bundle = {"text/html": page, static_mime: static, "text/plain": alt_text}
    metadata[METADATA_KEY] = {"chart": {"name": name, "caption": caption, "alt": alt_text}}
    return bundle, metadata


def show(
    chart: Any,
    *,
    caption: str | None = None,
    alt: str | None = None,
    name: str | None = None,
    max_svg_bytes: int = MAX_SVG_BYTES,
    fit: bool = True,
) -> None:
    """Display the chart: a live view in the book, a static picture in Jupyter, Colab and print.

    ``caption`` (MyST markdown) makes it a numbered figure in the book; ``name`` (needs a
    caption) is its label for ``{numref}``; ``alt`` describes it for readers who cannot see it.
    Returns None, so ``show(chart)`` as a cell's last line displays the chart once.
    """
    from IPython.display import display

    bundle, metadata = chart_bundle(
        chart, caption=caption, alt=alt, name=name, max_svg_bytes=max_svg_bytes, fit=fit
    )
    display(bundle, raw=True, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class ChartParts:
    """A chart output's HTML split for the book: the live part and the static picture."""

    live: str  # the view element and the spec script
    mime: str  # "image/svg+xml" or "image/png"
    content: str  # SVG text, or PNG as base64 (as notebooks store images)
    alt: str
    width: int | None


_CHART_HTML = re.compile(
    r'^<div class="coupling-chart">(?P<live>.*?)'
    r'<img class="coupling-chart-static" alt="(?P<alt>[^"]*)"(?: width="(?P<width>\d+)")? '
    r'src="data:(?P<mime>image/svg\+xml|image/png);base64,(?P<data>[A-Za-z0-9+/=]*)"></div>$',
    re.DOTALL,
)


def chart_parts(page: str) -> ChartParts:
    """Split the ``text/html`` of a :func:`chart_bundle` into its live part and static picture."""
    m = _CHART_HTML.match(page.strip())
    if m is None:
        raise ValueError(
            "not the HTML of a coupling_utils chart output (made by display.show); "
            "rerun the notebook with this version of coupling_utils"
        )
    data = m.group("data")
    content = base64.b64decode(data).decode() if m.group("mime") == "image/svg+xml" else data
    width = int(m.group("width")) if m.group("width") else None
    return ChartParts(m.group("live"), m.group("mime"), content, html.unescape(m.group("alt")), width)


def _cell_text(value: Any) -> Any:
    """Table cell text with line breaks shown as ↵ (never a literal backslash-n), and a number to
    four significant digits ("0.08599", "7.653e-07"; a whole number whole: "143000"), where pandas
    would print six decimals, or switch a whole column to "8.507584e-01" for one small value in it.
    The CSV download keeps every digit."""
    if isinstance(value, str):
        return re.sub(r"\s*\n\s*", " ↵ ", value.strip())
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return f"{value:.0f}" if value == round(value) and abs(value) < 1e15 else f"{value:.4g}"
    return value


def table_bundle(
    df,
    name: str | None = None,
    *,
    caption: str | None = None,
    max_rows: int = 30,
    index: bool = False,
    titles: bool = True,
) -> tuple[dict, dict]:
    """The (MIME bundle, output metadata) that :func:`show_table` displays."""
    import pandas as pd

    from coupling_utils.analysis.plots import title_of

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"show_table expects a pandas DataFrame, got {type(df).__name__}")
    if name is not None and not (isinstance(name, str) and _NAME.match(name)):
        raise ValueError(
            f"table name is its file name: letters, digits, '-' and '_', starting with a letter "
            f"(e.g. 'per_prompt'), got {name!r}"
        )
    if not (isinstance(max_rows, int) and max_rows >= 1):
        raise ValueError(f"max_rows must be a positive integer, got {max_rows!r}")
    shown = df.head(max_rows)
    shown = shown.apply(lambda col: col.map(_cell_text)) if len(shown.columns) else shown
    if titles:
        shown = shown.rename(columns=lambda c: title_of(c) if isinstance(c, str) else c)
    table = shown.to_html(index=index, border=0, classes=["coupling-table"], na_rep="", escape=True)
    notes = []
    if caption:
        notes.append(f'<p class="coupling-table-caption">{html.escape(caption)}</p>')
    more = (
        f'<p class="coupling-table-note">First {max_rows} of {len(df)} rows'
        + (f"; the CSV download <code>{name}.csv</code> has all of them" if name else "")
        + ".</p>"
        if len(df) > max_rows
        else ""
    )
    page = '<div class="coupling-table-wrap">' + "".join(notes) + table + more + "</div>"
    text = df.to_string(max_rows=max_rows, index=index)
    metadata = {}
    if name:
        metadata[METADATA_KEY] = {"table": {"name": name, "rows": len(df), "csv": df.to_csv(index=index)}}
    return {"text/html": page, "text/plain": text}, metadata


def show_table(
    df,
    name: str | None = None,
    *,
    caption: str | None = None,
    max_rows: int = 30,
    index: bool = False,
    titles: bool = True,
) -> None:
    """Display a table whose text wraps, and offer it as ``<name>.csv`` in the book.

    Shows the first ``max_rows`` rows (line breaks in text as ↵; column names as human titles
    with ``titles``); with a ``name`` the whole table goes into the output as CSV, which the
    book build writes to ``notebooks/<chapter>/<name>.csv`` for download. Returns None.
    """
    from IPython.display import display

    bundle, metadata = table_bundle(df, name, caption=caption, max_rows=max_rows, index=index, titles=titles)
    display(bundle, raw=True, metadata=metadata)


def _renderer(spec: dict, **_: Any) -> tuple[dict, dict]:
    return chart_bundle(spec)


def use_book_charts() -> None:
    """Make a cell's bare ``chart`` display as :func:`show` does (live in the book, static elsewhere)."""
    import altair as alt

    if RENDERER_NAME not in alt.renderers.names():
        alt.renderers.register(RENDERER_NAME, _renderer)
    alt.renderers.enable(RENDERER_NAME)


def glue_all(values: Mapping[str, Any]) -> None:
    """Glue every ``{name: value}`` for the prose (``{glue:text}`name```), not displayed: a
    chapter's glue values, computed in its module, in one call from its notebook."""
    from myst_nb import glue

    for name, value in values.items():
        glue(name, value, display=False)
