"""The measurement loop: stored jobs load no model, failures are recorded, models are released,
and results are keyed by the code that made them."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from coupling_utils import provenance
from coupling_utils.measurement import Extra, Loads, Options, Settings, collect, measure, plan, run
from coupling_utils.measurement.loop import Collected

PROMPTS = {"a": torch.tensor([[1, 5, 9, 3, 7]]), "b": torch.tensor([[2, 4, 6, 8]])}


class _Tok:
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 32 for c in text]])}

    def convert_ids_to_tokens(self, ids):
        return [chr(65 + i % 26) for i in ids]

    def decode(self, ids):
        return "".join(self.convert_ids_to_tokens(ids))


def _model(n_layers: int = 3, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=n_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).eval().requires_grad_(False)


class Loader:
    """Builds a fresh model per call (seeded by name and weights), like load_model; counts calls."""

    def __init__(self, fail: dict[str, Exception] | None = None):
        self.calls, self.fail, self.alive = [], fail or {}, []

    def __call__(self, name, *, dtype="float32", revision=None, random_init=False, seed=0):
        self.calls.append((name, revision, random_init))
        if name in self.fail:
            raise self.fail[name]
        model = _model(
            seed=sum(map(ord, name)) + 101 * bool(random_init) + (int(revision[4:]) if revision else 0)
        )
        model.cycle = [model]  # a reference cycle, as hooks make: only gc.collect() frees it
        self.alive.append(weakref.ref(model))
        return SimpleNamespace(
            model=model, tokenizer=_Tok(), name=name, revision=revision, dtype=dtype, arch="llama",
            n_layers=3, d_model=8, provenance={},
        )  # fmt: skip


def _refuse(*args, **kwargs):
    raise AssertionError("a model was loaded although everything is stored")


def test_a_stored_job_loads_no_model(tmp_path):
    jobs = plan(["m-a", "m-b"], PROMPTS, Settings(k=(2, 3)), root=tmp_path)
    assert [j.labels for j in jobs] == [{"model": "m-a"}, {"model": "m-b"}]
    assert jobs[0].out("measure").parent == tmp_path / "m-a" / "main" / "trained"
    load = Loader()
    first = collect(jobs, Options(load=load))
    assert [r.loaded for r in first.results] == [True, True] and load.calls == [
        ("m-a", None, False),
        ("m-b", None, False),
    ]
    again = collect(plan(["m-a", "m-b"], PROMPTS, Settings(k=(2, 3)), root=tmp_path), Options(load=_refuse))
    assert [r.loaded for r in again.results] == [False, False] and again.failures.empty
    pd.testing.assert_frame_equal(again.table("depthwise"), first.table("depthwise"))
    assert list(again.table("depthwise").columns[:2]) == ["model", "prompt"]
    # another setting is another measurement: it needs the model
    other = collect(plan(["m-a"], PROMPTS, Settings(k=2), root=tmp_path), Options(load=_refuse))
    assert other.failures.loc[0, "error"] == "AssertionError" and other.missing == [other.results[0].job]


def test_failures_are_recorded_with_their_reason_and_the_others_still_run(tmp_path):
    load = Loader(fail={"gated/model": OSError("gated repo: log in with `hf auth login`")})
    revisions = Loads(revisions=["step1"])
    jobs = plan(["gated/model", "m-ok"], PROMPTS, Settings(k=2), root=tmp_path, loads=revisions)
    done = collect(jobs, Options(load=load))
    assert [r.ok for r in done.results] == [False, True]
    row = done.failures.iloc[0]
    assert (row["model"], row["revision"], row["error"]) == ("gated/model", "step1", "OSError")
    assert "hf auth login" in row["message"]
    assert "model=gated/model, revision=step1" in done.report() and "OSError" in done.report()
    assert set(done.table("depthwise")["model"]) == {"m-ok"}
    with pytest.raises(OSError, match="gated repo"):
        collect(jobs, Options(load=load, on_error="raise"))
    # read-only: the stored failure's reason, and "not measured" for what never ran
    unseen = plan(["never"], PROMPTS, Settings(k=2), root=tmp_path)
    status = collect(jobs + unseen, Options(load=_refuse, compute=False))
    assert [r.error for r in status.results] == ["OSError", None, "NotMeasured"]
    load.fail.clear()  # the repo became reachable: measured, and its failure record removed
    assert run(jobs[0], Options(load=load)).ok and collect(jobs, Options(compute=False)).failures.empty


def test_models_are_released_between_jobs(tmp_path):
    load = Loader()
    seen_alive = []

    def checking_load(name, **kwargs):
        seen_alive.append(sum(ref() is not None for ref in load.alive))
        return load(name, **kwargs)

    def bad_layers(lm):
        if lm.name == "m-c":
            raise ValueError("m-c: refused by check")

    jobs = plan(["m-a", "m-b", "m-c", "m-d"], PROMPTS, Settings(k=2), check=bad_layers)
    done = collect(jobs, Options(load=checking_load))
    assert [r.ok for r in done.results] == [True, True, False, True]
    assert seen_alive == [0, 0, 0, 0]  # no earlier model alive when the next one loads
    assert all(ref() is None for ref in load.alive)


def test_in_an_unfrozen_heap_the_loop_collects_only_its_own_objects_and_unfreezes_after():
    """A notebook kernel's heap is not frozen (this session's is: conftest): collect freezes what
    was there before its first job, so each release between jobs scans only the jobs' own objects,
    still frees every model's cycles, and unfreezes the heap when it ends, even after an error."""
    import gc

    gc.unfreeze()
    try:
        load, during = Loader(), []

        def checking_load(name, **kwargs):
            during.append((gc.get_freeze_count() > 0, sum(ref() is not None for ref in load.alive)))
            return load(name, **kwargs)

        done = collect(plan(["m-a", "m-b", "m-c"], PROMPTS, Settings(k=2)), Options(load=checking_load))
        assert all(r.ok for r in done.results) and during == [(True, 0)] * 3
        assert gc.get_freeze_count() == 0 and all(ref() is None for ref in load.alive)
        with pytest.raises(OSError):
            collect(
                plan(["m-x"], PROMPTS, Settings(k=2)),
                Options(load=Loader({"m-x": OSError()}), on_error="raise"),
            )
        assert gc.get_freeze_count() == 0
    finally:
        gc.freeze()


