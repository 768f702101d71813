"""Emergence over training: checkpoint names, growth summaries, and a sweep over tiny checkpoints."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import emergence as em
from coupling_utils.analysis.last_block import checkpoints_without_last_block
from coupling_utils.engine.metric import coupling
from coupling_utils.measurement import Options, collect


# --------------------------------------------------------------------------- checkpoints
def test_step_of_and_checkpoint_steps():
    assert em.step_of("step143000") == 143000
    assert em.step_of(7) == 7
    assert em.checkpoint_steps(["step0", "step1", "step512"]) == [0, 1, 512]
    with pytest.raises(ValueError, match="not a checkpoint name"):
        em.step_of("main")
    with pytest.raises(ValueError, match="cannot be negative"):
        em.step_of(-1)
    with pytest.raises(ValueError, match="same step more than once"):
        em.checkpoint_steps(["step1", 1])


def test_pick_checkpoints_spreads_over_log_steps():
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 4000]
    assert em.pick_checkpoints(steps, 3) == [1, 64, 4000]
    assert em.pick_checkpoints([0, 1, 2, 3], 3) == [1, 2, 3]
    five = em.pick_checkpoints(steps, 5)
    assert len(set(five)) == 5 and five[0] == 1 and five[-1] == 4000
    with pytest.raises(ValueError, match="at least 3 checkpoints"):
        em.pick_checkpoints([0, 1, 2], 3)


# --------------------------------------------------------------------------- curves
def _curve(values, steps=None, **tags):
    steps = steps or [0, 1, 2, 4, 8, 16][: len(values)]
    return pd.DataFrame({"step": steps, "value": values, **tags})


def test_growth_summary_of_a_monotone_rise():
    df = _curve([0.5, 0.1, 0.12, 0.15, 0.2, 0.24])
    s = em.growth_summary(df, "value").iloc[0]
    assert s.early_step == 1 and s.final_step == 16  # step 0 is not the early reference
    assert s.ratio == pytest.approx(2.4)
    assert s.spearman == pytest.approx(1.0)
    assert s.rises == 1.0 and s.max_drop == 0.0 and s.n_checkpoints == 5
    # an explicit early step: the first checkpoint at or after it
    s = em.growth_summary(df, "value", early_step=3).iloc[0]
    assert s.early_step == 4 and s.ratio == pytest.approx(0.24 / 0.15)


def test_growth_summary_sees_drops_and_groups_and_averages_prompts():
    a = _curve([0.1, 0.3, 0.2, 0.4], steps=[1, 2, 4, 8], model="a")
    b = _curve([0.4, 0.3, 0.2, 0.1], steps=[1, 2, 4, 8], model="b")
    twice = pd.concat([a, a.assign(value=a.value + 0.02), b, b.assign(value=b.value - 0.02)])
    s = em.growth_summary(twice, "value", by="model").set_index("model")
    assert s.loc["a", "rises"] == pytest.approx(2 / 3)
    assert s.loc["a", "max_drop"] == pytest.approx(0.1 / 0.3)  # a fall of 0.1 over a range of 0.3
    assert s.loc["a", "early"] == pytest.approx(0.11)  # mean of the two "prompts"
    assert s.loc["b", "spearman"] == pytest.approx(-1.0) and s.loc["b", "ratio"] == pytest.approx(0.09 / 0.39)
    with pytest.raises(ValueError, match=r"df: missing column\(s\) \['nope'\]"):
        em.growth_summary(a, "nope")
    with pytest.raises(ValueError, match="no checkpoint at or after step 100"):
        em.growth_summary(a, "value", early_step=100)
    with pytest.raises(ValueError, match="NaN"):
        em.growth_summary(_curve([0.1, np.nan, 0.2]), "value")


def test_relative_curve_ends_at_one():
    df = pd.concat(
        [
            _curve([0.0, 0.1, 0.2], steps=[0, 10, 20], model="a"),
            _curve([0.5, 1.0], steps=[100, 1000], model="b"),
        ]
    )
    r = em.relative_curve(df, "value", by="model")
    assert set(r.columns) >= {"model", "step", "value", "training_fraction", "relative"}
    assert (r.step > 0).all()
    last = r.groupby("model").tail(1)
    np.testing.assert_allclose(last.relative, 1.0)
    np.testing.assert_allclose(last.training_fraction, 1.0)
    np.testing.assert_allclose(r[r.model == "a"].relative, [0.5, 1.0])


# --------------------------------------------------------------------------- a sweep over tiny checkpoints
class _Tok:
    """A stand-in tokenizer: characters to ids (the sweep only needs ``tok(text, return_tensors)``)."""

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 64 for c in text]])}

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


def _tiny_checkpoints():
    """Three 'checkpoints' of a 4-block GPT-NeoX (d = 16): random weights of growing scale."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        rotary_pct=0.25,
    )
    models = {}
    for step, seed in ((0, 0), (4, 1), (16, 2)):
        torch.manual_seed(seed)
        m = GPTNeoXForCausalLM(cfg).eval()
        models[f"step{step}"] = m
    return models


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    models = _tiny_checkpoints()
    loads = []

    def load(name, *, revision, dtype):
        loads.append(revision)
        return SimpleNamespace(
            model=models[revision],
            tokenizer=_Tok(),
            name=name,
            revision=revision,
            dtype=dtype,
            arch="gpt_neox",
            n_layers=4,
            d_model=16,
            provenance={},
        )

    out = tmp_path_factory.mktemp("sweep")
    prompts = {"a": "hello world", "b": "coupling!"}
    sweep = em.sweep_checkpoints(
        "tiny", ["step16", "step0", "step4"], prompts, em.SweepSettings(k=(2, 4)), out=out,
        options=Options(load=load, on_error="raise"),
    )  # fmt: skip
    return SimpleNamespace(sweep=sweep, models=models, prompts=prompts, out=out, load=load, loads=loads)


