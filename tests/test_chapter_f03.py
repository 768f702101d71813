"""Chapter f03's module: its plan holds every panel the notebook measures (held-out windows
first, then the quiz prompts), and run() collects exactly that plan."""

from __future__ import annotations

import sys

import pytest

from coupling_utils.chapters import f03_training_emergence as f03
from coupling_utils.measurement import Options


def _params(**changes):
    values = {"models": ["org/run"], "revisions": ["step8", "step1"], "n_windows": 2, "window_tokens": 12,
              "max_tokens": 6, "k": [2, 4], "k_main": 2, **changes}  # fmt: skip
    return f03.Params.checked(values)


def test_jobs_hold_the_held_out_windows_and_the_quiz_prompts():
    p = _params()
    panels = f03.panel_jobs(p)
    assert list(panels) == [f03.MAIN, f03.QUIZ]
    windows, quiz = panels[f03.MAIN], panels[f03.QUIZ]
    assert [j.revision for j in windows] == ["step1", "step8"] == [j.revision for j in quiz]
    assert all(j.prompts == f03.windows(p) and j.settings["depth"].max_tokens == 12 for j in windows)
    assert all(j.prompts == f03.prompts(p) and j.settings["depth"].max_tokens == 6 for j in quiz)
    assert f03.jobs(p) == windows + quiz
    assert len({j.key for j in f03.jobs(p)}) == 4  # the panels are stored apart
    # no quiz panel when there is no prompt to measure; the windows are always measured
    alone = f03.jobs(_params(n_prompts=0, include_demo=False))
    assert alone == windows and f03.quiz_prompts(_params(n_prompts=0, include_demo=False)) is None


def test_run_collects_exactly_the_plan(monkeypatch, tmp_path):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p, seen = _params(), []
    home = sys.modules[f03.run.__module__]  # the module whose collect() run calls
    real = home.collect

    def spy(jobs, options=None, **kwargs):
        seen.extend(jobs)
        return real(jobs, options, **kwargs)

    monkeypatch.setattr(home, "collect", spy)
    with pytest.raises(RuntimeError, match="none of the runs"):  # nothing stored, nothing computed
        f03.run(p, Options(compute=False))
    assert seen == f03.jobs(p)


def test_search_levels_read_for_people():
    from coupling_utils.chapters.f03_training_emergence.story import _level

    assert [_level(v) for v in (163840.0, 1635840.0, 64.0, 0.003)] == ["163,840", "1,635,840", "64", "0.003"]


def _stub_results(steps: list[int]):
    """The least of a Results that the exercise numbers and the measured line read."""
    from types import SimpleNamespace

    import pandas as pd

    from coupling_utils.chapters.f03_training_emergence.story import MAIN

    rows = [
        {"panel": MAIN, "model": "m", "K": k, "step": s, "coupling": 0.1 + 0.01 * s}
        for k in (2, 4)
        for s in steps
    ]
    summary = pd.DataFrame(rows)
    levels = pd.DataFrame({"model": ["m", "m"], "K": [2, 4], "first": [0.1, 0.12]})
    return SimpleNamespace(
        params=SimpleNamespace(early_step=1), summary=summary, showcase="m", levels=levels, k_main=2
    )


def test_the_early_step_solution_reads_after_in_this_run():
    """The solution says "In this run {f03_ex_128}": not "In this run this run has ..."."""
    from pathlib import Path

    from coupling_utils.chapters.f03_training_emergence.story import _exercise_k

    notebook = (Path(__file__).resolve().parents[1] / "notebooks" / "f03_training_emergence.md").read_text()
    assert "In this run {glue:md}`f03_ex_128`." in notebook
    words = _exercise_k(_stub_results([0, 1, 4, 16]))["f03_ex_128"].data
    assert not words.startswith("this run") and "too few checkpoints from step 128 on" in words


def test_the_measured_line_counts_in_words():
    from coupling_utils.chapters.f03_training_emergence.results import Results

    line = Results.measured_line.fget(_stub_results([0, 1, 4, 16]))
    assert line == "4 checkpoints measured for 1 model; none missing"  # not "1 model(s)"
