"""The performance page's matrix-free findings follow the stored benchmark, worded by its numbers."""

from __future__ import annotations

import pandas as pd

from coupling_utils.files import data_dir
from coupling_utils.pipeline.pages import (
    MATRIX_FREE_MARKER,
    matrix_free_findings,
    stage_matrix_free_findings,
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
    assert stage_matrix_free_findings(page, CSV.parent)
    assert MATRIX_FREE_MARKER not in page.read_text() and "passes per layer" in page.read_text()
    page.write_text(f"{MATRIX_FREE_MARKER}\n")
    assert stage_matrix_free_findings(page, tmp_path)
    assert "bench/bench_jacobians.py --cases matrix_free" in page.read_text()
    assert not stage_matrix_free_findings(page, CSV.parent)  # no marker left: nothing to do