def test_sweep_tables_are_tidy_and_ordered(tiny_sweep):
    s = tiny_sweep.sweep
    assert list(s.depthwise.columns[:4]) == ["model", "revision", "step", "prompt"]
    assert s.depthwise.step.is_monotonic_increasing  # checkpoints measured in step order
    assert set(s.depthwise.K) == {2, 4}
    # 3 checkpoints x 2 prompts x 2 K x 4 x 4 layer pairs, last token only
    assert len(s.depthwise) == 3 * 2 * 2 * 16
    n_tokens = sum(len(t) for t in tiny_sweep.prompts.values())
    assert len(s.trajectories) == 3 * n_tokens
    assert {"lss", "expodistance_ratio_cv", "growth_log_linear_r2"} <= set(s.trajectories.columns)
    assert len(s.step_norms) == 3 * n_tokens * 4
    assert list(s.summary.step) == [0, 0, 4, 4, 16, 16] and list(s.summary.K) == [2, 4] * 3
    assert (s.summary.lss >= 1).all()  # a path is never shorter than the straight line


def test_sweep_values_match_a_direct_computation(tiny_sweep):
    from coupling_utils.engine.jacobians import reference_jacobians  # the oracle, not the fast path

    s = tiny_sweep.sweep
    model = tiny_sweep.models["step4"]
    ids = _Tok()(tiny_sweep.prompts["b"])["input_ids"]
    J1, J3 = (reference_jacobians(model, ids, layer, tokens=[-1])[0] for layer in (1, 3))
    row = s.depthwise.query("step == 4 and prompt == 'b' and K == 2 and layer_i == 1 and layer_j == 3")
    assert row.m.item() == pytest.approx(coupling(J1, J3, 2), abs=1e-5)
    # the summary is the mean of 1 - m^2 over off-diagonal pairs, prompts counted equally
    g = s.depthwise.query("step == 4 and K == 4 and layer_i != layer_j")
    expected = (1 - g.m**2).groupby(g.prompt).mean().mean()  # from m, not the table's coupling column
    assert s.summary.query("step == 4 and K == 4").coupling.item() == pytest.approx(expected)


