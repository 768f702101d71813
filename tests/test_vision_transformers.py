"""Chapter f04's analysis: token choice, independent twins, curve shapes, plateaus, missing hub ViTs."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.engine.metric import k_for_width
from coupling_utils.measurement import Options
from coupling_utils.models import vit_training as vit


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A seconds-long ViT run (seed 0) with checkpoints step0..step4: CLS + 16 patches, width 8."""
    out = tmp_path_factory.mktemp("vit") / "run"
    spec = vit.VitSpec(
        d_model=8, n_layers=2, n_heads=2, batch_size=16, steps=4, lr=3e-3, warmup=1, n_linear=1,
        train_subset=64, val_images=32, test_images=32, seed=0,
    )  # fmt: skip
    vit.train_vit(spec, out, progress=False)
    return out


def test_the_twin_is_an_independent_draw_not_the_step0_checkpoint(tiny_run):
    run = str(tiny_run)
    assert vt.training_seed(run) == 0
    with pytest.raises(ValueError, match="its own step-0 checkpoint"):
        vt.vit_coupling({"run": run}, vt.ViTSetup(n_images=2), k=2, twins=True, init_seed=0)
    step0 = vt.vit_coupling(
        {"step0": {"name_or_path": run, "revision": "step0"}}, vt.ViTSetup(n_images=2), k=2
    )
    twins = vt.vit_coupling({"run": run}, vt.ViTSetup(n_images=2), k=2, twins=True, init_seed=1)
    s = twins.summary.set_index("weights")
    assert list(s.index) == ["trained", "random init"] and set(twins.summary.K) == {2}
    # the old bug: a "twin" drawn from the training seed reproduced step 0 exactly
    assert s.loc["random init", "coupling"] != pytest.approx(step0.summary.coupling.iloc[0], abs=1e-6)
    gap = vt.twin_gap(twins, n_resamples=20).iloc[0]
    per = twins.per_prompt.pivot(index="prompt", columns="weights", values="coupling")
    assert gap.excess == pytest.approx(float((per["trained"] - per["random init"]).mean()))
    assert gap.trained == pytest.approx(s.loc["trained", "coupling"]) and gap.n_images == 2
    assert gap.excess_ci_low <= gap.excess <= gap.excess_ci_high


@pytest.mark.parametrize(
    ("token", "positions"), [("cls", {0}), ("last", {16}), ("patch5", {6}), ("mean", set(range(17)))]
)
def test_token_choice_measures_that_token(tiny_run, tmp_path, token, positions):
    from coupling_utils.measurement import collect

    setup = vt.ViTSetup(n_images=1, token=token, cache=tmp_path)
    got = vt.vit_coupling({"run": str(tiny_run)}, setup, k=2)
    assert got.summary.token.iloc[0] == token
    stored = collect(vt.vit_jobs({"run": str(tiny_run)}, setup, k=2), Options(compute=False))
    assert set(stored.table("depthwise").token) == positions


def test_a_patch_outside_the_grid_is_named(tiny_run):
    with pytest.raises(ValueError, match=r"4×4 = 16 patches, numbered 0..15"):
        vt.vit_coupling({"run": str(tiny_run)}, vt.ViTSetup(n_images=1, token="patch16"), k=2)


def test_k_per_model(tiny_run):
    got = vt.vit_coupling(
        {"a": str(tiny_run), "b": str(tiny_run)}, vt.ViTSetup(n_images=1), k={"a": 2, "b": 4}
    )
    assert dict(zip(got.summary.model, got.summary.K)) == {"a": 2, "b": 4}
    assert k_for_width(64, 0.25) == 16 and k_for_width(32, 0.25) == 8 and k_for_width(4, 0.01) == 1
    with pytest.raises(ValueError, match="k_over_d"):
        k_for_width(64, 0)


def test_missing_hub_vits_are_recorded_and_the_others_measured(standin_hub, tiny_run):
    got = vt.vit_coupling(
        {"here": str(tiny_run), "vit": "google/vit-base-patch16-224", "absent": "org/absent-vit"},
        vt.ViTSetup(n_images=1), k=2, twins=True, init_seed=5, options=Options(on_error="record"),
    )  # fmt: skip
    assert got.missing == ["absent"] and set(got.failures.weights) == set(vt.WEIGHTS)
    assert "absent" in got.report() and "OSError" in got.report()
    assert set(got.summary.model) == {"here", "vit"} and len(got.summary) == 4
    assert set(vt.twin_gap(got, n_resamples=20).model) == {"here", "vit"}
    with pytest.raises(OSError):
        vt.vit_coupling({"absent": "org/absent-vit"}, vt.ViTSetup(n_images=1), k=2)


def test_curve_shape_judges_the_whole_curve():
    steps = [0, 1, 2, 4, 8, 16, 32, 64]
    rising = pd.DataFrame({"step": steps, "coupling": np.linspace(0.1, 0.3, 8)})
    s = vt.curve_shape(rising)
    assert s["spearman"] == pytest.approx(1) and s["max_drop"] == 0 and s["peak_fraction"] == 1
    assert s["ratio"] == pytest.approx(3) and s["rise"] == pytest.approx(1)
    assert s["init"] == pytest.approx(0.1) and s["n_checkpoints"] == 8
    transient = pd.DataFrame({"step": steps, "coupling": [0.1, 0.2, 0.3, 0.25, 0.2, 0.15, 0.12, 0.11]})
    t = vt.curve_shape(transient)
    assert t["peak_step"] == 2 and t["peak_fraction"] == pytest.approx(2 / 64)
    assert t["ratio"] > 1 and t["rise"] == pytest.approx(0.01 / 0.2)
    assert t["spearman"] < 0 and t["max_drop"] == pytest.approx(0.05 / 0.2)
    with pytest.raises(ValueError, match="no checkpoints"):
        vt.curve_shape(rising.iloc[:0])


