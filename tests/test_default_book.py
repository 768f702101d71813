"""The typed prose of every chapter holds on the default run (``make book`` runs this after the run).

Sentences that interpret a result are paired in the notebooks with the condition they assume
(:func:`coupling_utils.analysis.verdicts.assume`). This test reads the executed notebooks of the
default profile and fails, naming the notebook and the sentence's assumption, if a rerun broke one.
It needs the default run (``make book``); it is not part of ``make test``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coupling_utils.pipeline.status import read_assumptions

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = Path(os.environ.get("COUPLING_BOOK_EXECUTED", ROOT / "_build" / "notebooks"))

pytestmark = pytest.mark.default_book


def _default_runs() -> list[Path]:
    manifest = EXECUTED / "runs.json"
    if not manifest.exists():
        pytest.fail(f"no executed notebooks at {EXECUTED}: run `make book` (profile default) first")
    runs = json.loads(manifest.read_text())
    done = [EXECUTED / f"{name}.ipynb" for name, r in runs.items() if r.get("profile") == "default"]
    if not done:
        pytest.fail(f"{EXECUTED} holds no run of the default profile: run `make book` first")
    return sorted(done)


def test_typed_prose_holds_on_the_default_run():
    broken = []
    for path in _default_runs():
        df = read_assumptions(path)
        broken += [
            f"{path.stem}: {r.key}: the text assumes that {r.text}" for r in df.itertuples() if not r.holds
        ]
    assert not broken, (
        "sentences this run contradicts (rewrite them or make them conditional):\n" + "\n".join(broken)
    )
