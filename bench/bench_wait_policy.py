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

import csv
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_chapters import FACTS, TIMED  # noqa: E402
from bench_checkpoint import Way, bench_main  # noqa: E402

WAYS = {
    "OMP_WAIT_POLICY=PASSIVE (the kernels' setting until 2026-12-07)": Way(
        {"omp_wait_policy": "PASSIVE"}, env={"OMP_WAIT_POLICY": "PASSIVE"}
    ),
    "OpenMP's default (unset)": Way({"omp_wait_policy": ""}, env={"OMP_WAIT_POLICY": None}),
}
COLUMNS = ["chapter", "way", "omp_wait_policy", "repeat", *TIMED, "ratio", *FACTS]
DEFAULT = ["f04", "f03", "f01"]
RULE = (
    "the kernels stop setting PASSIVE if the ratio is at least 1.05 for one chapter and at least 0.95 "
    "for every chapter"
)


def ratios(path: Path) -> dict[str, float]:
    """Each chapter's ratio (median with PASSIVE over median with OpenMP's default) in a CSV of this
    bench's rows."""
    with Path(path).open(encoding="utf-8", newline="") as fh:
        return {row["chapter"]: float(row["ratio"]) for row in csv.DictReader(fh)}


def rule_met(by_chapter: Mapping[str, float]) -> bool:
    """Whether the ratios meet :data:`RULE` (fixed before the rows of ``fa0fb64`` were all seen)."""
    values = list(by_chapter.values())
    return bool(values) and max(values) >= 1.05 and min(values) >= 0.95


def verdict(by_chapter: Mapping[str, float]) -> str:
    """The rule, the ratios it read and whether they meet it, as a line."""
    read = ", ".join(f"{chapter} {ratio:.2f}" for chapter, ratio in by_chapter.items())
    return f"rule ({RULE}): {'met' if rule_met(by_chapter) else 'not met'} by the ratios {read}"


def main(argv=None) -> int:
    return bench_main(
        argv, name="wait_policy", doc=__doc__, ways=WAYS, columns=COLUMNS, default=DEFAULT,
        report=lambda path: verdict(ratios(path)),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