def test_checkpoints_without_last_block_drop_its_pairs_and_recompute_the_coupling(tiny_sweep):
    s = tiny_sweep.sweep
    cut = checkpoints_without_last_block(s)
    assert set(cut.depthwise.layer_i) == set(cut.depthwise.layer_j) == {0, 1, 2}
    g = s.depthwise.query("step == 4 and K == 4 and layer_i != layer_j and layer_i < 3 and layer_j < 3")
    expected = (1 - g.m**2).groupby(g.prompt).mean().mean()
    assert cut.summary.query("step == 4 and K == 4").coupling.item() == pytest.approx(expected)
    assert cut.summary.query("step == 4 and K == 4").coupling.item() != pytest.approx(
        s.summary.query("step == 4 and K == 4").coupling.item()
    )
    pd.testing.assert_frame_equal(cut.summary.drop(columns="coupling"), s.summary.drop(columns="coupling"))
    two = s.depthwise[(s.depthwise.layer_i < 2) & (s.depthwise.layer_j < 2)]
    with pytest.raises(ValueError, match="needs three"):
        checkpoints_without_last_block(dataclasses.replace(s, depthwise=two))


def test_the_last_block_setting_reaches_the_measurement():
    jobs = em.checkpoint_jobs("tiny", ["step0"], {"a": "x"}, em.SweepSettings(last_block="final_norm"))
    assert jobs and {s.last_block for j in jobs for s in j.settings.values()} == {"final_norm"}
    assert {
        s.last_block for j in em.checkpoint_jobs("tiny", ["step0"], {"a": "x"}) for s in j.settings.values()
    } == {"block"}


def test_one_sweep_measures_the_last_block_under_both_maps(tiny_sweep, tmp_path):
    """``last_block_also``: the checkpoints' last block once more under the other map, in the same
    jobs; read under that map (``Collected.under``) the sweep is the one measured with it alone."""
    both = em.SweepSettings(k=(2, 4), last_block="final_norm", last_block_also="block")
    jobs = em.checkpoint_jobs("tiny", ["step16", "step0", "step4"], tiny_sweep.prompts, both, root=tmp_path)
    assert {s.last_block_also for j in jobs for s in j.settings.values()} == {"block"}
    done = collect(jobs, Options(load=tiny_sweep.load, on_error="raise"))
    alone = em.sweep_of(done.under("block"), "tiny")
    pd.testing.assert_frame_equal(alone.summary, tiny_sweep.sweep.summary, atol=1e-6)
    pd.testing.assert_frame_equal(alone.depthwise, tiny_sweep.sweep.depthwise, atol=1e-6)
    folded = em.sweep_of(done, "tiny")
    last = folded.depthwise.query("layer_j == 3 and layer_i != 3")
    assert not np.allclose(last.m, alone.depthwise.query("layer_j == 3 and layer_i != 3").m)
    inner = "layer_i < 3 and layer_j < 3"
    pd.testing.assert_frame_equal(folded.depthwise.query(inner), alone.depthwise.query(inner))


def test_sweep_reuses_stored_measurements(tiny_sweep, monkeypatch):
    import coupling_utils.engine.jacobians as jac

    def no_jacobians(*args, **kwargs):
        raise AssertionError("a stored checkpoint was measured again")

    monkeypatch.setattr(jac, "token_jacobians", no_jacobians)
    again = em.sweep_checkpoints(
        "tiny",
        ["step0", "step4", "step16"],
        tiny_sweep.prompts,
        em.SweepSettings(k=(2, 4)),
        out=tiny_sweep.out,
        options=Options(load=tiny_sweep.load),
    )
    pd.testing.assert_frame_equal(again.summary, tiny_sweep.sweep.summary)


