"""Bad input refused before any work, as exit 2: a revision an embedded run's recipe does not
save (every chapter parameter that names one, and ``measure --revision``, in the same words;
nothing is built to know it), and a token-id prompt outside a model's vocabulary where its config
can be read without loading it (``measure --prompts ids.json``). Before: the notebook, or the
measurement, failed at load time (exit 1)."""

from __future__ import annotations

import json

import pytest

from coupling_utils.chapters.checks import REVISIONS, ParameterError, check_local_models, check_revisions
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.models import loading, zoo
from coupling_utils.models.zoo import build
from coupling_utils.pipeline import execution
from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.measure_inputs import vocabulary_size
from coupling_utils.pipeline.sweep import planned_params

SMOKE = "embedded:pythia-smoke"  # saves step0, step1, step2, step4, step8, step16
SAID = (
    f"{SMOKE} has no checkpoint 'step999'; it has: step0, step1, step2, step4, step8, step16; choose one "
    "of them, or leave"
)


@pytest.fixture
def nothing_built_or_loaded(monkeypatch):
    """Building an embedded model, loading any model or starting a notebook fails the test."""

    def refuse(name, *args, **kwargs):
        pytest.fail(f"a check built, loaded or ran {name}")

    for module, name in [(build, "prepare"), (zoo, "prepare"), (loading, "load_model")]:
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(execution, "_papermill", refuse)


@pytest.mark.parametrize(
    "notebook, override, said",
    [
        ("f00", "revision=step999", f"parameter 'revision': {SAID} 'revision' empty for the final model"),
        ("f03", "revisions=[step1, step999]", f"parameter 'revisions': {SAID} 'revisions' empty for every"),
        ("f04", "revisions=[step3]", "'revisions': embedded:vit-mnist-smoke has no checkpoint 'step3'"),
        ("f05", "revision=step1", "embedded:lm-family-smoke/w16-l3-s8-seed0 has no checkpoint 'step1'; "
         "it keeps only the final model (no revisions); leave 'revision' empty"),
    ],
)  # fmt: skip
def test_run_refuses_a_checkpoint_the_recipe_does_not_save(
    notebook, override, said, tmp_path, nothing_built_or_loaded, capsys
):
    argv = ["run", notebook, "--profile", "smoke", "-p", override, "--output-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "nothing was run" in err, err
    with pytest.raises(ParameterError, match="has no checkpoint"):  # a sweep refuses it when planned
        planned_params(notebook, "smoke", dict([execution.parse_override(override)]))


def test_every_revision_parameter_is_checked_and_hub_or_final_ones_are_left(nothing_built_or_loaded):
    from coupling_utils.chapters import NAMES, chapter

    named = {n for c in NAMES for n in chapter(c).Params.names() if "revision" in n}
    assert named == set(REVISIONS)  # a new revision parameter is checked too, or this fails
    check_revisions({"model": SMOKE, "revision": "step4"})
    check_revisions({"model": SMOKE, "revision": ""})  # the final model
    check_revisions({"model": "EleutherAI/pythia-160m", "revision": "step999"})  # loading checks a hub's
    check_revisions({"models": [SMOKE], "revisions": []})  # every checkpoint it saves
    with pytest.raises(ParameterError, match="'step3'"):
        check_revisions({"models": ["EleutherAI/pythia-160m", SMOKE], "revisions": ["step1", "step3"]})


def test_final_weights_have_one_spelling_for_plans_builds_and_loading():
    # the zoo cannot import loading's constant (that module loads torch): the two must agree
    assert zoo.FINAL == loading.FINAL_REVISIONS
    assert all(zoo.is_final(r) for r in (None, "", *loading.FINAL_REVISIONS))
    assert not zoo.is_final("step0") and not zoo.is_final("Main")


def test_a_built_run_lacking_a_checkpoint_says_what_the_plan_says(smoke_zoo):
    # the plan's check reads the recipe, resolve() the built run: one sentence for both
    with pytest.raises(ParameterError) as planned:
        check_revisions({"model": SMOKE, "revision": "step999"})
    with pytest.raises(zoo.ZooError) as built:
        zoo.resolve(SMOKE, revision="step999")
    assert str(built.value) in str(planned.value), (built.value, planned.value)
    assert zoo.resolve(SMOKE, revision="") == zoo.resolve(SMOKE)  # empty: the final model, as planned


def test_measure_refuses_a_revision_in_the_same_words(tmp_path, nothing_built_or_loaded, capsys):
    out = tmp_path / "out"
    assert main(["measure", SMOKE, "--revision", "step999", "--n-prompts", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: --revision: {SAID} --revision out for the final model" in err, err
    assert not out.exists()


@pytest.fixture
def two_blocks(tmp_path):
    """A local 2-block GPT-2 (vocabulary 64) and a prompts file with an id past it."""
    local = tmp_path / "two-blocks"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"ok": [1, 5], "far": [1, 5, 64, 3, 700]}))
    return local, prompts


