"""bench/bench_chapters.py records, per timed state, the CPU time other processes used (from two
/proc/stat snapshots less the run's own CPU time), keeps older rows readable, and does not replace
a quiet row by a contended one unless --force. Tested with fake /proc/stat snapshots and a fake
run: the real bench takes an hour."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")


def _load(name: str):
    return load_script(f"bench/{name}.py")


@pytest.fixture(scope="module")
def common():
    return _load("_common")


@pytest.fixture(scope="module")
def bench():
    return _load("bench_chapters")


def stat(user, nice, system, idle, iowait=0, irq=0, softirq=0, steal=0) -> str:
    """A /proc/stat text: the aggregate line, a per-CPU line and others, as Linux writes them."""
    fields = f"{user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0"
    return f"cpu  {fields}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345 0 0\nctxt 999\nbtime 1700000000\n"


def test_busy_and_total_ticks_from_proc_stat(common):
    assert common.cpu_jiffies(stat(100, 10, 50, 800, 20, 5, 5, 10)) == (180, 1000)
    with pytest.raises(ValueError, match="no aggregate 'cpu' line"):
        common.cpu_jiffies("intr 1 2 3\n")


def test_other_processes_cpu_is_the_busy_ticks_less_the_runs_own(common):
    before = common.cpu_jiffies(stat(1000, 0, 200, 5000))
    after = common.cpu_jiffies(stat(1600, 0, 400, 5200))  # 800 busy ticks of 1000 over the interval
    other, share = common.other_cpu(before, after, own_cpu_seconds=5.0, hz=100)
    assert math.isclose(other, 3.0) and math.isclose(share, 0.3)  # 8 s busy, 5 s of them the run's
    quiet, zero = common.other_cpu(before, after, own_cpu_seconds=8.05, hz=100)  # tick rounding
    assert quiet == 0.0 and zero == 0.0
    assert all(math.isnan(x) for x in common.other_cpu(None, after, 1.0, hz=100))


def test_a_timed_run_records_the_other_processes_cpu(bench):
    """timed_run: the CPU that the fake /proc/stat says the machine spent, less the run's own
    (a tiny Python command), and the share of the interval's capacity; "" without /proc/stat."""
    snapshots = iter([(0, 0), (3 * HZ, 10 * HZ)])  # 3 s busy of 10 s of capacity
    row = bench.timed_run([sys.executable, "-c", "pass"], dict(os.environ), stat=lambda: next(snapshots))
    assert row["status"] == "ok" and 2.0 <= row["other_cpu_seconds"] <= 3.0
    assert math.isclose(row["other_cpu_share"], row["other_cpu_seconds"] / 10, abs_tol=0.006)
    blind = bench.timed_run([sys.executable, "-c", "pass"], dict(os.environ), stat=lambda: None)
    assert blind["other_cpu_seconds"] == "" and blind["other_cpu_share"] == ""


def _rows(path: Path) -> dict:
    with path.open(newline="") as fh:
        return {(r["chapter"], r["state"]): r for r in csv.DictReader(fh)}


@pytest.fixture
def fake(bench, monkeypatch):
    """bench_chapters.main with its runs faked: each run returns ``result`` (set by the test)."""
    from coupling_utils.pipeline import teaching

    result = {"seconds": 50.0, "cpu_seconds": 49.0, "peak_rss_mib": 900, "status": "ok"}
    monkeypatch.setattr(bench, "run", lambda chapter, cache, out: dict(result))
    monkeypatch.setattr(bench, "machine", lambda: {"machine": "2 CPU (X), no GPU"})
    monkeypatch.setattr(bench, "load_at_start", lambda: 0.1)
    monkeypatch.setattr(bench, "prepare_models", lambda chapter, cache: None)
    monkeypatch.setattr(teaching, "chapter_plan", lambda chapter: "plan-a")
    return result


OLD = (  # a row as written before the contention columns existed
    "chapter,state,seconds,cpu_seconds,peak_rss_mib,status,profile,plan,machine,memory_gib,torch,"
    "coupling_utils,date_utc,command\n"
    'f00,cold,30.0,30.0,800,ok,default,plan-a,"2 CPU (X), no GPU, load 0.5 at start",8,2,0.1,'
    "2026-12-04 10:00,python bench/bench_chapters.py\n"
)


def test_new_rows_carry_the_columns_and_old_rows_stay_readable(bench, fake, tmp_path):
    out = tmp_path / "costs.csv"
    out.write_text(OLD)
    fake |= {"other_cpu_seconds": 1.5, "other_cpu_share": 0.02}
    assert bench.main(["--chapters", "f01", "--states", "models", "--out", str(out)]) == 0
    rows = _rows(out)
    assert rows["f00", "cold"]["other_cpu_share"] == "" and rows["f00", "cold"]["seconds"] == "30.0"
    assert rows["f01", "models"]["other_cpu_share"] == "0.02" and rows["f01", "models"]["plan"] == "plan-a"
    assert rows["f01", "models"]["commit"] == bench.commit() != "" and rows["f00", "cold"]["commit"] == ""
    assert (
        rows["f01", "models"]["load_at_start"] == "0.1"
        and rows["f01", "models"]["machine"] == "2 CPU (X), no GPU"
    )