def test_sweep_rejects_bad_arguments(tiny_sweep):
    with pytest.raises(ValueError, match="revisions is empty"):
        em.sweep_checkpoints("tiny", [], {"a": "x"}, options=Options(load=tiny_sweep.load))
    with pytest.raises(ValueError, match="not a checkpoint name"):
        em.sweep_checkpoints("tiny", ["main"], {"a": "x"}, options=Options(load=tiny_sweep.load))
    with pytest.raises(ValueError, match="trajectory_tokens"):
        em.sweep_checkpoints("tiny", ["step0"], {"a": "x"}, em.SweepSettings(trajectory_tokens="first"))


# --------------------------------------------------------------------------- runs, matrices, graphs
def test_run_checkpoints_of_a_local_run(tmp_path):
    for step in (0, 1, 16, 2):
        d = tmp_path / "revisions" / f"step{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    pd.DataFrame({"step": [0, 1, 2, 16], "val_loss": [7.0, 6.0, 5.0, 4.0]}).to_parquet(
        tmp_path / "losses.parquet"
    )
    run = em.run_checkpoints(str(tmp_path))
    assert run.revisions == ["step0", "step1", "step2", "step16"] and run.steps == [0, 1, 2, 16]
    assert list(run.losses.val_loss) == [7.0, 6.0, 5.0, 4.0]
    assert em.run_checkpoints(str(tmp_path), ["step16", "step1"]).revisions == ["step1", "step16"]
    with pytest.raises(ValueError, match=r"no checkpoint\(s\) \['step4'\]; it has: step0, step1"):
        em.run_checkpoints(str(tmp_path), ["step4"])
    with pytest.raises(ValueError, match="name them with revisions"):
        em.run_checkpoints("EleutherAI/pythia-6.9b")
    hub = em.run_checkpoints("EleutherAI/pythia-6.9b", ["step143000", "step128"])
    assert hub.steps == [128, 143000] and hub.losses is None and hub.path is None


def test_mean_matrices_and_edge_counts():
    rows = []
    for prompt, shift in (("a", 0.0), ("b", 0.2)):
        for i in range(3):
            for j in range(3):
                c = (
                    1.0
                    if i == j
                    else {(0, 1): 0.5, (1, 0): 0.3, (0, 2): 0.1, (2, 0): 0.1, (1, 2): 0.7, (2, 1): 0.7}[
                        (i, j)
                    ]
                    + shift
                )
                rows.append(
                    {
                        "step": 8,
                        "prompt": prompt,
                        "K": 2,
                        "layer_i": i,
                        "layer_j": j,
                        "m": float(np.sqrt(max(0.0, 1 - c))),
                        "coupling": c,
                    }
                )
    M = em.mean_matrices(pd.DataFrame(rows))
    assert len(M) == 9
    assert M.query("layer_i == 0 and layer_j == 1").coupling.item() == pytest.approx(0.6)
    e = em.edge_counts(M, 0.45).iloc[0]
    # symmetrised pairs: (0,1) -> 0.5, (0,2) -> 0.2, (1,2) -> 0.8
    assert (e.pairs, e.edges) == (3, 2) and e.density == pytest.approx(2 / 3)
    assert em.edge_counts(M, 0.9).edges.item() == 0
    with pytest.raises(ValueError, match="mixes K"):
        em.mean_matrices(pd.DataFrame(rows + [{**rows[0], "K": 3}]))


# --------------------------------------------------------------------------- shapes, K levels, graph steps
def test_growth_summary_says_where_the_peak_is():
    # the f03 default before the search: an early peak, a fall, a final value above the early one
    early_peak = _curve([0.05, 0.05, 0.29, 0.2, 0.1, 0.099], steps=[0, 1, 64, 256, 512, 1024])
    s = em.growth_summary(early_peak, "value").iloc[0]
    assert s.ratio == pytest.approx(0.099 / 0.05) and s.peak_step == 64 and s.peak == pytest.approx(0.29)
    assert s.peak_position == pytest.approx(np.log(64) / np.log(1024))  # 0.6 on the log-step axis
    assert s.final_vs_peak == pytest.approx(0.099 / 0.29)
    rise = em.growth_summary(_curve([0.1, 0.1, 0.12, 0.15, 0.2, 0.24]), "value").iloc[0]
    assert rise.peak_step == 16 and rise.peak_position == 1.0 and rise.final_vs_peak == 1.0
    # from step 0 there is no log axis: the position is NaN (and a rule on it never says yes)
    assert np.isnan(em.growth_summary(_curve([0.1, 0.2, 0.3]), "value", early_step=0).peak_position.item())


