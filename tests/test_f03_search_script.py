"""scripts/f03_emergence_search.py: a configuration's run is written as a whole (files.atomic_dir),
so a failed or killed training never leaves a half run that a rerun would take for a finished one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    """The script as a module (its environment defaults undone after the test)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return load_script("scripts/f03_emergence_search.py")


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_run_is_written_whole_once_and_follows_the_umask(script, tmp_path, monkeypatch):
    calls = []

    def train_lm(spec, out_dir, *, progress, desc):
        """A stand-in: a 0600 weights file (as save_pretrained writes), then the metrics; fails once."""
        calls.append(Path(out_dir))
        Path(out_dir).mkdir(parents=True, exist_ok=True)  # as train_lm does
        fd, _ = tempfile.mkstemp(prefix="model.", suffix=".safetensors", dir=out_dir)
        os.close(fd)
        if len(calls) == 1:
            raise RuntimeError("killed mid-training")
        return {"val_loss": 4.5, "train_seconds": 1.0}

    monkeypatch.setattr(script, "train_lm", train_lm)
    spec = script.LMSpec(**{**script.BASE, **script.CONFIGS["w64-l2-s1024"]})
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / ".w64-l2-s1024.tmp").mkdir()  # a killed run of the script before files.atomic_dir
    before = os.umask(0o002)
    try:
        with pytest.raises(RuntimeError, match="killed"):
            script.train("w64-l2-s1024", spec, tmp_path)
        assert not (runs / "w64-l2-s1024").exists()
        run, metrics = script.train("w64-l2-s1024", spec, tmp_path)
    finally:
        os.umask(before)
    assert run == runs / "w64-l2-s1024" and calls[1].parent == runs and calls[1] != run
    assert json.loads((run / "done.json").read_text()) == metrics and metrics["val_loss"] == 4.5
    assert {p.stat().st_mode & 0o777 for p in run.iterdir()} == {0o664}
    assert _hidden(runs) == []
    assert script.train("w64-l2-s1024", spec, tmp_path) == (run, metrics) and len(calls) == 2  # reused
