"""A block or a K that the model does not have is bad input, named in the caller's terms: a chapter
refuses it with a ParameterError naming the parameter, the model, its depth or width and what to
choose (``coupling-book run`` exits 2); ``coupling-book measure`` names the option (exit 2), refuses
a vision model on text prompts and names the weight file that cannot be read.

Each chapter's refusals are proven on its own plan: the jobs it plans for the bad parameters carry
a check that refuses the model each job loads (:func:`_refusals`, no measurement); one run per
chapter then shows that such a refusal stops the chapter as bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_chapter_f01 import _Loader, _params
from test_chapter_f02 import SMALL, Loader
from test_chapter_f04 import _params as f04_params
from test_chapter_f04 import smoke_vits  # noqa: F401 (the smoke ViTs, a fixture)

from coupling_utils.chapters import f00_coupling_metric as f00
from coupling_utils.chapters import f01_depth_and_tokens as f01
from coupling_utils.chapters import f02_generalization as f02
from coupling_utils.chapters import f04_vision_transformers as f04
from coupling_utils.chapters import f05_token_trajectories as f05
from coupling_utils.chapters.checks import NotMeasured, ParameterError, check_block, check_top_k
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import Job, Options
from coupling_utils.models.loading import load_model
from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.execution import _cell_error, bad_input_error


def test_a_block_check_names_the_parameter_the_model_its_depth_and_the_range():
    with pytest.raises(ParameterError) as info:
        check_block("layers", 99, "tiny", 4)
    assert str(info.value) == (
        "parameter 'layers' must be <= 3, got 99: tiny has 4 blocks (0..3); choose a block in 0..3"
    )
    assert check_block("--layers", -1, "tiny", 4, negative=True) == 3
    with pytest.raises(ParameterError, match=r"^--layers must be >= -4, got -5: .*or -4\.\.-1 counting"):
        check_block("--layers", -5, "tiny", 4, negative=True)
    with pytest.raises(ParameterError, match="'layer' cannot be met, got 0: tiny has 1 block .*deeper model"):
        check_block("layer", 0, "tiny", 1, last=-1)
    with pytest.raises(
        ParameterError, match=r"\(K\) must be <= the model width d=16, got 20: tiny is 16 wide"
    ):
        check_top_k("k", 20, d=16, model="tiny")


def test_f00_names_the_model_and_its_depth():
    with pytest.raises(ParameterError) as info:
        f00.check_sizes(99, 4, 2, 32, "embedded:pythia-smoke")
    assert str(info.value).startswith(
        "parameter 'layer' must be <= 0, got 99: embedded:pythia-smoke has 2 blocks (0..1), and layer + 1"
    )
    with pytest.raises(ParameterError, match="got 64: embedded:pythia-smoke is 32 wide; choose K <= 32"):
        f00.check_sizes(0, 64, 2, 32, "embedded:pythia-smoke")


# --------------------------------------------------------------------------- each chapter's plan
def _refusals(jobs: list[Job], load) -> list[str | None]:
    """Each of ``jobs``' own check run on its model as ``load`` loads it (each model once), as a
    chapter's run does before measuring: the ParameterError's message, or None where it passes."""
    models, said = {}, []
    for job in jobs:
        key = json.dumps([job.model, job.load_kwargs], sort_keys=True)
        if key not in models:
            models[key] = load(job.model, **job.load_kwargs)
        try:
            if job.check is not None:
                job.check(models[key])
            said.append(None)
        except ParameterError as exc:
            said.append(str(exc))
    return said


def _only(load, *names: str):
    """``load`` for ``names``; any other model is not on this machine (a failure that is not bad
    input, and a job whose check never runs)."""

    def only(name, **kwargs):
        if name not in names:
            raise OSError(f"{name} is not on this machine")
        return load(name, **kwargs)

    return only


def _refused(run, *said: str) -> str:
    """``run()`` raises a NotMeasured that ``coupling-book run`` reads as bad input (exit 2),
    saying each of ``said`` (before, a raw ValueError: exit 1); returns its message."""
    with pytest.raises(NotMeasured) as info:
        run()
    for words in said:
        assert f"ParameterError: {words}" in str(info.value), str(info.value)
    assert bad_input_error(_cell_error(info.value))
    return str(info.value)


def _ids(cases: list[tuple]) -> list[str]:
    """The cases' ids: each one's change (the parameters set), not its message."""
    return [",".join(f"{k}={v}" for k, v in change.items()).replace(" ", "") for change, _ in cases]


@pytest.fixture(scope="module")
def f01_load():
    """test_chapter_f01's tiny Llama (4 blocks, width 16) under any name, built once."""
    return _Loader()


