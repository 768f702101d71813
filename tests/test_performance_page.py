"""The performance page's matrix-free findings follow the stored benchmark, worded by its numbers."""

from __future__ import annotations

import re

import pandas as pd

from coupling_utils.files import data_dir
from coupling_utils.pipeline.pages import (
    MATRIX_FREE_MARKER,
    matrix_free_findings,
    stage_performance_findings,
)

CSV = data_dir() / "benchmarks" / "matrix_free.csv"


def _default(t: pd.DataFrame, scope: str = "adjacent pairs") -> pd.Series:
    rows = t[(t.solver == "lanczos") & (t.steps == 45) & (t.scope == scope)].sort_values("K")
    return rows.iloc[0]


def test_the_findings_say_the_stored_numbers():
    t = pd.read_csv(CSV)
    text = matrix_free_findings(t)
    first, whole, exact = _default(t), _default(t, "all layer pairs"), t[t.method == "exact"].iloc[0]
    assert (
        f"used {first.block_passes_per_layer:.0f} passes per layer, {first.passes_reduction:.1f}× fewer"
        in text
    )
    assert f"took {first.seconds:.1f} s against {exact.seconds:.1f} s for the exact method" in text
    assert f"the default row reaches {whole.passes_reduction:.1f}×" in text
    assert ("meets" if first.meets_target else "misses") + " the matrix-free target" in text
    assert text.startswith("- **") and "nan" not in text.lower()


def test_the_words_follow_the_numbers():
    t = pd.read_csv(CSV)
    lanczos = (t.solver == "lanczos") & (t.steps == 45)
    faster = t.assign(seconds=t.seconds.where(~lanczos, 0.01))  # Lanczos now quicker than exact
    assert "Fewer passes are less time on this CPU too" in matrix_free_findings(faster)
    slower = t.assign(seconds=t.seconds.where(lanczos, 0.01))
    assert "Fewer passes are not less time" in matrix_free_findings(slower)
    missed = t.assign(meets_target=False)
    assert "misses the matrix-free target" in matrix_free_findings(missed)
    few_tiles = t.assign(tile_passes=t.tile_passes.where(t.scope != "all layer pairs", 50.0))
    text = matrix_free_findings(few_tiles)
    assert "no solver can" not in text and "which leaves room for" in text


