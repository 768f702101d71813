"""Where a stored number came from: file-safe names, stable hashes, version stamps, code fingerprints.

One helper each, used by every layer that stores results:

- :func:`slug`: a model name or revision as one safe path component;
- :func:`stable_hash`: a short hash of settings and inputs (dicts, lists, numbers, strings,
  tensors and arrays), the same in every process and on every machine;
- :func:`file_sha256`: the SHA-256 of a file's bytes (weights, packages), memoised;
- :func:`versions`: the versions of the package and of the libraries behind its numbers;
- :func:`code_fingerprint`: a hash of the code that determines a measurement's numbers, so a
  stored result made by other code is recognised as stale.

What determines a measurement's numbers (:data:`NUMBER_SOURCES`): the Jacobian engine
(``engine/``: the metric, spectra, attention, blocks, Jacobians and the architecture table),
``measure()`` itself (``measurement/``) and how a model is loaded (``models/loading.py``: dtype,
device, random initialisation; ``models/preprocessors.py``: its tokenizer or image processor),
together with the installed torch and transformers. The inputs (prompts, images) and the model's
identity are not code: they are part of a measurement's key.
Sources are hashed as syntax trees without docstrings, so comments, docstrings and formatting
do not make a result stale; any change to the code itself does.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from coupling_utils.files import atomic_write_text, cache_dir, file_lock

__all__ = [
    "slug",
    "stable_hash",
    "file_sha256",
    "tensors_sha256",
    "versions",
    "cpu_name",
    "cpu_vendor",
    "code_fingerprint",
    "NUMBER_SOURCES",
]

PACKAGE = Path(__file__).resolve().parent
NUMBER_SOURCES = ("engine", "measurement", "models/loading.py", "models/preprocessors.py")


def slug(text: str, max_len: int = 80) -> str:
    """``text`` as one file-name-safe path component: runs of other characters become ``_``.

    Keeps the end of long names (a path's tail names the model); never empty, never ``.``/``..``
    or a hidden name.
    """
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))[-max_len:]
    return s.strip("._") or "x"


def stable_hash(obj, length: int = 12) -> str:
    """A short sha256 of JSON-like data: mappings (in key order), lists and tuples, strings,
    numbers, None, paths, numpy arrays and torch tensors (by dtype, shape and bytes)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:length]


