"""The stand-in hub: the paper profiles' repos, offline, with their switches, loadable by id and revision."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch
from support import standin_hub as S

from coupling_utils import token_jacobians
from coupling_utils.models.loading import gated_repos, load_model

ROOT = Path(__file__).resolve().parents[1]
PAPER = S.profile_repos()  # the paper and laptop profiles' repos
DEMO = "What is the capital of France? The capital is"


def test_profiles_and_standin_name_the_same_repos(standin_hub):
    path, manifest = standin_hub
    assert set(manifest) == set(PAPER)
    on_disk = {p.name[len("models--") :].replace("--", "/") for p in path.glob("models--*")}
    assert on_disk == set(PAPER)
    # read independently of profile_repos: every hub id in the YAML files is in the stand-in
    import yaml

    files = [f for p in S.HUB_PROFILES for f in sorted((ROOT / "notebooks" / "profiles" / p).glob("*.yaml"))]
    assert {f.parent.name for f in files} == {"paper", "laptop"}
    for f in files:
        text = yaml.safe_load(f.read_text())
        for key in ("model", "more_models", "hub_models", "models"):
            values = text.get(key) or []
            for v in [values] if isinstance(values, str) else values:
                if not v.startswith("embedded:"):
                    assert v in manifest, f"{f.name}: {key} names {v}, which the stand-in lacks"
                    revs = text.get("revisions") or ([text["revision"]] if text.get("revision") else [])
                    missing = set(revs) - set(manifest[v]["revisions"])
                    assert not missing, f"{f.parent.name}/{f.name}: {v} lacks revisions {sorted(missing)}"
    revs = PAPER["EleutherAI/pythia-6.9b"]
    assert (
        "step1" in revs
        and "step143000" in revs
        and set(manifest["EleutherAI/pythia-6.9b"]["revisions"])
        == {
            "main",
            *revs,
        }
    )


def test_a_new_profile_entry_cannot_go_untested(tmp_path):
    profile = tmp_path / "f99.yaml"
    profile.write_text('model: "someorg/brand-new-model"\nrevision: "step7"\nprompt: "a / b"\n')
    repos = S.profile_repos([*S.hub_profiles(), profile])
    assert repos["someorg/brand-new-model"] == ("step7",) and "a / b" not in repos
    with pytest.raises(S.StandInError, match=r"someorg/brand-new-model.*add exactly one rule"):
        S.write_standin_hub(tmp_path / "hub", repos=repos)
    assert not (tmp_path / "hub").exists(), "nothing half-written"


def test_every_paper_repo_has_a_gated_record():
    with open(ROOT / "data" / "gated_repos.csv", newline="") as f:
        rows = {r["model_id"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(PAPER)
    gated = set(gated_repos())
    assert len(gated) == 9 and all(r.startswith(("meta-llama/", "google/gemma", "mistralai/")) for r in gated)
    assert "tiiuae/falcon-11B" not in gated and "lmsys/vicuna-7b-v1.5" not in gated


def test_cache_layout(standin_hub):
    path, manifest = standin_hub
    repo = path / "models--lmsys--vicuna-7b-v1.5"
    commit = (repo / "refs" / "main").read_text()
    snap = repo / "snapshots" / commit
    assert len(commit) == 40 and (snap / "config.json").is_symlink()
    assert os.readlink(snap / "config.json").startswith(os.path.join("..", "..", "blobs"))
    # SentencePiece only, as the real Vicuna and Orca-2 repos; .bin weights
    for name in ("lmsys/vicuna-7b-v1.5", "microsoft/Orca-2-7b"):
        assert manifest[name]["tokenizer_files"] == ["tokenizer.model"]
        assert manifest[name]["weights"] == ["pytorch_model.bin"]
    assert "tokenizer.json" in manifest["meta-llama/Llama-2-7b-hf"]["tokenizer_files"]
    weights = {w for m in manifest.values() for w in m["weights"]}
    assert {"pytorch_model.bin", "model.safetensors", "model.safetensors.index.json"} <= weights
    # Pythia revisions share unchanged blobs (tokenizer) and have their own weights and commits
    pythia = path / "models--EleutherAI--pythia-6.9b"
    refs = {p.name: p.read_text() for p in (pythia / "refs").iterdir()}
    assert len(set(refs.values())) == len(refs) == len(PAPER["EleutherAI/pythia-6.9b"]) + 1
    tok = {os.readlink(pythia / "snapshots" / c / "tokenizer.json") for c in refs.values()}
    wts = {os.readlink(pythia / "snapshots" / c / "pytorch_model.bin") for c in refs.values()}
    assert len(tok) == 1 and len(wts) == len(refs)
    info = json.loads((path / "standin.json").read_text())
    assert info["repos"] == json.loads(json.dumps(manifest)) and info["seconds"] > 0


EXPECTED_SWITCHES = {
    "meta-llama/Meta-Llama-3-8B": ["GQA"],
    "Qwen/Qwen2-7B": ["GQA"],
    "google/gemma-2b": ["MQA"],
    "google/gemma-7b": ["head_dim 32 != hidden/heads 16"],
    "mistralai/Mistral-7B-v0.1": ["GQA", "sliding window 4"],
    "mistralai/Mistral-7B-Instruct-v0.1": ["sliding window 4"],
    "mistralai/Mistral-7B-v0.3": ["GQA"],
    "microsoft/phi-2": ["partial rotary 0.5", "parallel residual"],
    "EleutherAI/pythia-12b": ["partial rotary 0.25", "parallel residual"],
    "tiiuae/falcon-11B": ["GQA", "parallel residual", "new decoder architecture"],
    "allenai/OLMo-1.7-7B-hf": ["clip_qkv 8.0"],
}


def test_switches_of_the_real_checkpoints(standin_hub):
    _, manifest = standin_hub
    for repo, wanted in EXPECTED_SWITCHES.items():
        have = " | ".join(manifest[repo]["switches"])
        for w in wanted:
            assert w in have, f"{repo}: {w!r} not among {have!r}"
    assert "sliding window" not in " ".join(manifest["mistralai/Mistral-7B-Instruct-v0.2"]["switches"])
    assert manifest["allenai/OLMo-1B-hf"]["switches"] == []
    # the real depths (data/model_metadata.csv)
    assert (
        manifest["meta-llama/Meta-Llama-3-8B"]["layers"] == 32
        and manifest["tiiuae/falcon-11B"]["layers"] == 60
    )


@pytest.mark.parametrize("repo", sorted(PAPER))
def test_every_repo_loads_offline_by_id(standin_hub, repo):
    _, manifest = standin_hub
    lm = load_model(repo, device="cpu")
    info = manifest[repo]
    assert (lm.arch, lm.n_layers, lm.provenance["source"]) == (info["model_type"], info["layers"], "hub")
    assert lm.provenance["commit"] == info["revisions"]["main"]
    if info["tokenizer"] == "image":
        proc = lm.tokenizer
        mean = [0.485, 0.456, 0.406] if repo.startswith("facebook/deit") else [0.5, 0.5, 0.5]
        assert list(proc.image_mean) == pytest.approx(mean)
        inputs = {"pixel_values": torch.randn(1, 3, 32, 32)}
    else:
        inputs = lm.tokenizer(DEMO, return_tensors="pt").input_ids
        assert inputs.shape[1] > 4 and int(inputs.max()) < lm.model.config.vocab_size
    J = token_jacobians(lm, inputs, lm.n_layers - 1)
    assert J.dtype == torch.float32 and bool(torch.isfinite(J).all()) and float(J.abs().max()) > 0


def test_pythia_revisions_are_their_own_checkpoints(standin_hub):
    _, manifest = standin_hub
    repo = "EleutherAI/pythia-6.9b"
    main = load_model(repo, device="cpu")
    step1 = load_model(repo, revision="step1", device="cpu")
    again = load_model(repo, revision="step1", device="cpu")
    w = lambda lm: lm.model.gpt_neox.layers[3].attention.query_key_value.weight  # noqa: E731
    assert not torch.equal(w(main), w(step1)) and torch.equal(w(step1), w(again))
    assert step1.revision == "step1" and step1.provenance["commit"] == manifest[repo]["revisions"]["step1"]
    assert main.provenance["commit"] != step1.provenance["commit"]
    from coupling_utils.models.loading import ModelNotFoundError

    with pytest.raises(
        ModelNotFoundError, match=r"revision 'step3'.*hf download EleutherAI/pythia-6.9b --revision step3"
    ):
        load_model(repo, revision="step3", device="cpu")
