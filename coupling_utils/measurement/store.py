"""Where a measurement lives on disk: its folder, resume markers, atomic files and finished results.

Layout of ``out/``::

    settings.json            the resolved settings (a resumed run must match them)
    code.json                the fingerprint of the code that made what is stored
    _work/<prompt>/prompt.json, layer_<l>/{J.npy, basis_*.npy, *.parquet, done.json, cross.json}
    prompts/<batch>/{<table>.parquet, done.json}   finished prompts (:mod:`.finished`)
    <table>.parquet ..., provenance.json

A prompt's or a layer's table without rows gets no file: its marker names it (``empty_tables``;
a marker without that list vouches for a file per table). The finished tables all have files.

Every file is written atomically (a temporary name, then a rename), and every completion marker
(``done.json``, ``cross.json``, ``provenance.json``) only after the data it vouches for, so a
process killed at any point leaves a folder that a rerun resumes from. A layer's marker names
the shape of each array it vouches for; a stored file damaged later (cut short, missing, of
another shape) is found before it is used, and what its marker vouched for is measured again.
One process at a time works in a folder (:func:`coupling_utils.files.file_lock` on
``out/.lock``). A marker or stamp that is not valid JSON is moved aside (``*.corrupt-<time>``,
:func:`coupling_utils.files.read_json`) and what it vouched for is measured again.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.metric import SVD
from coupling_utils.files import (
    atomic_path,
    atomic_write_parquet,
    atomic_write_text,
    read_json,
    read_parquet,
    set_aside,
)
from coupling_utils.measurement.options import HELD_BYTES
from coupling_utils.measurement.settings import Settings
from coupling_utils.measurement.tables import TABLES, Measurement, concat, other_map_folder

__all__ = [
    "Store",
    "Checkpoint",
    "HeldLayers",
    "PromptArrays",
    "write_json",
    "save_npy",
    "load_npy",
    "empty_tables",
]

MARKERS = ("done.json", "cross.json", "provenance.json")


def write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def save_npy(path: Path, arr: torch.Tensor | np.ndarray) -> None:
    """Save an array atomically; a tensor is moved to the host first."""
    arr = arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else np.asarray(arr)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr))


def load_npy(path: Path, mmap: bool = True) -> np.ndarray:
    return np.load(path, mmap_mode="r" if mmap else None)


def empty_tables(marker: dict) -> set[str]:
    """The tables without rows that a prompt's or a layer's marker names (they have no file).
    Anything but a list of names names none: each table is then read from its file (a missing
    one is measured again), never taken as empty on a damaged marker's word."""
    listed = marker.get("empty_tables")
    return {x for x in listed if isinstance(x, str)} if isinstance(listed, list) else set()


def _read_json(path: Path) -> dict | None:
    return read_json(path, "stored measurement file")


_MARKER_FACTS = {  # what a layer stage's marker must say, and of which kind
    "done": {
        "layer": int,
        "T": int,
        "tokens": list,
        "context_tokens": list,
        "seconds": float,
        "block_passes": int,
    },
    "cross": {"layer": int, "seconds": float, "block_passes": int},
}


def _check_marker(meta: dict, layer: int, stage: str) -> None:
    """Raise ValueError naming what a layer stage's marker lacks (a fact, or its arrays' shapes)."""
    for key, kind in {**_MARKER_FACTS[stage], "arrays": dict}.items():
        value = meta.get(key)
        ok = isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool)
        if kind is list and ok:
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in value)
        if not ok:
            raise ValueError(f"its marker's {key} is {value!r}")
    if meta["layer"] != layer:
        raise ValueError(f"its marker is layer {meta['layer']}'s")
    if not all(isinstance(v, list) and all(isinstance(x, int) for x in v) for v in meta["arrays"].values()):
        raise ValueError(f"its marker's arrays are {meta['arrays']!r}, not shapes")


