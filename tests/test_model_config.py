"""A model reference's config.json read offline (``models.model_config``), the one reader behind
``emergence.model_width`` and ``measure_inputs.vocabulary_size``: each keeps its own policy (the
width may build a packaged embedded model and ask the hub last; the vocabulary never builds nor
asks), and both now read a checkpoint's own config, a multimodal model's text config, and give
None for a config that is not a JSON object."""

from __future__ import annotations

import json

import pytest

from coupling_utils.analysis import emergence
from coupling_utils.models import zoo
from coupling_utils.models.model_config import config_file, offline_config
from coupling_utils.pipeline.measure_inputs import vocabulary_size


def _config(folder, **values):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", **values}))


def test_a_checkpoint_is_read_from_its_own_folder(tmp_path):
    """Before: model_width read the run folder's config whatever the revision."""
    run = tmp_path / "run"
    _config(run, n_embd=64, vocab_size=100)
    _config(run / "revisions" / "step8", n_embd=32, vocab_size=90)
    assert emergence.model_width(str(run), "step8") == 32 and vocabulary_size(str(run), "step8") == 90
    assert emergence.model_width(str(run)) == 64 and vocabulary_size(str(run), "main") == 100
    assert offline_config(str(run), "step7") is None  # a checkpoint it does not hold: loading says so
    assert emergence.model_width(str(run), "step7") is None


def test_a_multimodal_config_gives_its_text_models_width_and_vocabulary(tmp_path):
    """Before: model_width found no hidden size at the top of a multimodal config (None)."""
    folder = tmp_path / "mm"
    _config(folder, text_config={"hidden_size": 48, "vocab_size": 77}, vision_config={"hidden_size": 16})
    assert emergence.model_width(str(folder)) == 48 and vocabulary_size(str(folder)) == 77


@pytest.mark.parametrize("text", ["[1, 2]", '"gpt2"'])
def test_a_config_that_is_not_a_json_object_gives_none(text, tmp_path):
    """Before: model_width raised AttributeError on a config that is a JSON list."""
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    assert offline_config(str(folder)) is None
    assert emergence.model_width(str(folder)) is None and vocabulary_size(str(folder)) is None


def test_a_hub_model_is_read_from_the_cache_and_else_from_the_record(standin_hub, monkeypatch):
    from transformers import AutoConfig

    path, _ = standin_hub
    repo = next(p.name for p in path.iterdir() if p.name.startswith("models--"))
    repo = repo.removeprefix("models--").replace("--", "/", 1)
    config = json.loads(config_file(repo).read_text())
    assert offline_config(repo) == config
    assert emergence.model_width(repo) == config.get("hidden_size", config.get("n_embd"))

    def no_network(*args, **kwargs):
        pytest.fail("asked the hub")

    monkeypatch.setattr(AutoConfig, "from_pretrained", no_network)
    recorded = "EleutherAI/pythia-70m"  # in data/model_configs.csv, not in the stand-in hub
    assert vocabulary_size(recorded) is None  # not cached: left to loading
    assert emergence.model_width(recorded) == 512


def test_only_the_width_builds_a_packaged_embedded_model(tmp_path, monkeypatch):
    """vocabulary_size never builds; model_width builds a packaged model (not a training run)
    once, through zoo.resolve, and reads the built config."""
    built = []
    name = "embedded:smollm2-135m"
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))  # not built, whatever other tests built

    def resolve(model, *args, **kwargs):
        built.append(model)
        _config(zoo.entry_path(model), hidden_size=576, vocab_size=49152)
        return zoo.entry_path(model)

    monkeypatch.setattr(zoo, "resolve", resolve)
    monkeypatch.setattr(zoo, "prepare", lambda *a, **k: pytest.fail("prepared"))
    assert vocabulary_size(name) is None and built == []
    assert emergence.model_width(name) == 576 and built == [name]
    assert vocabulary_size(name) == 49152 and emergence.model_width(name) == 576 and built == [name]