def test_log_position():
    assert em.log_position(1, 1, 4096) == 0.0 and em.log_position(4096, 1, 4096) == 1.0
    assert em.log_position(256, 1, 4096) == pytest.approx(2 / 3)  # the last third starts at step 256
    with pytest.raises(ValueError, match="0 < first < last"):
        em.log_position(1, 0, 10)
    with pytest.raises(ValueError, match="outside"):
        em.log_position(20, 1, 10)


def test_share_above_one_and_k_levels():
    rows = []
    for step, ms in ((0, [1.1, 0.9, 1.2, 0.95]), (8, [0.5, 0.6, 1.05, 0.7])):
        for (i, j), m in zip(((0, 1), (1, 0), (0, 2), (2, 0)), ms):
            rows.append(
                {
                    "model": "r",
                    "step": step,
                    "K": 16,
                    "prompt": "a",
                    "layer_i": i,
                    "layer_j": j,
                    "m": m,
                    "coupling": 1 - m**2,
                }
            )
        rows.append(
            {
                "model": "r",
                "step": step,
                "K": 16,
                "prompt": "a",
                "layer_i": 0,
                "layer_j": 0,
                "m": 0.0,
                "coupling": 1.0,
            }
        )  # the diagonal is not a pair
    depthwise = pd.DataFrame(rows)
    share = em.share_above_one(depthwise).set_index("step").share_m_above_1
    assert share.loc[0] == 0.5 and share.loc[8] == 0.25
    summary = pd.DataFrame({"model": "r", "step": [0, 8], "K": 16, "d_model": 64.0, "coupling": [-0.05, 0.3]})
    lv = em.k_levels(summary, depthwise).iloc[0]
    assert lv.K_over_d == 0.25 and lv.first == -0.05 and lv.lowest == -0.05 and lv.final == 0.3
    assert (lv.share_first, lv.share_final) == (0.5, 0.25)
    # a mean below zero needs pairs with m > 1: 1 - m^2 < 0 exactly there
    off = depthwise[depthwise.layer_i != depthwise.layer_j]
    assert ((off.coupling < 0) == (off.m > 1)).all()


def test_graph_checkpoints_replace_missing_steps_and_say_so():
    steps = [0, 1, 2, 4, 64, 1000, 4096]
    assert em.graph_checkpoints(steps) == (em.pick_checkpoints(steps, 3), "")
    assert em.graph_checkpoints(steps, [1, 64, 4096]) == ([1, 64, 4096], "")
    chosen, note = em.graph_checkpoints(steps, [1, 4000, 143000])
    assert chosen == [1, 4096] and "step 4000 → 4096" in note and "step 143000 → 4096" in note
    with pytest.raises(ValueError, match="no checkpoint after step 0"):
        em.graph_checkpoints([0], [1])


def test_sweep_runs_records_missing_checkpoints_and_runs(tiny_sweep):
    def load(name, *, revision, dtype):
        if name == "gone" or revision == "step4":
            raise OSError(f"{name} has no revision {revision} on the hub")
        return tiny_sweep.load(name, revision=revision, dtype=dtype)

    runs = [
        em.Checkpoints("tiny", ["step0", "step4", "step16"], [0, 4, 16]),
        em.Checkpoints("gone", ["step0"], [0]),
    ]
    two = em.SweepSettings(k=(2,))
    sw = em.sweep_runs(runs, tiny_sweep.prompts, two, panel="held-out", options=Options(load=load))
    assert set(sw.summary.step) == {0, 16} and set(sw.summary.panel) == {"held-out"}
    assert sw.summary.d_model.eq(16).all()
    failed = sw.failures
    assert set(failed.model) == {"tiny", "gone"} and (failed.panel == "held-out").all()
    assert "step4" in failed.astype(str).to_string()
    with pytest.raises(RuntimeError, match="none of the runs"):
        em.sweep_runs(runs[1:], tiny_sweep.prompts, two, options=Options(load=load))
    with pytest.raises(em.NoCheckpointMeasured, match="gone: no checkpoint could be measured"):
        em.sweep_checkpoints("gone", ["step0"], tiny_sweep.prompts, two, options=Options(load=load))
    with pytest.raises(OSError, match="no revision step4"):
        em.sweep_runs(runs[:1], tiny_sweep.prompts, two, options=Options(load=load, on_error="raise"))


