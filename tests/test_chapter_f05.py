"""Chapter f05's module: its plan (one stored job per weights), what run() reads back from the
store, and the values its notebook glues."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis import trajectories as tr
from coupling_utils.chapters import f05_token_trajectories as f05
from coupling_utils.measurement import Options
from coupling_utils.pipeline.sweep import planned_params

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "f05_token_trajectories.md"
HUB = {
    "model": "EleutherAI/pythia-160m",
    "revision": "step143000",
    "prompts": ["Paris is", "The quick brown fox"],
}


@pytest.mark.parametrize("profile", ["smoke", "default", "laptop", "paper"])
def test_jobs_are_the_model_and_its_twin_each_with_its_study(profile):
    p = planned_params(f05.NOTEBOOK, profile)
    trained, variant, twin = f05.jobs(p)  # the variant next to the job that loads the same model
    jobs = [trained, twin]
    assert [j.weights for j in jobs] == ["trained", "random init"]  # every profile compares with the twin
    # f05-ex-first-token's variant: the trained model with skip_first_token flipped, no linearisation
    assert (
        variant.labels == {**jobs[0].labels, "variant": "first_token"} and variant.extra.passes(12, 64) == 12
    )
    assert variant.extra.options["skip_first_token"] is not p.skip_first_token
    assert variant.load_kwargs == jobs[0].load_kwargs and variant.key not in {j.key for j in jobs}
    for job in jobs:
        assert job.storable and job.settings == {} and job.model == p.model and job.prompts == p.prompts
        assert job.extra.fn is tr.trajectory_study and job.extra.options["label"] == job.weights
        assert job.extra.options["window"] == [p.first_layer, p.last_layer]
        assert job.extra.passes(12, 64) == 24  # the linearisation: a forward and a JVP per block
        assert job.load_kwargs["dtype"] == p.dtype and job.revision == (p.revision or None)
    assert jobs[1].load_kwargs["random_init"] and jobs[1].load_kwargs["seed"] == p.init_seed
    assert "random_init" not in jobs[0].load_kwargs and jobs[0].folder != jobs[1].folder
    assert pickle.loads(pickle.dumps(jobs)) == jobs  # a sweep ships them to its workers


def test_jobs_follow_the_parameters():
    p = f05.Params.checked({"compare_random_init": False, "linearization": False, "first_layer": 2})
    job, _ = f05.jobs(p)
    assert job.weights == "trained" and job.extra.passes(12, 64) == 12
    assert job.extra.options["window"] == [2, -1] and not job.extra.options["linearization"]
    assert f05.jobs(p.__class__.checked({**p.values(), "init_seed": 3}))[0].key == job.key  # no twin, no seed


def _glue_names() -> tuple[set[str], set[str]]:
    """The names the notebook's prose reads, and those pinned for it (tests/pinned/smoke_values.yaml)."""
    import yaml

    prose = set(re.findall(r"\{glue:text\}`(f05_[a-zA-Z0-9_]+)", NOTEBOOK.read_text()))
    pinned = yaml.safe_load((Path(__file__).parent / "pinned" / "smoke_values.yaml").read_text())
    return prose, set(pinned["notebooks"][f05.NOTEBOOK]["glue"])