class Store:
    """The folder of one measurement: paths, markers, and what a run may reuse."""

    def __init__(self, out: Path):
        self.out = Path(out)

    # -- paths
    def work(self, pid: str) -> Path:
        return self.out / "_work" / pid

    def layer_dir(self, pid: str, layer: int) -> Path:
        return self.work(pid) / f"layer_{layer:04d}"

    # -- opening a folder for a run
    def open(self, settings: Settings, code: dict, *, resume: bool, reuse_stale: bool) -> dict:
        """Prepare the folder for a run with ``settings`` by ``code`` (its fingerprint).

        Refuses stored work of other settings (unless ``resume=False``, which clears it).
        Stored work of other code is cleared and recomputed, or, with ``reuse_stale=True``,
        kept. Returns the fingerprint of the code behind what the folder holds afterwards.
        """
        self.out.mkdir(parents=True, exist_ok=True)
        for tmp in self.out.rglob(".*.tmp"):  # left by a killed writer; we hold the lock
            tmp.unlink(missing_ok=True)
        stamps = [self.out / "settings.json", self.out / "code.json"]
        had = [p.exists() for p in stamps]
        stored, made_by = (_read_json(p) for p in stamps)
        if (had[0] and stored is None) or (had[1] and made_by is None):
            self.clear()  # a corrupt stamp: what the folder holds cannot be vouched for
        if stored is not None and resume:
            diff = settings.differences(stored)
            if diff:
                raise ValueError(
                    f"{self.out} holds a measurement with other settings ({', '.join(diff)}); "
                    "use another out directory, or resume=False to replace it"
                )
        if not resume or not self.holds_work():
            self.clear()
            made_by = code
        elif (made_by or {}).get("fingerprint") != code["fingerprint"]:
            if reuse_stale:  # kept as it is, and said so in the provenance
                made_by = made_by or {"fingerprint": None, "note": "stored before code fingerprints"}
            else:  # made by other code: measured again
                self.clear()
                made_by = code
        write_json(self.out / "code.json", made_by)
        write_json(self.out / "settings.json", settings.stored())
        return made_by

    def holds_work(self) -> bool:
        """Whether anything computed is stored (work, finished prompts or tables)."""
        return any((self.out / name).exists() for name in ("_work", "prompts", "provenance.json"))

    def clear(self) -> None:
        """Remove every computed file (the work first, the code stamp last)."""
        for name in ("provenance", *TABLES):
            (self.out / f"{name}.{'json' if name == 'provenance' else 'parquet'}").unlink(missing_ok=True)
        for name in ("_work", "prompts"):
            shutil.rmtree(self.out / name, ignore_errors=True)
        for folder in self.out.glob(other_map_folder("*")):  # the tables under a second map
            shutil.rmtree(folder, ignore_errors=True)
        (self.out / "code.json").unlink(missing_ok=True)

    # -- markers
    def layer_meta(self, pid: str, layer: int, stage: str = "done") -> dict | None:
        """The completion marker of a layer's stage ("done" or "cross"), None if not complete."""
        return _read_json(self.layer_dir(pid, layer) / f"{stage}.json")

    def stored_layer(
        self, pid: str, layer: int, tables: Sequence[str] = (), stage: str = "done"
    ) -> tuple[dict, dict[str, pd.DataFrame]] | None:
        """A layer's stage as stored: its marker and its ``tables`` read back (those the marker
        names as without rows are empty), if the marker and every file it vouches for can be
        read: its arrays (``arrays``: name -> shape) mapped with the shapes it names, its tables
        with their columns. None if the stage is not stored, or was damaged since (a file cut
        short, missing or of another shape, a marker without its facts): then the marker is set
        aside, said, and the stage computed again, like a finished prompt's."""
        ldir = self.layer_dir(pid, layer)
        meta = self.layer_meta(pid, layer, stage)
        if meta is None:
            return None
        try:
            _check_marker(meta, layer, stage)
            for name, shape in meta["arrays"].items():
                found = load_npy(ldir / f"{name}.npy").shape
                if list(found) != list(shape):
                    raise ValueError(f"{name}.npy holds an array of shape {list(found)}, not {list(shape)}")
            empty = empty_tables(meta)
            read = {
                name: concat(name, [] if name in empty else [read_parquet(ldir / f"{name}.parquet")])
                for name in tables
            }
        except (OSError, ValueError) as exc:
            why = f"layer {layer} of prompt {pid!r} stored in {ldir} cannot be read ({exc})"
            set_aside(ldir / f"{stage}.json", why)
            return None
        return meta, read

    def start_prompt(self, pid: str, digest: str, text: str) -> None:
        """Work folder of a prompt, cleared if it holds work for other inputs under this id."""
        work = self.work(pid)
        meta = _read_json(work / "prompt.json")
        if (meta is None and work.exists()) or (meta is not None and meta.get("digest") != digest):
            shutil.rmtree(work)  # work for other inputs under this id, or of unknown inputs
        work.mkdir(parents=True, exist_ok=True)
        write_json(work / "prompt.json", {"prompt": pid, "digest": digest, "text": text})

    def finish(
        self, tables: dict[str, pd.DataFrame], provenance: dict, other: Measurement | None = None
    ) -> None:
        """Store the final tables, then ``provenance.json``: the measurement is complete. ``other``:
        the tables under the run's second map of the last block, stored first in their own folder."""
        if other is not None:
            Store(self.out / other_map_folder(other.last_block)).finish(other.tables, other.provenance)
        for name, df in tables.items():
            atomic_write_parquet(df, self.out / f"{name}.parquet")
        write_json(self.out / "provenance.json", provenance)

    def finished(self, fingerprint: str, *, reuse_stale: bool = False) -> Measurement | None:
        """The finished measurement here, if today's code made it (or any code, with
        ``reuse_stale=True``, then marked stale); None otherwise. Reads no model."""
        prov = _read_json(self.out / "provenance.json")
        if prov is None:
            return None
        made_by = (prov.get("code") or {}).get("fingerprint")
        if made_by != fingerprint and not reuse_stale:
            return None
        try:
            m = Measurement.load(self.out)
        except (OSError, ValueError) as exc:  # a table damaged since it was stored: measure it again
            set_aside(
                self.out / "provenance.json",
                f"a table of the stored measurement {self.out} cannot be read ({exc})",
            )
            return None
        m.provenance["stale"] = made_by != fingerprint
        return m

    # -- stored arrays
    def arrays(self, pid: str, held: Mapping[tuple[int, str], np.ndarray] | None = None) -> PromptArrays:
        """Prompt ``pid``'s stored arrays, each file mapped once for as long as the result lives
        (``held``: arrays not yet written, by (layer, name), taken from memory instead)."""
        return PromptArrays(self, pid, held)

    def basis(self, pid: str, layer: int, prefix: str = "", index=None) -> SVD:
        """A layer's stored top singular triplets (all tokens, or token ``index``), on the host."""
        return self.arrays(pid).basis(layer, prefix, index)

    def array(self, pid: str, layer: int, name: str, index: int) -> torch.Tensor:
        """Row ``index`` of a layer's stored array ``name`` (e.g. "J"), on the host."""
        return self.arrays(pid).array(layer, name, index)