def test_load_search_and_judge_rows(tmp_path):
    from coupling_utils.analysis.verdicts import Rule

    with pytest.raises(FileNotFoundError, match="f03_emergence_search.py"):
        em.load_search(tmp_path)
    pd.DataFrame({"config": ["a", "b"], "spearman": [0.9, 0.1], "ratio": [2.0, 3.0]}).to_csv(
        tmp_path / "runs.csv"
    )
    pd.DataFrame({"config": ["a"], "step": [0], "K": [4], "coupling": [0.1]}).to_csv(tmp_path / "curves.csv")
    pd.DataFrame({"config": ["a"], "step": [0], "val_loss": [7.0]}).to_csv(tmp_path / "losses.csv")
    (tmp_path / "provenance.json").write_text('{"a": {"command": "x"}}')
    with pytest.raises(ValueError, match=r"\['b'\] have no provenance"):
        em.load_search(tmp_path)
    (tmp_path / "provenance.json").write_text('{"a": {"command": "x"}, "b": {"command": "y"}}')
    search = em.load_search(tmp_path)
    judged = em.judge_rows(search.runs, Rule(yes="spearman >= 0.7 and ratio >= 1.5"))
    assert list(judged.verdict) == ["yes", "no"]


def test_the_stored_search_is_complete():
    """data/f03_search: every configuration has its curves, losses and provenance, and the
    shape columns of runs.csv are those of its curves (the chapter re-judges them)."""
    search = em.load_search()
    assert set(search.runs.config) == set(search.curves.config) == set(search.losses.config)
    for row in search.runs.itertuples():
        curve = search.curves.query("config == @row.config and K == @row.K")
        g = em.growth_summary(curve, "coupling", early_step=1).iloc[0]
        assert g.peak_step == row.peak_step and g.final == pytest.approx(row.final, abs=1e-5)
        assert g.spearman == pytest.approx(row.spearman, abs=1e-4)
        assert search.provenance[row.config]["spec"]["d_model"] == row.d_model


def test_one_factor_effects_compare_runs_that_differ_in_one_factor_only():
    runs = pd.DataFrame(
        {
            "config": ["base", "long", "longer", "deep", "wide-long"],
            "d_model": [64, 64, 64, 64, 128],
            "n_layers": [4, 4, 4, 8, 4],
            "steps": [1024, 2048, 4096, 1024, 2048],
            "lr": [3e-3] * 5,
            "data_tokens": [0] * 5,
            "final": [0.24, 0.2, 0.15, 0.3, 0.25],
        }
    )
    fx = em.one_factor_effects(runs)
    steps = fx[fx.factor == "steps"]
    assert (
        list(steps.config) == ["base", "long", "longer"]
        and steps.change.tolist() == [pytest.approx(-0.09)] * 3
    )
    depth = fx[fx.factor == "n_layers"]
    assert list(depth.config) == ["base", "deep"] and depth.change.tolist() == [pytest.approx(0.06)] * 2
    width = fx[fx.factor == "d_model"]  # "long" and "wide-long" differ in width only
    assert list(width.config) == ["long", "wide-long"] and width.change.tolist() == [pytest.approx(0.05)] * 2
    assert "direction" not in fx  # single runs, one seed each: no "higher" or "lower" without an interval
    assert fx[fx.factor == "lr"].empty
    with pytest.raises(ValueError, match=r"runs: missing column\(s\) \['lr'\]"):
        em.one_factor_effects(runs.drop(columns="lr"))


