"""The intro page's generated bottom line and status chart, and the teaching page's exercise list."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from coupling_utils.analysis.display import chart_parts
from coupling_utils.pipeline import summary, teaching

ROOT = Path(__file__).resolve().parents[1]


def _rows() -> pd.DataFrame:
    rows = [
        ("f01_x", "f01 · Depth", "depth coupling", "clear", "0.08 vs 0.01", "yes", "measured"),
        ("f01_x", "f01 · Depth", "token coupling strong", "strong", 0.491, "partly", "measured"),
        ("f02_y", "f02 · General", "R² of the fit", 0.8, 0.801, "yes", "replot"),
        ("f02_y", "f02 · General", "family", "positive", -0.87, "no", "measured"),
    ]
    df = pd.DataFrame(rows, columns=["notebook", "title", "claim", "paper", "ours", "agree", "kind"])
    return df.assign(rule="yes if a > 1; otherwise no", note="", profile="default")


def test_bottom_line_counts_measured_claims_and_keeps_replots_apart():
    text = summary.bottom_line(_rows())
    assert "judged 3 of the paper's claims" in text
    assert "1 reproduced (yes), 1 partly and 1 not (no)" in text
    assert "1 more row redraws the paper's own digitised points" in text
    assert "- **family** (f02): this run measured -0.87." in text  # one line of reason per no
    assert "Partly: token coupling strong (f01)." in text
    assert "profile `default`" in text
    assert "No executed notebook" in summary.bottom_line(_rows().iloc[0:0])


def test_a_claim_not_reproduced_is_listed_with_the_values_its_rule_judged_and_their_intervals():
    """A verdict is given with its intervals: the bottom line quotes what the rule judged (the
    status row's "judged on ..."), not only the row's headline number."""
    from coupling_utils.analysis.verdicts import Interval, Rule, claim

    rho = Interval(-0.74, -0.97, 0.09, over="members")
    row = claim("family", paper="positive", rule=Rule(yes="rho > 0", partly="rho > 0"), values={"rho": rho},
                ours="Spearman ρ -0.74")  # fmt: skip
    df = pd.DataFrame([{**row, "notebook": "f02_y", "title": "f02 · General", "profile": "default"}])
    text = summary.bottom_line(df)
    assert (
        "- **family** (f02): this run measured Spearman ρ -0.74; "
        "judged on rho = -0.74 [-0.97, 0.09; 95% over members]." in text
    )


def test_a_row_of_an_older_run_is_quoted_without_its_old_note():
    """Executed notebooks of runs before d4a1313 carry "; a yes needs ..." after the judged
    values; a book built over them quotes the values alone, as for a new row."""
    rule = (
        "yes if rho > 0 (judged on rho = -0.74 [-0.97, 0.09; 95% over members]; a yes needs its "
        "condition over the whole of every interval: where only the estimates meet it, the verdict is partly)"
    )
    df = _rows().assign(rule=rule)
    quoted = "judged on rho = -0.74 [-0.97, 0.09; 95% over members]"
    assert f"- **family** (f02): this run measured -0.87; {quoted}.\n" in summary.bottom_line(df) + "\n"


def test_the_book_s_own_questions_are_not_counted_as_the_paper_s_claims():
    """A measured row that asks this book's own question (a contrast model the paper did not
    measure, an extension: chapters.own_claim) is not one of "the paper's claims" the bottom line
    counts, nor among the claims not reproduced; it is named apart with its verdict, and drawn
    as a circle, which the alt text and the caption say."""
    from coupling_utils.chapters import own_claim

    df = _rows()
    extra = {"notebook": "f01_x", "title": "f01 · Depth", "claim": own_claim("Contrast", "depth: minilm"),
             "paper": "no claim", "ours": "0.3", "agree": "no", "kind": "measured", "rule": "", "note": "",
             "profile": "default"}  # fmt: skip
    df = pd.concat([df, pd.DataFrame([extra])], ignore_index=True)
    text = summary.bottom_line(df)
    assert "judged 3 of the paper's claims" in text and "1 reproduced (yes), 1 partly and 1 not (no)" in text
    assert (
        "; 1 more row asks this book's own question, not the paper's claim, and is not counted among them "
        "(contrast: depth: minilm (f01), no)" in text
    )
    assert "- **Contrast" not in text  # not listed as a claim of the paper's not reproduced
    t = summary.tally(df)
    assert (t.judged, t.own, t.replots, t.squares) == (3, 1, 1, 5)
    assert "1 circle for this book's own questions, not the paper's claims" in summary.status_alt(t)
    assert "circles this book's own questions" in summary.status_caption(df)
    assert "circles" not in summary.status_caption(_rows())
    data = next(iter(summary.status_chart(df).to_dict()["datasets"].values()))
    assert [d["what"] for d in data if d["claim"] == extra["claim"]] == [summary.OWN_NAME]


def test_status_chart_draws_one_mark_per_claim_with_its_story():
    spec = summary.status_chart(_rows()).to_dict()
    data = next(iter(spec["datasets"].values()))
    assert len(data) == 4
    assert {d["chapter"] for d in data} == {"f01 · Depth", "f02 · General"}
    # within a chapter: measurements first, then yes, partly, no; one slot each
    f02 = sorted((d["slot"], d["agree"], d["what"]) for d in data if d["chapter"] == "f02 · General")
    assert f02 == [(1, "no", "this book's measurement"), (2, "yes", "replot of the paper's own points")]
    tips = {t["field"] for t in spec["encoding"]["tooltip"]}
    assert {"claim", "paper", "ours", "agree", "rule"} <= tips
    assert spec["encoding"]["color"]["scale"]["range"] == [
        summary.VERDICT_COLOURS[a] for a in ("yes", "partly", "no")
    ]
    with pytest.raises(ValueError, match="no status rows"):
        summary.status_chart(_rows().iloc[0:0])


def test_stage_summary_replaces_the_marker(tmp_path):
    page = tmp_path / "intro.md"
    page.write_text("# Title\n\nBefore.\n\n% reproduction-summary\n\nAfter.\n")
    assert summary.stage_summary(page, _rows())
    text = page.read_text()
    assert summary.MARKER not in text and text.index("Before.") < text.index("**Bottom line.**") < text.index(
        "After."
    )
    assert f"```{{chart-figure}} {summary.CHART_FILE}\n:name: fig-intro-status" in text
    parts = chart_parts((tmp_path / summary.CHART_FILE).read_text())
    assert parts.mime == "image/svg+xml" and "4 in all" in parts.alt
    plain = tmp_path / "other.md"
    plain.write_text("# No marker\n")
    assert not summary.stage_summary(plain, _rows()) and plain.read_text() == "# No marker\n"


EXERCISES = """
# f09 · A chapter

