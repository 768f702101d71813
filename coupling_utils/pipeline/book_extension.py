"""The book's Sphinx extension: live charts, numbered chart figures, chapter downloads, narrow tables.

``_config.yml`` lists it in ``sphinx.config.extensions``. It

- writes the chart runtime, Vega-Embed with Vega and Vega-Lite (``vl_convert.javascript_bundle``)
  plus ``book_static/charts.js``, once per build to ``_static/coupling/charts.js``, and loads it
  only on the pages that have charts (never from another host); writes ``book_static/book.css``
  to ``_static/coupling/book.css`` for every page (charts at natural width, wrapping tables,
  one search box, the download box);
- turns each chart output of :func:`coupling_utils.analysis.display.show` into a figure: the
  live view, the static picture as an image file (for print and readers without JavaScript)
  and, when the notebook gave one, a numbered MyST caption with a ``{numref}`` label. This part
  runs inside myst-nb as a MIME render plugin (:class:`ChartFigures`, registered under the
  ``myst_nb.mime_renderers`` entry point in ``pyproject.toml``), because only myst-nb's parser
  can turn a caption into nodes early enough for Sphinx to number the figure;
- adds the directives ``chapter-links`` (the chapter's downloads and links, written into each
  staged notebook by :func:`coupling_utils.pipeline.book.stage_book`), ``tidy-table`` (a CSV
  as a narrow table: the columns that hold one value on every row are said once, above it) and
  ``chart-figure`` (a chart saved by the build, such as the intro page's reproduction summary,
  as a live, numbered figure in a prose page);
- makes the theme's "edit this page" link point at the Markdown source: the repository holds
  every page, notebooks included, as ``.md`` (jupytext), while the book renders executed
  ``.ipynb`` copies.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

__all__ = ["setup", "ChartFigures", "chart_runtime", "ChapterLinks", "TidyTable", "ChartFigure"]

STATIC = Path(__file__).resolve().parent / "book_static"
RUNTIME = "coupling/charts.js"  # under _static/
STYLESHEET = "coupling/book.css"


def chart_runtime() -> str:
    """Vega-Embed, Vega and Vega-Lite bundled with the book's chart code (one classic script)."""
    import vl_convert as vlc

    from coupling_utils.analysis.rendering import _vegalite_version

    snippet = (STATIC / "charts.js").read_text(encoding="utf-8")
    version = _vegalite_version()
    bundle = vlc.javascript_bundle(snippet, vl_version=f"v{version}" if version else None)
    # one function scope: the bundle's top-level names (such as `_`) must not clash with the
    # page's other classic scripts (Sphinx's own define `_`)
    return "(function () {\n" + bundle + "\n})();\n"


def _write_assets(app) -> None:
    if getattr(app.builder, "format", "") != "html":
        return
    target = Path(app.outdir) / "_static" / "coupling"
    target.mkdir(parents=True, exist_ok=True)
    (target / Path(STYLESHEET).name).write_text((STATIC / "book.css").read_text(encoding="utf-8"), "utf-8")
    (target / Path(RUNTIME).name).write_text(chart_runtime(), encoding="utf-8")


