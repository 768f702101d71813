"""Interrupted runs: Ctrl-C (SIGINT) stops with a short message and exit 130, SIGTERM (``kill``, a time
limit) likewise with exit 143 and said as SIGTERM, SIGKILL leaves what is stored; either way no
hidden half-written file stays, and a rerun continues from what was finished. Two measures into one
folder at once make one whole measurement."""

from __future__ import annotations

import json
import os
import signal
import time

import pandas as pd
import pytest

from coupling_utils.pipeline.cli import main

N_PROMPTS = 120  # enough that a fast CPU is still measuring when the signal comes


@pytest.fixture
def many_prompts(tmp_path):
    path = tmp_path / "many.json"
    path.write_text(
        json.dumps({f"q{i:02d}": [(7 * i + j) % 63 + 1 for j in range(12)] for i in range(N_PROMPTS)})
    )
    return path


def _args(model_dir, prompts, out):
    return ["measure", str(model_dir), "--prompts", str(prompts), "--k", "2", "--out", str(out)]


def _finished(out):
    """The markers of the finished prompts' batches (written at most every checkpoint interval)."""
    return sorted(out.glob("store/*/*/*/*/*/prompts/*/done.json"))  # no ** walk through work being removed


def _prompts_in(markers) -> int:
    return sum(len(json.loads(p.read_text())["prompts"]) for p in markers)


def _under_way(out) -> bool:
    """Whether the measure has started several prompts (finished ones are held in memory, and
    written at the checkpoint interval, on a signal it can catch, or at the end)."""
    return len(list(out.glob("store/*/*/*/*/*/_work/*/prompt.json"))) >= 3 or bool(_finished(out))


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["sigint", "sigterm", "sigkill"]
)
def test_an_interrupted_measure_resumes(sig, cli, model_dir, many_prompts, tmp_path):
    out = tmp_path / "o"
    proc = cli(*_args(model_dir, many_prompts, out), background=True)
    deadline = time.monotonic() + 600
    reniced = False
    while not _under_way(out) and proc.poll() is None and time.monotonic() < deadline:
        if not reniced and list(out.glob("store/**/settings.json")):
            # measuring has begun (its start-up ran at normal priority, so a saturated machine
            # cannot starve it): from now on at the lowest priority, so that on a busy machine the
            # measure, not this polling loop, waits for a core and the signal still comes mid-run
            os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
            reniced = True
        time.sleep(0.005)
    if proc.poll() is None and not _under_way(out):
        proc.kill()
        pytest.fail("no prompt was measured within 600 s: the machine is too busy for this test")
    proc.send_signal(sig)
    rc = proc.wait(timeout=120)
    err = proc.stderr.read()
    done = {p: p.stat().st_mtime_ns for p in _finished(out)}
    assert _prompts_in(done) < N_PROMPTS, "the measure ended before the signal; give it more prompts"
    if sig != signal.SIGKILL:  # the finished prompts held were written as it stopped
        assert _prompts_in(done) > 0
    if sig == signal.SIGINT:
        assert rc == 130 and "interrupted" in err and "Traceback" not in err, err
    if sig == signal.SIGTERM:  # was: killed at once, silently (rc -15)
        assert rc == 143 and "terminated: stopped on SIGTERM" in err and "Traceback" not in err, err
    if sig != signal.SIGKILL:
        assert not list(out.rglob(".*.tmp")), "a half-written file was left"
    assert not (out / "summary.csv").exists()
    assert main(_args(model_dir, many_prompts, out)) == 0  # continues
    assert {p: p.stat().st_mtime_ns for p in done} == done  # finished prompts were not measured again
    assert len(pd.read_csv(out / "prompts.csv")) == N_PROMPTS


def test_two_measures_into_one_folder_at_once(cli, model_dir, ids_file, tmp_path):
    """The second waits for the first's lock, then reads what it stored: one measurement, whole."""
    out = tmp_path / "o"
    procs = [cli(*_args(model_dir, ids_file, out), background=True) for _ in range(2)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert len(list(out.glob("store/**/provenance.json"))) == 1 and _prompts_in(_finished(out)) == 2
    depth = pd.read_csv(out / "depthwise.csv")
    assert sorted(depth.prompt.unique()) == ["a", "b"] and depth.notna().all().all()


def test_ctrl_c_in_a_notebook_leaves_no_hidden_file(tmp_path, monkeypatch):
    from coupling_utils.pipeline import execution

    def interrupted(source, running, values, kernel, root):
        running.write_text("{}")  # papermill has started writing the executed copy
        raise KeyboardInterrupt

    monkeypatch.setattr(execution, "_papermill", interrupted)
    nb = execution.find_notebooks(["f00"])[0]
    with pytest.raises(KeyboardInterrupt):
        execution.run_notebooks(["f00"], "smoke", output_dir=tmp_path, echo=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], f"left behind for {nb.stem}"
