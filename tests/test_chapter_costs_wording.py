"""The teaching page and the chapters' time lines say what the measured chapter costs are: the
machine or machines, the dates and runs they come from, and whether other processes competed for
the CPU (contended, quiet, or not recorded), never one quiet machine's measurement by default."""

from __future__ import annotations

import pandas as pd

from coupling_utils.pipeline import book_times, teaching

MACHINE = "2 CPU (Xeon), no GPU"


def costs(**changes) -> pd.DataFrame:
    """Every lab chapter in every state, one run on one quiet 2-core machine; ``changes`` by column."""
    rows = [
        {"chapter": c, "state": s, "seconds": 60.0, "cpu_seconds": 60.0, "status": "ok", "plan": "p",
         "machine": MACHINE, "load_at_start": 0.5, "date_utc": "2026-12-04 10:00", "command": "python bench",
         "other_cpu_share": 0.01}
        for c in ("f00", "f01", "f05") for s in ("cold", "models", "warm")
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    for column, values in changes.items():
        df[column] = values
    return df


def test_one_quiet_run_on_one_machine_is_said_to_be_so():
    text = teaching.costs_summary(costs())
    assert "measured on a 2-core CPU (Xeon, no GPU) on 2026-12-04, in one run of the benchmark" in text
    assert "9 of the 9 timed chapter runs were quiet (others used under 10% of the CPU)" in text
    assert "different machines" not in text and "likely too long" not in text


def test_rows_of_different_machines_and_runs_are_said_to_be():
    four = ["4 CPU (Epyc), no GPU"] * 3 + [MACHINE] * 6
    dates = ["2026-12-05 09:00"] * 3 + ["2026-12-04 10:00"] * 6
    text = teaching.costs_summary(costs(machine=four, date_utc=dates))
    assert "on 2 different machines (a 2-core CPU (Xeon, no GPU); a 4-core CPU (Epyc, no GPU))" in text
    assert "whose times do not add up to one machine's" in text
    assert "from 2026-12-04 to 2026-12-05, in 2 separate runs of the benchmark" in text
    plans = teaching.plans_summary(costs(machine=four, date_utc=dates))
    assert "These sums add up rows measured on 2 different machines" in plans
    line = teaching.chapter_time(costs(machine=four, date_utc=dates), "f00")
    # f00's rows only
    assert "measured on a 4-core CPU (Epyc, no GPU) on 2026-12-05, in one run of the benchmark" in line
    assert "2-core" not in line


def test_contended_rows_are_named_with_the_share_others_used():
    share = [0.01] * 4 + [0.35] + [0.01] * 4  # f01 models
    text = teaching.costs_summary(costs(other_cpu_share=share))
    assert "other processes used at least 10% of the CPU while f01 models (35%) ran" in text
    assert "that time is likely too long" in text and "8 of the 9 timed chapter runs were quiet" in text
    line = teaching.chapter_time(costs(other_cpu_share=share), "f01_depth_and_tokens")
    assert "while f01 models (35%) ran, so that time is likely too long" in line
    assert "likely too long" not in teaching.chapter_time(costs(other_cpu_share=share), "f00")


def test_rows_without_a_record_of_contention_say_so():
    old = costs().drop(columns="other_cpu_share")  # rows written before the column existed
    old["load_at_start"] = [0.7, 0.7, 0.7, 3.2, 3.2, 3.2, 1.0, 1.0, 1.0]
    text = teaching.costs_summary(old)
    assert "whether other processes competed for the CPU during the runs was not recorded" in text
    assert "(the load average when each chapter's runs began: 0.7 to 3.2), so a time may be too long" in text
    assert "at start" not in text  # the machine is named without its load
    assert "not recorded" in teaching.plans_summary(old) and "not recorded" in teaching.chapter_time(
        old, "f00"
    )
    partly = costs(other_cpu_share=[None] * 3 + [0.01] * 6)  # f00 measured before the column
    assert "for f00 cold, f00 models, f00 warm the competition for the CPU was not recorded" in (
        teaching.costs_summary(partly)
    )
    assert "6 of the 9 timed chapter runs were quiet" in teaching.costs_summary(partly)


def test_the_shipped_costs_name_the_machine_and_read_the_load_from_its_column():
    """data/benchmarks/chapter_costs.csv keeps the load average at start in ``load_at_start``,
    not in the machine's name, and records per run the CPU others used and the commit; the page's
    sentence names the machine once, the commit, and how many runs were quiet."""
    from pathlib import Path

    shipped = pd.read_csv(Path(__file__).resolve().parents[1] / "data" / "benchmarks" / "chapter_costs.csv")
    assert not shipped["machine"].str.contains("load").any()
    assert pd.to_numeric(shipped["load_at_start"]).notna().all()
    assert shipped["other_cpu_share"].notna().all() and shipped["commit"].notna().all()
    text = teaching.costs_summary(shipped)
    (machine,) = shipped["machine"].unique()
    assert f"measured on {teaching._cores(machine)}" in text and "different machines" not in text
    commits = sorted(shipped["commit"].unique())  # a chapter rerun alone later adds its own
    assert f"at commit{'s' if len(commits) > 1 else ''} {', '.join(f'`{c}`' for c in commits)}" in text
    quiet = int((shipped["other_cpu_share"] < teaching.CONTENDED_SHARE).sum())
    assert f"{quiet} of the {len(shipped)} timed chapter runs were quiet" in text


def test_a_load_not_recorded_is_not_said():
    """Rows without the column (or with it empty) give no load range, and no error."""
    text = teaching.costs_summary(costs(load_at_start=None).drop(columns="other_cpu_share"))
    assert "was not recorded, so a time may be too long" in text and "load average" not in text


def test_the_code_the_rows_ran_is_named_by_its_commit_where_recorded():
    """Rows that record their commit name it (identity by content, not a date); rows of two commits
    name both; rows written before the column existed name none."""
    one = teaching.costs_summary(costs(commit="9980053a1b2c"))
    assert "on 2026-12-04, in one run of the benchmark, at commit `9980053a1b2c`;" in one
    two = teaching.chapter_time(costs(commit=["aaaa"] * 2 + ["bbbb+changes"] + ["aaaa"] * 6), "f00")
    assert "at commits `aaaa`, `bbbb+changes`" in two
    assert "at commit" not in teaching.costs_summary(costs())


def test_the_running_page_says_the_default_profile_s_time_per_notebook_from_the_costs():
    """The profiles table once said "about a minute to a few minutes" per notebook at the `default`
    profile while the measured costs gave f04 about 9 minutes with its models built and about 17
    from an empty cache: the sentence below the table is now made from the costs, fastest and
    slowest chapter per state, and the table types no time for that profile."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    seconds = [30.0, 20.0, 10.0, 600.0, 300.0, 40.0, 50.0, 25.0, 15.0]  # f00, f01, f05 × cold, models, warm
    text = teaching.profile_times(costs(seconds=seconds))
    assert "from under a minute (f00) to about 5 min (f01) with its models built beforehand" in text
    assert "from under a minute (f00) to about 10 min (f01) from an empty cache, building its models" in text
    assert "under a minute rerun, its measurements cached." in text
    assert "measured on a 2-core CPU (Xeon, no GPU) on 2026-12-04, in one run of the benchmark" in text
    failed = teaching.profile_times(costs(status=["ok"] * 6 + ["failed"] * 3))
    assert "f05: no successful run at the `default` profile measured" in failed

    shipped = pd.read_csv(root / "data" / "benchmarks" / "chapter_costs.csv")
    text = teaching.profile_times(shipped)
    ok = shipped[(shipped.status == "ok") & (shipped.profile == "default")]
    for state, words in teaching.STATE_WORDS.items():
        by = ok[ok.state == state].groupby("chapter").seconds.min() / 60
        low, high = teaching._about(by.min()), teaching._about(by.max())
        want = low if low == high else f"from {low} ({by.idxmin()}) to {high} ({by.idxmax()})"
        assert f"{want} {words}" in text
    page = (root / "book" / "running.md").read_text()
    (row,) = [line for line in page.splitlines() if line.startswith("| `default` |")]
    assert "minute" not in row and "measured per chapter (below the table)" in row
    lines = page.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("| `paper` |"))
    assert teaching.PROFILE_TIMES_MARKER in lines[table_end + 1 : table_end + 3]


def builds(**changes) -> pd.DataFrame:
    """``bench/bench_book.py``'s two rows, one quiet run on one 2-core machine; ``changes`` by column."""
    rows = [
        {"state": s, "seconds": t, "cpu_seconds": t, "status": "ok", "jobs": 2, "plans": "p",
         "machine": MACHINE, "load_at_start": 0.2, "date_utc": "2026-12-07 09:00", "commit": "abc",
         "command": "python bench/bench_book.py", "other_cpu_share": 0.01}
        for s, t in (("cold", 1513.0), ("warm", 177.0))
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    for column, values in changes.items():
        df[column] = values
    return df


def test_the_whole_book_s_time_comes_from_the_benchmark_and_says_when_the_chapters_changed():
    """The running page typed "23 minutes (1384 s at 14a7a7d …; the chapters have grown since that
    commit)": the sentence is now made from ``bench/bench_book.py``'s table, and says so itself
    when the chapters' plans changed after the run."""
    text = book_times.book_times(builds(), plans="p")
    assert text.startswith("The first `make book` on a clean clone took about 25 min (1513 s: a fresh `git")
    assert "2 at a time); a second one, with everything cached, took about 3 min (177 s)." in text
    said = "Measured on a 2-core CPU (Xeon, no GPU) on 2026-12-07, in one run of the benchmark, at commit"
    assert said + " `abc`" in text
    assert "2 of the 2 timed chapter runs were quiet" in text and "changed since" not in text
    replanned = book_times.book_times(builds(), plans="q")
    assert "default parameters or what they measure have changed since, so" in replanned
    busy = book_times.book_times(builds(other_cpu_share=[0.3, 0.01]), plans="p")
    assert "while `make book` cold (30%) ran, so that time is likely too long" in busy
    cold_only = book_times.book_times(builds(status=["ok", "failed (exit 2)"]), plans="p")
    assert "second one" not in cold_only and "1 of the 1 timed chapter runs were quiet" in cold_only
    for missing in (pd.DataFrame(), builds(status=["failed (exit 2)", "ok"])):
        text = book_times.book_times(missing)
        assert text.startswith("The time of a whole `make book` has not been measured"), text