F01_CASES = [
    ({"layers": [99]},
     "parameter 'layers' must be <= 3, got 99: tiny has 4 blocks (0..3); choose a block in 0..3; or leave "
     "'layers' empty (all blocks)"),
    ({"tile_layers": [1, 9]},
     "parameter 'tile_layers' must be <= 3, got 9: tiny has 4 blocks (0..3); choose a block in 0..3"),
    ({"token_layer": 7},
     "parameter 'token_layer' must be <= 3, got 7: tiny has 4 blocks (0..3); choose a block in 0..3"),
    ({"k": [2, 40]},
     "parameter 'k' (K) must be <= the model width d=16, got 40: tiny is 16 wide; choose K <= 16"),
    ({"last_block": "excluded"},
     "parameter 'token_layer' must be <= 2, got 3: tiny has 4 blocks (0..3), and last_block 'excluded' "
     "leaves the last out; choose a block in 0..2"),
]  # fmt: skip


@pytest.mark.parametrize("change, said", F01_CASES, ids=_ids(F01_CASES))
def test_f01_plans_jobs_that_refuse_a_block_or_k_their_model_lacks(change, said, f01_load):
    """Every job of the drawn model (its twin too, each measuring both maps of the last block, and
    under "excluded" the runs of each map) refuses before measuring, in the chapter's terms
    (``twin_jobs``' own check would offer blocks counted from the end, which f01's parameters do
    not take)."""
    planned = f01.jobs(_params(more_models=[], **change))
    excluded = change.get("last_block") == "excluded"
    assert len(planned) == (6 if excluded else 2) and set(_refusals(planned, f01_load)) == {said}


def test_f01_stops_at_a_block_its_model_lacks_as_bad_input(tmp_path, monkeypatch):
    """Before: a ValueError in a RuntimeError (exit 1); now a ParameterError in a NotMeasured,
    which ``coupling-book run`` reads as bad input (exit 2)."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    change, said = F01_CASES[0]
    _refused(lambda: f01.run(_params(more_models=[], **change), Options(load=_Loader())), said)


F02_CASES = [
    ({"hub_models": [], "scale_k": [2, 40]}, "parameter 'scale_k' (K) must be <= the model width d=32, "
     "got 40: embedded:pythia-smoke is 32 wide; choose K <= 32"),
    ({"hub_models": ["org/hub-a"], "k": 40}, "parameter 'k' (K) must be <= the model width d=32, got 40: "
     "org/hub-a is 32 wide; choose K <= 32"),
]  # fmt: skip


@pytest.mark.parametrize("change, said", F02_CASES, ids=_ids(F02_CASES))
def test_f02_plans_jobs_that_refuse_a_k_wider_than_their_model(change, said, tmp_path, monkeypatch):
    """The jobs that measure at the K refuse it (the scale reference's under every map of the
    last block, or the hub model's); the others, the family's at K per width, do not."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    planned = f02.jobs(f02.Params.checked({**SMALL, **change}))
    said_by = _refusals(planned, Loader())
    at_k = [any(40 in s.k for s in job.settings.values()) for job in planned]
    assert any(at_k) and {m for m, bad in zip(said_by, at_k) if bad} == {said}
    assert {m for m, bad in zip(said_by, at_k) if not bad} == {None}


def test_f02_stops_at_a_hub_models_k_as_bad_input_though_a_missing_hub_model_is_left_out(
    tmp_path, monkeypatch
):
    """A hub model that fails is left out, but one narrower than K is bad input (the other models
    are not on this machine: nothing is measured). Before: a recorded failure, the chapter shown."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    change, said = F02_CASES[1]
    p = f02.Params.checked({**SMALL, **change})
    _refused(lambda: f02.run(p, Options(load=_only(Loader(), "org/hub-a"))), said)


F04_CASES = [
    ({"k": 999},
     "parameter 'k' (K) must be <= the model width d=16, got 999: embedded:vit-mnist-smoke at step0 is 16 "
     "wide; choose K <= 16"),
    ({"token": "patch99"},
     "parameter 'token' names a patch that does not exist, got 'patch99': embedded:vit-mnist-smoke at step0 "
     "has a 4×4 grid of 16 patches; choose patch0..patch15 (row r, column c is patch r·4 + c), or 'cls', "
     "'last' or 'mean'"),
]  # fmt: skip


@pytest.mark.usefixtures("smoke_vits")
@pytest.mark.parametrize("change, said", F04_CASES, ids=_ids(F04_CASES))
def test_f04_plans_jobs_that_refuse_a_k_or_patch_their_vit_lacks(change, said):
    """The run's jobs at its first checkpoint refuse; a family member's K is a fraction of its
    width (it is not refused), and only jobs at the chapter's token refuse a patch (a refusal is
    stored by job key, so the variants at other tokens must not)."""
    planned = f04.jobs(f04_params(**change))
    said_by = dict(zip((job.describe() for job in planned), _refusals(planned, load_model)))
    first = planned[0].describe()
    assert first == "model=step0, weights=trained, study=training" and said_by[first] == said
    kept = ("variant=token", "variant=curve") if "token" in change else ("study=family",)
    passed = [d for d in said_by if any(words in d for words in kept)]
    assert passed and {said_by[d] for d in passed} == {None}
    assert None not in {m for d, m in said_by.items() if d not in passed}  # every other job refuses


@pytest.mark.usefixtures("smoke_vits")
def test_f04_stops_at_a_k_its_vit_lacks_as_bad_input():
    """The run's refusal is bad input though the family is not on this machine (not measured)."""
    change, said = F04_CASES[0]
    p = f04_params(**change)
    _refused(lambda: f04.run(p, Options(load=_only(load_model, p.model))), said)


