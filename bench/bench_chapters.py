"""What each chapter costs on this machine at the default profile, in three states of the cache.

For the teaching page's course plans: each finding notebook is run alone with
``coupling-book run <chapter> --profile default --jobs 1``

- ``cold``: with an empty ``COUPLING_CACHE``, so the run builds or trains the embedded models it
  needs and measures them (a student's first run, nothing prepared);
- ``models``: with a cache that holds only the chapter's embedded models, built beforehand
  (untimed) by ``coupling-book zoo prepare``: the run measures everything (a class whose
  machines were prepared as the teaching page says);
- ``warm``: again with the cache the cold run filled, models and measurements (a rerun).

Each run is one
subprocess; its wall time, the CPU time of the process and its children (user + system: less
sensitive than wall time to other load on a shared machine) and the largest resident memory of
any of its processes are written to ``data/benchmarks/chapter_costs.csv`` with the machine's
description, the command, the commit of the code that ran (``_common.commit``) and the chapter's
plan (``teaching.chapter_plan``: a hash of its parameter values at the default profile and
of the keys of the measurement jobs they plan, so the book can tell times measured on an
earlier plan).
Offline: only the embedded models are used.

**Contention, per state.** The load average at a chapter's start (the ``load_at_start`` column:
the one-minute load average when its first state began, empty where not recorded) says
nothing about a process that starts competing for the cores later. So each timed state also
records ``other_cpu_seconds``: the CPU time that processes *other than the run's own tree* used
during it, read as the machine's busy clock ticks over the interval (``/proc/stat``'s aggregate
``cpu`` line, before and after: ``_common.cpu_jiffies``) minus the run's own CPU time (the
``RUSAGE_CHILDREN`` this script gains from the run: the wrapper and every process it reaped); and
``other_cpu_share``, that time over the machine's capacity in the interval (all cores' ticks).
Limits: the ticks are sampled (10 ms), so a few tenths of a second of "other" are noise (a
quiet run's value is clipped at 0); kernel threads, interrupts, a hypervisor's steal and this
script itself count as "other" (small, but never zero); a process of the run that escapes the
wrapper (double-forked and reparented above it) would count as "other" too; Linux only (elsewhere,
and in rows written before this column existed, the column is empty: "not recorded"). A state is
*contended* when the share is at least ``teaching.CONTENDED_SHARE`` (the pages say so).

**A quiet row is not replaced by a contended one.** A time measured under contention is too long
by an unknown amount, while the quiet row of the same chapter, state and plan is still right. So
such a row (share recorded and below the threshold, same plan) is kept when the new measurement
of it is contended or has no share recorded, with a warning on stderr and exit status 1;
``--force`` replaces it anyway. A row of another plan is always replaced (it is stale).

    python bench/bench_chapters.py                       # all six chapters, every state
    python bench/bench_chapters.py --chapters f00 f05    # some of them (the others' rows are kept)
    python bench/bench_chapters.py --states models       # one state (the other states' rows are kept)
    python bench/bench_chapters.py --chapters f02 --force  # replace quiet rows even if contended
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import commit, other_cpu, read_cpu_jiffies  # noqa: E402

CHAPTERS = ("f00", "f01", "f02", "f03", "f04", "f05")
STATES = ("cold", "models", "warm")  # in the order they run: warm reuses the cold run's cache
TIMED = ["seconds", "cpu_seconds", "peak_rss_mib", "other_cpu_seconds", "other_cpu_share", "status"]
"""The columns :func:`timed_run` fills."""
FACTS = ["machine", "load_at_start", "memory_gib", "torch", "coupling_utils", "commit", "date_utc", "command"]
"""The columns that say where, when and with what code a row was measured (:func:`machine` and the rest)."""
COLUMNS = ["chapter", "state", *TIMED, "profile", "plan", *FACTS]


def load_at_start() -> float | str:
    """The one-minute load average now, for the ``load_at_start`` column ("" where the platform
    has none: not recorded)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else ""


def machine() -> dict:
    """The machine's description (cores, CPU, no GPU: what stays the same from run to run), its
    memory and the library versions; the load, which changes, is :func:`load_at_start`."""
    import torch

    import coupling_utils
    from coupling_utils.provenance import cpu_name

    cpu = cpu_name()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "machine": f"{os.cpu_count()} CPU ({cpu}), no GPU",
        "memory_gib": round(memory, 1),
        "torch": torch.__version__,
        "coupling_utils": coupling_utils.__version__,
    }