class Checkpoint:
    """When held work is due to be written: ``seconds`` after the last write (0: at once), or once
    :data:`~coupling_utils.measurement.options.HELD_BYTES` are held. The one clock of the held
    layers (:class:`HeldLayers`) and the held finished prompts (``finished.FinishedPrompts``)."""

    def __init__(self, seconds: float = 0.0):
        self.seconds = float(seconds)
        self.written = time.perf_counter()  # when held work was last written

    def due(self, held_bytes: int) -> bool:
        late = time.perf_counter() - self.written >= self.seconds
        return self.seconds <= 0 or late or held_bytes >= HELD_BYTES

    def wrote(self) -> None:
        self.written = time.perf_counter()


class HeldLayers:
    """A run's finished layers, held in memory until they are written to their folders.

    Each layer's arrays and tables, then its marker (``done.json``, which vouches for them), are
    written once ``checkpoint_seconds`` have passed since the last write (0: at once), once
    :data:`~coupling_utils.measurement.options.HELD_BYTES` are held, or when :meth:`write` is
    called (an error or Ctrl-C, a prompt whose work is kept). A process killed outright loses the
    layers held, at most that many seconds of work, and a resumed run measures them again; a small
    model's layers, which take milliseconds, do not each pay for their own files."""

    def __init__(self, store: Store, checkpoint_seconds: float = 0.0):
        self.store, self.clock = store, Checkpoint(checkpoint_seconds)
        self._held: dict[tuple[str, int], dict] = {}  # (prompt, layer) -> arrays, tables, marker
        self._bytes = 0

    def start(self, pid: str, layer: int) -> None:
        self._held[(pid, layer)] = {"arrays": {}, "tables": {}, "meta": None}

    def array(self, pid: str, layer: int, name: str, arr: torch.Tensor | np.ndarray) -> None:
        """Hold a layer's array, on the host."""
        held = np.ascontiguousarray(arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else arr)
        self._held[(pid, layer)]["arrays"][name] = held
        self._bytes += held.nbytes

    def table(self, pid: str, layer: int, name: str, table: pd.DataFrame) -> None:
        self._held[(pid, layer)]["tables"][name] = table

    def done(self, pid: str, layer: int, meta: dict) -> None:
        """The layer is complete (``meta``: its marker): write the held layers if they are due."""
        self._held[(pid, layer)]["meta"] = meta
        if self.clock.due(self._bytes):
            self.write()

    def write(self) -> None:
        """Write every complete layer held, in the order they were finished, each marker last. A
        layer still being computed (no marker yet) is dropped: it is measured again."""
        for key, held in list(self._held.items()):
            del self._held[key]
            if held["meta"] is None:
                continue
            ldir = self.store.layer_dir(*key)
            ldir.mkdir(parents=True, exist_ok=True)
            for name, arr in held["arrays"].items():
                save_npy(ldir / f"{name}.npy", arr)
            for name, table in held["tables"].items():
                atomic_write_parquet(table, ldir / f"{name}.parquet")
            write_json(ldir / "done.json", held["meta"])  # written last: the layer is complete
        self._bytes = 0
        self.clock.wrote()

    def arrays(self, pid: str) -> dict[tuple[int, str], np.ndarray]:
        """Prompt ``pid``'s complete layers' arrays still held, by (layer, name)."""
        return {
            (layer, name): arr
            for (held_pid, layer), held in self._held.items()
            if held_pid == pid and held["meta"] is not None
            for name, arr in held["arrays"].items()
        }

    def drop(self, pid: str) -> None:
        """Forget prompt ``pid``'s held layers: its tables are stored, its work is not needed."""
        self._held = {key: held for key, held in self._held.items() if key[0] != pid}
        self._bytes = sum(a.nbytes for held in self._held.values() for a in held["arrays"].values())