def test_staging_replaces_the_marker_or_says_how_to_measure(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(f"before\n{MATRIX_FREE_MARKER}\nafter\n")
    assert stage_performance_findings(page, CSV.parent)
    assert MATRIX_FREE_MARKER not in page.read_text() and "passes per layer" in page.read_text()
    page.write_text(f"{MATRIX_FREE_MARKER}\n")
    assert stage_performance_findings(page, tmp_path)
    assert "bench/bench_jacobians.py --cases matrix_free" in page.read_text()
    assert not stage_performance_findings(page, CSV.parent)  # no marker left: nothing to do


# --------------------------------------------------------------------------- the engine's target, the GPU run
ENGINE = data_dir() / "benchmarks" / "engine.csv"
GPU_CHECK = data_dir() / "benchmarks" / "gpu_check.csv"
PAGE = data_dir().parent / "book" / "performance.md"


def test_the_missed_target_is_stated_with_the_ratio_and_the_bound():
    """At the T where the all-token path misses T/2, the page gives the measured ratio, the target
    and the FLOP bound, and says why the measured ratio can exceed that bound."""
    from coupling_utils.pipeline.pages import engine_target_findings

    t = pd.read_csv(ENGINE)
    rows = t[
        t.case.str.startswith("block: SmolLM2") & (t.method == "all_tokens: Jacobians, spectra, coupling")
    ]
    text = engine_target_findings(t)
    for r in rows.itertuples():
        if r.speedup < r.target:
            assert f"**At T = {r.T} the all-token path misses its target**: {r.speedup:.1f}×" in text
            assert f"against the target T/2 = {r.target:.0f}" in text
            assert f"would be {r.flop_bound:.1f}× faster" in text
        else:
            assert f"At T = {r.T} the" not in text
    assert ("not a ceiling" in text) == bool(
        ((rows.speedup > rows.flop_bound) & (rows.speedup < rows.target)).any()
    )
    met = t.assign(target=t.target / 100)  # every target met: no missed-target paragraph
    assert "misses" not in engine_target_findings(met) and "met the target T/2 at T = 16, 64, 256" in (
        engine_target_findings(met)
    )
    slow = t.assign(speedup=t.speedup.where(t.flop_bound.isna(), t.flop_bound / 2))  # below the bound
    assert "not a ceiling" not in engine_target_findings(slow)


def test_the_page_does_not_call_the_flop_bound_a_ceiling():
    text = " ".join(PAGE.read_text().split())
    assert "if the whole path ran at the reference's FLOP rate" not in text  # it leaves out the spectra
    assert "It is not a ceiling on the measured speed-up" in text
    assert "% engine-target" in PAGE.read_text().splitlines()


def test_the_gpu_run_is_said_as_it_was_recorded():
    """The GPU, the day, the versions, which rows ran, failed (with no time) or were skipped, and
    that the predicted seconds are predictions: each read from the CSV."""
    from coupling_utils.pipeline.pages import gpu_run_findings

    df = pd.read_csv(GPU_CHECK)
    text = gpu_run_findings(df)
    assert f"**The recorded GPU run**: {df.device.iloc[0]}, {df.date_utc.iloc[0][:10]}" in text
    assert f"coupling_utils {df.coupling_utils.iloc[0]}, torch {df.torch.iloc[0]}" in text
    assert "(the rows record no commit)" in text
    notebooks = df[df.step == "paper profile"]
    for r in notebooks.itertuples():
        if r.status == "ok":
            assert r.name in text.split(" ran;")[0]
        else:
            assert (
                f"{r.name} **failed**" in text
                and f"its {r.seconds:.1f} s are the time until it failed" in text
            )
    for r in df[df.status.astype(str).str.startswith("skipped")].itertuples():
        assert f"rows were **not measured** ({r.status})" in text
    assert "is a prediction" in text and "not a measured run" in text
    fixed = df.assign(status="ok")
    assert "**failed**" not in gpu_run_findings(fixed) and "not measured" not in gpu_run_findings(fixed)
    assert ", commit abc123. At the" in gpu_run_findings(df.assign(commit="abc123"))
    mixed = df.assign(commit=["abc123"] + [None] * (len(df) - 1))
    assert f", commit abc123; {len(df) - 1} rows record none" in gpu_run_findings(mixed)
    two = df.assign(commit=["abc123"] + ["def456+changes"] * (len(df) - 1))
    assert ", commits abc123, def456+changes" in gpu_run_findings(two)


def test_staging_writes_every_performance_finding(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(PAGE.read_text())
    assert stage_performance_findings(page, CSV.parent)
    text = page.read_text()
    for marker in (MATRIX_FREE_MARKER, "% engine-target", "% gpu-check-run"):
        assert marker not in text.splitlines()
    assert "**The recorded GPU run**" in text and "misses its target" in text
    # the book's readers have no issue tracker: the page states each target itself
    assert not re.search(r"\bissues? \d", text), re.search(r".{60}\bissues? \d.{60}", text)
    page.write_text("% gpu-check-run\n")
    assert stage_performance_findings(page, tmp_path)  # no CSV: how to make it
    assert "`python bench/gpu_check.py (on a CUDA machine)`" in page.read_text()


def test_the_matrix_free_section_names_the_model_as_measured():
    """The page read "The trained SmolLM2-135M-Instruct (embedded:smollm2-135m)", not saying that the
    book's copy is dequantised from a Q4_1 GGUF file: it now says so as model_names words it (the
    quantisation tag of the zoo's file, the file, its package) and the dtype the benchmark loads."""
    from coupling_utils.analysis.model_names import gguf_quantisation
    from coupling_utils.models.zoo.registry import _SMOLLM2

    gguf = _SMOLLM2.relpath  # the zoo's GGUF file of embedded:smollm2-135m
    section = " ".join(
        PAGE.read_text().split("## Matrix-free on a trained model")[1].strip().split("\n\n")[0].split()
    )
    tag, package = gguf_quantisation(gguf), f"{_SMOLLM2.dist}==0.1.2"
    said = f"dequantised from a {tag} GGUF file, {gguf} from {package}, in float32"
    assert said in section and "SmolLM2-135M-Instruct (`embedded:smollm2-135m`)" not in section
