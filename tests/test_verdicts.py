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


def test_rule_without_partly_gives_yes_or_no_on_numbers():
    rule = Rule(yes="abs(rho) < 0.2 or -rho > 0.5")
    assert rule.judge({"rho": -0.6}) == "yes" and rule.judge({"rho": 0.3}) == "no"
    assert rule.names == {"rho"}


# ----------------------------------------------------------------- the rule's text


def test_the_text_tells_yes_from_partly_where_they_share_a_condition():
    """f02's "beats size" was printed "yes if gap > 0; partly if gap > 0": two equal clauses. The
    text says what judge() does: a yes over every interval, a partly at the estimates."""
    from coupling_utils.analysis.verdicts import Interval

    rule = Rule(yes="gap > 0", partly="gap > 0")
    assert rule.text == "yes if gap > 0 over every interval; partly if gap > 0 at the estimates; otherwise no"
    assert rule.judge({"gap": Interval(0.05, 0.01, 0.1)}) == "yes"
    assert rule.judge({"gap": Interval(0.05, -0.01, 0.1)}) == "partly"


def test_a_rule_without_partly_says_its_estimates_give_a_partly():
    """With an interval a rule without a partly-condition still gives "partly" (the estimate
    passes, the interval does not): its text says so; on a plain number it cannot."""
    from coupling_utils.analysis.verdicts import Interval

    rule = Rule(yes="abs(rho) < 0.2 or -rho > 0.5")
    assert rule.text == (
        "yes if abs(rho) < 0.2 or -rho > 0.5 over every interval; "
        "partly if abs(rho) < 0.2 or -rho > 0.5 at the estimates; otherwise no"
    )
    assert rule.judge({"rho": Interval(-0.6, -0.8, -0.1)}) == "partly"
    assert rule.judge({"rho": -0.6}) == "yes"  # a number is its own interval


def test_the_point_text_reads_a_rule_on_plain_numbers_without_intervals():
    """f02's axis rules judge single numbers (one value per candidate, no interval), yet were
    printed "... over every interval; partly if ... at the estimates": point_text says what
    judge() does with numbers."""
    rule = Rule(yes="trained >= 0.8 and trained - twin >= 0.02")
    assert rule.point_text == "yes if trained ≥ 0.8 and trained - twin ≥ 0.02; otherwise no"
    assert rule.judge({"trained": 0.9, "twin": 0.95}) == "no"  # no partly on a plain number
    both = Rule(yes="ratio >= 1.5", partly="ratio >= 1.2")
    assert both.point_text == "yes if ratio ≥ 1.5; partly if ratio ≥ 1.2; otherwise no"
    assert both.judge({"ratio": 1.3}) == "partly"
    assert Rule(yes="gap > 0", partly="gap > 0").point_text == "yes if gap > 0; otherwise no"


def test_the_text_names_the_yes_condition_where_the_partly_one_may_miss_it():
    """judge() gives partly where the estimates meet the yes-condition though not the partly one
    (f02's hub rule reads slope_low for a yes, slope for a partly): the text says so."""
    from coupling_utils.analysis.verdicts import Interval

    rule = Rule(yes="slope_low > 0", partly="slope > 0")
    assert rule.text == (
        "yes if slope_low > 0 over every interval; "
        "partly if slope > 0, or the yes-condition, at the estimates; otherwise no"
    )
    assert rule.judge({"slope_low": Interval(0.1, -0.1, 0.2), "slope": -1.0}) == "partly"


