"""The smoke notebook runs shared by the tests that read executed notebooks.

All notebooks run in one ``run_notebooks(..., jobs=2)`` call (as ``make book`` runs them) into
:data:`SMOKE_DIR`, in a temporary ``COUPLING_CACHE`` whose ``zoo`` and ``corpus`` are the
session's smoke models, shared read-only. ``conftest.smoke_runs`` makes one such run per test
session: ``tests/test_notebooks.py`` checks the runs, ``tests/test_captions.py`` their figures.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from coupling_utils.pipeline.execution import run_notebooks

ROOT = Path(__file__).resolve().parents[2]
SMOKE_DIR = ROOT / "_build" / "smoke" / "notebooks"
SHARED = ("zoo", "corpus")  # read-only in the notebook runs


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (symlinks followed, to files and folders) with its size and
    modification time."""
    found = {}
    for top, _, names in os.walk(folder, followlinks=True):
        for name in names:
            p = Path(top, name)
            if p.is_file():
                found[str(p.relative_to(folder))] = (p.stat().st_size, p.stat().st_mtime_ns)
    return dict(sorted(found.items()))


def _view(view: Path, shared: Path, names: list[str] | None = None) -> None:
    """Make ``view`` a folder of links to the entries ``names`` (None: all) of ``shared``: what the
    notebooks may read. A model or file they wrote would land in the view itself, or inside a
    linked entry, and show in its :func:`snapshot`; the test run's other workers, building other
    models into ``shared`` meanwhile, do not."""
    view.mkdir()
    for entry in sorted(shared.iterdir()) if names is None else [shared / n for n in names]:
        if entry.exists():
            (view / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())


def run_smoke(smoke_zoo: Path, tmp_path_factory) -> SimpleNamespace:
    """Run every notebook at the smoke profile; what ran, where, and the shared folders (as the
    notebooks see them: links to the smoke models and the corpus) before and right after the runs."""
    cache = tmp_path_factory.mktemp("notebook-cache")
    linked = {"zoo": smoke_zoo_names(), "corpus": None}
    for name in SHARED:
        _view(cache / name, smoke_zoo / name, linked[name])
    user_cache = tmp_path_factory.mktemp("xdg-cache")  # where platformdirs would put the user's cache
    before = {name: snapshot(cache / name) for name in SHARED}
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUPLING_CACHE", str(cache))
        mp.setenv("XDG_CACHE_HOME", str(user_cache))
        results = run_notebooks([], "smoke", output_dir=SMOKE_DIR, jobs=2, echo=lines.append)
    # taken now, not when a test reads it: other tests of the session may build more shared models
    after = {name: snapshot(cache / name) for name in SHARED}
    return SimpleNamespace(
        results={r.notebook: r for r in results},
        lines=lines,
        cache=cache,
        user_cache=user_cache,
        shared=smoke_zoo,
        before=before,
        after=after,
    )


def smoke_zoo_names() -> list[str]:
    """The embedded models the notebooks use under the smoke profile (as ``make test`` runs them).

    Here, not in a conftest: every folder's conftest is imported as ``conftest``, so a name
    imported from it depends on which one came last."""
    from coupling_utils.pipeline.execution import _planned_values, embedded_models, notebook_paths

    names: list[str] = []
    for nb in notebook_paths():
        names += embedded_models(_planned_values(nb, "smoke", None))
    return [n.removeprefix("embedded:") for n in dict.fromkeys(names)]
