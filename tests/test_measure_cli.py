"""``coupling-book measure``: models the book never heard of, into tidy tables, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_loading import write_tiny_llama_gguf

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.models import loading
from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.measure_models import MeasureError, read_prompts

HUB = "EleutherAI/pythia-1.4b"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def counted(monkeypatch):
    """Every load_model call, by model reference."""
    calls = []
    real = loading.load_model

    def counting(name, *args, **kwargs):
        calls.append(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(loading, "load_model", counting)
    return calls


def test_a_hub_id_a_directory_and_a_gguf_file_into_tidy_tables(standin_hub, tmp_path, counted, capsys):
    local = tmp_path / "my-model"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    gguf = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(tiny_model("llama", seed=4), gguf)
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"a": [1, 5, 9, 3, 7], "b": [2, 4, 6, 8, 10, 12]}))  # no tokenizer needed
    out = tmp_path / "out"
    args = [HUB, str(local), str(gguf), "--prompts", str(prompts), "--k", "2", "4", "--out", str(out)]
    assert main(["measure", *args]) == 0, capsys.readouterr()
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[:5]) == ["model", "revision", "last_block", "K", "how"]
    assert set(summary.model) == {HUB, str(local), str(gguf)} and set(summary.K) == {2, 4}
    assert set(summary.last_block) == {"block"}
    assert summary.coupling.between(0, 1).all() and (summary.n_prompts == 2).all()
    depth = pd.read_csv(out / "depthwise.csv")
    assert list(depth.columns[:3]) == ["model", "revision", "last_block"] and set(depth.prompt) == {"a", "b"}
    assert "last_block" not in pd.read_csv(out / "prompts.csv").columns  # its rows are not about blocks
    assert not (out / "failures.csv").exists()
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["prompts"]["a"] == "<5 token ids>" and len(prov["measurements"]) == 3
    assert sorted(counted) == sorted([HUB, str(local.resolve()), str(gguf.resolve())])
    # a rerun reads the store: no model is loaded, the tables are the same
    counted.clear()
    before = summary.copy()
    assert main(["measure", *args]) == 0
    assert counted == []
    pd.testing.assert_frame_equal(pd.read_csv(out / "summary.csv"), before)


def test_revisions_and_a_missing_model(standin_hub, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["EleutherAI/pythia-6.9b", "someorg/not-in-the-cache"]
    args += ["--revision", "step1", "--revision", "step128"]
    args += ["--k", "4", "--max-tokens", "6", "--n-prompts", "0", "--out", str(out)]
    assert main(["measure", *args]) == 1  # not everything could be measured
    text = capsys.readouterr().out
    assert "2 of 4 measured" in text and "someorg/not-in-the-cache" in text
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary.revision) == ["step1", "step128"]
    failures = pd.read_csv(out / "failures.csv")
    assert len(failures) == 2 and set(failures.error) == {"ModelNotFoundError"}
    assert failures.message.str.contains("hf download someorg/not-in-the-cache").all()


def test_the_last_block_under_both_maps_in_one_run(tmp_path, counted, capsys):
    """--last-block-also measures the last block once more in the same run: the tables hold both
    maps (their last_block column), each equal to its own run's; the rows without the last block
    are the same under both; a map named twice, or beside 'excluded', is refused."""
    local = tmp_path / "m"
    tiny_model("llama", seed=5).save_pretrained(local)
    (tmp_path / "ids.json").write_text(json.dumps({"a": [1, 5, 9, 3, 7], "b": [2, 4, 6, 8]}))
    common = [str(local), "--prompts", str(tmp_path / "ids.json"), "--k", "2", "4"]
    both, alone = tmp_path / "both", tmp_path / "alone"
    assert (
        main(
            [
                "measure",
                *common,
                "--last-block",
                "final_norm",
                "--last-block-also",
                "block",
                "--out",
                str(both),
            ]
        )
        == 0
    )
    assert main(["measure", *common, "--out", str(alone)]) == 0, capsys.readouterr()
    summary = pd.read_csv(both / "summary.csv")
    assert sorted(set(summary.last_block)) == ["block", "final_norm"] and len(summary) == 4
    keys = ["model", "revision", "last_block", "prompt", "token", "K", "layer_i", "layer_j"]
    depth = pd.read_csv(both / "depthwise.csv").sort_values(keys).reset_index(drop=True)
    one = pd.read_csv(alone / "depthwise.csv")
    got = depth[depth.last_block == "block"].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, one.sort_values(keys).reset_index(drop=True), atol=1e-6)
    pd.testing.assert_frame_equal(
        pd.read_csv(both / "summary.csv").query("last_block == 'block'").reset_index(drop=True),
        pd.read_csv(alone / "summary.csv"),
        atol=1e-6,
    )
    last = int(pd.read_csv(both / "summary.csv").n_layers.iloc[0]) - 1
    inner = depth[(depth.layer_i != last) & (depth.layer_j != last)]
    a, b = (
        inner[inner.last_block == m].drop(columns="last_block").reset_index(drop=True)
        for m in ("block", "final_norm")
    )
    pd.testing.assert_frame_equal(a, b)
    at_last = depth[depth.layer_j == last]
    under = {m: at_last[at_last.last_block == m].coupling.to_numpy() for m in ("block", "final_norm")}
    assert len(under["block"]) and not np.allclose(under["block"], under["final_norm"])
    prov = json.loads((both / "provenance.json").read_text())
    assert prov["settings"]["last_block"] == "final_norm" and prov["settings"]["last_block_also"] == "block"
    assert len(pd.read_csv(both / "prompts.csv")) == 2  # not about blocks: written once
    capsys.readouterr()
    for last_block, also, says in (
        ("block", "block", "pass --last-block-also final_norm"),
        ("excluded", "final_norm", "pass --last-block block --last-block-also final_norm"),
    ):
        args = [*common, "--last-block", last_block, "--last-block-also", also, "--out", str(tmp_path / "x")]
        assert main(["measure", *args]) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\nsecond prompt\n")
    assert read_prompts(tmp_path / "p.txt") == {"p0": "first prompt", "p1": "second prompt"}
    (tmp_path / "p.csv").write_text("id,text\nq1,hello there\nq2,general kenobi\n")
    assert read_prompts(tmp_path / "p.csv") == {"q1": "hello there", "q2": "general kenobi"}
    (tmp_path / "p.json").write_text(json.dumps(["a text", [3, 4, 5]]))
    got = read_prompts(tmp_path / "p.json")
    assert got["p0"] == "a text" and torch.equal(got["p1"], torch.tensor([[3, 4, 5]]))
    default = read_prompts(None, n=2)  # the project's prompt set: the demo prompt and n more
    assert len(default) == 3
    assert next(iter(default.values())) == "What is the capital of France? The capital is"
    for bad, match in (("[[1, -2]]", "list of token ids"), ("{", "not valid JSON"), ("3", "expected a list")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(MeasureError, match=match):
            read_prompts(tmp_path / "bad.json")
    with pytest.raises(MeasureError, match="does not exist"):
        read_prompts(tmp_path / "nope.txt")


def test_bad_arguments_are_named(tmp_path, capsys):
    assert main(["measure", "a/b", "a/b", "--out", str(tmp_path)]) == 2
    assert "named twice" in capsys.readouterr().err
    assert main(["measure", "a/b", "--k", "0", "--out", str(tmp_path)]) == 2
    assert "bad measurement settings" in capsys.readouterr().err


def test_a_dry_run_loads_measures_and_writes_nothing(standin_hub, tmp_path, counted, capsys):
    """--dry-run shows the models, revisions, settings, the output folder and (SLURM) the batch
    script; it loads no model, measures nothing, submits nothing and creates no folder."""
    out = tmp_path / "out"
    args = [HUB, "--k", "2", "--n-prompts", "0", "--revision", "step1", "--out", str(out), "--dry-run"]
    assert main(["measure", *args]) == 0
    text = capsys.readouterr().out
    assert "dry run" in text and f"would measure  model={HUB}, revision=step1" in text, text
    assert "k=[2]" in text and str(out) in text and "last_block_also" not in text  # said only when asked
    assert main(["measure", *args, "--last-block", "final_norm", "--last-block-also", "block"]) == 0
    assert "last_block=final_norm, last_block_also=block" in capsys.readouterr().out
    assert main(["measure", *args, "--executor", "local"]) == 0
    assert f"would run  {HUB}@step1" in capsys.readouterr().out
    assert main(["measure", *args, "--executor", "slurm", "--partition", "gpu", "--time", "30"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --time=30" in text, text
    assert counted == [] and not out.exists()


def test_options_the_executor_does_not_read_are_refused(tmp_path, counted, capsys):
    out = str(tmp_path / "out")
    # without --executor the run is in this process: SLURM's and the local executor's options are refused
    assert main(["measure", "a/b", "--partition", "gpu", "--time", "5", "--account", "x", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "--partition, --account and --time" in err and "--executor slurm" in err, err
    assert main(["measure", "a/b", "--max-parallel", "2", "--out", out]) == 2
    assert "--max-parallel" in capsys.readouterr().err
    # --executor local: the SLURM-only options
    assert main(["measure", "a/b", "--executor", "local", "--cpus-per-job", "2", "--out", out]) == 2
    assert "--cpus-per-job is a SLURM option" in capsys.readouterr().err
    assert main(["measure", "a/b", "--executor", "local", "--max-parallel", "0", "--out", out]) == 2
    assert "--max-parallel (jobs at once) must be 1 or more, got 0" in capsys.readouterr().err
    assert counted == [] and not (tmp_path / "out").exists()


def test_slurm_without_sbatch_is_refused_before_out_is_made(tmp_path, monkeypatch, counted, capsys):
    import shutil

    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **kw: None if name == "sbatch" else real(name, *a, **kw)
    )
    out = tmp_path / "out"
    assert main(["measure", "a/b", "--n-prompts", "0", "--executor", "slurm", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no sbatch on its PATH" in err and "login node" in err and "Traceback" not in err, err
    assert not out.exists() and counted == []
    # a dry run shows the batch script without sbatch
    assert (
        main(["measure", "a/b", "--n-prompts", "0", "--executor", "slurm", "--out", str(out), "--dry-run"])
        == 0
    )
    assert "#SBATCH" in capsys.readouterr().out and not out.exists()


def test_slurm_without_sbatch_with_everything_stored_writes_the_tables(
    standin_hub, tmp_path, monkeypatch, capsys
):
    """Nothing left to submit: the tables are written here, sbatch or not (only a submission needs it)."""
    import shutil

    out = tmp_path / "out"
    args = [
        "EleutherAI/pythia-6.9b",
        "--k",
        "2",
        "--max-tokens",
        "4",
        "--n-prompts",
        "0",
        "--revision",
        "step1",
        "--out",
        str(out),
    ]
    assert main(["measure", *args]) == 0
    (out / "summary.csv").unlink()
    real = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **kw: None if name == "sbatch" else real(name, *a, **kw)
    )
    assert main(["measure", *args, "--executor", "slurm"]) == 0, capsys.readouterr().err
    assert (out / "summary.csv").is_file()


def test_a_measure_run_is_checked_when_made(tmp_path):
    from coupling_utils.measurement import Loads, Settings
    from coupling_utils.pipeline.measure_models import MeasureRun

    good = dict(models=["a/b"], prompts={"p": "hi"}, settings=Settings(k=(2,)), out=str(tmp_path / "o"))
    run = MeasureRun(**good, loads=Loads(revisions=["step1", "step2"]))
    assert run.models == ("a/b",) and run.out == tmp_path / "o" and len(run.jobs()) == 2
    assert all(tmp_path / "o" / "store" in j.out("measure").parents for j in run.jobs())
    bad = {
        "how must be one of": dict(how="diagonal"),
        "no random init": dict(loads=Loads(weights=("trained", "random init"))),
        "revisions is empty": dict(loads=Loads(revisions=[])),
        "named twice": dict(models=["a/b", "a/b"]),
        "no prompts": dict(prompts={}),
        "is a file": dict(out=str(tmp_path / "f")),
    }
    (tmp_path / "f").write_text("")
    for match, change in bad.items():
        with pytest.raises(MeasureError, match=match):
            MeasureRun(**{**good, **change})
    assert not (tmp_path / "o").exists()


def test_one_block_is_refused_and_one_block_after_resolving_is_said(tmp_path, counted, capsys):
    """Coupling compares blocks: --layers naming one block is refused up front; indices that
    resolve to one block of a model (1 and -1 of a 2-block model) are measured, and the output
    says why there is no summary."""
    local = tmp_path / "two-blocks"
    tiny_model("gpt2", seed=3).save_pretrained(local)  # 2 blocks
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"a": [1, 5, 9, 3, 7]}))  # no tokenizer needed
    out = tmp_path / "out"
    common = [str(local), "--k", "2", "--prompts", str(prompts), "--out", str(out)]
    assert main(["measure", *common, "--layers", "1"]) == 2
    assert "--layers 1 names one block" in capsys.readouterr().err
    assert counted == [] and not out.exists()
    assert main(["measure", *common, "--layers", "1", "-1"]) == 0
    text = capsys.readouterr().out
    assert "note:" in text and "no coupling" in text and "block(s) [1] only" in text, text
    assert not (out / "summary.csv").exists() and (out / "singular_values.csv").exists()
    assert main(["measure", *common, "--layers", "99", "0"]) == 2  # out of range: bad input, named
    assert "--layers must be <= 1, got 99" in capsys.readouterr().err


def test_an_empty_out_is_refused(tmp_path, monkeypatch, counted, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["measure", "a/b", "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err
    assert main(["measure", "a/b", "a/b", "--out", "new"]) == 2  # refused before --out is made
    assert "named twice" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and counted == []


def test_zoo_prepare_exits_1_when_a_build_fails_and_2_when_refused(monkeypatch, capsys):
    from coupling_utils.models import zoo

    monkeypatch.delenv(zoo.GEMMA_ENV, raising=False)
    outcome = {"pythia-smoke": "RuntimeError: out of memory", "gemma3-270m": "terms not accepted"}
    monkeypatch.setattr(zoo, "prepare_many", lambda names, jobs: {n: outcome[n] for n in names})
    assert main(["zoo", "prepare", "pythia-smoke", "gemma3-270m"]) == 1  # a build failed
    assert "out of memory" in capsys.readouterr().err
    assert main(["zoo", "prepare", "gemma3-270m", "gemma3-270m", "-j", "2"]) == 2  # only refused


@pytest.mark.parametrize(
    "model, message",
    [
        ("./not-here", "MODEL ./not-here: nothing exists at {tmp}/not-here; give a save_pretrained folder"),
        ("weights.gguf", "MODEL weights.gguf: nothing exists at {tmp}/weights.gguf"),
        ("embedded:nosuch", "MODEL embedded:nosuch: unknown embedded model 'nosuch'; known: "),
        ("embedded:lm-family-smoke/zz", "MODEL embedded:lm-family-smoke/zz: 'lm-family-smoke' has no member"),
    ],
)
def test_a_model_that_names_nothing_is_refused_before_out_is_made(
    model, message, tmp_path, monkeypatch, counted, capsys
):
    """A local path where nothing exists, or an embedded name the zoo does not have: bad input,
    exit 2, named with the fix, and no --out folder half-made (was: exit 1 after writing an --out
    of a failures table and a provenance)."""
    monkeypatch.chdir(tmp_path)
    assert main(["measure", model, "--k", "2", "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(tmp=tmp_path)), err
    assert not (tmp_path / "out").exists() and counted == []


def test_a_cache_that_is_a_file_is_refused_before_out_is_made(tmp_path, monkeypatch, counted, capsys):
    """COUPLING_CACHE naming a file: exit 2 naming the variable and the fix, nothing written (was:
    exit 1, "Not a directory: <cache>/zoo", and an empty --out folder left behind)."""
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["measure", "embedded:pythia-smoke", "--k", "2", "--n-prompts", "0", "--out", "out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: $COUPLING_CACHE='{tmp_path / 'cache'}': {tmp_path / 'cache'} is a file"), (
        err
    )
    assert "point COUPLING_CACHE at a folder" in err
    assert not (tmp_path / "out").exists() and counted == []


def test_an_empty_revision_is_refused_before_out_is_made(tmp_path, monkeypatch, counted, capsys):
    """`--revision ""` (an unset shell variable, say): exit 2 naming it (was: measured as revision
    '' and listed as a failure, exit 1, with an --out written)."""
    monkeypatch.chdir(tmp_path)
    args = ["measure", "a/b", "--revision", "step1", "--revision", " ", "--out", "out"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --revision ['step1', ' ']: a revision is empty; name each one"), err
    assert not (tmp_path / "out").exists() and counted == []


def test_a_bad_prompts_file_says_what_to_give(tmp_path):
    """Broken JSON and repeated CSV ids: the message names the file, the problem and the fix (was:
    "p.json: not valid JSON (...)" and "p.csv: prompt ids must be unique", without which ids)."""
    (tmp_path / "p.json").write_text('{"a": ')
    with pytest.raises(
        MeasureError, match=r"^prompts file .*p\.json: not valid JSON \(.*\); give a JSON list"
    ):
        read_prompts(tmp_path / "p.json")
    (tmp_path / "p.csv").write_text("id,text\nq1,a\nq2,b\nq1,c\nq2,d\nq3,e\n")
    with pytest.raises(MeasureError, match=r"given more than once: \['q1', 'q2'\]$"):
        read_prompts(tmp_path / "p.csv")


def test_a_local_model_whose_files_say_why_it_failed_is_named_and_the_others_measured(tmp_path, capsys):
    """Loading fails, the run goes on (exit 1), and each failure says what its files show and the
    fix. Before: 'probably truncated or damaged' for a folder without weights, 'not a valid JSON
    file' without a fix, a bare AttributeError for a config that is a JSON list."""
    good = tmp_path / "good"
    tiny_model("gpt2", seed=3).save_pretrained(good)
    broken = {name: tmp_path / name for name in ("no-weights", "bad-json", "a-list")}
    for folder in broken.values():
        tiny_model("gpt2", seed=3).save_pretrained(folder)
    (broken["no-weights"] / "model.safetensors").unlink()
    (broken["bad-json"] / "config.json").write_text('{"model_type": "gpt2", ')
    (broken["a-list"] / "config.json").write_text("[1, 2]")
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps([[1, 5, 9]]))
    out = tmp_path / "out"
    args = [str(good), *map(str, broken.values()), "--prompts", str(prompts), "--k", "2", "--out", str(out)]
    assert main(["measure", *args]) == 1
    said = dict(pd.read_csv(out / "failures.csv")[["model", "message"]].values)
    assert said[str(broken["no-weights"])] == (
        f"{broken['no-weights']} holds config.json but no weights (no *.safetensors or *.bin file); save "
        "the model there with save_pretrained, or copy its weight files beside config.json"
    )
    assert said[str(broken["bad-json"])].startswith(
        f"{broken['bad-json'] / 'config.json'} is not valid JSON (Expecting property name"
    )
    assert said[str(broken["a-list"])] == (
        f"{broken['a-list'] / 'config.json'} is not a JSON object; write it again, e.g. with the model's "
        "config.save_pretrained(folder)"
    )
    assert pd.read_csv(out / "summary.csv").model.unique().tolist() == [str(good)]