```{exercise}
:label: f09-ex-a

Predict first: what happens? Then rerun.
```

```{solution} f09-ex-a
:class: dropdown

This.
```

````{exercise}
:label: f09-ex-gpu
:class: needs-gpu

Run the paper profile. Compare.
````

```{exercise}
Prove it.
```
"""


def test_exercises_are_read_from_the_sources(tmp_path):
    nb = tmp_path / "f09_chapter.md"
    nb.write_text(EXERCISES)
    table = teaching.exercises([nb])
    assert list(table.label) == ["f09-ex-a", "f09-ex-gpu", ""]
    assert list(table.predict_first) == [True, False, False]
    assert list(table.needs_gpu) == [False, True, False]
    assert list(table.has_solution) == [True, False, False]
    assert table.text.iloc[1] == "Run the paper profile."
    section = teaching.exercise_section(table)
    assert "3 exercises: 1 with a worked solution" in section
    # one of each agrees with its verb: "1 that asks", "1 that needs" (not "1 that need a GPU")
    assert "1 that asks for a prediction first and 1 that needs a GPU;" in section
    two = teaching.exercise_section(pd.concat([table, table], ignore_index=True))
    assert "6 exercises" in two and "2 that ask for a prediction first and 2 that need a GPU;" in two
    assert "hold 1 exercise:" in teaching.exercise_section(table.iloc[:1])
    assert "| {doc}`../notebooks/f09_chapter` | 3 | 1 | 1 | 1: {ref}`f09-ex-gpu` |" in section
    page = tmp_path / "teaching.md"
    page.write_text("Intro.\n\n% exercise-table\n")
    assert teaching.stage_exercises(page, [nb]) and "| chapter | exercises |" in page.read_text()


@pytest.mark.parametrize("chapter", ["f00_coupling_metric", "f01_depth_and_tokens", "f05_token_trajectories"])
def test_every_exercise_has_a_label_and_a_hidden_solution(chapter):
    source = ROOT / "notebooks" / f"{chapter}.md"
    table = teaching.exercises([source])
    assert len(table) >= 5 and table.label.str.len().gt(0).all() and table.label.is_unique
    assert table.has_solution.all(), f"exercises without a solution: {list(table.label[~table.has_solution])}"
    assert table.label.str.startswith(chapter[:3] + "-ex-").all()
    solutions = [b for b in teaching._blocks(source.read_text()) if b[0] == "solution"]
    assert all(options.get("class") == "dropdown" for _, _, options, _ in solutions)
    # the teaching page calls exercises that begin "Predict first" prediction-first: most of them are
    assert table.predict_first.sum() >= len(table) / 2


def test_costs_summary_follows_the_measured_costs(tmp_path):
    """The teaching page's lab timing is read from the measured costs, verdict by the stated rule."""
    rows = []
    for chapter, times in [("f00", (300, 90, 60)), ("f01", (600, 300, 240)), ("f05", (200, 150, 120)),
                           ("f03", (900, 400, 100))]:  # fmt: skip
        for state, sec in zip(("cold", "models", "warm"), times):
            rows.append(
                {"chapter": chapter, "state": state, "seconds": sec, "cpu_seconds": sec, "status": "ok"}
            )
    costs = pd.DataFrame(rows)
    text = teaching.costs_summary(costs)
    # judged on the runs with the models built beforehand (the state the course plans prepare)
    assert "With their models built beforehand, f00, f01, f05 run in 9.0 minutes together" in text
    assert "building their models: 18.3 minutes" in text and "measurements cached: 7.0 minutes" in text
    assert "**fits**" in text and "f03 15.0 cold / 6.7 models / 1.7 warm" in text
    slow = costs.assign(seconds=costs.seconds * 4)  # 36 minutes with the models built, 28 rerun
    assert "**does not fit**" in teaching.costs_summary(slow)
    broken = costs.assign(status=["ok"] * 3 + ["failed (exit 1)"] * 9)
    assert "its timing is unknown" in teaching.costs_summary(broken)
    unprepared = costs[costs.state != "models"]  # measured cold and warm only: no verdict from warm
    assert "its timing is unknown" in teaching.costs_summary(unprepared)
    assert "f03 15.0 cold / models not measured / 1.7 warm" in teaching.costs_summary(unprepared)
    assert "about 5 min with its models built beforehand; about 10 min from an empty cache" in (
        teaching.chapter_time(costs, "f01")
    )
    assert "not measured with the models built beforehand for f00, f01, f05" in (
        teaching.plans_summary(unprepared)
    )
    assert "Runs that failed when measured: f01, f03, f05" in teaching.costs_summary(broken)
    assert "run `python bench/bench_chapters.py`" in teaching.costs_summary(pd.DataFrame())
    page = tmp_path / "teaching.md"
    page.write_text("before\n% costs-summary\nafter\n")
    assert teaching.stage_costs(page, tmp_path / "missing.csv")
    assert "No chapter costs have been measured yet" in page.read_text() and "% costs" not in page.read_text()


