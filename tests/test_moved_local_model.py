"""A local model moved or renamed finds its stored measurements: the store's folder of a local
folder or ``.gguf`` file is named by its content (``local/<name>-<digest>``), not by its path,
while a hub id's and an embedded model's folders stay as they were."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import torch

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import Options, Settings, collect, plan
from coupling_utils.measurement.jobs import Loads
from coupling_utils.models.identity import content_hash

PROMPTS = {"a": torch.tensor([[1, 5, 9, 3, 7]]), "b": torch.tensor([[2, 4, 6, 8, 10]])}


def _refuse(*args, **kwargs):
    raise AssertionError("a model was loaded although its measurements are stored")


def _measure(path, store, load=None, loads=None):
    jobs = plan({"mine": str(path)}, PROMPTS, Settings(k=2), loads=loads, root=store)
    return jobs, collect(jobs, Options(load=load, on_error="raise"))


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "run1" / "ckpt"
    tiny_model("gpt2", seed=3).save_pretrained(path)
    return path


def test_a_moved_local_folder_loads_no_model_and_reads_the_same_tables(ckpt, tmp_path):
    store = tmp_path / "store"
    jobs, first = _measure(ckpt, store)
    assert [r.loaded for r in first.results] == [True]
    folder, digest = jobs[0].folder, content_hash(ckpt)[:12]
    moved = shutil.move(ckpt, tmp_path / "scratch" / "ckpt")
    again_jobs, again = _measure(moved, store, load=_refuse)
    assert [r.loaded for r in again.results] == [False] and again_jobs[0].folder == folder
    pd.testing.assert_frame_equal(again.table("depthwise"), first.table("depthwise"), check_like=True)
    renamed = shutil.move(moved, tmp_path / "ckpt-best")  # a new name: the same files, the same folder
    renamed_jobs, _ = _measure(renamed, store, load=_refuse)
    assert renamed_jobs[0].folder == folder == store / "local" / f"ckpt-{digest}" / "main" / "trained"


def test_another_checkpoint_of_the_same_name_is_measured_anew(ckpt, tmp_path):
    """A checkpoint moved away and another one of the same name put in its place: each is
    measured once, into its own folder, and the first is found again where it went."""
    store = tmp_path / "store"
    first_folder = _measure(ckpt, store)[0][0].folder
    archived = shutil.move(ckpt, tmp_path / "archive" / "ckpt")
    tiny_model("gpt2", seed=11).save_pretrained(ckpt)
    jobs, other = _measure(ckpt, store)
    assert [r.loaded for r in other.results] == [True] and jobs[0].folder != first_folder
    assert jobs[0].folder.parent.parent.name == f"ckpt-{content_hash(ckpt)[:12]}"
    assert [r.loaded for r in _measure(archived, store, load=_refuse)[1].results] == [False]


def test_each_revision_of_a_local_run_keeps_its_folder_when_the_run_adds_one(ckpt, tmp_path):
    store = tmp_path / "store"
    tiny_model("gpt2", seed=11).save_pretrained(ckpt / "revisions" / "step1")
    loads = Loads(revisions=["step1", "main"])
    jobs, first = _measure(ckpt, store, loads=loads)
    folders = [j.folder for j in jobs]
    assert len(set(folders)) == 2 and all(f.is_dir() for f in folders)
    tiny_model("gpt2", seed=12).save_pretrained(ckpt / "revisions" / "step2")  # the run goes on
    moved = shutil.move(ckpt, tmp_path / "moved")
    again_jobs, again = _measure(moved, store, load=_refuse, loads=loads)
    assert [j.folder for j in again_jobs] == folders
    pd.testing.assert_frame_equal(again.table("depthwise"), first.table("depthwise"), check_like=True)


def test_a_moved_gguf_file_keeps_its_folder(tmp_path):
    gguf = tmp_path / "a" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(range(64)))
    folder = plan([str(gguf)], PROMPTS, Settings(k=2), root=tmp_path / "store")[0].folder
    assert folder.parent.parent.name == f"tiny.gguf-{content_hash(gguf)[:12]}"
    (tmp_path / "b").mkdir()
    moved = shutil.move(gguf, tmp_path / "b" / "tiny.gguf")
    assert plan([str(moved)], PROMPTS, Settings(k=2), root=tmp_path / "store")[0].folder == folder


def test_hub_ids_and_embedded_models_keep_their_folders(ckpt, tmp_path):
    """Only a local model's folder is named by its content; a hub model's stored measurements
    stay where they were, each revision in its own folder."""
    store = tmp_path / "store"
    refs = ["EleutherAI/pythia-70m", "embedded:pythia-smoke", str(ckpt)]
    hub, embedded, local = plan(refs, PROMPTS, Settings(k=2), root=store)
    assert hub.folder == store / "EleutherAI_pythia-70m" / "main" / "trained"
    assert embedded.folder == store / "embedded_pythia-smoke" / "main" / "trained"
    assert local.folder == store / "local" / f"ckpt-{content_hash(ckpt)[:12]}" / "main" / "trained"
    step = plan(refs[:1], PROMPTS, Settings(k=2), loads=Loads(revisions=["step1"]), root=store)
    assert step[0].folder == store / "EleutherAI_pythia-70m" / "step1" / "trained"
