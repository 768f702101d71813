"""Shared test settings: offline, CPU, deterministic, and a private cache directory.

Every test runs with ``COUPLING_CACHE`` pointing into pytest's temporary folder, so no test can
read or write the user's real cache (``~/.cache/coupling-book``). The embedded models the smoke
notebooks use are built once per session there (:func:`smoke_zoo`) and shared by the tests
that need them.

``make test`` runs the suite on two workers (pytest-xdist, ``-n 2 --dist loadfile``), each test
file on one worker so that its module fixtures run once; :func:`pytest_xdist_make_scheduler`
keeps the files that share the session's smoke runs (:data:`GROUPS`) on one worker too, because
those runs write ``_build/smoke/notebooks``. The two longest groups are collected first, so that
each worker starts with one of them.
"""

from __future__ import annotations

import os

# Tests never reach the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402
import torch  # noqa: E402

# test files that share one expensive session fixture, by group; the longest groups first
GROUPS = {
    "test_paper_profile.py": "profiles",  # every notebook at the paper and laptop profiles
    "test_notebooks.py": "smoke",  # the session's smoke runs (smoke_runs)
    "test_captions.py": "smoke",
    "test_doc_commands.py": "smoke",
}
FIRST = ("profiles", "smoke")

# Tests use tiny tensors: one thread is faster than two, and far faster on a shared CPU.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """The :data:`FIRST` groups collected first; the order is otherwise unchanged (and the same on
    every worker, as pytest-xdist requires)."""
    items.sort(key=lambda item: _rank(item.nodeid))


def _group(nodeid: str) -> str:
    """A test's worker group: its file, or the file's :data:`GROUPS` entry."""
    path = nodeid.split("::", 1)[0]
    return GROUPS.get(path.rsplit("/", 1)[-1], path)


def _rank(nodeid: str) -> int:
    group = _group(nodeid)
    return FIRST.index(group) if group in FIRST else len(FIRST)


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: pytest-xdist's file scheduling, one work unit per :func:`_group`
    (its ``xdist_group`` marks do not reach the scheduler under pytest 9: the nodeid the worker
    reports has no group suffix)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileGroups(config, log)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """The session's private ``COUPLING_CACHE`` (whatever the caller's environment says)."""
    path = tmp_path_factory.getbasetemp() / "coupling-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUPLING_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def standin_hub(tmp_path_factory):
    """The stand-in hub (tiny random models under the paper profiles' repo ids) as the HF cache.

    Written once per session; ``HF_HUB_CACHE`` (and huggingface_hub's copy of it, read at import)
    point at it for the rest of the session. Yields (path, manifest).
    """
    from huggingface_hub import constants
    from support.standin_hub import write_standin_hub

    path = tmp_path_factory.mktemp("standin") / "hub"
    manifest = write_standin_hub(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(path))
        mp.setattr(constants, "HF_HUB_CACHE", str(path))
        yield path, manifest


@pytest.fixture(scope="session")
def smoke_runs(smoke_zoo, tmp_path_factory):
    """Every notebook run once per session at the smoke profile (``support.smoke_runs``)."""
    from support.smoke_runs import run_smoke

    return run_smoke(smoke_zoo, tmp_path_factory)


@pytest.fixture(scope="module")
def zoo_cache(session_cache):
    """The model cache shared by the zoo and training tests (the tokenizer is built once)."""
    return session_cache


@pytest.fixture(scope="session")
def smoke_zoo(session_cache):
    """The smoke notebooks' embedded models, built once per session into the session cache.

    Returns the cache folder; its ``zoo`` and ``corpus`` folders are then only read.
    """
    from support.smoke_runs import smoke_zoo_names

    from coupling_utils.models import zoo

    names = smoke_zoo_names()
    status = zoo.prepare_many(names, jobs=2, echo=lambda line: None)
    failed = {k: v for k, v in status.items() if v != "ready"}
    assert not failed, f"could not build the smoke models: {failed}"
    return session_cache