def test_the_first_screen_names_the_models_measured_and_what_the_paper_profile_takes(tmp_path):
    import json

    runs = {
        "f01_depth": {
            "status": "ok",
            "parameters": {"model": "embedded:smollm2-135m", "more_models": ["x/y"]},
        },
        "f03_train": {"status": "ok", "parameters": {"models": ["embedded:pythia-tiny"], "k": 4}},
        "f02_gen": {"status": "ok", "parameters": {"training_family": "embedded:lm-training-family"}},
        "f04_vit": {"status": "failed", "parameters": {"model": "embedded:vit-mnist"}},
    }
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    assert summary.measured_models(tmp_path) == {
        "embedded:lm-training-family": ["f02"], "embedded:smollm2-135m": ["f01"], "x/y": ["f01"],
        "embedded:pythia-tiny": ["f03"],
    }  # fmt: skip
    costs = tmp_path / "costs.csv"
    table = {"profile": ["paper", "paper", "laptop"], "TFLOP": [1000.0, 500.0, 1.0],
             "GPU memory (GB)": [30.5, 17.0, 3.0], "download (GB)": [300.0, 316.0, 1.0],
             "download not in an earlier notebook (GB)": [300.0, 16.0, 1.0]}  # fmt: skip
    pd.DataFrame(table).to_csv(costs)
    text = summary.what_was_measured(tmp_path, costs)
    # named as measured: the quantisation and dtype of the embedded SmolLM2
    assert "SmolLM2-135M-Instruct" in text and "Q4_1" in text and "dequantised to float32" in text
    assert "`x/y` (f01)" in text and "1 hub model(s)" in text
    # a model two chapters download is counted once (f01 and f02 share the paper's 28 models), and
    # 30.5 GB of GPU memory is not shown as 30
    assert (
        "about 1,500 TFLOP over 2 chapters, up to 30.5 GB of GPU memory and 316 GB of downloads (each model "
        "and checkpoint counted once)" in text
    )
    pd.DataFrame(table).drop(columns="download not in an earlier notebook (GB)").to_csv(
        costs
    )  # an older table
    assert "616 GB of downloads summed over the chapters (a model several chapters use counted in each)" in (
        summary.what_was_measured(tmp_path, costs)
    )
    # the paper's ViTs are not published (nor said to come from the hub)
    assert (
        "Pythia checkpoints from the Hugging Face hub, and vision transformers it does not identify" in text
    )
    assert summary.what_was_measured(tmp_path / "none") == ""


