"""bench/gpu_check.py: refuses to run without a GPU (exit 2, saying what to do) and runs correctly
on a CPU with --dry-run (tiny sizes, the notebooks listed, every engine method timed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_what_to_do(gpu_check, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err and "--dry-run" in gpu_check.__doc__


def test_dry_run_on_a_cpu(gpu_check, tmp_path, capsys):
    out = tmp_path / "gpu_check.csv"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    listed = df[df.step == "paper profile"]
    assert len(listed) == 6 and set(listed.status) == {"dry run: not run"}
    assert "would run f01_depth_and_tokens at the paper profile" in capsys.readouterr().out
    engine = df[(df.step == "engine") & (df.dtype == "bfloat16")]
    assert set(engine.method) == {
        "reference (1 token)",
        "one_token (1 token)",
        "all_tokens: Jacobians",
        "top-50 spectra",
    }
    assert (engine.status == "ok").all() and (engine.seconds > 0).all()
    assert ((engine.measure_seconds_predicted - engine.seconds * 2).abs() <= 1e-3 * engine.seconds).all()
    assert set(df.device) == {"dry run on a CPU (tiny sizes: not a GPU measurement)"}
    assert df[df.dtype == "4bit"].status.notna().all()  # run, or skipped saying why
