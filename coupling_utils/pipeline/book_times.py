"""How long a whole ``make book`` takes on a clean clone, in words for the running page, from
``bench/bench_book.py``'s table (``data/benchmarks/book_builds.csv``): the first time (``cold``:
its own venv, an empty model cache) and the second (``warm``), where and when they were measured,
and whether the chapters' default parameters, or what they measure, changed after the run.
Each chapter's own time is :mod:`coupling_utils.pipeline.teaching`'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from coupling_utils.pipeline.teaching import _about, current_plans, measured_how, replace_marker

__all__ = ["BOOK_TIMES_MARKER", "book_plans", "book_times", "stage_book_times"]

BOOK_TIMES_MARKER = "% book-times"  # the running page's whole `make book`, first and second time


def book_plans() -> str:
    """One hash of every chapter's plan today (:func:`current_plans`): what ``bench/bench_book.py``
    records with a whole book's time, so the page can tell when the chapters changed after it."""
    from coupling_utils.provenance import stable_hash

    return stable_hash(current_plans())


def book_times(builds: pd.DataFrame, plans: str | None = None) -> str:
    """How long a whole ``make book`` took on a clean clone, the first time (``cold``) and the
    second (``warm``), from ``bench/bench_book.py``'s table: where, when and at which commit
    (:func:`measured_how`), and, with ``plans`` (today's hash of every chapter's plan, as the
    benchmark records it), whether the chapters' default parameters, or what they measure,
    changed after the run."""
    need = {"state", "seconds", "status"}
    rows = builds[builds.status == "ok"] if need <= set(builds.columns) else builds[:0]
    said = {r.state: r for r in rows.itertuples()}
    if "cold" not in said:
        return "The time of a whole `make book` has not been measured yet (`python bench/bench_book.py`).\n"
    cold = said["cold"]
    jobs = int(cold.jobs) if "jobs" in rows.columns and pd.notna(cold.jobs) else None
    text = (
        f"The first `make book` on a clean clone took {_about(cold.seconds / 60)} ({cold.seconds:.0f} s: a "
        "fresh `git clone` with its own `make venv` and an empty model cache, `COUPLING_CACHE`"
        + (f"; the notebooks {jobs} at a time" if jobs else "")
        + ")"
    )
    if "warm" in said:
        warm = said["warm"].seconds
        text += f"; a second one, with everything cached, took {_about(warm / 60)} ({warm:.0f} s)"
    shown = rows[rows.state.isin(["cold", "warm"])].assign(chapter="`make book`")
    text += f". Measured {measured_how(shown)}."
    recorded = {str(p) for p in shown.get("plans", pd.Series(dtype=str)).dropna()}
    if plans and recorded != {plans}:
        text += (
            " The chapters' default parameters or what they measure have changed since"
            + (" (or were not recorded)" if not recorded else "")
            + ", so today's book may take longer or less: `python bench/bench_book.py` measures it again."
        )
    return text + "\n"


def stage_book_times(page: Path, builds_csv: Path) -> bool:
    """Replace the :data:`BOOK_TIMES_MARKER` line of a staged page with :func:`book_times`."""
    builds = pd.read_csv(builds_csv, dtype={"plans": str}) if Path(builds_csv).is_file() else pd.DataFrame()
    return replace_marker(page, BOOK_TIMES_MARKER, book_times(builds, plans=book_plans()))