def _page_context(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    if 'class="coupling-chart-spec"' in (context.get("body") or ""):
        app.add_js_file(RUNTIME, defer="defer")  # this page only (Sphinx >= 3.5)
    if context.get("page_source_suffix"):
        context["page_source_suffix"] = ".md"  # the repository's source of every page


# --------------------------------------------------------------------------- chart figures
class ChartFigures:
    """myst-nb MIME render plugin: a ``display.show`` chart output becomes a (captioned) figure.

    Handles ``text/html`` outputs whose metadata holds ``coupling_utils.chart``; every other
    output is left to myst-nb (returns None).
    """

    mime_priority_overrides: tuple = ()

    @staticmethod
    def handle_mime(renderer, data, inline: bool):
        from coupling_utils.analysis.display import METADATA_KEY, chart_parts

        if inline or data.mime_type != "text/html":
            return None
        chart = ((data.output_metadata or {}).get(METADATA_KEY) or {}).get("chart")
        if not isinstance(chart, dict):
            return None
        from myst_nb.core.render import MimeData, create_figure_context

        parts = chart_parts(data.string)
        live = nodes.raw("", parts.live, format="html")
        static_meta = (
            {parts.mime: {"width": parts.width}} if parts.mime == "image/png" and parts.width else {}
        )
        image = renderer.render_image(
            MimeData(
                parts.mime,
                parts.content,
                cell_metadata=data.cell_metadata,
                output_metadata=static_meta,
                cell_index=data.cell_index,
                output_index=data.output_index,
                line=data.line,
            )
        )[0]
        image["alt"] = parts.alt
        image["classes"] = [*image.get("classes", []), "coupling-chart-static"]
        image["loading"] = "lazy"  # hidden behind a drawn live view, it is never fetched
        caption, name = chart.get("caption"), chart.get("name")
        if not caption:
            return [nodes.container("", live, image, classes=["coupling-chart"])]
        options = {"caption": caption, "classes": "coupling-chart"}
        if name:
            options["name"] = name
        md = renderer.renderer
        with create_figure_context(md, options, data.line or 0):
            md.current_node.extend([live, image])
        return []


# --------------------------------------------------------------------------- directives
def _links(items: list[tuple[str, str, bool]]) -> str:
    return " · ".join(
        f'<a href="{html.escape(url)}"{" download" if download else ""}>{html.escape(text)}</a>'
        for text, url, download in items
    )


class ChapterLinks(SphinxDirective):
    """The chapter's download and link box (written by ``stage_book`` under each chapter title).

    Options: ``notebook`` (the executed .ipynb, relative to the page), ``tables`` (CSV files,
    one per line or space-separated), ``kit`` (the lab kit zip, relative to the page),
    ``colab`` and ``source`` (absolute URLs, when the book has a public repository).
    """

    has_content = False
    option_spec = {
        "notebook": directives.unchanged_required,
        "tables": directives.unchanged,
        "kit": directives.unchanged,
        "colab": directives.uri,
        "source": directives.uri,
    }

    def run(self):
        notebook = self.options.get("notebook")
        if not notebook:
            raise self.error("chapter-links needs :notebook: (the executed .ipynb, relative to the page)")
        tables = (self.options.get("tables") or "").split()
        lines = [
            "<strong>Download</strong>: "
            + _links([("executed notebook (.ipynb)", notebook, True)])
            + (
                " · result tables (CSV): " + _links([(Path(t).stem, t, True) for t in tables])
                if tables
                else ""
            )
            + (
                " · " + _links([("lab kit (all chapters, to run offline, .zip)", self.options["kit"], True)])
                if self.options.get("kit")
                else ""
            )
        ]
        online = []
        if self.options.get("colab"):
            online.append(("Open in Colab", self.options["colab"], False))
        if self.options.get("source"):
            online.append(("source of this chapter", self.options["source"], False))
        if online:
            lines.append(_links(online))
        body = "".join(f"<p>{line}</p>" for line in lines)
        return [nodes.raw("", f'<div class="chapter-links">{body}</div>', format="html")]


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["tidy-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    row = nodes.row()
    for text in header:
        row += nodes.entry("", nodes.paragraph(text=text))
    head += row
    for values in rows:
        row = nodes.row()
        for text in values:
            row += nodes.entry("", nodes.paragraph(text=text))
        body += row
    return table


class TidyTable(SphinxDirective):
    """A CSV file as a narrow table: ``{tidy-table} path/to.csv`` (relative to the page).

    The columns that hold the same value on every row (machine, versions, date, command; or
    those named in ``:once:``) are said once, in a line above the table; ``:columns:``
    (comma-separated) chooses and orders the table's columns (default: all the others); the
    remaining columns are named below it, with a link to download the whole CSV. A CSV of one
    row is shown as a two-column table (column, value). ``:missing:`` (text): a CSV that may
    not exist yet (made only on some machines) is then said to be missing in that text,
    instead of failing the build.
    """

    required_arguments = 1
    has_content = False
    option_spec = {
        "columns": directives.unchanged,
        "once": directives.unchanged,
        "missing": directives.unchanged,
    }

    def _names(self, option: str, df) -> list[str]:
        names = [c.strip() for c in (self.options.get(option) or "").split(",") if c.strip()]
        unknown = [c for c in names if c not in df.columns]
        if unknown:
            raise self.error(
                f"tidy-table: {self.arguments[0]} has no column(s) {unknown} (:{option}:); "
                f"it has {list(df.columns)}"
            )
        return names

    def run(self):
        import pandas as pd
        from sphinx import addnodes

        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        if not Path(path).is_file():
            if self.options.get("missing"):
                return [nodes.paragraph(text=self.options["missing"], classes=["tidy-table-missing"])]
            raise self.error(f"tidy-table: no CSV file at {self.arguments[0]} (looked for {path})")
        self.env.note_dependency(rel)
        df = pd.read_csv(path)
        if df.empty:
            raise self.error(f"tidy-table: {self.arguments[0]} has no rows")
        once = self._names("once", df)
        varying = [c for c in once if df[c].nunique(dropna=False) > 1]
        if varying:
            raise self.error(
                f"tidy-table: :once: columns {varying} differ between rows of {self.arguments[0]}"
            )
        if len(df) > 1:
            once += [c for c in df.columns if c not in once and df[c].nunique(dropna=False) == 1]
        shown = self._names("columns", df) or [c for c in df.columns if c not in once]
        rest = [c for c in df.columns if c not in shown and c not in once]
        out: list[nodes.Node] = []
        if once:
            para = nodes.paragraph(classes=["tidy-table-constants"])
            para += nodes.strong(text="Same on every row: " if len(df) > 1 else "Measured with: ")
            for k, c in enumerate(once):
                if k:
                    para += nodes.Text("; ")
                para += nodes.Text(f"{c.replace('_', ' ')} ")
                para += nodes.literal(text=_cell(df[c].iloc[0]))
            out.append(para)
        if len(df) == 1:
            out.append(
                _table(["column", "value"], [[c.replace("_", " "), _cell(df[c].iloc[0])] for c in shown])
            )
        else:
            rows = [[_cell(v) for v in record] for record in df[shown].itertuples(index=False)]
            out.append(_table([c.replace("_", " ") for c in shown], rows))
        para = nodes.paragraph(classes=["tidy-table-constants"])
        if rest:
            para += nodes.Text(f"More columns in the CSV ({', '.join(c.replace('_', ' ') for c in rest)}): ")
        else:
            para += nodes.Text("The CSV: ")
        para += addnodes.download_reference(
            "", "", nodes.literal(text=Path(path).name), reftarget=self.arguments[0], refdoc=self.env.docname
        )
        out.append(para)
        return out


class ChartFigure(SphinxDirective):
    """A saved chart as a numbered figure in a prose page: ``{chart-figure} path.html``.

    The argument (relative to the page) is the ``text/html`` of a
    :func:`coupling_utils.analysis.display.chart_bundle`; the content is the caption (MyST);
    ``:name:`` labels it for ``{numref}``. The figure holds the live view (drawn by the chart
    runtime, like a notebook's charts) and the static picture for print.
    """

    required_arguments = 1
    has_content = True
    option_spec = {"name": directives.unchanged}

    def run(self):
        import base64

        from coupling_utils.analysis.display import chart_parts

        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        if not Path(path).is_file():
            raise self.error(f"chart-figure: no chart file at {self.arguments[0]} (looked for {path})")
        if not self.content:
            raise self.error("chart-figure needs a caption (the directive's content)")
        self.env.note_dependency(rel)
        parts = chart_parts(Path(path).read_text(encoding="utf-8"))
        data = parts.content  # PNG: base64 already; SVG: text
        if parts.mime == "image/svg+xml":
            data = base64.b64encode(data.encode()).decode()
        image = nodes.image(
            uri=f"data:{parts.mime};base64,{data}",
            alt=parts.alt,
            classes=["coupling-chart-static"],
            loading="lazy",
        )
        if parts.width:
            image["width"] = f"{parts.width}px"
        holder = nodes.container()
        self.state.nested_parse(self.content, self.content_offset, holder)
        first = holder.children[0] if holder.children else None
        if not isinstance(first, nodes.paragraph):
            raise self.error("chart-figure: the caption must be a paragraph of text")
        figure = nodes.figure("", classes=["coupling-chart"])
        figure += nodes.raw("", parts.live, format="html")
        figure += image
        figure += nodes.caption(first.rawsource, "", *first.children)
        if len(holder.children) > 1:
            figure += nodes.legend("", *holder.children[1:])
        self.add_name(figure)
        return [figure]


def _single_page_handlers(app) -> None:
    """The printable edition (the ``singlehtml`` builder) renders every node the HTML book does.

    Sphinx uses the handlers registered for a builder's name instead of its format's once any
    extension registers one for that name (sphinx-design does for ``singlehtml``), so the nodes
    registered for ``html`` only (myst-nb's hidden code cells) would have none.
    """
    handlers = app.registry.translation_handlers
    if app.builder.name == "singlehtml" and "singlehtml" in handlers:
        for name, pair in handlers.get("html", {}).items():
            handlers["singlehtml"].setdefault(name, pair)


def setup(app) -> dict:
    app.connect("builder-inited", _single_page_handlers)
    app.connect("builder-inited", _write_assets)
    app.connect("html-page-context", _page_context, priority=400)  # before the theme's buttons
    app.add_css_file(STYLESHEET)
    app.add_directive("chapter-links", ChapterLinks)
    app.add_directive("tidy-table", TidyTable)
    app.add_directive("chart-figure", ChartFigure)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