def test_text_prompts_for_a_model_without_a_tokenizer_are_bad_input(tmp_path, capsys):
    """Before: a failed run (exit 1) saying 'pass a LoadedModel from coupling_utils.load_model'."""
    local = tmp_path / "no-tokenizer"
    tiny_model("gpt2", seed=3).save_pretrained(local)  # weights and config, no tokenizer
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt\nanother\n")
    out = tmp_path / "out"
    assert main(["measure", str(local), "--prompts", str(prompts), "--k", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: MODEL {local} has no tokenizer (none was saved with it), so its text prompts (p0, p1) "
        "cannot become token ids; give the prompts as token ids (--prompts ids.json"
    ) in err, err


def test_the_provenance_says_how_each_model_was_loaded_and_what_the_store_keys(tmp_path, capsys):
    local = tmp_path / "run"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    tiny_model("gpt2", seed=4).save_pretrained(local / "revisions" / "step8")
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps([[1, 5, 9]]))
    out = tmp_path / "out"
    common = ["--prompts", str(prompts), "--k", "2", "--out", str(out), "--dtype", "bfloat16"]
    assert main(["measure", str(local), "--revision", "step8", "--revision", "main", *common]) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert {k: prov["load"][k] for k in ("dtype", "revisions")} == {
        "dtype": "bfloat16",
        "revisions": ["step8", "main"],
    }
    assert "as asked" in prov["load"]["note"]
    identities = prov["identities"]
    assert sorted(identities) == [f"model={local}, revision={r}" for r in ("main", "step8")]
    assert all(i.startswith("files@") for i in identities.values()), identities


