"""Idle OpenMP threads that sleep at once (``OMP_WAIT_POLICY=PASSIVE``) against OpenMP's own
default (spin a while, then sleep): a chapter's measurements timed both ways, side by side, in
one run.

The notebook kernels' environment (``pipeline.execution.KERNEL_ENV``) and the Makefile set PASSIVE
until this benchmark (rows of ``fa0fb64``), so that threads waiting for work would not take a
small or shared CPU from the threads that have it; they now leave it unset. A measurement of a
small model is a long chain of small operations, each one a parallel region: a thread that sleeps
between them has to be woken for the next. For each chapter (default: f04, f03 and f01), its
embedded models are built first (untimed, or linked from the cache ``--models``); then its
measurements, ``<chapter>.run(Params())`` at the default profile from a cache holding only the
models, run in a subprocess ``--repeats`` times each way, alternating, each in the kernels'
environment with ``OMP_WAIT_POLICY`` set to PASSIVE or unset. The tables are the same either way;
only the time differs. Rows go to ``data/benchmarks/wait_policy.csv``; the ratio printed is the
median time with PASSIVE over the median time with OpenMP's default. Offline: only the embedded
models are used.

    python bench/bench_wait_policy.py                     # f04, f03 and f01, twice each way
    python bench/bench_wait_policy.py --chapters f03 --repeats 1 --models ~/.cache/coupling
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import commit  # noqa: E402
from bench_chapters import FACTS, TIMED, load_at_start, machine  # noqa: E402
from bench_checkpoint import CHAPTERS, Way, measure_chapter  # noqa: E402

WAYS = {
    "OMP_WAIT_POLICY=PASSIVE (the kernels' setting until 2026-12-07)": Way(
        {"omp_wait_policy": "PASSIVE"}, env={"OMP_WAIT_POLICY": "PASSIVE"}
    ),
    "OpenMP's default (unset)": Way({"omp_wait_policy": ""}, env={"OMP_WAIT_POLICY": None}),
}
COLUMNS = ["chapter", "way", "omp_wait_policy", "repeat", *TIMED, "ratio", *FACTS]
DEFAULT = ["f04", "f03", "f01"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chapters", nargs="*", default=DEFAULT, help=f"from {sorted(CHAPTERS)}")
    ap.add_argument("--repeats", type=int, default=2, help="runs each way, alternating (default 2)")
    ap.add_argument("--models", default=None, help="a cache whose zoo holds the models already built")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks" / "wait_policy.csv"))
    args = ap.parse_args(argv)
    unknown = [c for c in args.chapters if c not in CHAPTERS]
    if unknown:
        ap.error(f"unknown chapters {unknown}: choose from {sorted(CHAPTERS)}")
    if args.repeats < 1:
        ap.error(f"--repeats must be 1 or more, got {args.repeats}")
    if args.models is not None and not (Path(args.models) / "zoo").is_dir():
        ap.error(
            f"--models {args.models} holds no zoo/ folder: give a cache whose models are built, "
            "or leave it out"
        )
    command = (
        "python bench/bench_wait_policy.py"
        + ("" if args.chapters == DEFAULT else " --chapters " + " ".join(args.chapters))
        + ("" if args.repeats == 2 else f" --repeats {args.repeats}")
    )
    facts = machine() | {"load_at_start": load_at_start(), "commit": commit(), "command": command}
    rows = []
    with tempfile.TemporaryDirectory(prefix="wait-policy-") as tmp:
        for short in args.chapters:
            rows += measure_chapter(short, args.repeats, Path(tmp), WAYS, args.models and Path(args.models))
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    from coupling_utils.files import atomic_path

    target = Path(args.out)
    with atomic_path(target) as out, out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(r | facts | {"date_utc": now} for r in rows)
    print(f"wrote {target}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
