"""Chapter f04's module: its plan holds every measurement the notebook shows, planned without
any hub model; ``run`` collects exactly that plan, and a read-only rerun gives the same story."""

from __future__ import annotations

import pytest

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.chapters import ParameterError
from coupling_utils.chapters import f04_vision_transformers as f04
from coupling_utils.measurement import Options
from coupling_utils.models.training import list_revisions
from coupling_utils.pipeline.sweep import planned_params

ABSENT = "org/absent-vit"  # a hub ViT that is not on this machine


@pytest.fixture(scope="module")
def smoke_vits(session_cache):
    """The smoke profile's run and family, built once into the session cache."""
    from coupling_utils.models import zoo

    status = zoo.prepare_many(["vit-mnist-smoke", "vit-family-smoke"], jobs=2, echo=lambda line: None)
    assert set(status.values()) == {"ready"}, status


def _params(**overrides):
    return planned_params(f04.NOTEBOOK, "smoke", overrides)


@pytest.mark.parametrize("profile", ["smoke", "default", "laptop", "paper"])
def test_planning_trains_downloads_and_loads_nothing(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    jobs = f04.jobs(planned_params(f04.NOTEBOOK, profile))  # laptop, paper: hub ViTs not on this machine
    assert jobs and all(j.folder.is_relative_to(tmp_path / "f04") for j in jobs)
    built = [path for path in (tmp_path / "zoo").rglob("*") if path.is_file()]
    assert built == []  # no embedded run or family was trained to plan


def test_the_plan_holds_every_study_and_reads_no_hub_model(smoke_vits):
    p = _params(hub_models=[ABSENT])
    jobs = f04.jobs(p)
    by = {s: [j for j in jobs if j.labels["study"] == s] for s in f04.STUDIES}
    assert [j.labels["study"] for j in jobs] == [
        s for s in f04.STUDIES for _ in by[s]
    ]  # in the story's order
    assert [j.labels["model"] for j in by["training"]] == f04.checkpoints(p)
    assert {j.weights for j in by["training"]} == {"trained"}
    for study in ("twins", "hub"):
        assert [j.weights for j in by[study]] == ["trained", "random init"]
        assert by[study][1].load_kwargs["seed"] == p.init_seed
    assert by["hub"][0].model == ABSENT
    members = f04.family_runs(p)  # as trained: the recipes planned the same members, K and checkpoints
    planned = vt.family_recipes(p.family, k_over_d=p.family_k_over_d)
    assert planned[["run", "name", "K"]].equals(members[["run", "name", "K"]])
    assert f04.checkpoints(p) == list_revisions(f04.run_dir(p))
    assert [j.labels["model"] for j in by["family"]] == [r for r in members.run for _ in range(2)]
    k = {j.labels["model"]: j.settings["measure"].k for j in by["family"]}
    assert k == {run: (int(kk),) for run, kk in zip(members.run, members.K)}
    assert all(j.storable and j.prepare is vt.digit_inputs for j in jobs)
    assert len({j.key for j in jobs}) == len(jobs)
    with pytest.raises(ParameterError, match="use_cache"):
        f04.jobs(_params(use_cache=False))


def test_run_collects_the_plan_and_a_read_only_rerun_tells_the_same_story(smoke_vits):
    p = _params(hub_models=[ABSENT])
    with pytest.raises(f04.NotMeasured, match="not measured yet"):
        f04.run(p, Options(compute=False))
    measured = f04.run(p)
    missing = f04.glue_values(p, measured)["f04_hub_missing"].data
    assert measured.hub.missing == [ABSENT] and missing.startswith(f"Not measured in this run: {ABSENT} (")
    assert measured.hub_gaps.empty and len(f04.claims(p, measured)) == 3  # no hub row without its numbers
    read = f04.run(p, Options(compute=False))  # what a notebook does after a sweep
    for study in (read.over, read.twins, read.fam):
        assert set(study.summary.cached) == {True}  # read, nothing loaded
    glued, again = f04.glue_values(p, measured), f04.glue_values(p, read)
    assert {k: getattr(v, "data", v) for k, v in glued.items()} == {
        k: getattr(v, "data", v) for k, v in again.items()
    }
    assert f04.claims(p, measured) == f04.claims(p, read)
    assert set(glued) >= {"f04_rule_emerges", "f04_trained", "f04_rho_excess", "f04_best", "f04_n_tokens"}
