"""The lab kit's links to the book, and its reruns: the MyST roles Jupyter shows as written,
and the ``coupling-book run`` commands the chapters' prose types.

In the book ``{doc}``, ``{ref}`` and ``{term}`` link other pages (the method page, the status
page, the glossary) and labelled sections, ``{numref}`` numbers a figure and ``{cite}`` names a
reference of the bibliography. A kit holds the chapter notebooks only, and Jupyter shows a role
as written, so at kit build time :meth:`BookLinks.rewrite` turns each into a Markdown link to
the published book, when ``_config.yml`` names its address (``html.baseurl``), or else into
plain text: the page or section it pointed to, the figure by its name (``fig-f00-noise``, the
name the code that draws it gives it), the reference by authors and year. The glue roles stay (the kit
lists their values in a cell of its own), and so does what Jupyter renders (``$math$``). A rerun
the prose types in the repository's form becomes the kit's papermill line
(:func:`~coupling_utils.chapters.reruns.kit_command`, the rule of the glued rerun hints).
"""

from __future__ import annotations

import posixpath
import re
import shlex
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from coupling_utils.chapters.reruns import PROFILE, kit_command
from coupling_utils.pipeline.execution import ParameterError, parse_overrides

__all__ = ["BookLinks", "book_links", "site_url", "term_anchor", "kit_reruns"]

_ROLE = re.compile(r"\{(?P<role>doc|ref|term|numref|cite(?::[a-z]+)?)\}`(?P<content>[^`]+)`")
_CODE = re.compile(r"(?<!`)`(?P<code>[^`\n]+)`(?!`)")  # inline code, not a fence
_FIGURE_NAME = re.compile(r"""(?:\bname\s*=\s*["']|^:name:\s*)(?P<label>fig-[\w-]+)""", re.MULTILINE)
_BIB_ENTRY = re.compile(r"^@\w+\{(?P<key>[^,\s]+),(?P<body>.*?)^\}", re.MULTILINE | re.DOTALL)
_LATEX = re.compile(r"\\[a-zA-Z]+\s*|\\.|[{}]")  # commands, accents and braces: dropped
_PAGE_SAID = re.compile(r"\s+on the [\w\s-]{1,40}?\bpage\b")  # prose that names a figure's page
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$")  # "text <target>"
_TARGET = re.compile(r"^\((?P<label>[\w-]+)\)=\s*$")  # a MyST label line, "(f02-scale)="
_EXERCISE_LABEL = re.compile(r"^:label:\s*(?P<label>[\w-]+)\s*$")
GLOSSARY = "book/glossary"
BIBLIOGRAPHY = "book/bibliography"


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
    figures: dict[str, str] = field(default_factory=dict)  # the page of each named figure
    cites: dict[str, tuple[str, str]] = field(default_factory=dict)  # (authors, year) by bib key

    def rewrite(self, text: str, notebook: str) -> str:
        """``text`` (MyST, of the chapter notebook ``notebook``, its stem) with each ``{doc}``,
        ``{ref}``, ``{term}``, ``{numref}`` and ``{cite}`` role as a link to the published book or
        as plain words, and its typed reruns as the kit's papermill lines (:func:`kit_reruns`)."""
        here = f"notebooks/{notebook}"

        def one(m: re.Match) -> str:
            said_after = bool(_PAGE_SAID.match(m.string, m.end()))  # "… on the notation page"
            return self._one(m.group("role"), m.group("content"), here, said_after)

        return kit_reruns(_ROLE.sub(one, text))

    def _one(self, role: str, content: str, here: str, page_said: bool = False) -> str:
        m = _EXPLICIT.match(content)
        words, target = (m.group("text"), m.group("target")) if m else ("", content.strip())
        if role.startswith("cite"):
            return self._cite(role, content)
        if role == "numref":
            page = self.figures.get(target) or self._figure_page(target) or here
            named = page == here or page_said  # the prose names the page itself: not twice
            where = "" if named else f" (in the book's *{self.pages.get(page, page)}*)"
            said = (words or "Fig. %s").replace("%s", f"`{target}`").replace("{name}", f"`{target}`")
            return self._link(said, page, target, where)
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

    def _figure_page(self, label: str) -> str:
        """The page of a figure named by the book's rule ``fig-<page>-<what>`` (``fig-f00-noise``:
        the f00 chapter; ``fig-notation-tiles``: the notation page), "" for none."""
        part = label.split("-")[1] if label.count("-") >= 2 else ""
        pages = [p for p in self.pages if part and re.split(r"[-_]", p.rsplit("/", 1)[-1])[0] == part]
        return pages[0] if len(pages) == 1 else ""

    def _cite(self, role: str, content: str) -> str:
        """A citation by authors and year as the book's author-year style writes it: textual
        (``{cite:t}``) "Aubry et al. (2025)", parenthetical (``{cite:p}``, and ``{cite}``, which
        sphinxcontrib-bibtex reads as ``{cite:p}``) "(Aubry et al., 2025)"; linked to the book's
        bibliography where the book has an address."""
        found = [self.cites.get(key.strip(), (key.strip(), "")) for key in content.split(",")]
        if role.split(":")[-1] in ("t", "ts", "ct", "cts"):
            said = "; ".join(f"{who} ({year})" if year else who for who, year in found)
        else:
            said = "(" + "; ".join(f"{who}, {year}" if year else who for who, year in found) + ")"
        return self._link(said, BIBLIOGRAPHY, "", "")

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


