"""The lab kit's links to the book: the chapters' ``{doc}``, ``{ref}`` and ``{term}`` roles.

In the book they link other pages (the method page, the status page, the glossary) and labelled
sections. A kit holds the chapter notebooks only, and Jupyter shows a role as written, so at kit
build time :meth:`BookLinks.rewrite` turns each into a Markdown link to the published book, when
``_config.yml`` names its address (``html.baseurl``), or else into plain text that names the page
or section it pointed to.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BookLinks", "book_links", "site_url", "term_anchor"]

_ROLE = re.compile(r"\{(?P<role>doc|ref|term)\}`(?P<content>[^`]+)`")
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$")  # "text <target>"
_TARGET = re.compile(r"^\((?P<label>[\w-]+)\)=\s*$")  # a MyST label line, "(f02-scale)="
_EXERCISE_LABEL = re.compile(r"^:label:\s*(?P<label>[\w-]+)\s*$")
GLOSSARY = "book/glossary"


@dataclass(frozen=True)
class BookLinks:
    """What the book's roles point to: ``base``, the published book's address ("" for none);
    ``pages``, each page's title by docname (``"book/status"``); ``labels``, each label's page
    and words (a section's title, or "exercise LABEL"); ``terms``, the glossary's terms as it
    spells them (a ``{term}`` matches regardless of case, as in Sphinx)."""

    base: str = ""
    pages: dict[str, str] = field(default_factory=dict)
    labels: dict[str, tuple[str, str]] = field(default_factory=dict)
    terms: dict[str, str] = field(default_factory=dict)  # the glossary's terms, by their lower case

    def rewrite(self, text: str, notebook: str) -> str:
        """``text`` (MyST, of the chapter notebook ``notebook``, its stem) with each ``{doc}``,
        ``{ref}`` and ``{term}`` role as a link to the published book or as plain words."""
        here = f"notebooks/{notebook}"
        return _ROLE.sub(lambda m: self._one(m.group("role"), m.group("content"), here), text)

    def _one(self, role: str, content: str, here: str) -> str:
        m = _EXPLICIT.match(content)
        words, target = (m.group("text"), m.group("target")) if m else ("", content.strip())
        if role == "term":
            return self._link(
                words or target, GLOSSARY, term_anchor(self.terms.get(target.lower(), target)), ""
            )
        if role == "doc":
            page = posixpath.normpath(posixpath.join(posixpath.dirname(here), target)).lstrip("/")
            title = self.pages.get(page, target)
            return self._link(words or title, page, "", "" if words else " (a page of the book)")
        page, title = self.labels.get(target, (here, target))
        where = " (in this notebook)" if page == here else f" (in the book's *{self.pages.get(page, page)}*)"
        return self._link(words or title, page, target, where)

    def _link(self, words: str, page: str, anchor: str, where: str) -> str:
        """A Markdown link to ``page`` (a docname) at ``anchor`` in the published book, or, without
        its address, ``words`` in italics followed by ``where`` (which says where they are)."""
        if not self.base:
            return f"*{words}*{where}" if where else words
        return f"[{words}]({self.base}/{page}.html" + (f"#{anchor}" if anchor else "") + ")"


def term_anchor(term: str) -> str:
    """The id Sphinx gives a glossary term's entry: ``term-`` and the term in ASCII, each run of
    other characters one hyphen ("Spearman's ρ": ``term-Spearman-s``)."""
    ascii_term = unicodedata.normalize("NFKD", " ".join(term.split())).encode("ascii", "ignore").decode()
    return "term-" + re.sub(r"[^a-zA-Z0-9._]+", "-", ascii_term.strip()).rstrip("-")


def _glossary_terms(text: str) -> dict[str, str]:
    """The terms a ``{glossary}`` block of ``text`` defines (its unindented lines), by lower case."""
    terms, inside = {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```{glossary}"
        elif inside and line.strip() and not line[0].isspace():
            terms[line.strip().lower()] = line.strip()
    return terms


def site_url(config: dict) -> str:
    """The published book's address from ``_config.yml``'s ``html.baseurl`` ("" when unset)."""
    return str(((config or {}).get("html") or {}).get("baseurl") or "").strip().rstrip("/")


def _title(lines: list[str], at: int) -> str:
    """The first heading at or after line ``at``, without its hashes ("" for none)."""
    heading = next((line for line in lines[at:] if line.startswith("#")), "")
    return heading.lstrip("#").strip()


def book_links(root: Path, config: dict) -> BookLinks:
    """:class:`BookLinks` of the book at ``root``: its pages (``book/*.md``, ``notebooks/*.md``),
    their labelled sections and exercises, and the address ``config`` (``_config.yml``) names."""
    pages: dict[str, str] = {}
    labels: dict[str, tuple[str, str]] = {}
    for path in sorted([*root.glob("book/*.md"), *root.glob("notebooks/*.md")]):
        page = path.relative_to(root).with_suffix("").as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        pages[page] = _title(lines, 0) or page
        for at, line in enumerate(lines):
            if m := _TARGET.match(line):
                labels[m.group("label")] = (page, _title(lines, at + 1) or m.group("label"))
            elif m := _EXERCISE_LABEL.match(line):
                labels[m.group("label")] = (page, f"exercise {m.group('label')}")
    glossary = root / f"{GLOSSARY}.md"
    terms = _glossary_terms(glossary.read_text(encoding="utf-8")) if glossary.is_file() else {}
    return BookLinks(site_url(config), pages, labels, terms)