def _env(cache: Path) -> dict:
    """The environment of a timed run: the notebook kernels' own (``execution.KERNEL_ENV``, so that a
    run outside a kernel is timed as the book's are; values already set win), offline, on ``cache``."""
    from coupling_utils.pipeline.execution import KERNEL_ENV

    return {
        **KERNEL_ENV,
        **os.environ,
        "COUPLING_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def prepare_models(chapter: str, cache: Path) -> None:
    """Build the embedded models ``chapter`` names at the default profile into ``cache`` (untimed),
    with ``coupling-book zoo prepare``, as the teaching page tells a teacher to."""
    from coupling_utils.pipeline.execution import _planned_values, embedded_models, find_notebooks

    (notebook,) = find_notebooks([chapter])
    names = [m.removeprefix("embedded:") for m in embedded_models(_planned_values(notebook, "default", None))]
    if names:
        cmd = [str(Path(sys.executable).parent / "coupling-book"), "zoo", "prepare", *names]
        subprocess.run(cmd, env=_env(cache), cwd=ROOT, check=True, capture_output=True, text=True)


# a fresh wrapper process per run, so that its children's peak memory is this run's alone; on Linux
# it adopts the run's orphans (prctl PR_SET_CHILD_SUBREAPER) and waits for them too, so a process
# that outlives its parent (as the notebook kernels once did) still counts
WRAPPER = (
    "import ctypes, json, os, resource, subprocess, sys, time; t = time.perf_counter()\n"
    "if sys.platform.startswith('linux'): ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
    "rc = subprocess.run(sys.argv[1:]).returncode; s = time.perf_counter() - t\n"
    "while True:\n"
    "    try: os.wait()\n"
    "    except ChildProcessError: break\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(json.dumps({'rc': rc, 'seconds': s, 'cpu': u.ru_utime + u.ru_stime, 'rss_kib': u.ru_maxrss}))"
)


def _children_cpu() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def timed_run(cmd: list[str], env: dict, stat=read_cpu_jiffies, cwd: Path = ROOT) -> dict:
    """Run ``cmd`` in ``cwd`` under :data:`WRAPPER`: its wall and CPU time, peak RSS, status, and the
    CPU time other processes used meanwhile (``stat``: a ``/proc/stat`` snapshot, see the module
    docstring)."""
    own_before = _children_cpu()  # the wrapper and all it reaps, as this process sees them
    before = stat()
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *cmd], env=env, cwd=cwd, capture_output=True, text=True
    )
    after = stat()
    own = _children_cpu() - own_before
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    if usage["rc"]:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    other, share = other_cpu(before, after, own)
    return {
        "seconds": round(usage["seconds"], 1),
        "cpu_seconds": round(usage["cpu"], 1),
        "peak_rss_mib": round(usage["rss_kib"] / 1024),  # the largest process of the run (KiB on Linux)
        "other_cpu_seconds": "" if math.isnan(other) else round(other, 1),  # "": not recorded
        "other_cpu_share": "" if math.isnan(share) else round(share, 3),
        "status": "ok" if usage["rc"] == 0 else f"failed (exit {usage['rc']})",
    }


def timed_words(row: dict) -> str:
    """One :func:`timed_run` result as the benchmarks print it while they run."""
    other = "?" if row["other_cpu_seconds"] == "" else row["other_cpu_seconds"]  # 0.0 is recorded
    return (
        f"{row['seconds']} s wall, {row['cpu_seconds']} s CPU, {row['peak_rss_mib']} MiB peak, "
        f"other processes {other} s CPU, {row['status']}"
    )


def run(chapter: str, cache: Path, out: Path) -> dict:
    """One ``coupling-book run`` of ``chapter`` in a subprocess (:func:`timed_run`)."""
    env = _env(cache)
    cmd = [str(Path(sys.executable).parent / "coupling-book"), "run", chapter, "--profile", "default"]
    return timed_run(cmd + ["--jobs", "1", "--output-dir", str(out)], env)


def _quiet(row: dict) -> bool | None:
    """Whether a row was measured quietly (its share below the threshold); None: not recorded."""
    from coupling_utils.pipeline.teaching import CONTENDED_SHARE

    value = row.get("other_cpu_share")
    try:
        share = math.nan if value in (None, "") else float(value)
    except ValueError:
        return None
    return None if math.isnan(share) else share < CONTENDED_SHARE