def test_adjacent_jobs_of_one_model_load_it_once(tmp_path):
    """Two jobs that load the same reference with the same arguments, one after the other, share
    one load (f05's variant job); a job loading anything else in between, a failed job, or the
    end of the list releases the kept model before the next load, as between any jobs."""
    load = Loader()
    seen_alive = []

    def checking_load(name, **kwargs):
        seen_alive.append(sum(ref() is not None for ref in load.alive))
        return load(name, **kwargs)

    def job(model, k, **loads):
        (j,) = plan([model], PROMPTS, Settings(k=k), root=tmp_path / f"{model}-{k}", **loads)
        return j

    twin = Loads(weights=["random init"])
    jobs = [job("m-a", 2), job("m-a", 3), job("m-b", 2), job("m-a", 2, loads=twin), job("m-a", 3, loads=twin)]
    jobs.insert(1, job("m-a", 2))  # stored by then (same key as the first): loads nothing, keeps nothing
    done = collect(jobs, Options(load=checking_load))
    assert all(r.ok for r in done.results) and [r.loaded for r in done.results] == [True, False] + [True] * 4
    assert load.calls == [("m-a", None, False), ("m-b", None, False), ("m-a", None, True)]
    assert seen_alive == [0, 0, 0]  # no earlier model alive when the next one loads
    assert all(ref() is None for ref in load.alive)  # the last kept model is released at the end
    # the shared model measures what a fresh load measures
    fresh = collect(plan(["m-a"], PROMPTS, Settings(k=3), root=tmp_path / "fresh"), Options(load=Loader()))
    assert fresh.results[0].loaded
    pd.testing.assert_frame_equal(fresh.table("depthwise"), Collected(done.results[2:3]).table("depthwise"))


