"""How long ``make book`` takes on a clean clone, the first time and the second, on this machine.

The running page's sentence about the whole book comes from the table this writes,
``data/benchmarks/book_builds.csv``; each chapter's own cost is ``bench/bench_chapters.py``'s.

    python bench/bench_book.py              # cold, then warm
    python bench/bench_book.py --keep DIR   # leave the clone and its cache in DIR

It clones this checkout's ``HEAD`` into a temporary folder (uncommitted changes are not in the
clone: the rows record the clone's commit) and times two runs of ``make book`` there, offline,
each under ``bench_chapters.timed_run`` (wall and CPU time, largest process, and the CPU time
other processes used meanwhile):

- ``cold``: the clone's first ``make book``: its own ``make venv`` (pip, from whatever index or
  wheel cache pip is configured with) and an empty ``COUPLING_CACHE``, so every embedded model is
  built or trained and every notebook measures (a reader's first run);
- ``warm``: ``make book`` again in the same clone, everything cached (a rebuild).

Each row also records the chapters' plans (``plans``: ``book_times.book_plans``, a hash of every
chapter's plan), so the page can say when the chapters' default parameters, or what they
measure, changed after the measurement. A state's new row replaces its old one, whatever its
load: the page says when a run was contended.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import commit  # noqa: E402
from bench_chapters import FACTS, TIMED, load_at_start, machine, timed_run, timed_words  # noqa: E402

STATES = ("cold", "warm")  # in the order they run: warm reuses the cold run's clone and cache
COLUMNS = ["state", *TIMED, "jobs", "plans", *FACTS]
TARGET = ROOT / "data" / "benchmarks" / "book_builds.csv"
JOBS = 2  # make book's default (the Makefile's JOBS)


def clone(into: Path) -> Path:
    """``git clone`` of this checkout's ``HEAD`` into ``into/clone`` (untimed)."""
    target = into / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True, capture_output=True)
    return target


def make_book(checkout: Path, cache: Path) -> dict:
    """One timed ``make book`` in ``checkout``, offline, with ``cache`` as its ``COUPLING_CACHE``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"COUPLING_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return timed_run(["make", "book", f"JOBS={JOBS}"], env, cwd=checkout)


def measure(states: list[str], workdir: Path, command: str) -> list[dict]:
    """The rows of ``states``, run one after the other in one clone under ``workdir``."""
    checkout, cache = clone(workdir), workdir / "cache"
    from coupling_utils.pipeline.book_times import book_plans

    facts = machine() | {"jobs": JOBS, "plans": book_plans(), "commit": commit(checkout)}
    rows = []
    for state in states:
        facts["load_at_start"] = load_at_start()
        row = {"state": state, **make_book(checkout, cache)}
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        rows.append(row | facts | {"date_utc": now, "command": command})
        print(f"make book, {state}: {timed_words(row)}", flush=True)
        if row["status"] != "ok":
            break  # a warm run after a failed cold one would measure a half-built book
    return rows


def write_rows(target: Path, new: list[dict]) -> None:
    """Replace the rows of ``new``'s states in the table at ``target`` (the others are kept), atomically."""
    old = []
    if target.is_file():
        with target.open(newline="", encoding="utf-8") as fh:
            old = list(csv.DictReader(fh))
    states = {r["state"] for r in new}
    rows = [r for r in old if r.get("state") not in states] + new
    rows.sort(key=lambda r: STATES.index(r["state"]) if r["state"] in STATES else len(STATES))
    from coupling_utils.files import atomic_path

    with atomic_path(target) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {target}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--states", nargs="*", default=list(STATES), help=f"from {STATES} (warm needs cold)")
    ap.add_argument("--out", default=str(TARGET))
    ap.add_argument("--keep", metavar="DIR", help="leave the clone and its cache in DIR (new or empty)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.states if s not in STATES]
    if unknown:
        ap.error(f"unknown states {unknown}; choose from {STATES}")
    if "warm" in args.states and "cold" not in args.states:
        ap.error("--states warm reruns the cold run's clone: give cold too")
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        ap.error(f"--keep {args.keep} is not empty; name a new or empty folder")
    states = [s for s in STATES if s in args.states]
    command = "python bench/bench_book.py"
    command += "" if states == list(STATES) else " --states " + " ".join(states)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        rows = measure(states, Path(args.keep), command)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="book-build-"))
        try:
            rows = measure(states, workdir, command)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    write_rows(Path(args.out), rows)
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
