"""The f02 chapter: its run collects exactly its plan, stores it where the plan says, and splits
the results into the family, the hub models and the scale question (stand-in models, no zoo
training: the loader builds a tiny model for every reference)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from coupling_utils.chapters import ParameterError
from coupling_utils.chapters import f02_generalization as f02
from coupling_utils.engine.metric import k_for_width
from coupling_utils.measurement import Options

SMALL = {
    "family": "embedded:lm-family-smoke",
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
    assert list(got.prompt_table.prompt) == list(f02.prompts(p))
    # every measurement with the authors' last block; the family and the scale reference also
    # with the paper's, for the status rows' notes
    conventions = [j.settings["measure"].last_block for j in planned]
    n_family, n_scale = 2 * len(members), 2 * len(f02.scale_ks(p))
    assert conventions == ["final_norm"] * (n_family + 2 + n_scale) + ["block"] * (n_family + 2)
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