def test_other_code_remeasures_unless_stale_results_are_reused(tmp_path, monkeypatch):
    kw = dict(k=2, tokens="all", out=tmp_path / "m")
    model = _model()
    first = measure(model, PROMPTS, **kw)
    assert first.fingerprint == provenance.code_fingerprint()["fingerprint"] and not first.stale
    assert (tmp_path / "m" / "code.json").exists()
    monkeypatch.setattr(provenance, "_sources_hash", lambda covers: "other code")
    new_fp = provenance.code_fingerprint()["fingerprint"]
    reused = []
    stale = measure(model, PROMPTS, **kw, options=Options(reuse_stale=True), callback=reused.append)
    assert reused == [] and stale.stale and stale.fingerprint == first.fingerprint
    assert stale.provenance["current_code"]["fingerprint"] == new_fp
    pd.testing.assert_frame_equal(stale.depthwise, first.depthwise)
    computed = []
    fresh = measure(model, PROMPTS, **kw, callback=lambda i: computed.append(i["computed"]))
    assert computed == [True] * 6 and not fresh.stale and fresh.fingerprint == new_fp
    pd.testing.assert_frame_equal(fresh.depthwise, first.depthwise)  # the same numbers, remade


def test_the_loop_reuses_stale_results_only_when_asked(tmp_path, monkeypatch):
    jobs = plan(["m-a"], PROMPTS, Settings(k=2), root=tmp_path)
    collect(jobs, Options(load=Loader()))
    monkeypatch.setattr(provenance, "_sources_hash", lambda covers: "other code")
    needs_model = collect(jobs, Options(load=_refuse))
    assert needs_model.failures.loc[0, "error"] == "AssertionError"
    reused = collect(jobs, Options(load=_refuse, reuse_stale=True))
    assert reused.results[0].ok and not reused.results[0].loaded and reused.stale == jobs
    assert "stale (made by other code, reused) model=m-a" in reused.report()
    remade = collect(jobs, Options(load=Loader()))
    assert remade.results[0].loaded and not remade.stale


def _sizes(lm, prompts, *, scale):
    """An extra table: each prompt's length, scaled."""
    return {
        "sizes": pd.DataFrame({"prompt": list(prompts), "n": [scale * len(t[0]) for t in prompts.values()]})
    }


def _cut_short(path):
    path.write_bytes(path.read_bytes()[:20])


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda out: _cut_short(out / "sizes.parquet"), "sizes.parquet"),
        (lambda out: (out / "sizes.parquet").unlink(), "(sizes.parquet missing)"),
        (lambda out: (out / "done.json").write_text('{"tables": ["sizes"]}'), "no 'code'"),
        (
            lambda out: (out / "done.json").write_text('{"tables": "sizes", "code": {"fingerprint": "x"}}'),
            "its tables are 'sizes', not a list of names",
        ),
    ],
    ids=["table cut short", "table gone", "marker without code", "marker names one string"],
)
def test_extra_tables_damaged_since_they_were_stored_are_computed_again(damage, said, tmp_path, capsys):
    """A job's stored extra tables whose file or marker was damaged afterwards are set aside, said,
    and computed again with the model (as a measurement's tables are), not a crash of every rerun."""
    extra = Extra("sizes", _sizes, {"scale": 3})
    jobs = plan(["m-a"], PROMPTS, Settings(k=2), root=tmp_path, extra=extra)
    first = collect(jobs, Options(load=Loader()))
    assert first.results[0].ok and collect(jobs, Options(load=_refuse)).results[0].ok  # stored
    damage(jobs[0].extra_out())
    capsys.readouterr()
    again = collect(jobs, Options(load=Loader()))
    err = capsys.readouterr().err
    assert again.results[0].ok and again.results[0].loaded, again.report()
    assert "the sizes tables stored in" in err and "cannot be read" in err and said in err, err
    pd.testing.assert_frame_equal(again.table("sizes", None), first.table("sizes", None))
    assert collect(jobs, Options(load=_refuse)).results[0].ok  # stored again, whole