def test_run_reads_back_what_the_model_gives(standin_hub, tmp_path, monkeypatch):
    from coupling_utils import load_model

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f05.Params.checked(HUB)
    with pytest.raises(f05.NotMeasured, match="not measured yet"):
        f05.run(p, Options(compute=False))
    loads = []

    def load(ref, **kw):
        loads.append(kw.get("random_init", False))
        return load_model(ref, **kw)

    r = f05.run(p, Options(load=load))
    # the trained model (loaded once for its job and the first-token variant's, which follows it), its twin
    assert loads == [False, True]
    lm = load_model(HUB["model"], revision=HUB["revision"])
    inputs = [lm.tokenizer(t, return_tensors="pt").input_ids for t in HUB["prompts"]]
    want = tr.trajectory_tables(lm, inputs, label="trained", layers=(0, lm.n_layers), skip_first_token=True)
    for name in ("steps", "metrics", "linearization"):
        got = getattr(r, name).query("model == 'trained'").reset_index(drop=True)
        pd.testing.assert_frame_equal(
            got, getattr(want, name), check_dtype=False
        )  # exact: parquet round trip
    kept = tr.trajectory_tables(
        lm, inputs, label=f05.FIRST_TOKEN, layers=(0, lm.n_layers), linearization=False
    )
    for name in ("steps", "metrics"):  # f05-ex-first-token's variant: position 0 kept
        pd.testing.assert_frame_equal(r.first_token[name], getattr(kept, name), check_dtype=False)
    assert r.n_tokens == [int(x.shape[1]) for x in inputs] and r.window == (0, lm.n_layers)
    # the tokens as a reader reads them: each id decoded alone, its leading space shown as "␣"
    ids = inputs[0][0].tolist()
    shown = [lm.tokenizer.decode([i]).replace(" ", "␣") for i in ids]
    assert r.pca_tokens["token"].tolist() == shown and len(ids) > 1
    assert not any(m in t for t in shown for m in "Ġ▁") and any(t.startswith("␣") for t in shown[1:])
    assert set(r.pca["model"]) == {"trained", "random init"} and (r.pca["token"] > 0).all()
    lengths = " and ".join(str(n) for n in r.n_tokens)
    named = r.facts["named"]  # an extra-only job: the reference, its hub commit and the dtype asked
    assert named.startswith(f"{lm.name} at revision {lm.revision}, commit ") and named.endswith(
        ", in float32"
    )
    assert r.headline().startswith(
        f"{named}: {lm.n_layers} blocks, d = {lm.d_model}; 2 prompts of {lengths} tokens"
    )

    again = f05.run(p, Options(load=load, compute=False))  # read only: nothing loaded, the same numbers
    assert loads == [False, True]
    pd.testing.assert_frame_equal(again.metrics, r.metrics)
    rows = f05.claims(p, r)
    growth = r.growth | tr.growth_intervals(r.metrics)  # judged with its intervals over prompts
    assert [row["agree"] for row in rows] == [f05.LINEAR.judge(r.straight), f05.EXPONENTIAL.judge(growth)]
    status = pd.DataFrame(rows)
    values = f05.glue_values(p, r, status)
    prose, pinned = _glue_names()
    assert prose <= set(values) and set(values) == pinned  # every name the prose reads; the pinned set
    # one mean LSS on the page: over prompts of each prompt's mean, the status row's (r.straight)
    per_prompt = r.metrics.groupby(["model", "prompt"])["lss"].mean()
    assert values["f05_lss_trained"] == pytest.approx(per_prompt["trained"].mean()) == r.straight["lss"]
    assert values["f05_lss_random"] == pytest.approx(r.straight["lss_twin"])
    assert values["f05_lincos_note"].data == ""  # said only when a cosine is missing
    assert f"**{rows[0]['agree']}**" in values["f05_linear_verdict"].data  # the status row's verdict
    assert values["f05_sqrt_L"] == np.sqrt(lm.n_layers)