@pytest.mark.parametrize(
    "yes, partly, said_once",
    [
        ("spearman >= 0.7 and ratio >= 1.5", "spearman >= 0.3 and ratio > 1", True),
        ("x >= 0.9 and y <= 0.1", "x > y", True),
        ("abs(r2 - 0.80) <= 0.02", "abs(r2 - 0.80) <= 0.1", True),
        ("a > 1 and b < 1 and c < 1", "a > 1 and (b < 1 or c < 1)", True),
        ("lss <= -0.3 and n >= 6", "lss < 0", True),
        ("x > 0", "x > 0.5", False),
        ("x > 0 or y > 0", "x > 0", False),
        ("x >= 0", "x > 0", False),
        ("x > 0 and y > 0", "x + y > 0", False),  # true, but not told from the form: said
        ("x / 0 > 1", "x > 1", False),
    ],
)
def test_the_yes_condition_is_left_out_of_the_partly_clause_only_where_it_implies_it(yes, partly, said_once):
    """Where every estimate meeting the yes-condition meets the partly one, the partly clause is
    the partly-condition alone; checked here on a grid of values, so leaving it out is never false."""
    import itertools

    from coupling_utils.analysis.verdicts import _eval, _parse, _pretty

    rule = Rule(yes=yes, partly=partly)
    clause = _pretty(partly) + ("" if said_once else ", or the yes-condition,")
    assert f"; partly if {clause} at the estimates; otherwise no" in rule.text
    if said_once:
        grid = (-1.0, -0.3, 0.0, 0.05, 0.5, 0.8, 0.9, 1.0, 1.5, 2.0)
        names = sorted(rule.names)
        for point in itertools.product(grid, repeat=len(names)):
            values = dict(zip(names, point))
            assert not _eval(_parse(yes, "yes"), values) or _eval(_parse(partly, "partly"), values), values


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


# ----------------------------------------------------------------- intervals


def test_yes_needs_the_whole_interval_clear_of_the_threshold():
    from coupling_utils.analysis.verdicts import Interval

    rule = Rule(yes="margin >= 0.05")
    assert rule.judge({"margin": Interval(0.0545, 0.051, 0.06)}) == "yes"
    # the estimate passes, the interval reaches below the threshold: at most partly
    assert rule.judge({"margin": Interval(0.0545, 0.02, 0.09)}) == "partly"
    assert rule.judge({"margin": Interval(0.04, 0.02, 0.09)}) == "no"
    assert rule.judge({"margin": 0.0545}) == "yes"  # a number without interval is exact


def test_intervals_follow_arithmetic_negation_and_or():
    from coupling_utils.analysis.verdicts import Interval

    diff = Rule(yes="trained - twin > 0.1")
    # worst case of a difference: trained's low minus twin's high
    assert diff.judge({"trained": Interval(0.5, 0.45, 0.55), "twin": Interval(0.3, 0.25, 0.34)}) == "yes"
    assert diff.judge({"trained": Interval(0.5, 0.40, 0.55), "twin": Interval(0.3, 0.25, 0.34)}) == "partly"
    assert Rule(yes="not x < 1").judge({"x": Interval(1.5, 1.1, 2)}) == "yes"
    assert Rule(yes="not x < 1").judge({"x": Interval(1.5, 0.9, 2)}) == "partly"
    assert Rule(yes="x > 1 or y > 1").judge({"x": Interval(2, 1.5, 3), "y": Interval(0, -1, 1)}) == "yes"
    assert Rule(yes="x > 1 and y > 1").judge({"x": Interval(2, 1.5, 3), "y": Interval(2, 0.5, 3)}) == "partly"
    assert Rule(yes="abs(x) < 0.1").judge({"x": Interval(0.0, -0.05, 0.05)}) == "yes"
    assert Rule(yes="abs(x) < 0.1").judge({"x": Interval(0.0, -0.2, 0.05)}) == "partly"
    # a ratio whose denominator's interval contains 0 is never surely anything
    assert Rule(yes="a / b > 1").judge({"a": 2.0, "b": Interval(1.0, -0.5, 1.5)}) == "partly"


def test_partly_is_judged_on_the_estimates_and_nan_never_earns_yes():
    from coupling_utils.analysis.verdicts import Interval

    rule = Rule(yes="x >= 1", partly="x >= 0.5")
    assert rule.judge({"x": Interval(0.7, 0.1, 1.2)}) == "partly"
    assert rule.judge({"x": Interval(0.3, 0.1, 1.2)}) == "no"
    assert rule.judge({"x": Interval(float("nan"), float("nan"), float("nan"))}) == "no"


