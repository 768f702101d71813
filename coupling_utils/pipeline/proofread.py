"""Proofreading the built book: what a reader sees holds no Python or numpy repr, and no figure's
caption or alt text says a panel is where the figure does not show it.

:func:`proofread` reads every page of the built HTML: its text (prose, outputs, captions; not
the code of input cells, not scripts) and its images' alt text, for reprs such as
``np.float64(`` or ``array([``; and each chart figure's caption and alt text against the
Vega-Lite spec the page embeds (the final one, as laid out for the book's column) with
``layout.caption_problems``. ``build_book`` fails on what it finds, naming page and text.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from coupling_utils.analysis.layout import caption_problems

__all__ = ["PAGE_REPRS", "proofread"]

#: reprs that never belong in a page's text: numpy scalars and arrays, objects, pandas timestamps
#: (prose may say None or True, and input cells, whose code may call np.ones(...), are skipped)
PAGE_REPRS = re.compile(
    r"\b(?:np|numpy)\.(?:float|int|uint|complex|bool|str|bytes|datetime|timedelta|longdouble)\d*_?\("
    r"|\b(?:np|numpy)\.(?:True|False)_|\barray\(\[|<[\w.]+ object at 0x[0-9a-fA-F]+|\bTimestamp\("
)
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_SKIPPED = {"script", "style", "template"}


class _Page(HTMLParser):
    """One page's visible text, alt texts and chart figures (spec, caption, alt)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, set[str]]] = []
        self.text: list[str] = []
        self.alts: list[str] = []
        self.figures: list[dict] = []

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for _, classes in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if tag == "figure":
            self.figures.append({"spec": None, "caption": [], "alt": None})
        if tag == "img" and a.get("alt"):
            self.alts.append(a["alt"])
            if self.figures and self._inside_figure():
                self.figures[-1]["alt"] = a["alt"]
        if tag not in _VOID:
            self.stack.append((tag, classes | {f"<{tag}>"}))

    def _inside_figure(self) -> bool:
        return any("<figure>" in classes for _, classes in self.stack)

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, -1, -1):
            if self.stack[k][0] == tag:
                del self.stack[k:]
                return

    def handle_data(self, data):
        if self._inside("coupling-chart-spec") and self.figures:
            self.figures[-1]["spec"] = (self.figures[-1]["spec"] or "") + data
            return
        if any(t in _SKIPPED for t, _ in self.stack) or self._inside("cell_input"):
            return
        if self._inside("headerlink"):
            return
        self.text.append(data)
        if self.figures and self._inside("caption-text"):
            self.figures[-1]["caption"].append(data)


def _snippet(text: str, start: int, end: int) -> str:
    return " ".join(text[max(0, start - 50) : end + 30].split())


def _page_problems(page: _Page) -> list[str]:
    text = " ".join(" ".join(page.text).split())
    problems = [
        f"repr {m.group(0)!r} in the text: …{_snippet(text, *m.span())}…" for m in PAGE_REPRS.finditer(text)
    ]
    for alt in page.alts:
        problems += [f"repr {m.group(0)!r} in alt text {alt!r}" for m in PAGE_REPRS.finditer(alt)]
    for figure in page.figures:
        if not figure["spec"]:
            continue
        spec = json.loads(figure["spec"])
        caption = " ".join("".join(figure["caption"]).split())
        problems += [f"figure caption {caption!r}: {p}" for p in caption_problems(caption, spec)]
        alt = figure["alt"] or ""
        problems += [f"figure alt text {alt!r}: {p}" for p in caption_problems(alt, spec)]
    return list(dict.fromkeys(problems))


def proofread(html_dir: str | Path) -> list[str]:
    """Every problem in the built HTML under ``html_dir``, as ``"page: problem"`` lines."""
    root = Path(html_dir)
    found = []
    for path in sorted(root.rglob("*.html")):
        if "_static" in path.relative_to(root).parts:
            continue
        page = _Page()
        page.feed(path.read_text(encoding="utf-8", errors="replace"))
        page.close()
        found += [f"{path.relative_to(root)}: {p}" for p in _page_problems(page)]
    return found
