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
description, the command and the chapter's plan (``teaching.chapter_plan``: a hash of its
parameter values at the default profile, so the book can tell times measured on an earlier plan).
Offline: only the embedded models are used.

    python bench/bench_chapters.py                       # all six chapters, every state
    python bench/bench_chapters.py --chapters f00 f05    # some of them (the others' rows are kept)
    python bench/bench_chapters.py --states models       # one state (the other states' rows are kept)
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ("f00", "f01", "f02", "f03", "f04", "f05")
STATES = ("cold", "models", "warm")  # in the order they run: warm reuses the cold run's cache
COLUMNS = [
    "chapter",
    "state",
    "seconds",
    "cpu_seconds",
    "peak_rss_mib",
    "status",
    "profile",
    "plan",
    "machine",
    "memory_gib",
    "torch",
    "coupling_utils",
    "date_utc",
    "command",
]


def machine() -> dict:
    import torch

    import coupling_utils
    from coupling_utils.provenance import cpu_name

    cpu = cpu_name()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "machine": f"{os.cpu_count()} CPU ({cpu}), no GPU, load {os.getloadavg()[0]:.1f} at start",
        "memory_gib": round(memory, 1),
        "torch": torch.__version__,
        "coupling_utils": coupling_utils.__version__,
    }


def _env(cache: Path) -> dict:
    return dict(os.environ, COUPLING_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def prepare_models(chapter: str, cache: Path) -> None:
    """Build the embedded models ``chapter`` names at the default profile into ``cache`` (untimed),
    with ``coupling-book zoo prepare``, as the teaching page tells a teacher to."""
    from coupling_utils.pipeline.execution import _planned_values, embedded_models, find_notebooks

    (notebook,) = find_notebooks([chapter])
    names = [m.removeprefix("embedded:") for m in embedded_models(_planned_values(notebook, "default", None))]
    if names:
        cmd = [str(Path(sys.executable).parent / "coupling-book"), "zoo", "prepare", *names]
        subprocess.run(cmd, env=_env(cache), cwd=ROOT, check=True, capture_output=True, text=True)


def run(chapter: str, cache: Path, out: Path) -> dict:
    """One ``coupling-book run`` of ``chapter`` in a subprocess; its wall and CPU time, peak RSS."""
    env = _env(cache)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cmd = [str(Path(sys.executable).parent / "coupling-book"), "run", chapter, "--profile", "default"]
    cmd += ["--jobs", "1", "--output-dir", str(out)]
    # a fresh wrapper process per run, so that its children's peak memory is this run's alone; on
    # Linux it adopts the run's orphans (prctl PR_SET_CHILD_SUBREAPER) and waits for them too, so a
    # process that outlives its parent (as the notebook kernels once did) still counts
    wrapper = (
        "import ctypes, json, os, resource, subprocess, sys, time; t = time.perf_counter()\n"
        "if sys.platform.startswith('linux'): ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
        "rc = subprocess.run(sys.argv[1:]).returncode; s = time.perf_counter() - t\n"
        "while True:\n"
        "    try: os.wait()\n"
        "    except ChildProcessError: break\n"
        "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
        "print(json.dumps({'rc': rc, 'seconds': s, 'cpu': u.ru_utime + u.ru_stime, 'rss_kib': u.ru_maxrss}))"
    )
    wrapped = [sys.executable, "-c", wrapper, *cmd]
    done = subprocess.run(wrapped, env=env, cwd=ROOT, capture_output=True, text=True)
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    done.returncode = usage["rc"]
    seconds, cpu = usage["seconds"], usage["cpu"]
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    return {
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_mib": round(usage["rss_kib"] / 1024),  # the largest process of the run (KiB on Linux)
        "status": "ok" if done.returncode == 0 else f"failed (exit {done.returncode})",
    }


def main(argv=None) -> int:
    from coupling_utils.pipeline.teaching import chapter_plan

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chapters", nargs="*", default=list(CHAPTERS), help=f"from {CHAPTERS}")
    ap.add_argument("--states", nargs="*", default=list(STATES), help=f"from {STATES} (warm needs cold)")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks" / "chapter_costs.csv"))
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
    rows = []
    with tempfile.TemporaryDirectory(prefix="chapter-costs-") as tmp:
        for chapter in args.chapters:
            facts = machine()
            plan = chapter_plan(chapter)  # what was measured: the chapter's plan today
            for state in states:
                name = "models" if state == "models" else "cold"  # warm reruns the cold run's cache
                cache, out = Path(tmp) / f"cache-{chapter}-{name}", Path(tmp) / f"runs-{chapter}-{name}"
                if state == "models":
                    prepare_models(chapter, cache)
                result = run(chapter, cache, out)
                row = {
                    "chapter": chapter,
                    "state": state,
                    **result,
                    "profile": "default",
                    "plan": plan,
                    **facts,
                }
                now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
                row |= {"date_utc": now, "command": command}
                rows.append(row)
                print(
                    f"{chapter} {state}: {row['seconds']} s wall, {row['cpu_seconds']} s CPU, "
                    f"{row['peak_rss_mib']} MiB peak, {row['status']}",
                    flush=True,
                )
            for name in ("cold", "models"):
                shutil.rmtree(Path(tmp) / f"cache-{chapter}-{name}", ignore_errors=True)
    target = Path(args.out)
    if target.is_file():  # keep the rows not rerun, each with its own command and date
        with target.open(newline="", encoding="utf-8") as fh:
            kept = [
                {"plan": "", **r}
                for r in csv.DictReader(fh)
                if not (r["chapter"] in args.chapters and r["state"] in states)
            ]
        rows = sorted(kept + rows, key=lambda r: (CHAPTERS.index(r["chapter"]), STATES.index(r["state"])))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".tmp")
    with tmp_target.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    tmp_target.replace(target)
    print(f"wrote {target}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
