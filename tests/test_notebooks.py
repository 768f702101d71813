"""A papermill smoke run of every notebook (profile "smoke"), into _build/smoke/notebooks.

The executed notebooks are what the book-phase tests (``pytest -m book``) build and browse.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from coupling_utils.execution import notebook_paths, run_notebook

ROOT = Path(__file__).resolve().parents[1]
SMOKE_DIR = ROOT / "_build" / "smoke" / "notebooks"


@pytest.mark.parametrize("nb", notebook_paths(ROOT), ids=lambda p: p.stem)
def test_smoke_run(nb):
    result = run_notebook(nb, "smoke", output_dir=SMOKE_DIR)
    assert result.status == "ok", f"{nb.stem} failed: {result.error} (see {result.output})"
    assert Path(result.output).exists()
