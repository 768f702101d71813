"""bench/gpu_check.py: refuses to run without a GPU (exit 2, saying what to do) and runs correctly
on a CPU with --dry-run (tiny sizes, the notebooks listed, every engine method timed)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("bench/gpu_check.py")


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
    engine = df[(df.step == "engine") & (df.dtype == "bfloat16") & df.name.str.startswith("Llama")]
    assert set(engine.method) == {
        "reference (1 token)",
        "one_token (1 token)",
        "all_tokens: Jacobians",
        "top-50 spectra (full_svd, 8 matrices)",  # d = 64: the full SVD is the cheaper there
        # timed beside it on its first 4 matrices, judged against it (gesvdj is CUDA's only)
        "spectra candidate: gram_topk_batched (float32 Gram, full eigh, float64 refinement), 4 matrices",
        "spectra candidate: block Lanczos (spectra.topk_svd, float64, 90 steps), 4 matrices",
    }
    candidate = engine[engine.method.str.startswith("spectra candidate")]
    assert (candidate.max_metric_diff >= 0).all() and (candidate.matrices == 4).all()
    assert (candidate[candidate.method.str.contains("gram_topk_batched")].max_metric_diff <= 1e-5).all()
    # every method's last-token J_tt agrees with the reference's (bfloat16: to its rounding)
    agree = engine[engine.method.str.startswith(("one_token", "all_tokens"))].max_rel_diff_vs_reference
    assert len(agree) == 2 and (agree < 0.2).all()
    passes = engine[~engine.method.str.contains("spectra")]
    assert (passes.gemm_fraction > 0).all()
    assert ((passes.flops_per_s - passes.flops / passes.seconds).abs() <= 1e-3 * passes.flops_per_s).all()
    assert (engine.status == "ok").all() and (engine.seconds > 0).all()
    assert ((engine.measure_seconds_predicted - engine.seconds * 2).abs() <= 1e-3 * engine.seconds).all()
    assert set(df.device) == {"dry run on a CPU (tiny sizes: not a GPU measurement)"}
    assert df[df.dtype == "4bit"].status.notna().all()  # run, or skipped saying why
    falcon = df[df.name == "Falcon-style d=64, 2 blocks"].set_index("method")
    assert list(falcon.status) == ["ok", "ok"] and (falcon.seconds > 0).all()
    assert falcon.max_rel_diff_vs_reference.iloc[1] < 0.2  # eager against SDPA


def test_one_step_rerun_keeps_the_other_steps_rows(gpu_check, tmp_path):
    """--step notebooks replaces the notebook rows only; the engine rows of the earlier run stay,
    with their own provenance."""
    out = tmp_path / "gpu_check.csv"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    before = pd.read_csv(out)
    assert gpu_check.main(["--dry-run", "--step", "notebooks", "--jobs", "2", "--out", str(out)]) == 0
    after = pd.read_csv(out)
    engine = after[after.step == "engine"]
    assert len(engine) == len(before[before.step == "engine"])
    assert set(engine.command) == {f"python bench/gpu_check.py --dry-run --out {out}"}
    notebooks = after[after.step == "paper profile"]
    assert len(notebooks) == 6 and set(notebooks.command) == {
        f"python bench/gpu_check.py --dry-run --step notebooks --jobs 2 --out {out}"
    }
    assert list(after.step) == ["paper profile"] * 6 + ["engine"] * len(engine)


def test_the_performance_pages_sentences_follow_the_recorded_run():
    """Each claim the performance page makes about data/benchmarks/gpu_check.csv is there exactly
    when the table bears it out (a new run that changes the facts fails until the page follows)."""
    page = (ROOT / "book" / "performance.md").read_text()
    path = ROOT / "data" / "benchmarks" / "gpu_check.csv"
    df = pd.read_csv(path) if path.exists() else None
    f05 = None if df is None else df[(df.step == "paper profile") & (df.name == "f05_token_trajectories")]
    f05_failed = f05 is not None and len(f05) == 1 and not str(f05.status.iloc[0]).startswith("ok")
    assert ("% gpu-check: f05 failed" in page) == f05_failed
    dominate = False
    if df is not None:
        engine = df[(df.step == "engine") & (df.status == "ok") & (df.dtype == "bfloat16")]
        sweep = engine[engine.method == "all_tokens: Jacobians"].set_index("T").seconds
        spectra = engine[engine.method.str.startswith("top-50 spectra")].set_index("T").seconds
        dominate = len(sweep) > 0 and set(sweep.index) == set(spectra.index) and (spectra > sweep).all()
    assert ("% gpu-check: spectra dominate" in page) == dominate
    # the page describes rows the script writes; it says so where the recorded run predates them
    methods = [] if df is None else df.method.dropna().tolist()
    newer = ("Falcon with", " tokens)", "spectra candidate")  # " tokens)": one_token (n tokens), n = T/16
    lacking = df is not None and not any(
        any(w in m for m in methods if m != "one_token (1 token)") for w in newer
    )
    assert ("% gpu-check: newer rows missing" in page) == lacking


def test_gpu_rates_read_per_matrix_spectra_seconds():
    """rates.gpu_rates: the sweep's median FLOP rate, and the spectra's seconds per matrix over d³,
    dividing by ``matrices`` where a row has it and by T for rows of runs that timed all T."""
    from coupling_utils.pipeline.rates import gpu_rates

    name = "Llama-style d=100, 2 blocks"
    base = {"step": "engine", "name": name, "status": "ok", "dtype": "bfloat16", "device": "GPU X"}
    df = pd.DataFrame(
        [
            {**base, "T": 16, "method": "all_tokens: Jacobians", "flops_per_s": 2e12},
            {**base, "T": 128, "method": "all_tokens: Jacobians", "flops_per_s": 4e12},
            {**base, "T": 16, "method": "top-50 spectra", "seconds": 16.0},  # all 16: 1 s each
            {
                **base,
                "T": 128,
                "method": "top-50 spectra (gram_topk, 16 matrices)",
                "seconds": 48.0,
                "matrices": 16,
            },
        ]
    )
    rates = gpu_rates(df)
    assert rates.exact_flops_per_s == 3e12 and rates.machine == "GPU X"
    assert abs(rates.svd_seconds_per_d3 - 2.0 / 100**3) < 1e-15  # median of 1 s and 3 s per matrix
    assert gpu_rates(df[df.method.str.startswith("all_tokens")]) is None  # no spectra: no GPU time
    assert math.isnan(rates.one_token_flops_per_s)  # no one-token rows: its GPU time is unknown
    one = pd.DataFrame(
        [
            {**base, "T": t, "method": "one_token (1 token)", "flops_per_s": r}
            for t, r in ((16, 1e12), (128, 3e12))
        ]
    )
    assert gpu_rates(pd.concat([df, one])).one_token_flops_per_s == 2e12


def test_a_bad_out_is_refused_before_the_run(gpu_check, tmp_path, capsys):
    """An --out that cannot be written, or (with --step) an earlier file that is not this script's
    table, exits 2 with a message naming it, before anything is measured; nothing is written."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert gpu_check.main(["--dry-run", "--out", str(blocker / "gpu_check.csv")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot be written" in err and "Traceback" not in err
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\xff\xfe not a table")
    assert gpu_check.main(["--dry-run", "--step", "engine", "--out", str(bad)]) == 2
    assert "not a table written by this script" in capsys.readouterr().err
    assert bad.read_bytes() == b"\xff\xfe not a table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "file"]
