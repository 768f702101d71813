"""A training run's checkpoints and width are known from its recipe before it is trained:
``zoo.planned_revisions`` lists what the build then holds, and planning chapter f03 on a run
that is not built trains nothing."""

from __future__ import annotations

import json

import pytest

from coupling_utils.analysis import emergence
from coupling_utils.models import zoo
from coupling_utils.models.zoo import build


def test_planned_revisions_are_what_the_build_saved(smoke_zoo):
    """Every smoke-zoo entry (family members too): the planned checkpoints are the built ones,
    the ones its ``training_spec.json`` records, and the planned width is its config's."""
    from support.smoke_runs import smoke_zoo_names

    names = smoke_zoo_names()
    names += [f"{n}/{m}" for n in names for m in zoo.REGISTRY[n.partition("/")[0]].members()]
    for name in names:
        assert zoo.planned_revisions(name) == zoo.revisions(name), name
        path = zoo.resolve(name, progress=False)
        if zoo.training_spec(name) is not None and (path / "training_spec.json").exists():
            recorded = json.loads((path / "training_spec.json").read_text())["checkpoints"]
            assert recorded == zoo.planned_revisions(name), name
            config = json.loads((path / "config.json").read_text())
            assert emergence.model_width(f"embedded:{name}") == config["hidden_size"], name
    assert zoo.planned_revisions("pythia-smoke") == ["step0", "step1", "step2", "step4", "step8", "step16"]
    assert zoo.planned_revisions("vit-mnist-smoke")  # a ViT run on the "pythia" schedule too


@pytest.fixture
def no_training(monkeypatch):
    """Any attempt to prepare an embedded model fails the test."""

    def refuse(name, *args, **kwargs):
        pytest.fail(f"planning prepared {name}")

    monkeypatch.setattr(build, "prepare", refuse)
    monkeypatch.setattr(zoo, "prepare", refuse)


def test_planning_f03_trains_nothing(smoke_zoo, no_training):
    from coupling_utils.chapters import f03_training_emergence as f03

    run = "embedded:pythia-tiny"
    planned = zoo.planned_revisions(run)
    assert planned[:3] == ["step0", "step1", "step2"] and len(planned) > 10
    assert emergence.model_width(run) == zoo.training_spec(run).d_model
    p = f03.Params.checked({"models": [run], "n_windows": 1, "window_tokens": 8, "n_prompts": 0,
                            "include_demo": False, "k": [2, 4], "k_main": 2})  # fmt: skip
    jobs = f03.jobs(p)
    assert [j.revision for j in jobs] == planned
    # a checkpoint the recipe does not save is refused before anything is built, naming those it has
    with pytest.raises(ValueError, match=r"no checkpoint\(s\) \['step3'\].*step4"):
        emergence.run_checkpoints(run, ["step3"], prepare=False)
    # a run that keeps only its final model has no checkpoints to plan
    member = "embedded:lm-training-family/" + zoo.REGISTRY["lm-training-family"].members()[0]
    assert zoo.planned_revisions(member) == []
    with pytest.raises(ValueError, match="saved no checkpoints.*keeps only the final model"):
        emergence.run_checkpoints(member, prepare=False)
