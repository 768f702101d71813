"""Fixtures of the fault-injection tests: one tiny local model and token-id prompts (no tokenizer,
no model build, no network), and a way to run ``coupling-book`` in a subprocess."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IDS = {"a": [1, 5, 9, 3, 7], "b": [2, 4, 6, 8, 10, 12]}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny GPT-2 ``save_pretrained`` folder (d = 32, 2 blocks, 64 positions, 64 token ids)."""
    from coupling_utils.engine.architectures import tiny_model

    path = tmp_path_factory.mktemp("tiny") / "gpt2"
    tiny_model("gpt2", seed=3).save_pretrained(path)
    return path


@pytest.fixture
def model_dir(tiny_dir, tmp_path) -> Path:
    """A private copy of the tiny model, for tests that change its files."""
    import shutil

    return Path(shutil.copytree(tiny_dir, tmp_path / "model", copy_function=shutil.copy2))


@pytest.fixture
def ids_file(tmp_path) -> Path:
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(IDS))
    return path


@pytest.fixture
def cli():
    """``cli(*args, env=..., background=False)``: ``coupling-book ARGS`` in a subprocess (this tree,
    this session's cache), output captured; ``background=True`` returns the running Popen."""
    return _cli


def _cli(*args, env=None, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "coupling_utils.pipeline.cli", *map(str, args)]
    if kwargs.pop("background", False):
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        # Ctrl-C as in a terminal: a shell script's background job (a CI runner's, say) starts with
        # SIGINT ignored, and the child would inherit that and never see the signal
        reset = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
        return subprocess.Popen(cmd, env=full_env, cwd=ROOT, text=True, preexec_fn=reset, **pipes)
    return subprocess.run(cmd, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=300, **kwargs)