def test_without_the_twin_nothing_is_judged(standin_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f05.Params.checked({**HUB, "compare_random_init": False, "linearization": False})
    r = f05.run(p)
    assert set(r.metrics["model"]) == {"trained"} and r.linearization.empty and r.linearization_means.empty
    values = f05.glue_values(p, r, None)
    assert f05.claims(p, r) == [] and values["f05_linear_verdict"] == f05.NOT_JUDGED
    assert np.isnan(values["f05_lss_random"]) and np.isnan(values["f05_lincos_trained"])
    assert values["f05_lss_compared"] == "a line-shape score with no twin to compare it with"
    assert "linearisation was switched off" in values["f05_lincos_note"].data


def test_prompt_words_read_as_prose():
    assert f05.prompt_words([14]) == "1 prompt of 14 tokens"
    assert f05.prompt_words([10, 11]) == "2 prompts of 10 and 11 tokens"
    assert f05.prompt_words([3, 4, 5]) == "3 prompts of 3, 4 and 5 tokens"
    assert f05.prompt_words([8, 30, 9, 9, 9, 9]) == "6 prompts of 8 to 30 tokens"


def test_an_interval_over_one_prompt_is_said_in_words_and_decides_nothing():
    """One prompt leaves nothing to resample: the prose says so (not "-inf to inf"), and the
    straightness verdict can be no better than partly."""
    from coupling_utils.analysis.straightness import straightness

    lss = pd.DataFrame({"model": ["trained", "random init"], "prompt": [0, 0], "lss": [1.0, 2.0]})
    one = straightness(lss, model="trained", twin="random init", n_steps=9, d=64)
    values = f05._straight_values(one)
    for name in ("walk_ratio", "twin_ratio"):
        words = values[f"f05_{name}_interval"]
        assert words == "no 95% interval: only 1 prompt, nothing to resample" and "inf" not in words
    assert f05.LINEAR.judge(one) == "partly"  # both estimates meet the yes-condition
    two = straightness(pd.concat([lss, lss.assign(prompt=1, lss=[1.1, 2.1])]),
                       model="trained", twin="random init", n_steps=9, d=64)  # fmt: skip
    assert f05._straight_values(two)["f05_twin_ratio_interval"] == (
        "no 95% interval: only 2 prompts, too few to resample (a 95% interval needs at least 6)"
    )
    six = straightness(pd.concat([lss.assign(prompt=i, lss=[1.0 + i / 10, 2.0 + i / 9]) for i in range(6)]),
                       model="trained", twin="random init", n_steps=9, d=64)  # fmt: skip
    assert re.fullmatch(
        r"95% interval \d\.\d\d to \d\.\d\d over 6 prompts",
        f05._straight_values(six)["f05_twin_ratio_interval"],
    )
    assert (
        f05.interval_words(f05.Interval(np.nan, np.nan, np.nan))
        == "no interval: not measured without the twin"
    )


def test_the_mean_lss_weighs_every_prompt_the_same():
    """A long prompt does not outweigh a short one: the mean of the prompts' means, not of the tokens."""
    metrics = pd.DataFrame(
        {
            "model": "trained",
            "prompt": ["a", "a", "a", "b"],
            "token": [0, 1, 2, 0],
            "lss": [1.0, 1.0, 1.0, 3.0],
        }
    )
    assert f05.mean_lss(metrics)["trained"] == 2.0  # the token mean would be 1.5


def test_a_window_outside_the_model_names_both_parameters(standin_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f05.Params.checked({**HUB, "first_layer": 5, "last_layer": 3, "compare_random_init": False})
    with pytest.raises(f05.NotMeasured, match="first_layer=5 and last_layer=3"):
        f05.run(p)


def test_the_third_expodistance_is_zero_for_exact_growth_and_reads_only_the_window():
    """Exercise f05-ex-expodistance's measure: the mean |residual| of log step sizes about their
    line over the window; exact geometric steps give 0, noisy ones more; steps outside the window
    (here a huge last step) are not read."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    rows = []
    for model, noise in (("trained", 0.0), ("random init", 0.5)):
        for token in range(3):
            for layer in range(1, 8):
                size = 2.0**layer * np.exp(noise * rng.standard_normal()) if layer < 7 else 1e9
                rows.append({"model": model, "prompt": 0, "token": token, "layer": layer, "step_norm": size})
    r = SimpleNamespace(window=(0, 6), steps=pd.DataFrame(rows))
    values = f05._third_expodistance(r)
    assert values["f05_expo_residual_trained"] == pytest.approx(0, abs=1e-9)
    assert values["f05_expo_residual_twin"] > 0.1
    assert "not ranked" in values["f05_expo_residual_word"]  # no interval: no "lower"


def test_the_exponential_verdict_quotes_its_numbers_with_intervals():
    """The bullet's verdict comes with what the rule read, each with its interval over prompts."""
    rows = [
        {"model": m, "prompt": pr, "token": t, "growth_log_linear_r2": g + 0.01 * pr,
         "expodistance_ratio_cv": cv + 0.01 * t, "expodistance_log_linear_r2": r2 - 0.01 * pr}
        for m, g, cv, r2 in (("trained", 1.08, 0.4, 0.3), ("random init", 1.0, 0.1, 0.8))
        for pr in range(6)
        for t in (1, 2)
    ]  # fmt: skip
    words = f05.exponential_words(tr.growth_intervals(pd.DataFrame(rows)))
    assert words.startswith("The rule read growth ") and words.count("95% interval") == 3
    assert words.count("over 6 prompts") == 3 and "log-linear expodistance at" in words


def test_the_exponential_claim_states_what_its_rule_measures():
    """The rule reads growth > 1 (the steps grow) and the expodistances' ratios to the twin's (closer
    to exponential spacing): the old claim, "step sizes grow exponentially with depth in the trained
    model, more than at random init", asserted exponential growth outright and a growth faster than
    the twin's, neither of which the rule measures."""
    claim = f05.EXPONENTIAL_CLAIM
    assert "grow exponentially" not in claim and "more than at random init" not in claim
    assert f05.EXPONENTIAL.names == {"growth", "log_linear_r2_ratio", "ratio_cv_ratio"}
    assert "grow with depth (fitted growth above 1 per block)" in claim
    assert "closer to exponential spacing than at random init" in claim
    # the condition of a yes, not a result: the default run's ratio spread is 3.6× the twin's
    assert "(both expodistances lower)" not in claim
    assert "(a yes needs both expodistances lower than the twin's)" in claim


def test_the_exponential_row_says_which_expodistance_is_lower_from_its_interval():
    """The default run's row read "partly" under a claim saying "both expodistances lower" while the
    ratio spread's ratio was 3.6 [3.49, 3.69]: the note now says, from each ratio's interval over
    prompts, which reconstruction is lower for the trained model and which clearly higher."""
    from coupling_utils.analysis.verdicts import Interval

    iv = {
        "log_linear_r2_ratio": Interval(0.38, 0.35, 0.407, over="8 prompts"),
        "ratio_cv_ratio": Interval(3.6, 3.49, 3.69, over="8 prompts"),
    }
    note = f05._expodistance_note(iv)
    assert note == (
        "log-linear expodistance lower for the trained model than for the twin (ratio trained / twin "
        "0.38, 95% interval 0.35 to 0.41 over 8 prompts, below 1 throughout) and ratio spread higher for "
        "the trained model than for the twin (ratio trained / twin 3.60, 95% interval 3.49 to 3.69 over "
        "8 prompts, above 1 throughout)"
    )
    few = f05._expodistance_note({"ratio_cv_ratio": Interval(3.6, 3.49, 3.69, over="2 prompts")})
    assert few.startswith("ratio spread: ratio trained / twin 3.60, no 95% interval: only 2 prompts")
    apart = f05._expodistance_note({"ratio_cv_ratio": Interval(0.9, 0.8, 1.1, over="7 prompts")})
    assert "not told apart" in apart and "lower" not in apart and "higher" not in apart
    alone = f05._expodistance_note({"ratio_cv_ratio": Interval(0.9, -np.inf, np.inf, over="1 prompt")})
    assert alone.startswith("ratio spread: ratio trained / twin 0.90, no 95% interval: only 1 prompt")
    metrics = pd.DataFrame(
        [
            {"model": m, "prompt": pr, "token": t, "growth_log_linear_r2": 1.08 + 0.001 * t,
             "expodistance_ratio_cv": cv + 0.01 * t, "expodistance_log_linear_r2": r2 + 0.01 * pr}
            for m, cv, r2 in (("trained", 0.4, 0.3), ("random init", 0.1, 0.8))
            for pr in range(6)
            for t in (1, 2)
        ]
    )  # fmt: skip
    straight = {"walk_ratio": 0.8, "twin_ratio": 0.8, "lss": 1, "lss_twin": 1, "walk": 1}
    r = SimpleNamespace(window=(0, 5), growth=tr.growth_contrast(metrics), metrics=metrics, straight=straight,
                        growth_judged=tr.growth_intervals(metrics))  # fmt: skip
    p = SimpleNamespace(compare_random_init=True, model="m", revision="", prompts=["a", "b", "c"],
                        skip_first_token=True)  # fmt: skip
    row = f05.claims(p, r)[1]
    assert row["agree"] == "partly" and "ratio spread higher for the trained model" in row["note"]
    assert "log-linear expodistance lower for the trained model" in row["note"]


def test_the_third_expodistance_reads_equal_where_the_prose_prints_equal_numbers():
    """Residuals 0.0940 and 0.0941 print as 0.094 and 0.094: the old words said "higher"."""
    layers = np.arange(1, 6)
    wiggle = np.array([0.0, 1.0, -1.0, 1.0, 0.0])
    rows = [
        {"model": m, "prompt": 0, "token": 1, "layer": int(l), "step_norm": float(np.exp(0.1 * l + a * w))}
        for m, a in (("trained", 0.2), ("random init", 0.2001))
        for l, w in zip(layers, wiggle)
    ]  # fmt: skip
    r = SimpleNamespace(steps=pd.DataFrame(rows), window=(0, 5))
    out = f05._third_expodistance(r)
    assert round(out["f05_expo_residual_trained"], 3) == round(out["f05_expo_residual_twin"], 3)
    assert out["f05_expo_residual_trained"] != out["f05_expo_residual_twin"]
    assert out["f05_expo_residual_word"] == "the same to three decimals"


def test_the_third_expodistance_earns_no_direction_word_without_an_interval():
    """The default run read "0.344 ... against 0.066 ...: higher (farther from exponential)" with no
    interval behind the comparison; the values now stand alone."""
    layers = np.arange(1, 6)
    wiggle = np.array([0.0, 1.0, -1.0, 1.0, 0.0])
    rows = [
        {"model": m, "prompt": 0, "token": 1, "layer": int(l), "step_norm": float(np.exp(0.1 * l + a * w))}
        for m, a in (("trained", 0.5), ("random init", 0.1))
        for l, w in zip(layers, wiggle)
    ]  # fmt: skip
    out = f05._third_expodistance(SimpleNamespace(steps=pd.DataFrame(rows), window=(0, 5)))
    assert out["f05_expo_residual_trained"] > out["f05_expo_residual_twin"]
    word = out["f05_expo_residual_word"]
    assert not re.search(r"\b(higher|lower|farther|closer)\b", word) and "no interval" in word


@pytest.mark.parametrize(
    "typed",
    [
        "whose steps are close to such a walk",  # the twin's LSS need not be near √L (paper: 4.87 vs 5.66)
        "steps point in nearly independent directions everywhere, so",
        "the minimum the expodistance needs beyond 3 steps",
    ],
)
def test_typed_prose_asserts_nothing_unmeasured(typed):
    assert typed not in NOTEBOOK.read_text()


def test_the_body_s_expodistance_words_follow_the_ratios_intervals():
    """The body said "lower (closer to exponential)" and "the two reconstructions agree" from the
    ratios' estimates alone: the words now follow each ratio's interval over prompts (below or above 1),
    and two prompts (no 95% interval) tell neither model apart."""

    def metrics(n_prompts):
        return pd.DataFrame(
            [{"model": m, "prompt": pr, "token": t, "growth_log_linear_r2": g + 0.01 * pr,
              "expodistance_ratio_cv": cv + 0.01 * t + 0.002 * pr,
              "expodistance_log_linear_r2": r2 - 0.01 * pr}
             for m, g, cv, r2 in (("trained", 1.08, 0.4, 0.3), ("random init", 1.0, 0.1, 0.8))
             for pr in range(n_prompts) for t in (1, 2)]
        )  # fmt: skip

    six = f05.expodistance_sides(tr.growth_intervals(metrics(6)))
    assert six == {
        "f05_expo_direction": "lower than the twin's (closer to exponential)",
        "f05_expo_cv_direction": "higher than the twin's (farther from exponential)",
        "f05_expo_agree": "disagree",
    }
    two = f05.expodistance_sides(tr.growth_intervals(metrics(2)))
    assert two["f05_expo_direction"].startswith("not told apart from the twin's")
    assert two["f05_expo_agree"] == "do not both tell the two models apart"


def test_the_line_shape_scores_are_lower_or_higher_only_where_their_ratios_interval_says_so():
    """The trained model's mean LSS against its twin's follows the ratio's interval over prompts (the
    prose said "lower" from the two means alone)."""
    from coupling_utils.analysis.verdicts import Interval

    six = "6 prompts"
    lower = f05.lss_compared(Interval(0.79, 0.77, 0.82, over=six))
    assert lower == "a lower line-shape score than its twin's"
    assert f05.lss_compared(Interval(1.2, 1.1, 1.3, over=six)) == "a higher line-shape score than its twin's"
    apart = f05.lss_compared(Interval(0.95, 0.85, 1.02, over=six))
    assert apart == ("a line-shape score not told apart from its twin's (ratio 0.95, 95% interval 0.85 to "
                     "1.02 over 6 prompts)")  # fmt: skip
    few = f05.lss_compared(Interval(0.5, 0.4, 0.6, over="2 prompts"))  # two prompts: no interval
    assert few.startswith("a line-shape score not told apart") and "only 2 prompts" in few
