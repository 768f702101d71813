"""Every finished layer and prompt written at once, against both held in memory between
checkpoints: a chapter's measurements timed both ways, side by side, in one run.

A measurement writes each finished (prompt, layer), and each finished prompt's tables, to disk so
that a killed run resumes from them (``measurement.store``, ``measurement.finished``). For a small
model a layer takes milliseconds and its files (arrays, Parquet tables, marker) cost as much
again, and so do a prompt's tables; so the default :class:`Options` holds finished layers and
prompts in memory and writes them at most every ``checkpoint_seconds`` (10 s;
``measurement.store.HeldLayers``, ``measurement.finished.FinishedPrompts``, finished prompts as one
batch). For each chapter (default: f04 and f03, whose models are small), its embedded models are
built first (untimed, ``coupling-book zoo prepare``); then its measurements,
``<chapter>.run(Params())`` at the default profile from a cache holding only the models, run in a
subprocess ``--repeats`` times each way, alternating: ``Options(checkpoint_seconds=0)`` (every
layer and every prompt written when done, each prompt as its own batch) and ``Options()``. The
tables are the same either way (``tests/test_measure.py``); only the time differs. Rows go to
``data/benchmarks/checkpoint.csv``; the ratio printed is the median time written-at-once over the
median time held. Offline: only the embedded models are used.

    python bench/bench_checkpoint.py                      # f04 and f03, twice each way
    python bench/bench_checkpoint.py --chapters f01 --repeats 1
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import commit  # noqa: E402
from bench_chapters import (  # noqa: E402
    FACTS,
    TIMED,
    _env,
    load_at_start,
    machine,
    prepare_models,
    timed_run,
    timed_words,
)

from coupling_utils.chapters import NAMES  # noqa: E402

CHAPTERS = {name[:3]: name for name in NAMES}  # "f04" -> "f04_vision_transformers"


@dataclass(frozen=True)
class Way:
    """One way of running a chapter's measurements: ``Options(checkpoint_seconds=...)`` and
    environment variables set (a value) or unset (None) on top of the kernels' (``_env``);
    ``columns``: what its CSV rows say of it."""

    columns: dict
    checkpoint_seconds: float = 10.0
    env: dict = field(default_factory=dict)


WAYS = {
    "every layer and prompt written (checkpoint_seconds=0)": Way({"checkpoint_seconds": 0.0}, 0.0),
    "held (checkpoint_seconds=10, the default)": Way({"checkpoint_seconds": 10.0}, 10.0),
}
COLUMNS = ["chapter", "way", "checkpoint_seconds", "repeat", *TIMED, "ratio", *FACTS]
MEASURE = (
    "import sys\nfrom coupling_utils.chapters import chapter\n"
    "from coupling_utils.measurement import Options\n"
    "m = chapter(sys.argv[1]); m.run(m.Params(), Options(checkpoint_seconds=float(sys.argv[2])))"
)


def measure_chapter(
    short: str, repeats: int, tmp: Path, ways: dict[str, Way] = WAYS, models_from: Path | None = None
) -> list[dict]:
    """The rows of one chapter: its measurements timed each way ``repeats`` times, alternating,
    each from a copy of a cache that holds only the chapter's models (built here, or the ``zoo``
    and ``corpus`` of the cache ``models_from``, linked); ``ratio``: the first way's median over
    the second's."""
    models = tmp / f"models-{short}"
    if models_from is None:
        prepare_models(short, models)
    else:  # the built models and the corpus they tokenise with, not a chapter's measurements
        models.mkdir(parents=True)
        for name in ("zoo", "corpus"):
            if (Path(models_from) / name).exists():
                (models / name).symlink_to(Path(models_from).resolve() / name)
    rows = []
    for repeat in range(1, repeats + 1):
        for name, way in ways.items():
            cache = tmp / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(models, cache, symlinks=True)
            env = {k: v for k, v in (_env(cache) | way.env).items() if v is not None}
            cmd = [sys.executable, "-c", MEASURE, CHAPTERS[short], str(way.checkpoint_seconds)]
            row = timed_run(cmd, env)
            rows.append({"chapter": short, "way": name, **way.columns, "repeat": repeat} | row)
            print(f"{short} {name}, run {repeat}: {timed_words(row)}", flush=True)
    shutil.rmtree(tmp / "cache", ignore_errors=True)
    shutil.rmtree(models, ignore_errors=True)
    first, second = (statistics.median(r["seconds"] for r in rows if r["way"] == name) for name in ways)
    for r in rows:
        r["ratio"] = round(first / second, 2)
    said = ", ".join(f"{name} {t:.1f} s" for name, t in zip(ways, (first, second)))
    print(f"{short}: {said} (medians of {repeats}): {first / second:.2f}×")
    return rows


def bench_main(
    argv,
    *,
    name: str,
    doc: str,
    ways: dict[str, Way],
    columns: list[str],
    default: list[str],
    report: Callable[[Path], str] | None = None,
) -> int:
    """The command line of a bench that times chapters' measurements in ``ways`` (this one's and
    ``bench_wait_policy.py``'s): check the arguments (exit 2 naming a bad one), time each chapter,
    write the rows to ``data/benchmarks/<name>.csv`` (or ``--out``) as one file, then print
    ``report`` of that file (the bench's verdict, where it has a rule)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--chapters", nargs="*", default=default, help=f"from {sorted(CHAPTERS)}")
    ap.add_argument("--repeats", type=int, default=2, help="runs each way, alternating (default 2)")
    ap.add_argument("--models", default=None, help="a cache whose zoo holds the models already built")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks" / f"{name}.csv"))
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
        f"python bench/bench_{name}.py"
        + ("" if args.chapters == default else " --chapters " + " ".join(args.chapters))
        + ("" if args.repeats == 2 else f" --repeats {args.repeats}")
    )
    facts = machine() | {"load_at_start": load_at_start(), "commit": commit(), "command": command}
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        for short in args.chapters:
            rows += measure_chapter(short, args.repeats, Path(tmp), ways, args.models and Path(args.models))
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    from coupling_utils.files import atomic_path

    target = Path(args.out)
    with atomic_path(target) as out, out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(r | facts | {"date_utc": now} for r in rows)
    print(f"wrote {target}")
    if report is not None:
        print(report(target))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main(argv=None) -> int:
    default = ["f04", "f03"]
    return bench_main(argv, name="checkpoint", doc=__doc__, ways=WAYS, columns=COLUMNS, default=default)


if __name__ == "__main__":
    sys.exit(main())