class PromptArrays:
    """The stored arrays of one prompt's layers, each file memory-mapped at its first read and
    kept while this object lives (one assembly of a prompt whose layers are all stored): reading
    them a token at a time then maps each file once, not once per token (on a small model,
    mapping a file cost more than the arithmetic on what it holds)."""

    def __init__(self, store: Store, pid: str, held: Mapping[tuple[int, str], np.ndarray] | None = None):
        self.store, self.pid = store, pid
        self._maps: dict[tuple[int, str], np.ndarray] = dict(held or {})

    def _mapped(self, layer: int, name: str) -> np.ndarray:
        key = (layer, name)
        if key not in self._maps:
            self._maps[key] = load_npy(self.store.layer_dir(self.pid, layer) / f"{name}.npy")
        return self._maps[key]

    def basis(self, layer: int, prefix: str = "", index=None) -> SVD:
        """A layer's top singular triplets (all tokens, or token ``index``), on the host."""
        parts = []
        for name in ("U", "S", "Vh"):
            arr = self._mapped(layer, f"{prefix}basis_{name}")
            parts.append(torch.from_numpy(np.array(arr if index is None else arr[index])))
        return SVD(*parts)

    def array(self, layer: int, name: str, index: int) -> torch.Tensor:
        """Row ``index`` of a layer's array ``name`` (e.g. "J"), on the host."""
        return torch.from_numpy(np.array(self._mapped(layer, name)[index]))