def kit_reruns(text: str) -> str:
    """``text`` (MyST) with each chapter rerun it types as inline code in the repository's form
    (``coupling-book run f01 -p how=adjacent``, ``--profile paper``) as the kit's papermill line;
    a code of ``-p`` options alone after one, in the same paragraph ("then `-p revision=step64`"),
    as that rerun with those settings changed. Any other command stays as written (the kit's
    README says which form to use)."""
    return "".join(_paragraph_reruns(part) for part in re.split(r"(\n[ \t]*\n)", text))


def _paragraph_reruns(paragraph: str) -> str:
    """:func:`kit_reruns` of one paragraph (a ``-p`` code changes the rerun before it)."""
    before: list[tuple[str, dict, str]] = []

    def one(m: re.Match) -> str:
        run = _rerun(m.group("code"), before[-1] if before else None)
        if run is None:
            return m.group(0)
        before.append(run)
        return f"`{kit_command(*run)}`"

    return _CODE.sub(one, paragraph)


def _rerun(code: str, before: tuple | None) -> tuple[str, dict, str] | None:
    """(chapter, settings, profile) that the inline code ``code`` reruns: ``coupling-book run
    fNN`` with only ``--profile`` and ``-p NAME=VALUE`` options, or, after the rerun ``before``,
    ``-p`` options alone; None for any other code."""
    try:
        words = shlex.split(code)
    except ValueError:
        return None
    if words[:2] == ["coupling-book", "run"] and len(words) > 2 and re.fullmatch(r"f\d\d", words[2]):
        chapter, settings, profile, words = words[2], {}, PROFILE, words[3:]
    elif before is not None and words[:1] in (["-p"], ["--param"]):
        chapter, settings, profile = before[0], dict(before[1]), before[2]
    else:
        return None
    given = []
    for flag, value in zip(words[::2], words[1::2], strict=False):
        if flag in ("-p", "--param"):
            given.append(value)
        elif flag == "--profile":
            profile = value
        else:
            return None
    try:
        settings.update(parse_overrides(given))
        kit_command(chapter, settings, profile)
    except (ParameterError, ValueError):
        return None
    return (chapter, settings, profile) if len(words) % 2 == 0 else None


def _bib_field(body: str, name: str) -> str:
    """The field ``name`` of a BibTeX entry's ``body`` (braced, perhaps nested), as plain text."""
    m = re.search(rf"\b{name}\s*=\s*\{{", body)
    if not m:
        return ""
    depth, at = 1, m.end()
    while depth and at < len(body):
        depth += {"{": 1, "}": -1}.get(body[at], 0)
        at += 1
    return " ".join(_LATEX.sub("", body[m.end() : at - 1]).split())


def _authors(names: str) -> str:
    """BibTeX ``author`` as a citation names them: "Gai and Zhang", "Aubry et al."."""
    family = [
        n.split(",")[0].strip() if "," in n else n.split()[-1] for n in names.split(" and ") if n.strip()
    ]
    if len(family) > 2 or "others" in family:
        return f"{family[0]} et al."
    return " and ".join(family)


def _citations(bib: Path) -> dict[str, tuple[str, str]]:
    """(authors, year) of each entry of the BibTeX file ``bib`` by its key ({} for no file)."""
    text = bib.read_text(encoding="utf-8") if bib.is_file() else ""
    return {
        m.group("key"): (_authors(_bib_field(m.group("body"), "author")), _bib_field(m.group("body"), "year"))
        for m in _BIB_ENTRY.finditer(text)
    }


def site_url(config: dict) -> str:
    """The published book's address from ``_config.yml``'s ``html.baseurl`` ("" when unset)."""
    return str(((config or {}).get("html") or {}).get("baseurl") or "").strip().rstrip("/")


def _title(lines: list[str], at: int) -> str:
    """The first heading at or after line ``at``, without its hashes ("" for none)."""
    heading = next((line for line in lines[at:] if line.startswith("#")), "")
    return heading.lstrip("#").strip()


def book_links(root: Path, config: dict) -> BookLinks:
    """:class:`BookLinks` of the book at ``root``: its pages (``book/*.md``, ``notebooks/*.md``),
    their labelled sections, exercises and named figures, the references of the bibliography
    files and the address ``config`` (``_config.yml``) names."""
    pages: dict[str, str] = {}
    labels: dict[str, tuple[str, str]] = {}
    figures: dict[str, str] = {}
    for path in sorted([*root.glob("book/*.md"), *root.glob("notebooks/*.md")]):
        page = path.relative_to(root).with_suffix("").as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        pages[page] = _title(lines, 0) or page
        figures.update((m.group("label"), page) for m in _FIGURE_NAME.finditer(text))
        for at, line in enumerate(lines):
            if m := _TARGET.match(line):
                labels[m.group("label")] = (page, _title(lines, at + 1) or m.group("label"))
            elif m := _EXERCISE_LABEL.match(line):
                labels[m.group("label")] = (page, f"exercise {m.group('label')}")
    glossary = root / f"{GLOSSARY}.md"
    terms = _glossary_terms(glossary.read_text(encoding="utf-8")) if glossary.is_file() else {}
    bibs = [root / b for b in (config or {}).get("bibtex_bibfiles") or []]
    cites = {key: said for bib in bibs for key, said in _citations(bib).items()}
    return BookLinks(site_url(config), pages, labels, terms, figures, cites)
