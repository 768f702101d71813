"""Shared test settings: offline, CPU, deterministic, and a private cache directory."""

from __future__ import annotations

import os

# Tests never reach the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests use tiny tensors: one thread is faster than two, and far faster on a shared CPU.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def zoo_cache(tmp_path_factory):
    """A private model cache shared by the zoo and training tests (the tokenizer is built once)."""
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

    from coupling_utils.models.standin_hub import write_standin_hub

    path = tmp_path_factory.mktemp("standin") / "hub"
    manifest = write_standin_hub(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(path))
        mp.setattr(constants, "HF_HUB_CACHE", str(path))
        yield path, manifest