def test_measure_refuses_a_token_id_outside_the_vocabulary_before_loading(
    two_blocks, tmp_path, nothing_built_or_loaded, capsys
):
    local, prompts = two_blocks
    out = tmp_path / "out"
    assert main(["measure", str(local), "--prompts", str(prompts), "--k", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: prompts file {prompts}: prompt 'far' has token ids 64, 700, outside the vocabulary of "
        f"MODEL {local} (64 ids, 0..63); give ids that model's tokenizer makes, or the prompt as text"
    ) in err, err
    assert not out.exists()
    assert vocabulary_size(SMOKE) == zoo.training_spec(SMOKE).vocab_size  # from the recipe
    assert vocabulary_size(str(tmp_path / "model.gguf")) is None  # left to loading


def test_a_hub_models_vocabulary_is_read_from_the_cache(standin_hub, tmp_path):
    path, _ = standin_hub
    repo = next(p.name for p in path.iterdir() if p.name.startswith("models--")).removeprefix("models--")
    repo = repo.replace("--", "/", 1)
    config = next((path / f"models--{repo.replace('/', '--')}").rglob("config.json"))
    assert vocabulary_size(repo) == json.loads(config.read_text())["vocab_size"]
    assert vocabulary_size("nosuchorg/nosuchmodel") is None  # not downloaded: loading checks it


def test_a_local_model_no_copy_can_make_measurable_is_refused_before_any_work(
    tmp_path, two_blocks, nothing_built_or_loaded, capsys
):
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    local, _ = two_blocks
    cases = [
        (["-p", f"model={t5}"], "model_type 't5' (an encoder-decoder"),
        (["-p", f"model={local}", "-p", "revision=step9"], "has no revision 'step9'"),
    ]
    for overrides, said in cases:
        assert (
            main(["run", "f00", "--profile", "smoke", *overrides, "--output-dir", str(tmp_path / "o")]) == 2
        )
        err = capsys.readouterr().err
        assert "parameter 'model': " in err and said in err and "nothing was run" in err, err
    with pytest.raises(ParameterError, match="has no revision 'step9'"):
        check_local_models({"models": [SMOKE, str(local)], "revisions": ["step9"]})
    check_local_models({"model": str(local), "revision": ""})  # its final model: fine


def test_a_model_path_where_nothing_is_is_refused_by_a_chapter_in_measures_words(
    tmp_path, monkeypatch, nothing_built_or_loaded, capsys
):
    """One check routes a model reference for measure and for a chapter: a path where nothing
    exists is refused by both in the same words (the chapters' own check let it through)."""
    monkeypatch.chdir(tmp_path)
    for model in ("./my-run", "ckpt.gguf"):
        said = f"nothing exists at {tmp_path / model.removeprefix('./')}; give a save_pretrained folder"
        with pytest.raises(ParameterError, match=rf"parameter 'models': {model}: {said}"):
            check_local_models({"models": [SMOKE, model], "revisions": []})
        assert main(["measure", model, "--n-prompts", "1", "--out", str(tmp_path / "out")]) == 2
        assert f"MODEL {model}: {said}" in capsys.readouterr().err
    check_local_models({"model": "someorg/not-in-the-cache", "revision": ""})  # a hub id: left to loading


def test_a_cached_hub_model_of_an_architecture_without_a_row_is_refused_up_front(
    tmp_path, monkeypatch, nothing_built_or_loaded, capsys
):
    """A hub id whose config.json lies in the Hugging Face cache is read there (nothing fetched):
    an architecture the engine has no row for is bad input for measure and for a chapter."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--someorg--tiny-t5"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "out"
    assert main(["measure", "someorg/tiny-t5", "--n-prompts", "1", "--out", str(out)]) == 2
    assert "MODEL someorg/tiny-t5: its " in capsys.readouterr().err and not out.exists()
    with pytest.raises(ParameterError, match=r"parameter 'model': someorg/tiny-t5: .*model_type 't5'"):
        check_local_models({"model": "someorg/tiny-t5", "revision": ""})
    check_local_models({"model": "someorg/not-in-the-cache", "revision": ""})  # left to loading
