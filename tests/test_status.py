"""Reproduction status: row validation, the JSON output in executed notebooks, collecting, the page."""

from __future__ import annotations

import json

import nbformat
import numpy as np
import pytest

from coupling_utils.pipeline.status import (
    METADATA_KEY,
    StatusError,
    read_notebook_status,
    read_statuses,
    status_markdown,
    status_table,
)

ROWS = [
    {
        "claim": "coupling predicts the leaderboard",
        "paper": 0.80,
        "ours": np.float64(0.6123),
        "agree": "partly",
        "note": "digitised | replotted",
    },
    {"claim": "direction of the fit", "paper": "positive", "ours": "positive", "agree": "Yes"},
]
REPLOT = {
    "claim": "the paper's Fig. 1a fit",
    "paper": 0.80,
    "ours": 0.801,
    "agree": "yes",
    "rule": "yes if r2 ≥ 0.7",
    "kind": "replot",
}


def test_rows_are_validated_and_normalised():
    df = status_table(ROWS)
    assert list(df.columns) == ["claim", "paper", "ours", "agree", "rule", "kind", "note"]
    assert df.agree.tolist() == ["partly", "yes"]
    assert isinstance(df.ours[0], float) and df.note[1] == "" and df.rule[1] == ""
    assert df.kind.tolist() == ["measured", "measured"]  # the default kind
    assert status_table([{**ROWS[0], "ours": float("nan")}]).ours[0] == "nan"  # JSON has no NaN


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{**ROWS[0], "agree": "maybe"}], "'agree' must be one of"),
        ([{k: v for k, v in ROWS[0].items() if k != "ours"}], r"lacks \['ours'\]"),
        ([{**ROWS[0], "extra": 1}], "unknown key"),
        ([{**ROWS[0], "claim": " "}], "'claim' must be a non-empty text"),
        ([{**ROWS[0], "ours": [1, 2]}], "'ours' must be a number or a text"),
        ([{**ROWS[0], "ours": np.zeros(3)}], "'ours' must be a single number"),
        ([{**ROWS[0], "kind": "guess"}], "'kind' must be one of"),
        ([{**ROWS[0], "rule": 3}], "'rule' must be a text"),
        ([], "no status rows"),
        (ROWS[0], "list of dicts"),
    ],
)
def test_bad_rows_fail_naming_the_problem(rows, match):
    with pytest.raises(StatusError, match=match):
        status_table(rows)


def _fake_executed(path, notebook, rows, *, json_as_text=False):
    """An executed notebook as papermill would write it, with one status output."""
    payload = {"notebook": notebook, "rows": status_table(rows).to_dict("records")}
    meta = {METADATA_KEY: json.dumps(payload) if json_as_text else payload}
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(f"Intro.\n\n# {notebook} · A title"),
            nbformat.v4.new_code_cell("x = 1", outputs=[nbformat.v4.new_output("stream", text="hi\n")]),
            nbformat.v4.new_code_cell(
                "report(...)",
                outputs=[
                    nbformat.v4.new_output("display_data", data={"text/plain": "status"}, metadata=meta)
                ],
            ),
        ]
    )
    nbformat.write(nb, path)