F05_CASES = [
    ({"first_layer": 99},
     "parameter 'first_layer' must be <= 3, got 99: tiny has 4 blocks, so residual states 0..4, and "
     "last_layer needs a later one; choose a state in 0..3"),
    ({"last_layer": 99},
     "parameter 'last_layer' must be <= 4, got 99: tiny has 4 blocks, so residual states 0..4; choose a "
     "state in 1..4, or -4..-1 counting from the end (-1: state 4)"),
    ({"first_layer": 2, "last_layer": -4},
     "parameters first_layer=2 and last_layer=-4 give an empty window: tiny has 4 blocks, so residual "
     "states 0..4 (-1: state 4), and the window runs from state first_layer to a later state last_layer; "
     "choose first_layer < last_layer, e.g. -p first_layer=2 -p last_layer=4"),
]  # fmt: skip


def _f05(change: dict) -> f05.Params:
    return f05.Params.checked({"model": "tiny", "prompts": ["To be, or not to be"], **change})


def _f05_load(loader: _Loader):
    """f05 loads with ``dtype`` and, for the twin, ``random_init`` and ``seed``."""

    def load(name, *, dtype, random_init=False, seed=0):
        return loader(name, dtype=dtype, random_init=random_init, seed=seed)

    return load


@pytest.mark.parametrize("change, said", F05_CASES, ids=_ids(F05_CASES))
def test_f05_plans_jobs_that_refuse_a_window_their_model_lacks(change, said, f01_load):
    planned = f05.jobs(_f05(change))
    assert len(planned) == 3 and set(_refusals(planned, _f05_load(f01_load))) == {said}


def test_f05_stops_at_a_window_its_model_lacks_as_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    change, said = F05_CASES[0]
    _refused(lambda: f05.run(_f05(change), Options(load=_f05_load(_Loader()))), said)


# --------------------------------------------------------------------------- coupling-book measure
@pytest.fixture
def two_blocks(tmp_path):
    """A tiny GPT-2 (2 blocks, width 32) saved to a folder, and prompts of token ids."""
    local = tmp_path / "two-blocks"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"a": [1, 5, 9, 3, 7]}))
    return local, ["--prompts", str(prompts), "--out", str(tmp_path / "out")]


def test_measure_names_layers_and_k_the_model_does_not_have(two_blocks, capsys):
    local, common = two_blocks
    assert main(["measure", str(local), "--layers", "0", "99", "--k", "2", *common]) == 2
    err = capsys.readouterr().err
    assert f"error: --layers must be <= 1, got 99: {local} has 2 blocks (0..1)" in err, err
    assert "-2..-1 counting from the end; or leave --layers out" in err
    assert main(["measure", str(local), *common]) == 2  # the default K = 10, 30, 50 on width 32
    err = capsys.readouterr().err
    assert "error: --k (K) must be <= the model width d=32, got 50" in err, err
    assert "(without --k, K is 10, 30 and 50)" in err
    assert main(["measure", str(local), "--k", "2", "--last-block", "excluded", *common]) == 2
    assert "--last-block excluded leaves 1 of the 2 blocks" in capsys.readouterr().err


def test_measure_refuses_a_vision_model_on_text_prompts(two_blocks, tmp_path, capsys):
    _, common = two_blocks
    vit = tmp_path / "vit"
    tiny_model("vit", seed=1).save_pretrained(vit)
    assert main(["measure", str(vit), "--k", "2", *common]) == 2
    err = capsys.readouterr().err
    assert f"MODEL {vit} is a vision transformer (model type 'vit')" in err, err
    assert f"coupling-book run f04 -p 'hub_models=[{vit}]'" in err


def test_measure_names_the_weight_file_that_cannot_be_read(two_blocks, tmp_path, capsys):
    local, common = two_blocks
    weights = local / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    assert main(["measure", str(local), "--k", "2", *common]) == 1  # a failed run, not bad input
    message = pd.read_csv(tmp_path / "out" / "failures.csv").message.iloc[0]
    assert f"the file that cannot be read: {weights} (SafetensorError" in message, message
    assert f"the file that cannot be read: {weights}" in capsys.readouterr().out