def test_an_interval_is_checked_and_shown_in_the_status_row():
    from coupling_utils.analysis.verdicts import Interval

    with pytest.raises(RuleError, match="low <= estimate <= high"):
        Interval(0.5, 0.6, 0.7)
    with pytest.raises(RuleError, match="level"):
        Interval(0.5, 0.4, 0.7, level=95)
    row = claim("c", paper="p", rule=Rule(yes="x > 0"), values={"x": Interval(0.2, 0.1, 0.3, over="prompts")})
    assert row["agree"] == "yes"
    assert "x = 0.2 [0.1, 0.3; 95% over prompts]" in row["rule"]
    # the row's rule text says how a yes reads an interval, once: here the estimate passes but the
    # interval does not
    wide = claim("c", paper="p", rule=Rule(yes="x > 0"), values={"x": Interval(0.2, -0.1, 0.3)})
    assert wide["agree"] == "partly"
    assert wide["rule"] == (
        "yes if x > 0 over every interval; partly if x > 0 at the estimates; otherwise no "
        "(judged on x = 0.2 [-0.1, 0.3; 95%])"
    )
    boot = {"estimate": 0.2, "ci_low": 0.1, "ci_high": 0.3, "level": 0.9}
    assert Interval.from_bootstrap(boot, over="models") == Interval(0.2, 0.1, 0.3, 0.9, "models")


def test_an_interval_over_too_few_to_resample_says_so_in_words():
    """One prompt gives a bootstrap interval of (-inf, inf): the status table said
    '[-inf, inf; 95% over 1 prompt]'; it says there is no interval."""
    from coupling_utils.analysis.verdicts import Interval

    assert (
        str(Interval(0.5, -math.inf, math.inf, over="1 prompt"))
        == "0.5 [no 95% interval: only 1 prompt, nothing to resample]"
    )
    assert str(Interval(0.5, 0.4, 0.6, over="6 prompts")) == "0.5 [0.4, 0.6; 95% over 6 prompts]"


def test_an_interval_over_fewer_than_six_units_is_no_95_percent_interval():
    """The audit of the built book: an interval 'over 2 prompts' was the two prompts' values, shown as
    a 95% interval and read by a rule as one (f01's only 'yes'). Of n units, the lowest and highest
    both miss the median with probability 2·2⁻ⁿ (6.25% for 5), so below MIN_UNITS = 6 there is no
    95% interval: the bounds are unbounded, the words say why, and no rule reads a yes from it."""
    from coupling_utils.analysis.verdicts import MIN_UNITS, Interval, Rule

    assert MIN_UNITS == 6 and 2 * 0.5**5 > 0.05 >= 2 * 0.5**6
    two = Interval(0.0667, 0.0574, 0.0759, over="2 prompts")
    assert (two.low, two.high, two.units, two.resampled) == (-math.inf, math.inf, 2, False)
    assert str(two) == (
        "0.0667 [no 95% interval: only 2 prompts, too few to resample (a 95% interval needs at least 6)]"
    )
    rule = Rule(yes="excess >= 0.05", partly="excess > 0")
    assert rule.judge({"excess": two}) == "partly"
    five = Interval(0.5, 0.4, 0.6, over="5 images, paired")
    assert five.units == 5 and not five.resampled
    six = Interval(0.0667, 0.0574, 0.0759, over="6 prompts")
    assert (six.low, six.high, six.resampled) == (0.0574, 0.0759, True)
    assert rule.judge({"excess": six}) == "yes"
    named = Interval(0.5, 0.4, 0.6, over="members", units=3)  # a count the words do not start with
    assert not named.resampled and named.words() == (
        "no 95% interval: only 3 members, too few to resample (a 95% interval needs at least 6)"
    )
    assert Interval(0.5, 0.4, 0.6, over="members").resampled  # no count known: taken as given
    nan = Interval(float("nan"), float("nan"), float("nan"), over="2 prompts")
    assert math.isnan(nan.low)  # a missing number stays missing


