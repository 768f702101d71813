"""The teaching page's list of exercises, read from the chapters' sources when the book is built.

Every chapter's exercises are ``{exercise}`` blocks (sphinx-exercise), each followed by a
``{solution}`` block naming its label. :func:`exercises` reads them from the notebooks' MyST
sources, so that the teaching page says what is true of the exercises as they are:

- an exercise **asks for a prediction first** when its text begins with "Predict first";
- an exercise **needs a GPU** when it carries ``:class: needs-gpu`` (a class the book's
  stylesheet may mark; the default: it runs on a laptop CPU);
- it **has a worked solution** when a ``{solution}`` block names its label.

:func:`stage_exercises` replaces the teaching page's ``% exercise-table`` line with the counts
and a table per chapter.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

__all__ = ["MARKER", "GPU_CLASS", "exercises", "exercise_section", "stage_exercises"]

MARKER = "% exercise-table"
GPU_CLASS = "needs-gpu"
PREDICT = re.compile(r"^\s*predict first\b", re.IGNORECASE)
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\{(?P<kind>exercise|solution)\}\s*(?P<arg>\S*)\s*$")


def _blocks(text: str):
    """(kind, argument, options, body) of each exercise/solution block of a MyST source."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, end = m.group("fence"), i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        options, body = {}, []
        for line in lines[i + 1 : end]:
            opt = re.match(r"^:(\w[\w-]*):\s*(.*)$", line)
            if opt and not body:
                options[opt.group(1)] = opt.group(2).strip()
            elif body or line.strip():
                body.append(line)
        yield m.group("kind"), m.group("arg"), options, "\n".join(body).strip()
        i = end + 1


def exercises(notebooks: list[Path] | Path) -> pd.DataFrame:
    """One row per exercise of the given MyST notebooks (or every ``f*.md`` in a folder).

    Columns: chapter (file stem), label, predict_first, needs_gpu, has_solution, text (the first
    sentence of the exercise). An exercise without a ``:label:`` cannot have a solution, and is
    listed with an empty label.
    """
    if isinstance(notebooks, Path):
        notebooks = sorted(notebooks.glob("f*.md"))
    rows = []
    for path in notebooks:
        blocks = list(_blocks(Path(path).read_text(encoding="utf-8")))
        solved = {arg for kind, arg, _, _ in blocks if kind == "solution"}
        for kind, _, options, body in blocks:
            if kind != "exercise":
                continue
            label = options.get("label", "")
            first = re.split(r"(?<=[.?!])\s", " ".join(body.split()), maxsplit=1)[0]
            rows.append(
                {
                    "chapter": Path(path).stem,
                    "label": label,
                    "predict_first": bool(PREDICT.match(body)),
                    "needs_gpu": GPU_CLASS in options.get("class", "").split(),
                    "has_solution": bool(label) and label in solved,
                    "text": first,
                }
            )
    columns = ["chapter", "label", "predict_first", "needs_gpu", "has_solution", "text"]
    return pd.DataFrame(rows, columns=columns)


def exercise_section(table: pd.DataFrame) -> str:
    """The counts and one row per chapter (MyST markdown) for the teaching page."""
    if table.empty:
        return "No chapter has exercises yet.\n"
    n = len(table)
    lines = [
        f"The chapters hold {n} exercises: {int(table.has_solution.sum())} with a worked solution "
        f"(hidden until opened), {int(table.predict_first.sum())} that ask for a prediction first "
        f"and {int(table.needs_gpu.sum())} that need a GPU; the others run on a laptop CPU. "
        "This list is read from the chapters when the book is built.",
        "",
        "| chapter | exercises | with a solution | predict first | need a GPU |",
        "| --- | --- | --- | --- | --- |",
    ]
    for chapter, group in table.groupby("chapter", sort=True):
        gpu = group[group.needs_gpu]
        named = [f"{{ref}}`{label}`" for label in gpu.label if label]
        need = f"{len(gpu)}: " + ", ".join(named) if named else str(len(gpu))
        lines.append(
            f"| {{doc}}`../notebooks/{chapter}` | {len(group)} | {int(group.has_solution.sum())} | "
            f"{int(group.predict_first.sum())} | {need} |"
        )
    return "\n".join(lines) + "\n"


def stage_exercises(page: Path, notebooks: list[Path]) -> bool:
    """Replace the :data:`MARKER` line of a staged page with :func:`exercise_section` of the
    notebooks the book includes. Returns False (the page unchanged) when the page has no marker."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    if MARKER not in lines:
        return False
    at = lines.index(MARKER)
    section = exercise_section(exercises(notebooks)).splitlines()
    page.write_text("\n".join([*lines[:at], *section, *lines[at + 1 :]]) + "\n", encoding="utf-8")
    return True
