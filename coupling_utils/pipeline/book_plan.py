"""What a book build includes: the table of contents resolved to sources and executed notebooks.

``_toc.yml`` lists prose pages (``book/<page>``) and finding notebooks (``notebooks/fNN_<slug>``).
:func:`plan_book` says, page by page, what a build can stage, what is not written yet (left out)
and which written notebooks have no executed copy (an error unless partial builds are allowed,
:func:`check_executed`); :func:`staged_toc` is the toc Jupyter Book then sees, and
:func:`report_plan` tells the reader of a build what was left out or may be stale.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from coupling_utils.pipeline.pages import BookError, BookInputError, book_yaml

__all__ = [
    "TocEntry",
    "BookPlan",
    "toc_entries",
    "plan_book",
    "check_executed",
    "staged_toc",
    "report_plan",
    "path_or_default",
]

PROSE_DIR = "book"
NOTEBOOK_DIR = "notebooks"
EXECUTED_DIR = "_build/notebooks"  # where `coupling-book run` writes, under the repository


@dataclasses.dataclass(frozen=True)
class TocEntry:
    """One page of the table of contents and where its content comes from.

    ``status`` is "ok" (ready to stage), "no-source" (the page or notebook is not written
    yet: left out of the book) or "not-executed" (the notebook exists but has no executed
    copy: an error unless partial builds are allowed).
    """

    docname: str  # e.g. "book/intro" or "notebooks/f00_coupling_metric"
    kind: str  # "prose" | "notebook"
    source: Path  # book/<page>.md or notebooks/<name>.md in the repository
    content: Path  # the file staged: the prose source or the executed .ipynb
    status: str

    @property
    def run_command(self) -> str:
        """The command that produces this notebook's executed copy."""
        short = Path(self.docname).name.split("_", 1)[0]
        return f"coupling-book run {short} --profile <smoke|default|laptop|paper>"


@dataclasses.dataclass(frozen=True)
class BookPlan:
    """What a build would include, leave out, or miss."""

    entries: tuple[TocEntry, ...]

    @property
    def included(self) -> list[TocEntry]:
        return [e for e in self.entries if e.status == "ok"]

    @property
    def unwritten(self) -> list[TocEntry]:
        return [e for e in self.entries if e.status == "no-source"]

    @property
    def unexecuted(self) -> list[TocEntry]:
        return [e for e in self.entries if e.status == "not-executed"]


def path_or_default(path: str | os.PathLike | None, default: Path | None, name: str) -> Path | None:
    """``path`` as given, made absolute (a relative one is read from the current folder, as
    ``open`` reads it), or ``default`` when it is None; an empty or non-path value is an error
    naming ``name``."""
    if path is None:
        return default
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        fallback = f" for {default}" if default is not None else ""
        raise BookInputError(f"{name}={path!r} is not a path: give a folder, or leave {name} out{fallback}")
    return Path(path).absolute()


def _toc_files(node) -> list[str]:
    """Every ``file:`` of a jb-book toc (root first), in reading order."""
    files: list[str] = []
    if isinstance(node, dict):
        if "root" in node:
            files.append(str(node["root"]))
        if "file" in node:
            files.append(str(node["file"]))
        for key in ("parts", "chapters", "sections"):
            for child in node.get(key) or []:
                files.extend(_toc_files(child))
    return files


def toc_entries(root: str | Path = ".") -> list[str]:
    """The docnames listed in ``<root>/_toc.yml``, root page first."""
    toc_path = Path(root) / "_toc.yml"
    if not toc_path.is_file():
        raise BookError(f"no table of contents at {toc_path}: run from the repository root")
    toc = book_yaml(toc_path, "the table of contents")
    if not isinstance(toc, dict) or toc.get("format") != "jb-book" or "root" not in toc:
        raise BookError(f"{toc_path} is not a Jupyter Book 'jb-book' toc with a root page")
    return _toc_files(toc)


