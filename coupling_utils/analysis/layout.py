"""Where each panel of a chart is, as the book shows it: so that a caption's "left" is true.

A figure's panels are laid out by its Vega-Lite spec *after* :func:`rendering.chart_spec` has
wrapped it to the book's column (side-by-side charts become rows, facets get fewer columns), and
facet panels come in the facet's sort order (ascending by default), not in the order a caption
writer may assume. :func:`spec_panels` reads a final spec and returns its panels in reading order
with their position words; :func:`where` writes a panel's name with its position for a caption::

    chart = f01.token_chart(results)
    show(chart, caption=f"... {where(chart, 'trained')} against {where(chart, 'random init')}.")
    # -> "... trained (top) against random init (bottom)." when show stacks the two panels

:func:`caption_problems` checks a caption (or alt text) against a final spec: every position in
parentheses ("(left)", "(top row)", "(bottom-right, ...)") places the panel(s) named last before
it, by a word of their titles that other panels' titles lack ("trained", "excess"), and must be
where they are; "side by side" and "stacked" must describe the layout; loose phrases such as
"on the left" or "right panel" name no panel and are refused. ``display.show`` refuses a caption
it finds false, and the book build proofreads every figure of the built pages with it
(``pipeline.proofread``).

Facet panels are read from the spec's inline data (the book embeds every chart's data); a facet
sorted by another field is read as ascending, and a ``repeat`` or data from a URL as one panel.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from typing import Any

from coupling_utils.analysis.rendering import _spec, chart_spec, plain

__all__ = ["Panel", "spec_panels", "shown_panels", "position", "where", "caption_problems"]

_SIDES = {"row": ("top", "bottom"), "column": ("left", "right")}


@dataclasses.dataclass(frozen=True)
class Panel:
    """One panel of a figure: what heads it, its row and column (from 0, reading order), and the
    words that say where it is ("top", "bottom-left", ...; "" in a figure of one panel)."""

    title: str
    row: int
    column: int
    position: str


# --------------------------------------------------------------------------- reading a spec
def _plain(value: Any) -> str:
    """A facet value or title as text (numbers without numpy or float noise)."""
    return plain(value) if value is not None else "null"


def _title_text(title: Any) -> str:
    if isinstance(title, dict):
        title = title.get("text", "")
    if isinstance(title, list):
        return " ".join(plain(t) for t in title)
    return plain(title)


def _rows_of(spec: dict) -> list[dict]:
    """The inline data rows of a spec's top-level data (named dataset or values)."""
    data = spec.get("data") or {}
    if "values" in data:
        return list(data["values"])
    name = data.get("name")
    return list((spec.get("datasets") or {}).get(name, [])) if name else []


def _sorted_values(rows: list[dict], fielddef: dict) -> list:
    """A facet field's distinct values in Vega-Lite's order: ascending (the default, and for a
    null sort), descending, or the listed values first and the rest in the order of the data."""
    field = fielddef.get("field")
    seen = list(dict.fromkeys(r.get(field) for r in rows if field in r))
    sort = fielddef.get("sort", "ascending")
    if isinstance(sort, list):
        listed = [v for v in sort if v in seen]
        return listed + [v for v in seen if v not in listed]

    def key(v):
        return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))

    ordered = sorted(seen, key=key)
    return ordered[::-1] if sort == "descending" else ordered


def _grid(spec: dict) -> tuple[list[str], int | None] | None:
    """(panel titles in reading order, panels per row or None for one row); None for a spec of
    one panel."""
    for key in ("hconcat", "vconcat", "concat"):
        if key in spec:
            titles = [_title_text(child.get("title")) for child in spec[key]]
            columns = {"hconcat": None, "vconcat": 1}.get(key, spec.get("columns"))
            return titles, columns
    facet = spec.get("facet") if "spec" in spec else None
    if facet is None:
        enc = spec.get("encoding") or {}
        facet = enc.get("facet") or {k: enc[k] for k in ("row", "column") if k in enc} or None
        if facet and "field" in facet:
            spec = dict(spec, columns=facet.get("columns", spec.get("columns")))
    if not facet:
        return None
    rows = _rows_of(spec)
    if "field" in facet:  # a wrapped facet
        return [_plain(v) for v in _sorted_values(rows, facet)], spec.get("columns")
    down = _sorted_values(rows, facet["row"]) if "row" in facet else [None]
    across = _sorted_values(rows, facet["column"]) if "column" in facet else [None]
    titles = [", ".join(_plain(v) for v in (r, c) if v is not None) for r in down for c in across]
    return titles, len(across)


def _along(k: int, n: int, axis: str) -> str:
    """The word for place ``k`` of ``n`` along rows ("top" ...) or columns ("left" ...)."""
    first, last = _SIDES[axis]
    if n == 1:
        return ""
    if k == 0:
        return first
    if k == n - 1:
        return last
    if n == 3:
        return "middle"
    ordinal = {1: "st", 2: "nd", 3: "rd"}.get(k + 1 if k + 1 < 20 else (k + 1) % 10, "th")
    return f"{k + 1}{ordinal} from the {first}"


