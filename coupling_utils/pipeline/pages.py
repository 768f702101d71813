"""Sections of the book's pages made when it is built, from the repository and the executed runs.

The status page's tables (from each executed notebook's status rows), the architecture page's
table (from the adapter table) and the bibliography's "Cite this companion" (from
``CITATION.cff``): written at build time, so a page never states what the code or the runs do
not.
"""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = [
    "BookError",
    "PRINT_DIR",
    "PRINT_MARKER",
    "citation_section",
    "printable_link",
    "architectures_section",
    "status_rows",
    "status_section",
]

PRINT_DIR = "print"  # the printable edition: the whole book on one page, out/print/index.html
PRINT_MARKER = "% printable"  # the intro's line that links it


class BookError(RuntimeError):
    """The book cannot be built as asked; the message names the problem and the fix."""


def _names(people) -> list[str]:
    """CITATION.cff persons as "Given Family" (or their ``name``)."""
    out = []
    for p in people or []:
        if p.get("name"):
            out.append(str(p["name"]))
        else:
            out.append(" ".join(str(p[k]) for k in ("given-names", "family-names") if p.get(k)))
    return out


def _bibtex(kind: str, key: str, fields: list[tuple[str, str]]) -> str:
    fields = [(k, v) for k, v in fields if v]
    width = max((len(k) for k, _ in fields), default=0)
    body = ",\n".join(f"  {k:<{width}} = {{{v}}}" for k, v in fields)
    return f"```bibtex\n@{kind}{{{key},\n{body}\n}}\n```\n"


def _paper_citation(preferred: dict) -> str:
    """The paper, from CITATION.cff's ``preferred-citation``: a sentence and its BibTeX."""
    people = preferred.get("authors") or []
    authors = _names(people)
    title = str(preferred.get("title", "")).strip()
    venue = str(preferred.get("collection-title") or preferred.get("journal") or "").strip()
    year = str(preferred.get("year", "")).strip()
    ids = [str(i.get("value", "")) for i in preferred.get("identifiers") or [] if i.get("value")]
    sentence = f"{', '.join(authors)}. *{title}*." + (f" {venue}." if venue else "")
    sentence += f" {year}." if year and year not in venue else ""
    sentence += "".join(f" {i}." for i in ids)
    bib_authors = " and ".join(
        f"{p['family-names']}, {p['given-names']}" if p.get("family-names") else str(p.get("name", ""))
        for p in people
    )
    key = (str(people[0].get("family-names", "paper")).lower() if people else "paper") + year
    fields = [("title", title), ("author", bib_authors), ("booktitle", venue), ("year", year)]
    fields += [("note", "; ".join(ids))]
    return f"**The paper** (the preferred citation): {sentence}\n\n" + _bibtex("inproceedings", key, fields)


def citation_section(cff: Path, url: str = "") -> str:
    """ "Cite this companion and the paper": sentences and BibTeX entries generated from
    ``CITATION.cff`` (the paper from its ``preferred-citation``, the companion from the rest)."""
    meta = yaml.safe_load(Path(cff).read_text(encoding="utf-8")) or {}
    title = str(meta.get("title", "")).strip()
    if not title:
        raise BookError(f"{cff} has no title: CITATION.cff needs title, authors, version")
    authors = _names(meta.get("authors"))
    version = str(meta.get("version", "")).strip()
    date = str(meta.get("date-released", "")).strip()
    link = url or str(meta.get("repository-code") or meta.get("url") or "").strip()
    year = date[:4] if date[:4].isdigit() else ""
    sentence = f"{' and '.join(authors) or 'The authors'}. *{title}*"
    sentence += f", version {version}" if version else ""
    sentence += f" ({date})" if date else ""
    sentence += f". <{link}>" if link else "."
    fields = [("title", title), ("author", " and ".join(f"{{{a}}}" if " " in a else a for a in authors))]
    fields += [("version", version), ("year", year), ("url", link)]
    preferred = meta.get("preferred-citation") or {}
    paper = (
        "It reproduces {cite:t}`aubry2025coupling`; please cite the paper as well.\n\n"
        + _paper_citation(preferred)
        if preferred
        else ""
    )
    message = str(meta.get("message", "")).strip()
    return (
        "## Cite this companion and the paper\n\n"
        f"Generated from the repository's `CITATION.cff` when the book was built. {message}\n\n"
        f"**This companion**: {sentence}\n\n"
        + _bibtex("software", "coupling_companion", fields)
        + (f"\n{paper}" if paper else "")
    )


def architectures_section() -> str:
    """The supported-architectures table, generated from ``architectures.ARCHITECTURES``."""
    from coupling_utils.engine.architectures import supported_architectures

    df = supported_architectures()[
        ["name", "model_types", "examples", "attention", "modality", "token_diagonal", "notes"]
    ]
    header = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    rows = "".join(
        "| " + " | ".join(str(v).replace("|", "/") for v in row) + " |\n"
        for row in df.itertuples(index=False)
    )
    return header + rows


def status_rows(executed: Path, notebooks: set[str] | None = None):
    """The executed notebooks' status rows (:func:`~coupling_utils.pipeline.status.read_statuses`),
    only those of ``notebooks`` (file stems) when given; an empty table without executed ones."""
    import pandas as pd

    from coupling_utils.pipeline.status import COLUMNS, read_statuses

    if not executed.is_dir():
        return pd.DataFrame(columns=["notebook", *COLUMNS, "profile", "seconds", "finished"])
    df = read_statuses(executed)
    if notebooks is not None:
        attrs = dict(df.attrs)
        df = df[df["notebook"].isin(notebooks)].reset_index(drop=True)
        df.attrs = attrs
    return df


def status_section(executed: Path, notebooks: set[str] | None = None) -> str:
    """The reproduction-status tables, generated from the executed notebooks' status outputs.

    Only ``notebooks`` (file stems) are reported when given: the ones the book includes.
    """
    from coupling_utils.pipeline.status import status_markdown

    return status_markdown(status_rows(executed, notebooks))


def printable_link(printable: bool) -> str:
    """The intro's list item about the printable edition: a link to it (and to its PDF when this
    build can print one, :func:`~coupling_utils.pipeline.printing.pdf_planned`), or how to build it."""
    from coupling_utils.pipeline.printing import PDF_FILE, pdf_planned

    item = "- A **printable edition**, for classrooms without a screen per student: "
    if printable and pdf_planned(printable):
        return item + (
            f'<a href="../{PRINT_DIR}/index.html">the whole book on one page</a> and '
            f'<a href="../{PRINT_DIR}/{PDF_FILE}">the same as one PDF</a>, printed by headless Chromium '
            "when the book was built (`coupling-book build --printable`, which `make book` runs)."
        )
    if printable:
        return item + (
            f'<a href="../{PRINT_DIR}/index.html">the whole book on one page</a>, to print or to save '
            "as a PDF from the browser (`coupling-book build --printable`, which `make book` runs; "
            "with Chromium installed it also makes the PDF)."
        )
    return item + "not part of this build; `coupling-book build --printable` adds it (`make book` does)."
