"""Shared test settings: offline, CPU, deterministic, and a private cache directory.

Every test runs with ``COUPLING_CACHE`` pointing into pytest's temporary folder, so no test can
read or write the user's real cache (``~/.cache/coupling-book``). The embedded models the smoke
notebooks use are built once per test run there (:func:`smoke_zoo`; the models folder is one
for all workers, :func:`session_cache`) and shared by the tests that need them.
"""

from __future__ import annotations

import gc
import os
import pickle

# Tests never reach the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests use tiny tensors: one thread is faster than two, and far faster on a shared CPU.
torch.set_num_threads(1)


def pytest_collection_finish(session):
    """Put what collection loaded (torch, transformers, the package: a large heap that never turns
    into garbage) out of the cyclic collector's reach: a chapter frees memory after each measured
    job with ``gc.collect()``, which would otherwise rescan all of it each time (about half a
    second a job on this machine, most of a smoke chapter's run)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test`` runs two workers, each taking whole files), the files
    holding slow tests go first (`make test` passes --no-loadscope-reorder, so xdist keeps this
    order), so that the workers do not end on one long file."""
    if getattr(config.option, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {item.path for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: item.path not in slow)  # stable: each file keeps its order


def once_per_run(tmp_path_factory, name: str, make):
    """``make()``, made once per test run: under pytest-xdist the first worker to ask makes it and
    the others wait, then read its pickled value; without xdist, simply ``make()``. For session
    fixtures that write into the repository (two workers would write the same files)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    from coupling_utils.files import file_lock

    shared = run_folder(tmp_path_factory)
    done = shared / f"{name}.pickle"
    with file_lock(shared / f"{name}.lock"):
        if done.exists():
            return pickle.loads(done.read_bytes())
        value = make()
        done.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def run_folder(tmp_path_factory):
    """The folder of this test run: under pytest-xdist the one every worker's basetemp lies in,
    without it the basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """The session's private ``COUPLING_CACHE`` (whatever the caller's environment says). Its
    ``zoo`` and ``corpus`` (the embedded models and the tokenised corpus) are the test run's, one
    for all pytest-xdist workers: each model is built once, the second worker to want it waiting on
    the zoo's lock (as a sweep's jobs do on a shared cache)."""
    path = tmp_path_factory.getbasetemp() / "coupling-cache"
    models = run_folder(tmp_path_factory) / "models"
    path.mkdir(parents=True, exist_ok=True)
    for part in ("zoo", "corpus"):
        (models / part).mkdir(parents=True, exist_ok=True)
        if not (path / part).exists():
            (path / part).symlink_to(models / part, target_is_directory=True)
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
    """Every notebook run once per test run at the smoke profile (``support.smoke_runs``)."""
    from support.smoke_runs import run_smoke

    return once_per_run(tmp_path_factory, "smoke_runs", lambda: run_smoke(smoke_zoo, tmp_path_factory))


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