def test_plateau_reads_the_last_third():
    acc = pd.DataFrame({"step": [0, 100, 200, 300], "val_acc": [0.1, 0.9, 0.95, 0.96], "test_acc": np.nan})
    p = vt.plateau(acc)
    assert p == {
        "final": 0.96,
        "from_step": 200,
        "gain": pytest.approx(0.01),
        "share": pytest.approx(0.01 / 0.86),
    }
    assert vt.plateau(acc, tail=0.5)["from_step"] == 100
    with pytest.raises(ValueError, match="at least two"):
        vt.plateau(acc, "test_acc")
    with pytest.raises(ValueError, match="tail"):
        vt.plateau(acc, tail=1)


def test_curve_checkpoints_evaluate_along_the_way_and_save_only_the_final(tmp_path):
    spec = vit.VitSpec(
        d_model=8, n_layers=2, n_heads=2, batch_size=16, steps=4, lr=3e-3, warmup=1, n_linear=2,
        train_subset=64, val_images=32, test_images=32, checkpoints="curve",
    )  # fmt: skip
    vit.train_vit(spec, tmp_path / "c", progress=False)
    acc = vit.load_accuracy(tmp_path / "c")
    assert list(acc.step) == [0, 1, 2, 4] and acc.val_acc.notna().all()
    assert acc.test_acc.isna().tolist() == [True, True, True, False]
    assert not (tmp_path / "c" / "revisions").exists() and (tmp_path / "c" / "config.json").exists()
    assert json.loads((tmp_path / "c" / "training_spec.json").read_text())["checkpoints"] == []
    with pytest.raises(ValueError, match="checkpoints must be one of"):
        vit.train_vit(vit.VitSpec(checkpoints="every"), tmp_path / "x", progress=False)


def test_describe_curve_words_follow_the_descriptors():
    steps = [0, 1, 2, 4, 8, 16, 32, 64]
    rising = vt.curve_shape(pd.DataFrame({"step": steps, "coupling": np.linspace(0.1, 0.3, 8)}))
    assert vt.describe_curve(rising) == "rises and is highest at the end of training"
    transient = vt.curve_shape(
        pd.DataFrame({"step": steps, "coupling": [0.1, 0.2, 0.3, 0.25, 0.2, 0.15, 0.12, 0.11]})
    )
    assert vt.describe_curve(transient).startswith(
        "rises to a peak of 0.300 at step 2 and falls back to 0.110"
    )
    dipped = vt.curve_shape(
        pd.DataFrame({"step": steps, "coupling": [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.35, 0.4]})
    )
    assert vt.describe_curve(dipped).endswith("with a fall of 67% of its range along the way")
    falling = vt.curve_shape(pd.DataFrame({"step": steps, "coupling": np.linspace(0.3, 0.1, 8)}))
    assert vt.describe_curve(falling) == "falls below its value at initialisation"
    up_down = vt.curve_shape(
        pd.DataFrame({"step": steps, "coupling": [0.2, 0.3, 0.25, 0.2, 0.15, 0.1, 0.1, 0.1]})
    )
    assert vt.describe_curve(up_down) == "peaks at step 1 and ends below its value at initialisation"


def test_planning_reads_no_model_and_the_key_names_the_digits(tmp_path):
    setup = vt.ViTSetup(n_images=2, seed=0, cache=tmp_path)
    jobs = vt.vit_jobs(
        {"absent": "org/absent-vit"}, setup, k=2, twins=True, init_seed=5
    )  # not on this machine
    digits, _ = vt.mnist_digits(2, seed=0)
    assert [j.weights for j in jobs] == ["trained", "random init"]
    assert all(list(j.prompts) == list(digits) and j.prepare is vt.digit_inputs for j in jobs)
    assert all(x.dtype == torch.uint8 and x.shape == (28, 28) for x in jobs[0].prompts.values())
    keys = [j.key for j in jobs]
    assert keys == [
        j.key for j in vt.vit_jobs({"absent": "org/absent-vit"}, setup, k=2, twins=True, init_seed=5)
    ]
    for other in (dataclasses.replace(setup, seed=1), dataclasses.replace(setup, n_images=3)):
        assert vt.vit_jobs({"absent": "org/absent-vit"}, other, k=2)[0].key != keys[0]
    again = pickle.loads(pickle.dumps(jobs[1]))  # a sweep pickles its jobs
    assert again.key == keys[1] and again.prepare is vt.digit_inputs
    assert len(pickle.dumps(jobs[0])) < 20_000  # the digits alone, not the whole MNIST split


def test_digit_inputs_are_what_each_model_was_given_before(standin_hub, tiny_run):
    """The prepare step gives the loaded model the pixels that the files-only format gave (the
    MNIST ViT's own 28×28 normalisation; a hub ViT's resize and its processor's mean and std)."""
    from coupling_utils import load_model
    from coupling_utils.models.images import image_format, mnist_inputs

    digits, labels = vt.mnist_digits(3, seed=4)
    for ref in (str(tiny_run), "google/vit-base-patch16-224"):
        before, before_labels = mnist_inputs(image_format(ref), 3, seed=4)
        after = vt.digit_inputs(load_model(ref), digits)
        assert list(after) == list(before) and labels == before_labels
        assert all(torch.equal(after[pid]["pixel_values"], before[pid]["pixel_values"]) for pid in before)