def test_the_machine_is_named_without_its_load(bench):
    """The load average changes from run to run: it has its own column, not a place in the name."""
    import os

    assert "load" not in bench.machine()["machine"] and "load_at_start" in bench.COLUMNS
    load = bench.load_at_start()
    assert load == "" if not hasattr(os, "getloadavg") else isinstance(load, float) and load >= 0


def test_a_quiet_row_is_kept_against_a_contended_rerun_unless_forced(bench, fake, tmp_path, capsys):
    out = tmp_path / "costs.csv"
    quiet = {"other_cpu_seconds": 0.2, "other_cpu_share": 0.01}
    fake |= quiet
    assert bench.main(["--chapters", "f01", "--states", "models", "--out", str(out)]) == 0
    fake |= {"seconds": 90.0, "other_cpu_seconds": 40.0, "other_cpu_share": 0.4}
    assert bench.main(["--chapters", "f01", "--states", "models", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "WARNING: kept the quiet row of f01 models" in err and "40%" in err and "--force" in err
    assert _rows(out)["f01", "models"]["seconds"] == "50.0"  # the quiet measurement stays
    assert bench.main(["--chapters", "f01", "--states", "models", "--force", "--out", str(out)]) == 0
    assert _rows(out)["f01", "models"]["seconds"] == "90.0"
    assert _rows(out)["f01", "models"]["command"].endswith("--force")


def test_a_quiet_row_of_an_earlier_plan_is_replaced(bench, fake, tmp_path, monkeypatch):
    from coupling_utils.pipeline import teaching

    out = tmp_path / "costs.csv"
    fake |= {"other_cpu_seconds": 0.2, "other_cpu_share": 0.01}
    assert bench.main(["--chapters", "f01", "--states", "models", "--out", str(out)]) == 0
    monkeypatch.setattr(teaching, "chapter_plan", lambda chapter: "plan-b")  # the chapter changed since
    fake |= {"seconds": 90.0, "other_cpu_seconds": 40.0, "other_cpu_share": 0.4}
    assert bench.main(["--chapters", "f01", "--states", "models", "--out", str(out)]) == 0
    assert _rows(out)["f01", "models"]["plan"] == "plan-b"


def test_every_benchmark_row_records_the_commit_it_ran(common, tmp_path):
    """``commit``: the checkout's HEAD, marked when tracked files other than the benchmarks' results
    differ from it; ``unknown``
    outside a git checkout (a copied tree, as on a lent GPU machine without ``.git``)."""
    import subprocess

    assert common.commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "data" / "benchmarks").mkdir(parents=True)
    (tmp_path / "data" / "benchmarks" / "costs.csv").write_text("a\n1\n")
    subprocess.run([*git, "add", "a.txt", "data"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    assert common.commit(tmp_path) == head[:12]
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert common.commit(tmp_path) == head[:12]
    (tmp_path / "data" / "benchmarks" / "costs.csv").write_text("a\n2\n")  # an earlier benchmark's rows
    assert common.commit(tmp_path) == head[:12]
    (tmp_path / "a.txt").write_text("two\n")
    assert common.commit(tmp_path) == head[:12] + "+changes"
    assert common.provenance("python bench/x.py")["commit"] == common.commit()


def test_a_timed_run_has_the_notebook_kernels_environment_offline_on_its_cache(bench, monkeypatch, tmp_path):
    """Both benchmarks time their runs in ``_env``: the kernels' settings, so that a run outside a
    kernel is timed as the book's are, a value the user set winning; OpenMP's wait policy left at its
    default, as the kernels leave it (bench_wait_policy.py measured why)."""
    from coupling_utils.pipeline.execution import KERNEL_ENV

    for key in KERNEL_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "0")
    env = bench._env(tmp_path)
    assert "OMP_WAIT_POLICY" not in KERNEL_ENV
    assert env.get("OMP_WAIT_POLICY") == os.environ.get("OMP_WAIT_POLICY")
    assert env["TQDM_DISABLE"] == "0"
    assert {k: env[k] for k in KERNEL_ENV if k != "TQDM_DISABLE"} == {
        k: v for k, v in KERNEL_ENV.items() if k != "TQDM_DISABLE"
    }
    assert (env["COUPLING_CACHE"], env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"]) == (
        str(tmp_path),
        "1",
        "1",
    )
