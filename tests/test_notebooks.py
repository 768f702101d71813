"""A papermill smoke run of every notebook (profile "smoke"), into _build/smoke/notebooks.

All notebooks run in one ``run_notebooks(..., jobs=2)`` call, the way ``make book`` runs them
(models built first, two notebooks at a time); each notebook then has its own test. The executed
notebooks are what the book-phase tests (``pytest -m book``) build and browse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coupling_utils.pipeline.execution import embedded_models, notebook_paths, run_notebooks

ROOT = Path(__file__).resolve().parents[1]
SMOKE_DIR = ROOT / "_build" / "smoke" / "notebooks"


@pytest.fixture(scope="module")
def smoke_runs():
    lines: list[str] = []
    results = run_notebooks([], "smoke", output_dir=SMOKE_DIR, jobs=2, echo=lines.append)
    return {r.notebook: r for r in results}, lines


@pytest.mark.parametrize("nb", notebook_paths(ROOT), ids=lambda p: p.stem)
def test_smoke_run(nb, smoke_runs):
    results, lines = smoke_runs
    result = results[nb.stem]
    assert result.status == "ok", f"{nb.stem} failed: {result.error} (see {result.output})"
    assert Path(result.output).exists()
    record = json.loads((SMOKE_DIR / "runs.json").read_text())[nb.stem]
    assert record["status"] == "ok" and record["profile"] == "smoke"


def test_embedded_models_are_found_in_parameter_values():
    values = {
        "model": "embedded:smollm2-135m",
        "more": ["embedded:minilm-l6", "gpt2"],
        "k": 10,
        "family": "embedded:lm-family/w64-l2-s100-seed0",
        "again": "embedded:minilm-l6",
    }
    assert embedded_models(values) == ["embedded:smollm2-135m", "embedded:minilm-l6", "embedded:lm-family"]