def _position(row: int, column: int, rows: int, columns: int) -> str:
    vertical, horizontal = _along(row, rows, "row"), _along(column, columns, "column")
    if not vertical or not horizontal:
        return vertical or horizontal
    if rows > 3 or columns > 3:
        return f"row {row + 1}, column {column + 1}"
    if vertical == horizontal == "middle":
        return "centre"
    return f"{vertical}-{horizontal}"


def spec_panels(spec: dict) -> list[Panel]:
    """The panels of a final Vega-Lite spec (as :func:`rendering.chart_spec` returns it) in reading
    order, each with its position words. Concatenations (``hconcat``: one row, ``vconcat``: one
    column, ``concat`` with ``columns``) and facets (wrapped with ``columns``, or ``row`` ×
    ``column``, in their sort order) have a panel per view or value; a nested composition counts
    as one panel; any other spec is one panel, headed by its title."""
    grid = _grid(spec)
    if grid is None or len(grid[0]) <= 1:
        titles = grid[0] if grid else [_title_text(spec.get("title"))]
        return [Panel(titles[0] if titles else "", 0, 0, "")]
    titles, columns = grid
    columns = min(columns or len(titles), len(titles))
    rows = math.ceil(len(titles) / columns)
    return [
        Panel(t, k // columns, k % columns, _position(k // columns, k % columns, rows, columns))
        for k, t in enumerate(titles)
    ]


@functools.lru_cache(maxsize=8)
def _final_panels(spec_json: str) -> tuple[Panel, ...]:
    return tuple(spec_panels(chart_spec(json.loads(spec_json))[0]))


def shown_panels(chart: Any) -> list[Panel]:
    """The panels of ``chart`` as ``display.show`` lays it out (wrapped to the book's column)."""
    return list(_final_panels(json.dumps(_spec(chart), sort_keys=True, default=str)))


# --------------------------------------------------------------------------- naming panels
def _norm(text: str) -> str:
    return re.sub(r"[\s\-‐–]+", " ", text).strip().casefold()


def _members(found: list[Panel], name: str) -> list[Panel]:
    """The panels a name stands for: the panel with that title, or those whose title starts with
    it before a comma (``"trained"`` for ``"trained, K = 4"`` and ``"trained, K = 8"``)."""
    key = _norm(name)
    exact = [p for p in found if _norm(p.title) == key]
    return exact or [p for p in found if _norm(p.title.split(",")[0]) == key]


def _group_position(found: list[Panel], group: list[Panel]) -> str:
    """Where a group of panels is: one panel's position, a whole row ("top row") or column
    ("left column") of a grid of several, whole rows or columns side by side ("rows 1–2"), or the
    positions of its panels joined by "and"."""
    if len(group) == 1:
        return group[0].position
    for axis in ("row", "column"):
        lines = {getattr(p, axis) for p in group}
        count = max(getattr(p, axis) for p in found) + 1
        line = next(iter(lines))
        if len(lines) == 1 and count > 1 and all(p in group for p in found if getattr(p, axis) == line):
            return f"{_along(line, count, axis)} {axis}"
    for axis, other in (("row", "column"), ("column", "row")):  # whole rows side by side: "rows 1–2"
        lines = sorted({getattr(p, axis) for p in group})
        whole = all(p in group for p in found if getattr(p, axis) in lines)
        across = len({getattr(p, other) for p in found}) > 1  # a line of one panel is that panel
        if whole and across and lines[-1] - lines[0] == len(lines) - 1:
            return f"{axis}s {lines[0] + 1}–{lines[-1] + 1}"
    return " and ".join(p.position for p in group)


def _named(found: list[Panel], name: str) -> list[Panel]:
    group = _members(found, name)
    if not group:
        raise ValueError(
            f"no panel of this chart is headed {name!r}; its panels are "
            f"{[p.title for p in found]}: name one of them (or the part of a title before its comma)"
        )
    return group


def position(chart: Any, name: str) -> str:
    """Where the panel(s) headed ``name`` are as the book shows ``chart``: ``"bottom"``,
    ``"top row"`` (every panel headed ``"name, ..."``), ``"top-left and bottom-left"``. Raises
    ValueError when no panel is headed ``name``, or the figure has one panel (no position)."""
    found = shown_panels(chart)
    if len(found) == 1:
        raise ValueError("a figure of one panel has no positions: leave the positional words out")
    return _group_position(found, _named(found, name))


def where(chart: Any, name: str) -> str:
    """``name`` with its position as the book shows ``chart``: ``"trained (bottom)"``,
    ``"trained (top row)"`` for every panel headed ``"trained, ..."``; just ``name`` in a figure
    of one panel. Raises ValueError naming the panels when none is headed ``name``."""
    found = shown_panels(chart)
    group = _named(found, name)
    return f"{name} ({_group_position(found, group)})" if len(found) > 1 else name


# --------------------------------------------------------------------------- checking a caption
_WORD = r"(?:top|bottom|middle|upper|lower)(?:-(?:left|right|middle))?|left|right|centre|center|above|below"
_ONE = (
    r"row \d+, column \d+|(?:row|column)s \d+–\d+|\d+(?:st|nd|rd|th) from the (?:left|right|top|bottom)|"
    rf"(?:{_WORD})(?: (?:row|column|panel)s?)?"
)
# a position in parentheses, first or after a comma: "(left)", "(top row, ...)", "(trained, left)"
CLAIM = re.compile(
    rf"\((?:[^()]*?[,;]\s*)?(?P<pos>(?:{_ONE})(?: and (?:{_ONE}))*)(?=\s*[),;])", re.IGNORECASE
)
LOOSE = re.compile(
    r"\b(?:on|at|in) the (?:left|right|top|bottom)\b|\b(?:top|bottom|left|right)\s*:|"
    r"\b(?:left|right|top|bottom|upper|lower)(?:-hand)? (?:panel|chart|plot|heatmap|graph|scatter)s?\b",
    re.IGNORECASE,
)
ARRANGED = re.compile(r"\b(?P<row>side by side|in a row)\b|\b(?P<column>stacked|one above the other)\b", re.I)
_STOP = {
    "the",
    "a",
    "an",
    "of",
    "in",
    "on",
    "at",
    "to",
    "and",
    "or",
    "vs",
    "over",
    "with",
    "for",
    "by",
    "its",
}


def _words(text: str) -> list[str]:
    """The words that can name a panel: no stop words, no single letters ("paper's" is "paper")."""
    words = re.findall(r"[^\W_]+", text.casefold())
    return [w for w in words if w not in _STOP and (len(w) > 1 or w.isdigit())]


def _mentioned(text: str, found: list[Panel]) -> tuple[str, list[Panel]] | None:
    """The word of ``text`` that names panels last, and the panels it names: the last word that
    some but not all titles hold ("trained" names every "trained, K = ..." panel, "excess" the
    panel "In excess of the twin"); None when no word names a panel."""
    holders: dict[str, list[Panel]] = {}
    for p in found:
        for w in set(_words(p.title)):
            holders.setdefault(w, []).append(p)
    named = None
    for w in _words(text):
        if 0 < len(holders.get(w, [])) < len(found):
            named = (w, holders[w])
    return named


def _bare(position: str) -> str:
    """A position without its "row", "column" or "panel" ("top row" and "top" say the same)."""
    return re.sub(r" (?:row|column|panel)s?\b", "", position.lower())


def _claim_problem(said: str, before: str, found: list[Panel]) -> str | None:
    if len(found) == 1:
        return f"({said}) in a figure of one panel: leave positional words out"
    named = _mentioned(before, found)
    if named is None:
        return (
            f"({said}) follows no word of a panel's title (panels: {[p.title for p in found]}); "
            "name the panel before it, as layout.where(chart, title) does"
        )
    word, group = named
    true = _group_position(found, group)
    if _bare(said) != _bare(true):
        names = " / ".join(p.title for p in group)
        return f"{names!r} (named by {word!r} before it) is said to be ({said}) but is at ({true})"
    return None


def _arrangement_problem(m: re.Match, found: list[Panel]) -> str | None:
    rows = max(p.row for p in found) + 1
    columns = max(p.column for p in found) + 1
    if m.group("row") and not (len(found) > 1 and rows == 1):
        return f"{m.group(0)!r}, but the figure shows {len(found)} panel(s) in {rows} row(s)"
    if m.group("column") and not (len(found) > 1 and columns == 1):
        return f"{m.group(0)!r}, but the figure shows {len(found)} panel(s) in {columns} column(s)"
    return None


def caption_problems(caption: str, spec: dict) -> list[str]:
    """What a caption (or alt text) says about where panels are that its final spec contradicts,
    as sentences naming the words; empty when every positional word is true.

    A position in parentheses ("(left)", "(top row, ...)") places the panel(s) named last before
    it (:func:`_mentioned`); "side by side" and "stacked" must describe the layout; loose
    phrases ("on the left", "right panel", "Top:") name no panel and are refused."""
    found = spec_panels(spec)
    claims = list(CLAIM.finditer(caption or ""))
    spans = [m.span("pos") for m in claims]
    problems = [
        f"{m.group(0)!r} names no panel: write the panel's title with its position in parentheses, "
        "as layout.where(chart, title) does"
        for m in LOOSE.finditer(caption or "")
        if not any(a <= m.start() < b for a, b in spans)
    ]
    problems += [p for m in ARRANGED.finditer(caption or "") if (p := _arrangement_problem(m, found))]
    start = 0
    for m in claims:
        problem = _claim_problem(m.group("pos").lower(), caption[start : m.start("pos")], found)
        start = m.end()
        if problem:
            problems.append(problem)
    return problems