def test_costs_measured_on_another_plan_are_named_as_such():
    """A chapter's cost measured with other (or unrecorded) default parameters is said to be."""
    from coupling_utils.pipeline import teaching

    plans = {"f00": teaching.current_plans()["f00"], "f01": "0123456789ab"}
    costs = pd.DataFrame(
        {"chapter": ["f00", "f00", "f01", "f01"], "state": ["cold", "warm"] * 2, "seconds": [120.0, 60.0] * 2,
         "cpu_seconds": [60.0, 30.0] * 2, "status": "ok", "plan": [plans["f00"]] * 2 + ["", ""]}
    )  # fmt: skip
    assert teaching.replanned(costs, plans) == ["f01"]
    assert "earlier plan" not in teaching.costs_summary(costs.iloc[:2], lab=("f00",), plans=plans)
    assert "The times of f01 were measured on an earlier plan" in teaching.costs_summary(costs, plans=plans)
    assert "--chapters f01` measures them again" in teaching.plans_summary(costs, chapter_plans=plans)
    assert "have changed since" in teaching.chapter_time(costs, "f01", plans["f01"])
    assert "have changed since" not in teaching.chapter_time(costs, "f00", plans["f00"])
    assert teaching.replanned(costs.drop(columns="plan"), plans) == ["f00", "f01"]  # no column: unrecorded


def test_a_chapter_that_measures_more_for_the_same_parameters_is_another_plan(monkeypatch):
    """The plan hashes the measurement jobs the parameters plan, not only the values: f01 with
    the last block measured once more in every measurement (same parameter values) is another plan."""
    import dataclasses

    from coupling_utils.pipeline import sweep, teaching

    teaching.chapter_plan.cache_clear()
    today = teaching.chapter_plan("f01")
    planned = sweep.notebook_jobs

    def more(notebook, profile, overrides=None):
        def also(s):
            other = "final_norm" if s.last_block == "block" else "block"
            return dataclasses.replace(s, last_block_also=other)

        return [
            dataclasses.replace(job, settings={k: also(s) for k, s in job.settings.items()})
            for job in planned(notebook, profile, overrides)
        ]

    monkeypatch.setattr(sweep, "notebook_jobs", more)
    teaching.chapter_plan.cache_clear()
    try:
        assert teaching.chapter_plan("f01") != today
    finally:
        teaching.chapter_plan.cache_clear()


def test_the_bottom_line_names_the_verdicts_another_last_block_would_change():
    """A verdict that holds under the chapter's convention of the last block but not under another
    (the row's note says so) is named as depending on it, with both verdicts."""
    from coupling_utils.analysis.last_block import convention_note

    df = _rows()
    df.loc[0, "note"] = "K = 72; " + convention_note(
        "final_norm", "yes", {"block": "partly", "excluded": "yes"}
    )
    text = summary.bottom_line(df)
    assert (
        "These verdicts depend on what the last block is: "
        "depth coupling (f01): yes here, partly under 'block'." in text
    )
    assert "depend on what the last block is" not in summary.bottom_line(_rows())
