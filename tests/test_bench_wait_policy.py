"""bench/bench_wait_policy.py times a chapter's measurements with idle OpenMP threads sleeping at
once (PASSIVE, the kernels' setting) and with OpenMP's default, alternating, each from a fresh copy
of a cache that holds only the chapter's models, and writes the ratio of the medians. Tested with
a fake run: the real bench takes most of an hour."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/bench_wait_policy.py")


def test_both_policies_alternate_in_the_kernels_environment_and_the_ratio_is_of_the_medians(
    bench, tmp_path, monkeypatch
):
    built = tmp_path / "built"
    (built / "zoo").mkdir(parents=True)
    (built / "zoo" / "model.bin").write_text("weights")
    runs = []

    def timed(cmd, env):
        cache = Path(env["COUPLING_CACHE"])
        assert sorted(p.name for p in cache.iterdir()) == ["zoo"]  # only the models, every time
        assert (cache / "zoo" / "model.bin").read_text() == "weights"  # linked from --models
        (cache / "f03").mkdir()  # what a measurement leaves behind
        policy = env.get("OMP_WAIT_POLICY")
        assert env["TQDM_DISABLE"] == "1" and cmd[-1] == "10.0"  # the kernels' environment, held layers
        runs.append(policy)
        took = {"PASSIVE": [30.0, 50.0], None: [20.0, 20.0]}[policy][runs.count(policy) - 1]
        return {"seconds": took, "cpu_seconds": took, "peak_rss_mib": 100, "other_cpu_seconds": 0.0,
                "other_cpu_share": 0.0, "status": "ok"}  # fmt: skip

    monkeypatch.setitem(bench.bench_main.__globals__, "timed_run", timed)  # bench_checkpoint's runs
    out = tmp_path / "wait_policy.csv"
    assert bench.main(["--chapters", "f03", "--models", str(built), "--out", str(out)]) == 0
    assert runs == ["PASSIVE", None, "PASSIVE", None]
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [r["omp_wait_policy"] for r in rows] == ["PASSIVE", "", "PASSIVE", ""]
    assert {r["ratio"] for r in rows} == {"2.0"}  # median 40 s with PASSIVE over median 20 s without
    assert (
        list(rows[0]) == bench.COLUMNS
        and rows[0]["command"] == "python bench/bench_wait_policy.py --chapters f03"
    )
    assert (built / "zoo" / "model.bin").exists()  # the linked models are left as they were


@pytest.mark.parametrize("args", [["--chapters", "f09"], ["--repeats", "0"], ["--models", "/nonexistent"]])
def test_bad_arguments_exit_2_naming_them(bench, args, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(args)
    assert stop.value.code == 2
    assert {"--chapters": "f09", "--repeats": "--repeats must be 1 or more", "--models": "holds no zoo/"}[
        args[0]
    ] in capsys.readouterr().err
