"""Zoo builds as a set: a forced rebuild swaps in only when complete, and every file follows the umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from coupling_utils.models import zoo


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache; the tokenised corpus comes from memory (tokenised once per session)."""
    from coupling_utils.models.corpus import tokenized_corpus

    tokenized_corpus(2048)  # in the session cache, kept in memory for the builds below
    cache = tmp_path / "cache"
    monkeypatch.setenv("COUPLING_CACHE", str(cache))
    return cache


@pytest.fixture
def umask_set():
    """Set the process's umask for one test (``umask_set(0o002)``), then restore it."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


def _modes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix() + ("/" if p.is_dir() else ""): stat.filemode(p.lstat().st_mode)
        for p in [folder, *folder.rglob("*")]
    }


@pytest.mark.parametrize(
    "mask, name",
    [(0o022, "pythia-smoke"), (0o002, "pythia-smoke"), (0o002, "lm-family-smoke")],
    ids=["022-run", "002-run", "002-family"],
)
def test_every_file_of_a_build_follows_the_umask(mask, name, own_cache, umask_set):
    """Weights too (save_pretrained writes them 0600), so a group can share a cache."""
    umask_set(mask)
    zoo.prepare(name, progress=False)
    modes = _modes(own_cache / "zoo")
    want_file, want_dir = stat.filemode(0o100666 & ~mask), stat.filemode(0o040777 & ~mask)
    wrong = {p: m for p, m in modes.items() if m != (want_dir if p.endswith("/") else want_file)}
    assert not wrong, f"umask {mask:03o}: want {want_file} / {want_dir}, got {wrong}"
    assert any(p.endswith("model.safetensors") for p in modes)
    if name == "pythia-smoke":
        assert any("revisions/step" in p for p in modes)


def _snapshot(name: str) -> dict:
    root = zoo.entry_path(name)
    return {
        "checksums": zoo.weights_checksums(name),
        "files": {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in root.rglob("*")},
        "manifest": json.loads((root / "manifest.json").read_text()),
    }


def _state(name: str) -> str:
    return zoo.list_entries().set_index("name").loc[f"embedded:{name}", "state"]


@pytest.mark.parametrize(
    "name, fail_at, error",
    [
        ("lm-family-smoke", 2, KeyboardInterrupt),  # Ctrl-C with the first member rebuilt
        ("lm-family-smoke", 1, RuntimeError),
        ("pythia-smoke", 1, KeyboardInterrupt),
    ],
    ids=["family-ctrl-c-at-second-member", "family-fails", "run-ctrl-c"],
)
def test_a_forced_rebuild_that_stops_leaves_the_old_build(name, fail_at, error, own_cache, monkeypatch):
    """`zoo prepare NAME --force` builds aside: stopped or failed, the old build stays whole and listed
    as ready, nothing of the new one is left; completed, it replaces the old one."""
    zoo.prepare(name, progress=False)
    before = _snapshot(name)
    real, calls = zoo.build._train_one, []

    def train(*args, **kwargs):
        calls.append(args)
        if len(calls) == fail_at:
            raise error("stopped mid-rebuild")
        return real(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(zoo.build, "_train_one", train)
        with pytest.raises(error, match="stopped mid-rebuild"):
            zoo.prepare(name, force=True, progress=False)
    assert len(calls) == fail_at
    assert zoo.is_ready(name) and _state(name) == "ready"
    assert _snapshot(name) == before, "the stopped rebuild changed the old build"
    folder = own_cache / "zoo" / name
    assert not _leftovers(folder), "the stopped rebuild left files behind"
    zoo.prepare(name, force=True, progress=False)  # completed: swapped in
    after = _snapshot(name)
    assert zoo.is_ready(name) and _state(name) == "ready"
    assert after["checksums"] == before["checksums"]  # seeded: the same weights
    assert after["manifest"]["built_at"] >= before["manifest"]["built_at"]
    assert set(after["files"]) == set(before["files"])
    assert all(after["files"][f] != t for f, t in before["files"].items() if f.endswith(".safetensors"))
    assert not _leftovers(folder)


def _leftovers(folder: Path) -> list[str]:
    """What is in an entry's folder besides its build and its locks (``.lock``, ``.members/``)."""
    key = zoo.REGISTRY[folder.name].key()
    beside = [p.name for p in folder.iterdir() if p.name not in (key, ".lock", ".members")]
    hidden = [p.relative_to(folder).as_posix() for p in (folder / key).rglob(".*")]
    return beside + hidden


def test_a_swap_killed_between_its_renames_gets_the_old_build_back(own_cache):
    """The old build moved aside (``.<key>.old``) and the new one not yet in place: the next
    prepare puts the old one back instead of rebuilding."""
    zoo.prepare("pythia-smoke", progress=False)
    root = zoo.entry_path("pythia-smoke")
    before = _snapshot("pythia-smoke")
    os.replace(root, root.with_name(f".{root.name}.old"))
    assert _state("pythia-smoke") == "missing"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo.build, "_train_one", lambda *a, **k: pytest.fail("rebuilt instead of restored"))
        assert zoo.prepare("pythia-smoke", progress=False) == root
    assert _snapshot("pythia-smoke") == before and _state("pythia-smoke") == "ready"
    assert not root.with_name(f".{root.name}.old").exists()


def test_a_quiet_build_shows_no_library_bars_and_leaves_them_as_they_were(own_cache, capfd):
    """``progress=False`` (a notebook's quiet build) keeps transformers' own bars ("Writing model
    shards") out of the output too, and turns them back on afterwards."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    zoo.prepare("pythia-smoke", progress=False)
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "%|" not in err, err
    assert hf_logging.is_progress_bar_enabled()