def test_collect_reads_executed_notebooks_in_order_with_their_runs(tmp_path):
    _fake_executed(tmp_path / "f04_vit.ipynb", "f04_vit", [ROWS[1]], json_as_text=True)
    _fake_executed(tmp_path / "f02_gen.ipynb", "f02_gen", [*ROWS, REPLOT])
    _fake_executed(tmp_path / "f03_train.failed.ipynb", "f03_train", ROWS)  # a failed run: ignored
    _fake_executed(tmp_path / ".f05_x.running.ipynb", "f05_x", ROWS)  # in flight: ignored
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "f01_plain.ipynb")  # reports nothing
    (tmp_path / "runs.json").write_text(
        json.dumps(
            {
                "f02_gen": {
                    "status": "ok",
                    "profile": "smoke",
                    "seconds": 12.5,
                    "finished": "2025-01-01T00:00:00Z",
                    "code": "0123456789abcdef",
                },
                "f03_train": {"status": "failed", "profile": "default", "seconds": 3.0},
            }
        )
    )
    df = read_statuses(tmp_path)
    assert df.notebook.tolist() == ["f02_gen", "f02_gen", "f02_gen", "f04_vit"]
    assert df.claim.tolist() == [r["claim"] for r in ROWS] + [REPLOT["claim"], ROWS[1]["claim"]]
    assert df.profile.tolist()[:3] == ["smoke"] * 3 and df.profile[3] is None
    assert df.attrs["without_status"] == ["f01_plain"] and df.attrs["failed"] == ["f03_train"]
    assert read_notebook_status(tmp_path / "f01_plain.ipynb").empty

    md = status_markdown(df, profile="default")
    assert df.title.tolist()[0] == "f02_gen · A title"
    assert (
        "## f02_gen · A title" in md
        and "## f04_vit · A title" in md
        and md.index("## f02_gen") < md.index("## f04_vit")
    )
    assert "(status-f02_gen)=" in md
    assert "code fingerprint `0123456789abcdef`" in md  # the code behind the run's numbers
    assert "profile `smoke`" in md and "profile `default`" in md  # f04 has no run record: the fallback
    assert "| coupling predicts the leaderboard | 0.8 | 0.612 | partly |  | digitised \\| replotted |" in md
    assert "`f03_train` failed" in md and "`f01_plain`" in md
    # overview: one row per notebook with its measured yes / partly / no, its own questions and
    # its replots apart
    assert "| notebook | profile | paper's claims: yes | paper's claims: partly | paper's claims: no |" in md
    assert "| {ref}`f02_gen · A title <status-f02_gen>` | smoke | 1 | 1 | 0 | 0 | 1 |" in md
    # the replot is listed after the measured claims, under its own heading, never counted as "yes"
    section = md[md.index("## f02_gen") : md.index("## f04_vit")]
    assert section.index("Replots of the paper's own") > section.index("coupling predicts the leaderboard")
    assert section.index("Replots of the paper's own") < section.index("the paper's Fig. 1a fit")
    assert "| the paper's Fig. 1a fit | 0.8 | 0.801 | yes | yes if r2 ≥ 0.7 |  |" in section


def test_the_overview_counts_this_books_own_questions_apart_from_the_papers_claims():
    """The default book's overview counted f01's MiniLM contrast among its measured "no" (3, where
    the bottom line counts 2 of the paper's claims not reproduced and the contrast apart)."""
    from coupling_utils.chapters import own_claim

    contrast = own_claim("Contrast", "more coupled across depth: minilm")
    rows = [{"claim": "more coupled across depth: smollm2", "ours": "0.08", "agree": "yes"},
            {"claim": contrast, "ours": "-0.26", "agree": "no"},
            {"claim": "token-wise self coupling is strong", "ours": "0.51", "agree": "no"}]  # fmt: skip
    df = status_table([r | {"paper": "coupled"} for r in rows]).assign(
        notebook="f01_depth", title="f01 · Depth", profile="default"
    )
    md = status_markdown(df)
    assert "| {ref}`f01 · Depth <status-f01_depth>` | default | 1 | 0 | 1 | 1 | 0 |" in md
    assert "own questions | replots |" in md


def test_collect_and_markdown_when_nothing_ran(tmp_path):
    with pytest.raises(StatusError, match="coupling-book run"):
        read_statuses(tmp_path / "missing")
    md = status_markdown(read_statuses(tmp_path), profile="smoke")
    assert "No executed notebook" in md and "--profile smoke" in md


def test_report_in_a_kernel_stores_machine_readable_rows(tmp_path):
    """End to end: report() in a real kernel, the notebook written, read_statuses() reads it back."""
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "from coupling_utils.pipeline.status import StatusError, report\n"
                "try:\n"
                f"    report('f09_demo', {ROWS[1]!r})\n"  # a single dict is refused, naming the fix
                "except StatusError as exc:\n"
                "    print('refused:', exc)\n"
                f"df = report('f09_demo', [{ROWS[1]!r}, "
                "{'claim': 'c', 'paper': 1, 'ours': 2.0, 'agree': 'no'}]);"
            )
        ]
    )
    # generous guards against a hang (nbclient names them when they fire), not a verdict on speed
    nbclient.NotebookClient(nb, timeout=600, startup_timeout=600, kernel_name="python3").execute()
    nbformat.validate(nb)
    outputs = nb.cells[0].outputs
    assert "refused:" in outputs[0].text and "list of dicts" in outputs[0].text
    shown = [o for o in outputs if METADATA_KEY in o.get("metadata", {})]
    assert len(shown) == 1 and set(shown[0]["data"]) == {"text/html", "text/plain"}  # only renderable types
    assert shown[0]["metadata"][METADATA_KEY]["notebook"] == "f09_demo"
    glued = [
        o for o in outputs if o.get("metadata", {}).get("scrapbook", {}).get("name") == "f09_demo_status"
    ]
    assert len(glued) == 1
    nbformat.write(nb, tmp_path / "f09_demo.ipynb")
    df = read_statuses(tmp_path)
    assert df.claim.tolist() == [ROWS[1]["claim"], "c"] and df.agree.tolist() == ["yes", "no"]