def test_plan_checks_its_models_and_labels_revisions_and_weights():
    ref = {"x": {"name_or_path": "org/x", "revision": "r1"}}
    jobs = plan(ref, PROMPTS, Settings(k=2), loads=Loads(weights=("trained", "random init")))
    assert [j.load_kwargs for j in jobs] == [
        {"dtype": "float32", "random_init": False, "seed": 0, "revision": "r1"},
        {"dtype": "float32", "random_init": True, "seed": 0, "revision": "r1"},
    ]
    assert [j.labels["weights"] for j in jobs] == ["trained", "random init"]
    assert jobs[0].model == "org/x" and jobs[0].revision == "r1" and jobs[1].weights == "random init"
    assert jobs[0].key != jobs[1].key
    trained = Loads(weights=("trained",))
    assert jobs[0].key == plan(ref, PROMPTS, Settings(k=2), loads=trained)[0].key  # stable
    # revisions outermost, then weights; each job's load arguments and labels name what is varied
    loads = Loads(["s1", "s2"], ("trained", "random init"), seed=3, dtype="float16")
    grid = plan(["m"], PROMPTS, Settings(k=2), loads=loads)
    assert [(j.revision, j.weights) for j in grid] == [
        ("s1", "trained"), ("s1", "random init"), ("s2", "trained"), ("s2", "random init")
    ]  # fmt: skip
    assert grid[1].load_kwargs == {"dtype": "float16", "revision": "s1", "random_init": True, "seed": 3}
    assert grid[1].labels == {"model": "m", "revision": "s1", "weights": "random init"}
    assert plan(["m"], PROMPTS, Settings(k=2))[0].load_kwargs == {"dtype": "float32"}  # nothing varied
    with pytest.raises(ValueError, match="model names must be unique"):
        plan(["m", "m"], PROMPTS, Settings(k=2))
    with pytest.raises(ValueError, match="weights must be among"):
        plan(["m"], PROMPTS, Settings(k=2), loads=Loads(weights=["random"]))
    with pytest.raises(ValueError, match="needs 'name_or_path'"):
        plan([{"revision": "r"}], PROMPTS, Settings(k=2))
    with pytest.raises(ValueError, match="models is empty"):
        plan([], PROMPTS, Settings(k=2))


def _same(a: pd.DataFrame, b: pd.DataFrame, drop=()) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=list(drop)), b.drop(columns=list(drop)), check_exact=True)