def plan_book(root: str | Path = ".", executed: str | Path | None = None) -> BookPlan:
    """Resolve every toc entry to its source and content and say whether it can be staged.

    ``executed`` is the folder of executed notebooks as given (relative to the current folder);
    None: ``<root>/_build/notebooks``, where ``coupling-book run`` writes them.
    """
    root = Path(root).resolve()
    executed = path_or_default(executed, root / EXECUTED_DIR, "executed")
    entries = []
    for docname in toc_entries(root):
        top = docname.split("/", 1)[0]
        if top == NOTEBOOK_DIR:
            source = root / f"{docname}.md"
            content = executed / f"{Path(docname).name}.ipynb"
            if not source.is_file():
                status = "no-source"
            elif not content.is_file():
                status = "not-executed"
            else:
                status = "ok"
            entries.append(TocEntry(docname, "notebook", source, content, status))
        elif top == PROSE_DIR:
            source = root / f"{docname}.md"
            status = "ok" if source.is_file() else "no-source"
            entries.append(TocEntry(docname, "prose", source, source, status))
        else:
            raise BookError(
                f"_toc.yml entry {docname!r} is neither under {PROSE_DIR}/ nor {NOTEBOOK_DIR}/: "
                "put prose in book/ and finding notebooks in notebooks/"
            )
    if entries[0].status != "ok":
        raise BookError(f"the book's root page {entries[0].source} is missing")
    return BookPlan(tuple(entries))


def check_executed(plan: BookPlan) -> None:
    """Refuse a plan with written but unexecuted notebooks, naming each and its command."""
    if not plan.unexecuted:
        return
    lines = "\n".join(
        f"  - {e.docname}: expected {e.content}; run `{e.run_command}`" for e in plan.unexecuted
    )
    raise BookError(
        "these notebooks are in _toc.yml but have not been executed:\n"
        + lines
        + "\n(or `coupling-book run --profile <profile>` for all of them; "
        "`coupling-book build --allow-unexecuted` builds without them)"
    )


def staged_toc(root: Path, plan: BookPlan) -> dict:
    """The repository toc restricted to the pages ``plan`` includes; parts left empty are dropped."""
    toc = book_yaml(root / "_toc.yml", "the table of contents")
    keep = {e.docname for e in plan.included}

    def prune(items):
        kept = []
        for item in items or []:
            if "file" in item and item["file"] not in keep:
                continue
            item = dict(item)
            for key in ("chapters", "sections"):
                if key in item:
                    item[key] = prune(item[key])
                    if not item[key]:
                        del item[key]
            if "file" in item or item.get("chapters"):
                kept.append(item)
        return kept

    if "parts" in toc:
        toc["parts"] = prune(toc["parts"])
    if "chapters" in toc:
        toc["chapters"] = prune(toc["chapters"])
    return toc


def report_plan(plan: BookPlan) -> None:
    """Say on stderr which pages are left out, and which executed notebooks may be stale."""
    for entry in plan.unwritten:
        print(f"[book] not written yet, left out: {entry.docname} ({entry.source})", file=sys.stderr)
    for entry in plan.unexecuted:
        print(f"[book] not executed, left out: {entry.docname} (run `{entry.run_command}`)", file=sys.stderr)
    for entry in plan.included:
        failed = entry.content.with_suffix(".failed.ipynb")
        if (
            entry.kind == "notebook"
            and failed.is_file()
            and failed.stat().st_mtime > entry.content.stat().st_mtime
        ):
            print(
                f"[book] warning: the last run of {entry.docname} failed ({failed.name}); "
                "the book shows the earlier successful run",
                file=sys.stderr,
            )
        if entry.kind == "notebook" and entry.source.stat().st_mtime > entry.content.stat().st_mtime:
            print(
                f"[book] warning: {entry.content.name} is older than {entry.source.name}; "
                f"rerun `{entry.run_command}` to refresh it",
                file=sys.stderr,
            )
