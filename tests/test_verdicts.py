"""Verdict rules: stated before the result, judged on the values, shown with the row."""

from __future__ import annotations

import math

import pytest

from coupling_utils.analysis.verdicts import Rule, RuleError, claim
from coupling_utils.pipeline.status import status_table

RISES = Rule(yes="ratio >= 1.5 and spearman >= 0.7 and peak_position >= 2/3", partly="ratio >= 1.2")


@pytest.mark.parametrize(
    "values, expected",
    [
        ({"ratio": 1.93, "spearman": 0.9, "peak_position": 0.9}, "yes"),
        # the two end points say "rises", the shape does not: f03's default run today
        ({"ratio": 1.93, "spearman": 0.29, "peak_position": 0.3}, "partly"),
        ({"ratio": 1.1, "spearman": 0.9, "peak_position": 1.0}, "no"),
        ({"ratio": 1.5, "spearman": 0.7, "peak_position": 2 / 3}, "yes"),  # bounds are inclusive
        (
            {"ratio": math.nan, "spearman": 0.9, "peak_position": 1.0},
            "no",
        ),  # a missing number never earns yes
    ],
)
def test_rules_judge_the_values(values, expected):
    assert RISES.judge(values) == expected


def test_rule_without_partly_gives_yes_or_no():
    rule = Rule(yes="abs(rho) < 0.2 or -rho > 0.5")
    assert rule.judge({"rho": -0.6}) == "yes" and rule.judge({"rho": 0.3}) == "no"
    assert rule.names == {"rho"}
    assert rule.text == "yes if abs(rho) < 0.2 or -rho > 0.5; otherwise no"


def test_division_by_zero_is_not_a_verdict():
    assert Rule(yes="a / b > 1").judge({"a": 1, "b": 0}) == "no"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"yes": "ratio >="}, "not a valid expression"),
        ({"yes": "__import__('os')"}, "only function"),
        ({"yes": "x.real > 1"}, "uses Attribute"),
        ({"yes": "x > 'a'"}, "literals must be numbers"),
        ({"yes": ""}, "non-empty expression"),
        ({"yes": "x > 1", "partly": "y >"}, "partly"),
    ],
)
def test_bad_rules_fail_when_made(kwargs, match):
    with pytest.raises(RuleError, match=match):
        Rule(**kwargs)


def test_missing_value_names_what_the_rule_needs():
    with pytest.raises(RuleError, match=r"needs \['peak_position', 'spearman'\]"):
        RISES.judge({"ratio": 2.0})
    with pytest.raises(RuleError, match="not a number"):
        Rule(yes="x > 1").judge({"x": "high"})


def test_claim_rows_carry_rule_values_and_kind():
    row = claim(
        "coupling rises over training",
        paper="2.4×, nearly monotonic",
        rule=RISES,
        values={"ratio": 1.93, "spearman": 0.29, "peak_position": 0.3},
    )
    assert row["agree"] == "partly" and row["kind"] == "measured"
    assert row["rule"].startswith("yes if ratio ≥ 1.5 and spearman ≥ 0.7")
    assert "judged on peak_position = 0.3, ratio = 1.93, spearman = 0.29" in row["rule"]
    assert row["ours"] == "peak_position = 0.3, ratio = 1.93, spearman = 0.29"
    df = status_table(
        [row, claim("fit", paper=0.8, rule=Rule(yes="r2 >= 0.7"), values={"r2": 0.8}, kind="replot")]
    )
    assert df.kind.tolist() == ["measured", "replot"] and df.agree.tolist() == ["partly", "yes"]
    with pytest.raises(RuleError, match="kind must be one of"):
        claim("x", paper=1, rule=RISES, values={}, kind="guess")


def test_assumptions_are_recorded_and_a_broken_one_shows_and_fails(tmp_path, monkeypatch):
    """assume(): silent when it holds, a warning on the page when not; the default-book check reads both."""
    import nbformat

    import tests.test_default_book as check
    from coupling_utils.analysis.verdicts import ASSUMPTION_KEY, assume
    from coupling_utils.pipeline.status import read_assumptions

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda data, metadata, raw: shown.append((data, metadata)))
    assert assume("twin-flat", 0.01 < 0.05, "the twin sits at chance level") is True
    assert assume("rises", False, "coupling rises") is False
    assert shown[0][0] == {"text/html": ""} and "contradicts" in shown[1][0]["text/html"]
    outputs = [nbformat.v4.new_output("display_data", data=d, metadata=m) for d, m in shown]
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=outputs)]),
        tmp_path / "f09_demo.ipynb",
    )
    df = read_assumptions(tmp_path / "f09_demo.ipynb")
    assert df.to_dict("records") == [
        {"key": "twin-flat", "holds": True, "text": "the twin sits at chance level"},
        {"key": "rises", "holds": False, "text": "coupling rises"},
    ]
    assert shown[1][1][ASSUMPTION_KEY]["holds"] is False
    (tmp_path / "runs.json").write_text('{"f09_demo": {"profile": "default", "status": "ok"}}')
    from coupling_utils.pipeline.status import read_statuses, status_markdown

    page = status_markdown(read_statuses(tmp_path))  # the status page names the contradicted sentence
    assert "```{warning}" in page and "- `f09_demo`: that coupling rises" in page
    assert "chance level" not in page
    monkeypatch.setattr(check, "EXECUTED", tmp_path)
    with pytest.raises(AssertionError, match="f09_demo: rises: the text assumes that coupling rises"):
        check.test_typed_prose_holds_on_the_default_run()
