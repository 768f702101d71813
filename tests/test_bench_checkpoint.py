"""bench/bench_checkpoint.py times a chapter's measurements both ways, alternating, each from a
fresh copy of a cache that holds only the chapter's models, and writes the ratio of the medians.
Tested with a fake run: the real bench takes half an hour."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/bench_checkpoint.py")


def test_both_ways_alternate_from_fresh_caches_and_the_ratio_is_of_the_medians(bench, tmp_path, monkeypatch):
    def prepare(short, cache):
        (cache / "zoo").mkdir(parents=True)
        (cache / "zoo" / "model.bin").write_text("weights")

    runs = []

    def timed(cmd, env):
        cache = Path(env["COUPLING_CACHE"])
        assert sorted(p.name for p in cache.iterdir()) == ["zoo"]  # only the models, every time
        (cache / "f04").mkdir()  # what a measurement leaves behind
        seconds = float(cmd[-1])
        runs.append((cmd[-2], seconds))
        took = {0.0: [30.0, 50.0], 10.0: [20.0, 20.0]}[seconds][sum(1 for _, s in runs if s == seconds) - 1]
        return {"seconds": took, "cpu_seconds": took, "peak_rss_mib": 100, "other_cpu_seconds": 0.0,
                "other_cpu_share": 0.0, "status": "ok"}  # fmt: skip

    monkeypatch.setattr(bench, "prepare_models", prepare)
    monkeypatch.setattr(bench, "timed_run", timed)
    out = tmp_path / "checkpoint.csv"
    assert bench.main(["--chapters", "f04", "--out", str(out)]) == 0
    assert runs == [("f04_vision_transformers", s) for s in (0.0, 10.0, 0.0, 10.0)]
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [r["checkpoint_seconds"] for r in rows] == ["0.0", "10.0", "0.0", "10.0"]
    assert {r["ratio"] for r in rows} == {"2.0"}  # median 40 s written over median 20 s held
    assert list(rows[0]) == bench.COLUMNS
    assert rows[0]["command"] == "python bench/bench_checkpoint.py --chapters f04"


@pytest.mark.parametrize("args", [["--chapters", "f09"], ["--repeats", "0"]])
def test_bad_arguments_exit_2_naming_them(bench, args, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(args)
    assert stop.value.code == 2
    assert ("f09" if "f09" in args else "--repeats must be 1 or more") in capsys.readouterr().err