def test_the_chapter_run_is_a_searched_run():
    """embedded:pythia-tiny is trained with exactly the spec of one searched configuration, so the
    chapter's own run and its row in the search table are the same run."""
    from coupling_utils.models import zoo

    spec = zoo.REGISTRY["pythia-tiny"].specs().to_dict()
    matches = [c for c, p in em.load_search().provenance.items() if p["spec"] == spec]
    assert matches == ["w64-l4-s4096"]


def test_shape_intervals_resample_the_units_of_the_mean_curve():
    from coupling_utils.analysis.training_curves import shape_intervals

    steps = [1, 2, 4, 8, 16]
    rng = np.random.default_rng(0)
    rows = [
        {"prompt": p, "step": s, "coupling": 0.1 * np.log2(s) + 0.05 * rng.standard_normal()}
        for p in "abcdef"
        for s in steps
    ]
    df = pd.DataFrame(rows)

    def shape(curve):
        return em.growth_summary(curve, "coupling").iloc[0].to_dict()

    names = ["ratio", "spearman", "max_drop", "peak_position"]
    out = shape_intervals(df, "coupling", shape, names, n_resamples=200)
    mean = shape(df.groupby("step", as_index=False).coupling.mean())
    for name in ("ratio", "spearman", "max_drop", "peak_position"):
        iv = out[name]
        assert iv.estimate == pytest.approx(mean[name]) and iv.low <= iv.estimate <= iv.high
        assert iv.over == "6 prompts"
    assert out["ratio"].high > out["ratio"].low  # the prompts differ, so the ratio moves
    assert set(out) == set(names)  # what the rules judge, nothing else
    one = shape_intervals(df[df.prompt == "a"], "coupling", shape, names)
    assert one["ratio"].low == -np.inf and one["ratio"].over == "1 prompt"
    with pytest.raises(ValueError, match="every prompt must be measured at every step"):
        shape_intervals(df.iloc[1:], "coupling", shape, names)


@pytest.mark.parametrize("early_step", [None, 2, 0])
def test_growth_intervals_give_shape_intervals_of_growth_summary_every_resample_at_once(early_step):
    """f03 reran growth_summary (pandas, a Spearman ρ from scipy) on each of 500 resampled curves,
    most of a warm rerun's time: growth_shape_intervals judges them all at once and must give the same
    intervals, on curves with tied values, a flat stretch and a step 0."""
    from coupling_utils.analysis.training_curves import growth_shape_intervals, shape_intervals

    steps = [0, 1, 2, 4, 8, 16, 32]
    rng = np.random.default_rng(1)
    rows = [
        {"prompt": p, "step": s, "coupling": round(0.1 * np.log2(s + 1) + 0.05 * rng.standard_normal(), 2)}
        for p in "abcdefgh"
        for s in steps
    ]
    df = pd.DataFrame(rows)

    def shape(curve):
        return em.growth_summary(curve, "coupling", early_step=early_step).iloc[0].to_dict()

    names = ["early", "final", "ratio", "spearman", "rises", "max_drop", "peak", "final_vs_peak"]
    names += [] if early_step == 0 else ["peak_position"]  # no log axis from step 0
    old = shape_intervals(df, "coupling", shape, names, n_resamples=300)
    new = growth_shape_intervals(df, "coupling", names, early_step=early_step, n_resamples=300)
    assert set(new) == set(old) == set(names)
    for name in names:
        a, b = old[name], new[name]
        assert (b.estimate, b.low, b.high) == pytest.approx((a.estimate, a.low, a.high), abs=1e-12), name
        assert b.over == a.over == "8 prompts"
    still = df.assign(coupling=0.5)
    flat = growth_shape_intervals(still, "coupling", ["spearman", "max_drop"], n_resamples=20)
    assert flat["max_drop"].high == 0 and "spearman" not in flat  # a flat curve has no ρ (NaN)
