"""Each glossary term is linked (``{term}``) at its first use in the prose of every chapter.

    python scripts/glossary_links.py            # list the first uses that are not linked
    python scripts/glossary_links.py --fix      # link them in notebooks/*.md

Prose is what a reader sees as text: code cells, math, inline code and roles, headings,
directive lines and link texts are skipped. A term matches case-insensitively as a whole word
(plural "s" allowed). ``tests/test_glossary.py`` runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "book" / "glossary.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("f0*.md"))

# spans a term never matches inside: math, inline code, roles/refs, markdown links, glue
_SKIP = re.compile(
    r"\$\$.*?\$\$|\$[^$\n]+\$|\{[a-z:-]+\}`[^`]*`|`[^`]*`|\[[^\]]*\]\([^)]*\)|<[^>]+>",
    re.S,
)


def glossary_terms(text: str | None = None) -> list[str]:
    """The terms defined in the glossary's ``{glossary}`` block (unindented lines)."""
    text = GLOSSARY.read_text(encoding="utf-8") if text is None else text
    block = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line[0].isspace()]


def _prose_lines(text: str):
    """(line index, line) of prose: outside code cells and fences, not headings or directives."""
    fence = None
    for i, line in enumerate(text.splitlines()):
        stripped = line.strip()
        opener = re.match(r"^(`{3,}|:{3,}|~{3,})", stripped)
        if fence is None and opener:
            marker = opener.group(1)
            # a fenced code cell or code block: skip until it closes; other directives hold prose
            if re.match(
                r"^(`{3,}|~{3,})\s*(\{code-cell\}|\{code\}|python|bash|text|yaml|console|\{tidy-table\}|\{index\}|\{glossary\}|$)",
                stripped,
            ):  # noqa: E501
                fence = marker
            continue
        if fence is not None:
            if stripped.startswith(fence) and stripped.strip("`~") == "":
                fence = None
            continue
        if stripped.startswith(("#", ":", "+++", "%", "---")) or not stripped:
            continue
        yield i, line


def _pattern(term: str) -> re.Pattern:
    return re.compile(r"(?<![\w-])" + re.escape(term) + r"(?:s|es)?(?![\w-])", re.I)


def first_uses(text: str, terms: list[str]) -> dict[str, tuple[int, int, int, bool]]:
    """``{term: (line, start, end, linked)}`` of each term's first use in the prose."""
    found: dict[str, tuple[int, int, int, bool]] = {}
    for i, line in _prose_lines(text):
        spans = [(m.start(), m.end(), m.group(0)) for m in _SKIP.finditer(line)]
        for term in terms:
            if term in found:
                continue
            linked = [(a, b) for a, b, s in spans if s.startswith("{term}") and _is_link_to(s, term)]
            if linked:
                found[term] = (i, *linked[0], True)
                continue
            for m in _pattern(term).finditer(line):
                if not any(a <= m.start() < b for a, b, _ in spans):
                    found[term] = (i, m.start(), m.end(), False)
                    break
    return found


def _is_link_to(role: str, term: str) -> bool:
    inner = role[len("{term}`") : -1]
    target = inner.rsplit("<", 1)[1].rstrip(">") if inner.endswith(">") and "<" in inner else inner
    return target.strip().lower() == term.lower()


def unlinked(path: Path, terms: list[str]) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    uses = sorted(first_uses(text, terms).items(), key=lambda kv: kv[1])
    return [
        f"{path.name}:{i + 1}: first use of {term!r} is not linked: {lines[i].strip()[:90]}"
        for term, (i, _a, _b, ok) in uses
        if not ok
    ]


def link(path: Path, terms: list[str]) -> int:
    """Link every unlinked first use in ``path``; returns how many were linked."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    todo = [(i, a, b, t) for t, (i, a, b, ok) in first_uses(text, terms).items() if not ok]
    for i, a, b, term in sorted(todo, key=lambda x: (x[0], -x[1])):
        word = lines[i][a:b]
        role = f"{{term}}`{word}`" if word.lower() == term.lower() else f"{{term}}`{word} <{term}>`"
        lines[i] = lines[i][:a] + role + lines[i][b:]
    path.write_text("".join(lines), encoding="utf-8")
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fix", action="store_true", help="link the unlinked first uses")
    args = ap.parse_args(argv)
    terms = glossary_terms()
    if args.fix:
        for nb in NOTEBOOKS:
            print(f"{nb.name}: linked {link(nb, terms)}")
        return 0
    problems = [p for nb in NOTEBOOKS for p in unlinked(nb, terms)]
    print("\n".join(problems) or f"every glossary term ({len(terms)}) is linked at its first use")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
