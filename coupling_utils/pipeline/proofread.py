"""Proofreading the built book: what a reader sees holds no Python or numpy repr, no figure's
caption or alt text says a panel is where the figure does not show it, and no verdict in the
prose differs from the page's status table.

:func:`proofread` reads every page of the built HTML: its text (prose, outputs, captions; not
the code of input cells, not scripts) and its images' alt text, for reprs such as
``np.float64(`` or ``array([``; and each chart figure's caption and alt text against the
Vega-Lite spec the page embeds (the final one, as laid out for the book's column) with
``layout.caption_problems``; and each verdict word of the prose (``verdicts.verdict_word``, a
span naming its claim) against the row of that claim in the page's status table, while a bold
"yes", "partly" or "no" typed outside such a span is refused (a verdict is glued from the status
rows, never typed). ``build_book`` fails on what it finds, naming page and text.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

from coupling_utils.analysis.layout import caption_problems
from coupling_utils.analysis.verdicts import VERDICT_CLASS

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
        self.verdicts: list[dict] = []  # {"claim", "text"}: the prose's verdict words
        self.status: list[dict] = []  # {"claim", "agree"}: the rows of the page's status tables
        self.bold: list[list[str]] = []  # bold text outside verdict words and status tables

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for _, classes in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if tag == "figure":
            self.figures.append({"spec": None, "caption": [], "alt": None})
        if tag == "span" and VERDICT_CLASS in classes:
            self.verdicts.append({"claim": a.get("data-claim") or "", "text": []})
        if tag == "tr" and self._inside("coupling-status"):
            self.status.append({"claim": [], "agree": []})
        if tag == "strong" and not self._inside(VERDICT_CLASS) and not self._inside("coupling-status"):
            self.bold.append([])
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
        if self.verdicts and self._inside(VERDICT_CLASS):
            self.verdicts[-1]["text"].append(data)
        for column in ("claim", "agree"):
            if self.status and self._inside(f"status-{column}"):
                self.status[-1][column].append(data)
        if self.bold and self._inside("<strong>") and not self._inside(VERDICT_CLASS):
            self.bold[-1].append(data)
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
    return list(dict.fromkeys(problems + _verdict_problems(page)))


_VERDICT_WORDS = {"yes", "partly", "no"}


def _verdict_problems(page: _Page) -> list[str]:
    """Verdict words of the prose against the page's status rows, and typed bold verdicts."""
    rows = {}
    for row in page.status:
        claim = " ".join("".join(row["claim"]).split())
        if claim:
            rows.setdefault(claim, set()).add("".join(row["agree"]).strip())
    problems = []
    for v in page.verdicts:
        word, claim = "".join(v["text"]).strip(), " ".join(v["claim"].split())
        if claim not in rows:
            problems.append(
                f"verdict {word!r} for the claim {claim!r}, which no status table on the page lists"
            )
        elif word not in rows[claim]:
            shown = " or ".join(sorted(rows[claim]))
            problems.append(f"verdict {word!r} in the prose, {shown!r} in the status table, for {claim!r}")
    for bold in page.bold:
        word = "".join(bold).strip()
        if word.lower() in _VERDICT_WORDS:
            problems.append(
                f"a typed bold verdict {word!r}: glue it from the status rows (verdicts.verdict_word)"
            )
    return problems


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
