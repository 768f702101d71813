"""bench/bench_book.py times ``make book`` twice in one clean clone and writes the rows the running
page's sentence is made from. Tested with the clone and the runs faked: the real bench takes
half an hour."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/bench_book.py")


@pytest.fixture
def fake(bench, monkeypatch, tmp_path):
    """bench_book.main with its clone and runs faked; ``calls`` records each run's checkout and cache,
    ``results`` the run results in order (one per ``make book``)."""
    from coupling_utils.pipeline import book_times

    calls, results = [], []

    def make_book(checkout, cache):
        calls.append((checkout, cache))
        return dict(results.pop(0))

    def clone(into):
        (into / "clone").mkdir(parents=True)
        return into / "clone"

    monkeypatch.setattr(bench, "make_book", make_book)
    monkeypatch.setattr(bench, "clone", clone)
    monkeypatch.setattr(bench, "commit", lambda repo: "abc123def456")
    monkeypatch.setattr(bench, "machine", lambda: {"machine": "2 CPU (X), no GPU", "memory_gib": 8})
    monkeypatch.setattr(bench, "load_at_start", lambda: 0.1)
    monkeypatch.setattr(book_times, "book_plans", lambda: "plans-a")
    return calls, results


def run_result(seconds: float, status: str = "ok") -> dict:
    return {"seconds": seconds, "cpu_seconds": seconds, "peak_rss_mib": 900, "other_cpu_seconds": 1.0,
            "other_cpu_share": 0.01, "status": status}  # fmt: skip


def _rows(path: Path) -> dict[str, dict]:
    with path.open(newline="") as fh:
        return {r["state"]: r for r in csv.DictReader(fh)}


def test_cold_then_warm_in_one_clone_and_cache(bench, fake, tmp_path):
    calls, results = fake
    results += [run_result(1500.0), run_result(180.0)]
    out = tmp_path / "builds.csv"
    assert bench.main(["--out", str(out), "--keep", str(tmp_path / "work")]) == 0
    assert len(calls) == 2 and calls[0] == calls[1], "warm must rerun the cold run's clone and cache"
    rows = _rows(out)
    assert [rows["cold"]["seconds"], rows["warm"]["seconds"]] == ["1500.0", "180.0"]
    assert {r["commit"] for r in rows.values()} == {"abc123def456"}  # the clone's commit, not the checkout's
    assert {r["plans"] for r in rows.values()} == {"plans-a"} and rows["cold"]["jobs"] == str(bench.JOBS)
    assert rows["cold"]["command"] == "python bench/bench_book.py"


def test_a_failed_cold_run_is_recorded_and_no_warm_run_follows(bench, fake, tmp_path):
    calls, results = fake
    out = tmp_path / "builds.csv"
    results += [run_result(1500.0), run_result(180.0)]
    assert bench.main(["--out", str(out)]) == 0
    results += [run_result(90.0, "failed (exit 2)")]
    assert bench.main(["--out", str(out)]) == 1
    assert len(calls) == 3, "a warm run after a failed cold one would time a half-built book"
    rows = _rows(out)
    assert rows["cold"]["status"] == "failed (exit 2)" and rows["warm"]["seconds"] == "180.0"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--states", "warm"], "give cold too"),
        (["--states", "hot"], "unknown states"),
        (["--keep", "{full}"], "is not empty"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(bench, fake, tmp_path, capsys, argv, message):
    calls, _ = fake
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    argv = [a.replace("{full}", str(tmp_path / "full")) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--out", str(tmp_path / "builds.csv")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err and not calls


def test_the_shipped_table_is_one_the_page_can_read():
    """data/benchmarks/book_builds.csv holds a successful cold run with the columns the page reads."""
    import pandas as pd

    from coupling_utils.pipeline import book_times

    shipped = pd.read_csv(ROOT / "data" / "benchmarks" / "book_builds.csv", dtype={"plans": str})
    assert set(shipped.columns) >= {"state", "seconds", "status", "jobs", "plans", "commit", "machine"}
    assert (shipped[shipped.state == "cold"].status == "ok").any()
    assert book_times.book_times(shipped).startswith("The first `make book` on a clean clone took ")


def test_the_readme_quotes_the_shipped_table():
    """The README (read on GitHub, not built) types the whole book's time; it must be the table's
    (the page's sentence is made from it): rerunning the benchmark fails this test until the
    README says what it measured."""
    import re

    import pandas as pd

    shipped = pd.read_csv(ROOT / "data" / "benchmarks" / "book_builds.csv", dtype={"commit": str})
    ok = {r.state: r for r in shipped[shipped.status == "ok"].itertuples()}
    readme = " ".join((ROOT / "README.md").read_text().split())
    cold = re.search(
        r"the first `make book` on a clean clone took about (\d+) min \((\d+) s, measured at `(\w+)`", readme
    )
    warm = re.search(r"with everything cached, took about (\d+) min \((\d+) s", readme)
    assert cold and warm, "the README no longer says how long `make book` took"
    assert (int(cold[2]), cold[3]) == (round(ok["cold"].seconds), ok["cold"].commit[:7])
    assert int(cold[1]) == round(ok["cold"].seconds / 60) and int(warm[2]) == round(ok["warm"].seconds)
    assert int(warm[1]) == round(ok["warm"].seconds / 60)