def test_the_status_table_and_the_prose_say_a_missing_interval_in_the_same_words():
    """One mechanism: the status table's brackets and the chapters' prose (``Interval.words``)
    say "no interval" alike; with an interval, prose names its bounds and what was resampled."""
    from coupling_utils.analysis.verdicts import Interval

    one = Interval(0.5, -math.inf, math.inf, over="1 window")
    assert one.words() == "no 95% interval: only 1 window, nothing to resample"
    assert one.words() in str(one)
    assert Interval(0.5, 0.4, 0.6, over="8 windows").words() == "95% interval 0.40 to 0.60 over 8 windows"
    eight = Interval(0.5, 0.4, 0.6, over="8 windows")
    assert eight.words(".3f") == "95% interval 0.400 to 0.600 over 8 windows"


def test_an_interval_without_units_says_why_in_plain_words():
    """No resampling unit named: the words say there were too few units, not 'too few units only'."""
    from coupling_utils.analysis.verdicts import Interval

    none = Interval(0.5, float("-inf"), float("inf"), 0.95, None)
    assert none.words() == "no 95% interval: too few units to resample"
    one = Interval(0.5, float("-inf"), float("inf"), 0.95, "1 prompt")
    assert one.words() == "no 95% interval: only 1 prompt, nothing to resample"
    assert Interval(0.5, 0.4, 0.6, 0.95, "7 prompts").words() == "95% interval 0.40 to 0.60 over 7 prompts"


def test_short_of_yes_names_each_part_that_kept_a_verdict_from_yes():
    """A "partly" or "no" in prose said which threshold failed only where a chapter wrote its own
    words (f01's tiles, f03's together): Rule.short_of_yes says it for any rule, from the rule's
    own parts, at the estimate or over the interval, with the values and their intervals."""
    from coupling_utils.analysis.verdicts import Interval, Rule

    rule = Rule(yes="walk_ratio <= 0.8 and twin_ratio <= 0.9", partly="walk_ratio < 1 and twin_ratio < 1")
    clear = {"walk_ratio": Interval(0.7, 0.65, 0.75, over="8 prompts"), "twin_ratio": 0.5}
    assert rule.judge(clear) == "yes" and rule.short_of_yes(clear) == ""
    wide = {"walk_ratio": Interval(0.79, 0.77, 0.82, over="6 prompts"), "twin_ratio": 0.5}
    assert rule.judge(wide) == "partly"
    assert rule.short_of_yes(wide) == (
        "walk_ratio ≤ 0.8 does not hold over its whole interval "
        "(walk_ratio 0.79, 95% interval 0.77 to 0.82 over 6 prompts)"
    )
    both = {"walk_ratio": Interval(0.9, 0.85, 0.95, over="8 windows"), "twin_ratio": 0.95}
    said = rule.short_of_yes(both)
    assert said.startswith("walk_ratio ≤ 0.8 does not hold at the estimate (walk_ratio 0.90, 95% interval")
    assert said.endswith("; twin_ratio ≤ 0.9 does not hold at the estimate (twin_ratio 0.95)")
    few = {"walk_ratio": Interval(0.5, 0.4, 0.6, over="2 prompts"), "twin_ratio": 0.5}  # no interval
    said = rule.short_of_yes(few)
    assert said.startswith("walk_ratio ≤ 0.8 holds at the estimate only (walk_ratio 0.50, no 95%"), said
    kept = Rule(yes="abs(r2 - 0.80) <= 0.02")  # the rule's own text, not Python's reprint of it
    assert kept.short_of_yes({"r2": 0.85}) == "abs(r2 - 0.80) ≤ 0.02 does not hold at the estimate (r2 0.85)"
