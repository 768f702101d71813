"""``coupling-book measure``: models the book never heard of, into tidy tables, offline."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from test_loading import write_tiny_llama_gguf

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.models import loading
from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.measure_models import MeasureError, read_prompts

HUB = "EleutherAI/pythia-1.4b"


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
    assert list(summary.columns[:4]) == ["model", "revision", "K", "how"]
    assert set(summary.model) == {HUB, str(local), str(gguf)} and set(summary.K) == {2, 4}
    assert summary.coupling.between(0, 1).all() and (summary.n_prompts == 2).all()
    depth = pd.read_csv(out / "depthwise.csv")
    assert list(depth.columns[:2]) == ["model", "revision"] and set(depth.prompt) == {"a", "b"}
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