def test_the_analyses_rerun_without_loading_a_model(tmp_path):
    from coupling_utils.analysis.depth_and_tokens import measure_twins
    from coupling_utils.analysis.emergence import SweepSettings, sweep_checkpoints
    from coupling_utils.analysis.generalization import family_coupling, family_jobs

    texts = {"p": "abcdef", "q": "xyz!"}
    kw = dict(k=(2, 3), tile_layers=[0, 1], tile_k=2, token_layer=-1, out=tmp_path / "f01")
    twins = measure_twins("tiny", texts, options=Options(load=Loader(), on_error="raise"), **kw)
    again = measure_twins("tiny", texts, options=Options(load=_refuse, on_error="raise"), **kw)
    for name in ("depthwise", "tiles", "singular_values", "tokenwise", "context", "summary"):
        _same(getattr(again, name), getattr(twins, name))
    assert again.tokens == twins.tokens == {"p": list("BCDEFG"), "q": ["Y", "Z", "A", "B"]}
    assert (again.n_layers, again.d_model, again.token_layer) == (3, 8, 2)

    two, f03 = SweepSettings(k=2), tmp_path / "f03"
    sweep = sweep_checkpoints("tiny", ["step2", "step0"], texts, two, out=f03, options=Options(load=Loader()))
    again = sweep_checkpoints("tiny", ["step2", "step0"], texts, two, out=f03, options=Options(load=_refuse))
    in_memory = sweep_checkpoints("tiny", ["step2", "step0"], texts, two, options=Options(load=Loader()))
    for name in ("depthwise", "trajectories", "step_norms", "summary"):
        _same(getattr(again, name), getattr(sweep, name))
        _same(getattr(in_memory, name), getattr(sweep, name))  # stored tables read back unchanged
    assert list(sweep.summary["step"]) == [0, 2] and sweep.failures.empty

    jobs = family_jobs(["m-a", "m-b"], PROMPTS, k=2, root=tmp_path / "f02")
    fam = family_coupling(jobs, how="adjacent", options=Options(load=Loader()))
    again = family_coupling(jobs, how="adjacent", options=Options(load=_refuse))
    _same(again.summary, fam.summary, drop=("seconds", "cached"))
    assert list(fam.summary["cached"]) == [False, False] and list(again.summary["cached"]) == [True, True]
    _same(again.per_prompt, fam.per_prompt)
    _same(again.depthwise, fam.depthwise)


def test_the_analyses_record_failures_when_asked(tmp_path):
    from coupling_utils.analysis.emergence import SweepSettings, sweep_checkpoints
    from coupling_utils.analysis.generalization import family_coupling, family_jobs

    load = Loader(fail={"gated/model": OSError("gated repo")})
    lines = []
    fam = family_coupling(
        family_jobs(["gated/model", "m-a"], PROMPTS, k=2), options=Options(load=load), echo=lines.append
    )
    row = fam.summary.set_index("model").loc["gated/model"]
    assert pd.isna(row["coupling"]) and row["note"] == "failed: OSError: gated repo"
    assert lines[0] == "gated/model: failed: OSError: gated repo" and lines[1].startswith("m-a: coupling ")
    with pytest.raises(OSError, match="gated repo"):
        family_coupling(
            family_jobs(["gated/model"], PROMPTS, k=2), options=Options(load=load, on_error="raise")
        )

    def flaky(name, *, revision, dtype):
        if revision == "step1":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return Loader()(name, revision=revision, dtype=dtype)

    sweep = sweep_checkpoints(
        "tiny", ["step0", "step1", "step2"], {"a": "hello"}, SweepSettings(k=2), options=Options(load=flaky)
    )
    assert sorted(set(sweep.depthwise["step"])) == [0, 2]
    assert list(sweep.failures["revision"]) == ["step1"] and list(sweep.failures["error"]) == [
        "OutOfMemoryError"
    ]


def test_the_analyses_job_lists_pickle_with_stable_keys(tmp_path):
    """What a cluster sweep needs: the notebook's job list, sent to another process intact."""
    import pickle

    from coupling_utils.analysis.depth_and_tokens import twin_jobs
    from coupling_utils.analysis.emergence import SweepSettings, checkpoint_jobs
    from coupling_utils.analysis.generalization import family_jobs

    texts = {"p": "abc"}
    jobs = (
        twin_jobs("org/m", texts, k=2, tile_layers=[0, 1], token_layer=-1, root=tmp_path)
        + checkpoint_jobs("org/m", ["step8", "step1"], texts, SweepSettings(k=2), root=tmp_path)
        + family_jobs(["org/m", "org/n"], texts, k=2, root=tmp_path)
    )
    back = pickle.loads(pickle.dumps(jobs))
    assert back == jobs and [j.key for j in back] == [j.key for j in jobs]
    assert [j.revision for j in jobs[2:4]] == ["step1", "step8"] and jobs[2].labels["step"] == 1
    assert sorted(jobs[0].settings) == ["depth", "tokens"] and jobs[1].weights == "random init"
    assert len({j.out(part) for j in jobs for part in j.settings}) == 2 * 2 + 2 + 2