def _feed(h, o) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(o, torch.Tensor):
        t = o.detach().cpu().contiguous()
        h.update(f"T{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif type(o).__module__ == "numpy" and getattr(o, "ndim", None) == 0 and hasattr(o, "item"):
        _feed(h, o.item())  # a numpy scalar hashes like the Python number
    elif type(o).__module__ == "numpy" and hasattr(o, "tobytes"):
        h.update(f"A{getattr(o, 'shape', ())}{o.dtype}".encode())
        h.update(o.tobytes())
    elif isinstance(o, Mapping):
        h.update(b"{")
        for key in sorted(o, key=str):
            _feed(h, str(key))
            _feed(h, o[key])
        h.update(b"}")
    elif isinstance(o, (list, tuple)):
        h.update(b"[")
        for v in o:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(o, Path):
        _feed(h, str(o))
    elif o is None or isinstance(o, (str, bool, int, float)):
        h.update(json.dumps(o).encode())
    else:
        raise TypeError(
            f"cannot hash a {type(o).__name__} stably; pass strings, numbers, lists, dicts or tensors"
        )


_SHA_MEMO: dict[str, str] = {}  # memo key (see _memo_keys) -> digest, this process


def _stream_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 4 MiB blocks (not memoised)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tensors_sha256(path: str | Path) -> str:
    """SHA-256 of the tensors in one safetensors file: names, dtypes, shapes and bytes, in name order.

    Independent of the file's metadata and layout, so it changes only when a weight does.
    """
    import torch
    from safetensors import safe_open

    h = hashlib.sha256()
    with safe_open(str(path), "pt") as st:
        for key in sorted(st.keys()):  # noqa: SIM118 (safe_open is not iterable)
            t = st.get_tensor(key).contiguous()
            h.update(f"{key}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _memo_keys(path: Path, st) -> list[str]:
    """The memo's keys for a file, each with its size and mtime in nanoseconds: its inode on its
    device (``inode|dev|ino|size|mtime_ns``), which a move or rename within one filesystem keeps,
    and its path with its inode (``path|path|ino|size|mtime_ns``), which another machine sharing
    the cache and the files finds (its device numbers differ; an NFS inode is the server's).

    A file rewritten in place (same inode) changes its mtime, and another file at the old path
    has another inode while the moved one holds it: both are hashed again. A filesystem without
    inode numbers (``st_ino`` 0) has only the path key. Entries of the older format
    (``path|size|mtime_ns``, without the inode) are not read: such a file is hashed once more.
    """
    by_path = f"path|{path}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    if not st.st_ino:
        return [by_path]
    return [f"inode|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}", by_path]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, memoised by its inode or its path, with its size and mtime, in memory
    and in the cache directory (``<cache>/zoo/sha256-memo.json``), so large weight files are read
    once, and a checkpoint moved or renamed within its filesystem is not read again."""
    path = Path(path).resolve()
    keys = _memo_keys(path, path.stat())
    digest = next((_SHA_MEMO[k] for k in keys if k in _SHA_MEMO), None)
    if digest is not None:
        return digest
    memo = _read_memo()
    digest = next((memo[k] for k in keys if isinstance(memo.get(k), str)), None)
    if digest is None or any(k not in memo for k in keys):
        digest = digest or _stream_sha256(path)
        _remember(dict.fromkeys(keys, digest))
    _SHA_MEMO.update(dict.fromkeys(keys, digest))
    return digest


def _read_memo() -> dict:
    """The cache's memo of file digests ({} where there is none, or it cannot be read)."""
    try:  # a cache one cannot write, or without a zoo folder yet, has no memo to read
        memo = json.loads((cache_dir("zoo") / "sha256-memo.json").read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def _remember(entries: dict[str, str]) -> None:
    """Add ``entries`` to the cache's memo: read again, updated and written under its lock, so
    processes sharing a cache (a sweep's jobs) keep each other's entries instead of the last
    writer's alone. A read-only cache serves what it holds, unremembered."""
    with contextlib.suppress(OSError):
        folder = cache_dir("zoo")
        with file_lock(folder / ".sha256-memo.lock", quiet=True):
            memo = _read_memo()
            memo.update(entries)
            atomic_write_text(folder / "sha256-memo.json", json.dumps(memo, indent=1))


def versions() -> dict[str, str]:
    """Versions of coupling_utils, Python and the libraries behind the numbers."""
    import numpy
    import pandas
    import torch
    import transformers

    from coupling_utils import __version__

    return {
        "coupling_utils": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
    }


def _cpuinfo(field: str) -> str | None:
    """One field of ``/proc/cpuinfo`` (Linux), or None where it is not there."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows), for
    benchmark rows that say which machine measured them."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The processor's vendor id (``GenuineIntel``, ``AuthenticAMD``; else what ``platform`` knows):
    the BLAS picks other kernels on Intel and AMD at the same capability."""
    return _cpuinfo("vendor_id") or platform.processor() or platform.machine()


def code_fingerprint(extra: Iterable[str] = ()) -> dict[str, object]:
    """The fingerprint of the code behind a measurement's numbers (see the module doc).

    ``extra``: more sources (paths relative to the package, e.g. ``"analysis/trajectories.py"``)
    for results that other code computes. Returns ``fingerprint`` (16 hex digits, what to
    compare), ``sources`` (the hash of the code alone), the torch and transformers versions and
    ``covers`` (what was hashed).
    """
    import torch
    import transformers

    covers = tuple(NUMBER_SOURCES) + tuple(sorted(set(extra) - set(NUMBER_SOURCES)))
    sources = _sources_hash(covers)
    stamp = {"sources": sources, "torch": torch.__version__, "transformers": transformers.__version__}
    return {"fingerprint": stable_hash(stamp, 16), **stamp, "covers": list(covers)}


@functools.cache
def _sources_hash(covers: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for rel in covers:
        path = PACKAGE / rel
        if not path.exists():
            raise FileNotFoundError(f"code_fingerprint: {rel} is not a part of coupling_utils")
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(PACKAGE)).encode() + b"\0")
            h.update(_code_only(f.read_text(encoding="utf-8")).encode() + b"\0")
    return h.hexdigest()


def _code_only(source: str) -> str:
    """A module's syntax tree without docstrings: what the code does, not how it is written."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)
