"""Where zoo entries live in the project cache: their keys, their directories and their build locks.

An entry lives in ``<cache>/zoo/<name>/<key>``, where the key changes whenever what the entry
produces would (a new package version or weights, a new training spec, corpus or
:data:`ZOO_FORMAT`), so a stale build is never reused. :func:`entry_dir` is the one function that
spells that layout; everything else asks it. The hashes (of files, for the keys; of tensors, for the
pinned checksums) live in :mod:`coupling_utils.provenance`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

from coupling_utils.files import cache_dir, file_lock, is_locked
from coupling_utils.provenance import file_sha256 as file_sha256  # its old home: zoo.cache.file_sha256
from coupling_utils.provenance import tensors_sha256 as tensors_sha256  # its old home

ZOO_FORMAT = 1  # bump when the on-disk layout or the training code changes what a spec produces


# --------------------------------------------------------------------------- keys
def _data_key(kind: str) -> str:
    if kind.startswith("lm"):
        from coupling_utils.models.corpus import CORPUS_SHA256

        return CORPUS_SHA256
    from coupling_utils.models.vit_training import MNIST_SHA256

    return MNIST_SHA256


def _spec_key(kind: str, specs) -> str:
    """The key of a training run (or a family's ``{run: spec}``): format, kind, data and specs."""
    payload = {
        "format": ZOO_FORMAT,
        "kind": kind,
        "data": _data_key(kind),
        "specs": {k: v.to_dict() for k, v in specs.items()} if isinstance(specs, dict) else specs.to_dict(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- paths
class Keyed(Protocol):
    """What :func:`entry_dir` reads of a :class:`~coupling_utils.models.zoo.registry.ZooEntry`
    (the registry builds on this module, not the other way round)."""

    name: str

    def key(self) -> str: ...


def entry_dir(entry: Keyed, member: str | None = None) -> Path:
    """Where an entry lives (or will live): ``<cache>/zoo/<name>/<key>``, or a family member's
    ``<cache>/zoo/<name>/<key>/<member>``. The only place that spells this layout.

    Computing the key can raise :class:`~coupling_utils.models.zoo.errors.ZooError` (a package
    with the weights is not installed).
    """
    key = entry.key()
    path = cache_dir("zoo") / entry.name / key
    return path / member if member else path


# --------------------------------------------------------------------------- locks
def _lock_file(name: str) -> Path:
    return cache_dir("zoo") / name / ".lock"


def _lock(name: str):
    """An inter-process lock per entry, so two processes do not build the same thing at once."""
    return file_lock(_lock_file(name), f"embedded:{name}")


def _is_locked(name: str) -> bool:
    """Whether another process holds an entry's build lock right now."""
    return is_locked(_lock_file(name))