def test_files_measure_did_not_write_in_out_are_refused_and_kept(tmp_path, counted, capsys):
    """--out holding a file named as one of the tables (here the prompts file itself) that no
    earlier `measure` wrote there is refused before anything loads: the set of tables is replaced
    as a whole, so it would have been overwritten (an audit found a prompts.csv replaced by the
    output's prompts table, and the rerun measuring its ids p0, p1 instead of a, b)."""
    local = tmp_path / "tiny"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "prompts.csv"
    mine.write_text("id,token_ids\na,[1 5 9 3 7]\n")
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"a": [1, 5, 9, 3, 7]}))
    common = [str(local), "--k", "2", "--prompts", str(ids), "--out", str(out)]
    assert main(["measure", *common]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} holds prompts.csv, which this run would replace" in err and "another --out" in err
    assert counted == [] and mine.read_text() == "id,token_ids\na,[1 5 9 3 7]\n"
    mine.unlink()
    assert main(["measure", *common]) == 0  # its own tables, listed in its provenance, are replaced
    assert main(["measure", *common, "--max-tokens", "4"]) == 0
    assert set(pd.read_csv(out / "prompts.csv").n_tokens) == {4}


def test_a_family_name_is_refused_before_anything_is_built(tmp_path, counted, capsys):
    """A family is several models: measuring its bare name trained every member, then failed
    (exit 1: 'holds no model'); it is refused up front, naming the members to give."""
    out = tmp_path / "out"
    assert main(["measure", "embedded:lm-family-smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "MODEL embedded:lm-family-smoke is a family of models, not one; name its members: " in err
    assert "embedded:lm-family-smoke/" in err and counted == [] and not out.exists()


def test_an_out_folder_whose_name_is_not_utf8(tmp_path):
    """A folder name whose bytes are not UTF-8 (kept as surrogates on Linux) is a folder like any
    other: pyarrow, given the path, failed every model with a UnicodeEncodeError; the Parquet files
    are now opened by Python (files.read_parquet, files.write_parquet)."""
    local = tmp_path / "tiny"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"a": [1, 5, 9, 3, 7]}))
    out = tmp_path / os.fsdecode(b"o\xe9ut")
    command = [str(local), "--k", "2", "--prompts", str(ids), "--out", str(out)]
    run = [sys.executable, "-c", "from coupling_utils.pipeline.cli import main; raise SystemExit(main())"]
    done = subprocess.run(
        [*run, "measure", *command], capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert os.fsencode(str(out)) in done.stdout  # the name printed as the bytes the shell gave
    first = pd.read_csv(out / "summary.csv")
    assert main(["measure", *command]) == 0  # read back from the store under that name
    assert pd.read_csv(out / "summary.csv").equals(first)
