"""The smoke notebook runs shared by the tests that read executed notebooks.

All notebooks run in one ``run_notebooks(..., jobs=2)`` call (as ``make book`` runs them) into
:data:`SMOKE_DIR`, in a temporary ``COUPLING_CACHE`` whose ``zoo`` and ``corpus`` are the
session's smoke models, shared read-only. ``conftest.smoke_runs`` makes one such run per test
session: ``tests/test_notebooks.py`` checks the runs, ``tests/test_captions.py`` their figures.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from coupling_utils.pipeline.execution import run_notebooks

ROOT = Path(__file__).resolve().parents[2]
SMOKE_DIR = ROOT / "_build" / "smoke" / "notebooks"
SHARED = ("zoo", "corpus")  # read-only in the notebook runs


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (symlinks followed) with its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def run_smoke(smoke_zoo: Path, tmp_path_factory) -> SimpleNamespace:
    """Run every notebook at the smoke profile; what ran, where, and the shared folders before
    and right after the runs."""
    cache = tmp_path_factory.mktemp("notebook-cache")
    for name in SHARED:
        (cache / name).symlink_to(smoke_zoo / name, target_is_directory=True)
    user_cache = tmp_path_factory.mktemp("xdg-cache")  # where platformdirs would put the user's cache
    before = {name: snapshot(smoke_zoo / name) for name in SHARED}
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUPLING_CACHE", str(cache))
        mp.setenv("XDG_CACHE_HOME", str(user_cache))
        results = run_notebooks([], "smoke", output_dir=SMOKE_DIR, jobs=2, echo=lines.append)
    # taken now, not when a test reads it: other tests of the session may build more shared models
    after = {name: snapshot(smoke_zoo / name) for name in SHARED}
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