def merge_rows(old: list[dict], new: list[dict], force: bool = False) -> tuple[list[dict], list[dict]]:
    """``(rows, refused)``: ``old`` with each of ``new`` in place of the row of its chapter and
    state, except (without ``force``) where the old row is quiet, of the same plan, and the new one
    is not known to be quiet: that old row stays and the new one is ``refused``."""
    by_key = {(r["chapter"], r["state"]): {"plan": "", **r} for r in old}
    refused = []
    for row in new:
        kept = by_key.get((row["chapter"], row["state"]))
        if not force and kept and _quiet(kept) and not _quiet(row) and kept["plan"] == row["plan"]:
            refused.append(row)
            continue
        by_key[(row["chapter"], row["state"])] = row
    order = lambda r: (CHAPTERS.index(r["chapter"]), STATES.index(r["state"]))  # noqa: E731
    return sorted(by_key.values(), key=order), refused


def measure_chapter(chapter: str, states: list[str], tmp: Path, command: str) -> list[dict]:
    """The rows of one chapter's ``states``, each run in its own cache under ``tmp``."""
    from coupling_utils.pipeline.teaching import chapter_plan

    rows = []
    facts = machine() | {"load_at_start": load_at_start(), "commit": commit()}
    plan = chapter_plan(chapter)  # what was measured: the chapter's plan today
    for state in states:
        name = "models" if state == "models" else "cold"  # warm reruns the cold run's cache
        cache, out = tmp / f"cache-{chapter}-{name}", tmp / f"runs-{chapter}-{name}"
        if state == "models":
            prepare_models(chapter, cache)
        row = {"chapter": chapter, "state": state, **run(chapter, cache, out), "profile": "default"}
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        rows.append(row | {"plan": plan, **facts, "date_utc": now, "command": command})
        print(f"{chapter} {state}: {timed_words(row)}", flush=True)
    for name in ("cold", "models"):
        shutil.rmtree(tmp / f"cache-{chapter}-{name}", ignore_errors=True)
    return rows


def write_rows(target: Path, new: list[dict], force: bool) -> list[dict]:
    """Merge ``new`` into the table at ``target`` (:func:`merge_rows`) and write it atomically;
    returns the refused rows, each named on stderr."""
    old = []
    if target.is_file():  # keep the rows not rerun, each with its own command and date
        with target.open(newline="", encoding="utf-8") as fh:
            old = list(csv.DictReader(fh))
    rows, refused = merge_rows(old, new, force)
    for r in refused:
        share = "an unrecorded share" if r["other_cpu_share"] == "" else f"{float(r['other_cpu_share']):.0%}"
        print(
            f"WARNING: kept the quiet row of {r['chapter']} {r['state']} (same plan): the new run was "
            f"measured while other processes used {share} of the CPU "
            f"({r['seconds']} s wall, not written); rerun on a quiet machine, or --force to replace it",
            file=sys.stderr,
        )
    from coupling_utils.files import atomic_path

    with atomic_path(target) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)  # old rows lack the new columns: "" (not recorded)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {target}")
    return refused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chapters", nargs="*", default=list(CHAPTERS), help=f"from {CHAPTERS}")
    ap.add_argument("--states", nargs="*", default=list(STATES), help=f"from {STATES} (warm needs cold)")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks" / "chapter_costs.csv"))
    ap.add_argument("--force", action="store_true", help="replace quiet rows even by contended runs")
    args = ap.parse_args(argv)
    unknown = [c for c in args.chapters if c not in CHAPTERS] + [s for s in args.states if s not in STATES]
    if unknown:
        ap.error(f"unknown chapters or states {unknown}; choose from {CHAPTERS} and {STATES}")
    if "warm" in args.states and "cold" not in args.states:
        ap.error("--states warm reruns the cold run's cache: give cold too")
    states = [s for s in STATES if s in args.states]
    command = "python bench/bench_chapters.py" + (
        "" if args.chapters == list(CHAPTERS) else " --chapters " + " ".join(args.chapters)
    )
    command += "" if states == list(STATES) else " --states " + " ".join(states)
    command += " --force" if args.force else ""
    rows = []
    with tempfile.TemporaryDirectory(prefix="chapter-costs-") as tmp:
        for chapter in args.chapters:
            rows += measure_chapter(chapter, states, Path(tmp), command)
    refused = write_rows(Path(args.out), rows, args.force)
    return 0 if all(r["status"] == "ok" for r in rows) and not refused else 1


if __name__ == "__main__":
    sys.exit(main())
