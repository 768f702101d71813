"""A measurement's finished prompts: their tables, held as prompts finish and written in batches.

A finished prompt's tables let a rerun skip it: an interrupted run resumes after it, and a later
run into the same folder with more prompts (the folder is keyed by the settings, not the prompts)
measures only the new ones. Written one prompt at a time, that cost a small model more than its
arithmetic (f04: thousands of images, seven files and a marker each). So they are held in memory
and written together, as one batch, on the clock of the held layers
(:class:`~coupling_utils.measurement.store.HeldLayers`: ``checkpoint_seconds``, 0 for every
prompt), when an error or Ctrl-C stops the run, and at its end.

Layout: ``prompts/<batch>/{<table>.parquet, done.json}``: each table holds the rows of the
batch's prompts (every table has a ``prompt`` column); ``done.json``, written after them, names
the prompts with their inputs' digests and the tables without rows (``{"prompts": {pid: digest},
"empty_tables": [...]}``). A folder of one prompt written before batches (``prompts/<pid>/``,
marker ``{"prompt": pid, "digest": ...}``) is read as a batch of one. A batch whose marker or
table cannot be read is set aside, said, and its prompts measured again.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd

from coupling_utils.files import atomic_write_parquet, read_json, read_parquet, set_aside
from coupling_utils.measurement.store import Checkpoint, Store, empty_tables, write_json
from coupling_utils.measurement.tables import TABLES, concat

__all__ = ["FinishedPrompts"]

_BATCH = re.compile(r"batch-(\d+)")


class FinishedPrompts:
    """The finished prompts of the measurement in ``store``: read from its batches, held, written.

    ``checkpoint_seconds``: how long finished prompts may be held before they are written (0: each
    one at once, as its own batch); a process killed outright loses at most that much work, which a
    resumed run measures again."""

    def __init__(self, store: Store, checkpoint_seconds: float = 0.0):
        self.store, self.clock = store, Checkpoint(checkpoint_seconds)
        self._held: dict[str, tuple[str, dict[str, pd.DataFrame], bool]] = {}  # pid -> digest, tables, keep
        self._bytes = 0
        self._index: dict[str, tuple[Path, str]] | None = None  # pid -> (batch folder, digest)
        self._read: dict[Path, dict[str, dict[str, pd.DataFrame]] | None] = {}  # folder -> pid -> tables
        self._number = 0  # the next batch's number (0: not yet looked up)

    @property
    def root(self) -> Path:
        return self.store.out / "prompts"

    # -- reading
    def tables(self, pid: str, digest: str) -> dict[str, pd.DataFrame] | None:
        """Prompt ``pid``'s stored or held tables (None: not finished); a ValueError if it was
        measured with other inputs (``digest``) under the same id."""
        if pid in self._held:
            return self._held[pid][1]
        found = self._stored().get(pid)
        if found is None:
            return None
        folder, stored = found
        if stored != digest:
            raise ValueError(
                f"{self.store.out}: prompt {pid!r} was measured with other inputs; use another "
                "out directory, other prompt ids, or resume=False"
            )
        if folder not in self._read:
            self._read[folder] = self._read_batch(folder)
        batch = self._read[folder]
        return None if batch is None else batch.get(pid)

    def _stored(self) -> dict[str, tuple[Path, str]]:
        """Every stored batch's prompts, read once per run: pid -> (folder, digest)."""
        if self._index is None:
            self._index = {}
            folders = sorted(self.root.glob("*/done.json"), key=lambda p: _order(p.parent.name))
            for marker_path in folders:
                marker = read_json(marker_path, "stored measurement file")
                for pid, digest in _prompts_of(marker).items():
                    self._index[pid] = (marker_path.parent, digest)
        return self._index

    def _read_batch(self, folder: Path) -> dict[str, dict[str, pd.DataFrame]] | None:
        """A batch's tables split by prompt (None: damaged since, its marker set aside)."""
        marker = read_json(folder / "done.json", "stored measurement file") or {}
        pids = list(_prompts_of(marker))
        empty = empty_tables(marker)
        try:
            read = {name: concat(name, [] if name in empty else [read_parquet(folder / f"{name}.parquet")])
                    for name in TABLES}  # fmt: skip
        except (OSError, ValueError) as exc:  # damaged since it was stored: its prompts measured again
            set_aside(
                folder / "done.json", f"a table of the prompts stored in {folder} cannot be read ({exc})"
            )
            for pid in pids:
                self._index.pop(pid, None)
            return None
        if len(pids) == 1:
            return {pids[0]: read}
        rows = {name: dict(tuple(df.groupby("prompt", sort=False))) for name, df in read.items()}
        return {
            pid: {name: concat(name, [rows[name][pid]]) if pid in rows[name] else concat(name, [])
                  for name in TABLES}
            for pid in pids
        }  # fmt: skip

    # -- holding and writing
    def add(self, pid: str, digest: str, tables: dict[str, pd.DataFrame], keep_work: bool) -> None:
        """Hold a finished prompt's tables; write the held prompts if they are due."""
        self._held[pid] = (digest, tables, keep_work)
        self._bytes += sum(int(df.memory_usage(index=False).sum()) for df in tables.values())
        if self.clock.due(self._bytes):
            self.write()

    def write(self) -> None:
        """Write the held prompts as one batch (each table, then the marker), then drop their work
        folders (unless their work is kept)."""
        if not self._held:
            return
        held, self._held, self._bytes = self._held, {}, 0
        self._number = self._number or self._next_batch()  # scanned once per run, then counted on
        folder = self.root / f"batch-{self._number}"
        self._number += 1
        shutil.rmtree(folder, ignore_errors=True)  # a batch a killed writer left without its marker
        folder.mkdir(parents=True)
        empty = []
        for name in TABLES:
            df = concat(name, [tables[name] for _, tables, _ in held.values()])
            if df.empty:
                empty.append(name)
            else:
                atomic_write_parquet(df, folder / f"{name}.parquet")
        marker = {
            "prompts": {pid: digest for pid, (digest, _, _) in held.items()},
            "empty_tables": sorted(empty),
        }
        write_json(folder / "done.json", marker)  # after the tables
        if self._index is not None:
            self._index.update({pid: (folder, digest) for pid, (digest, _, _) in held.items()})
        self._read[folder] = {pid: tables for pid, (_, tables, _) in held.items()}
        for pid, (_, _, keep) in held.items():
            if not keep:
                shutil.rmtree(self.store.work(pid), ignore_errors=True)
        self.clock.wrote()

    def _next_batch(self) -> int:
        """The number after the last batch written: one with its marker, or with the marker set aside
        (kept, for the record); a folder without either, left by a killed writer, is written over."""
        taken = [
            int(m.group(1))
            for p in self.root.glob("batch-*")
            if (m := _BATCH.fullmatch(p.name)) and any(p.glob("done.json*"))
        ]
        return max(taken, default=0) + 1


def _order(name: str) -> tuple[int, int, str]:
    """Batches in the order they were written (one-prompt folders of before, by name, first)."""
    m = _BATCH.fullmatch(name)
    return (1, int(m.group(1)), name) if m else (0, 0, name)


def _prompts_of(marker) -> dict[str, str]:
    """The prompts a marker vouches for, with their digests ({} for a marker that names none)."""
    if not isinstance(marker, dict):
        return {}
    named = marker.get("prompts")
    if isinstance(named, dict):
        return {str(pid): digest for pid, digest in named.items() if isinstance(digest, str)}
    if isinstance(marker.get("prompt"), str) and isinstance(marker.get("digest"), str):
        return {marker["prompt"]: marker["digest"]}  # a folder of one prompt, written before batches
    return {}
