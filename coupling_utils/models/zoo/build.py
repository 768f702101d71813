"""Preparing zoo entries: building them into the cache once (atomically, under a lock), finding
them afterwards, and reading what a build recorded.

:func:`prepare` builds one entry (a family member by member, so an interrupted build resumes) and
writes its ``manifest.json`` last (what it cost, the machine's load, the versions, the final
metrics); :func:`prepare_many` spreads several builds over worker processes. :func:`resolve`,
:func:`revisions`, :func:`manifest`, :func:`family_table`, :func:`list_entries` and
:func:`weights_checksums` read prepared entries.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from coupling_utils.files import ENV_VAR, atomic_dir, atomic_write_text, read_parquet, write_parquet
from coupling_utils.models.zoo.cache import _is_locked, _lock, entry_dir
from coupling_utils.models.zoo.errors import BuildFailed, ZooError
from coupling_utils.models.zoo.recipes import _build_gguf, _build_hf_copy, _train_one
from coupling_utils.models.zoo.registry import (
    PREFIX,
    REGISTRY,
    ZooEntry,
    _check_opt_in,
    _split,
    is_final,
    no_checkpoint,
)
from coupling_utils.provenance import tensors_sha256, versions


# --------------------------------------------------------------------------- where and whether
def entry_path(name: str) -> Path:
    """Where an entry lives (or will live) in the cache: ``<cache>/zoo/<name>/<key>``."""
    entry, member = _split(name)
    return entry_dir(entry, member)


def is_ready(name: str) -> bool:
    entry, member = _split(name)
    root = entry_dir(entry)
    return (root / "manifest.json").exists() and (member is None or (root / member / "config.json").exists())


# --------------------------------------------------------------------------- the manifest
def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def _versions() -> dict:
    """Library versions (one helper for the whole package), and the threads the build used."""
    import torch

    return {**versions(), "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}


def _write_manifest(
    dirpath: Path, entry: ZooEntry, key: str, t0: tuple[float, float], load0, metrics: dict, **extra
) -> dict:
    man = {
        "name": entry.name,
        "kind": entry.kind,
        "key": key,
        "description": entry.description,
        "licence": entry.licence,
        "expected_cost": entry.expected_cost,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0[0], 2),
        "cpu_seconds": round(time.process_time() - t0[1], 2),
        "size_bytes": _dir_size(dirpath),
        "loadavg_before": load0,
        "loadavg_after": _loadavg(),
        "versions": _versions(),
        "metrics": metrics,
        **extra,
    }
    atomic_write_text(dirpath / "manifest.json", json.dumps(man, indent=2, default=str))
    return man


# --------------------------------------------------------------------------- building
def _build(entry: ZooEntry, root: Path, key: str, progress: bool, *, force: bool = False) -> None:
    """Build an entry into ``root`` (call holding its lock).

    The build is written into a folder beside ``root`` and swapped in only when complete, so a
    forced rebuild leaves the old build usable until then, also when it fails or is interrupted.
    A family that is not forced is built in place member by member instead (each member written
    atomically, the table and the manifest last), so an interrupted build resumes.
    """
    t0, load0 = (time.perf_counter(), time.process_time()), _loadavg()
    with _library_bars(progress):
        if entry.is_family and not force:
            _build_family(entry, root, key, progress, t0, load0)
            return
        with atomic_dir(root) as tmp:
            _build_into(entry, tmp, key, progress, t0, load0)  # files follow the umask (atomic_dir)


@contextlib.contextmanager
def _library_bars(progress: bool) -> Iterator[None]:
    """transformers' own progress bars (save_pretrained's "Writing model shards", loading's
    "Loading weights") off while a build runs without progress, as a notebook's quiet build asks."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown and not progress:
            hf_logging.enable_progress_bar()


def _build_into(entry: ZooEntry, out: Path, key: str, progress: bool, t0, load0) -> None:
    """Build an entry, its manifest last, into the folder ``out`` (the caller swaps it in)."""
    if entry.source is not None:
        builder = _build_gguf if entry.source.gguf else _build_hf_copy
        if progress:
            print(f"preparing embedded:{entry.name} (once; {entry.expected_cost}) ...", flush=True)
        metrics = builder(entry.source, out, progress)
        _write_manifest(out, entry, key, t0, load0, metrics)
    elif entry.is_family:
        _build_family(entry, out, key, progress, t0, load0)
    else:
        metrics = _train_one(entry.kind, entry.specs(), out, progress, entry.name)
        _write_manifest(out, entry, key, t0, load0, metrics, spec=entry.specs().to_dict())


def _build_family(entry: ZooEntry, root: Path, key: str, progress: bool, t0, load0) -> None:
    """Each member is written atomically into ``root`` (so an interrupted build resumes), the
    family table and the manifest last."""
    from tqdm.auto import tqdm

    specs = entry.specs()
    rows = []
    for run, spec in tqdm(specs.items(), desc=entry.name, disable=not progress):
        mdir = _train_member(entry.name, run, progress, root=root)
        m = json.loads((mdir / "member.json").read_text())["metrics"]
        rows.append({"run": run, **m, "batch_size": spec.batch_size})
    table = pd.DataFrame(rows)
    write_parquet(table, root / "family.parquet")
    table.to_csv(root / "family.csv", index=False)
    summary_cols = [c for c in ("val_loss", "val_acc", "test_acc") if c in table]
    metrics = {
        "n_members": len(table),
        **{f"{c}_range": [float(table[c].min()), float(table[c].max())] for c in summary_cols},
        "train_seconds_total": float(table["train_seconds"].sum()),
    }
    _write_manifest(root, entry, key, t0, load0, metrics, members=list(specs))


def _train_member(family: str, run: str, progress: bool = False, *, root: Path | None = None) -> Path:
    """Train one family member into ``<family>/<key>/<run>`` (or ``<root>/<run>``: a rebuild
    beside the family) unless it is there (atomic, locked).

    Members are independent, so :func:`prepare_many` trains them in parallel processes; the
    family's table and manifest are written afterwards by :func:`prepare`.
    """
    entry = REGISTRY[family]
    spec = entry.specs()[run]
    mdir = entry_dir(entry, run) if root is None else root / run
    with _lock(f"{family}/.members/{run}"):
        for stale in mdir.parent.glob(f".{run}.*.tmp"):  # a killed build of this member
            shutil.rmtree(stale, ignore_errors=True)
        if not (mdir / "member.json").exists():
            with atomic_dir(mdir) as tmp:
                m = _train_one(entry.kind, spec, tmp, progress, run)
                (tmp / "member.json").write_text(
                    json.dumps({"run": run, "spec": spec.to_dict(), "metrics": m}, indent=2)
                )
    return mdir


def _remove_stale_builds(entry: ZooEntry, root: Path, key: str) -> None:
    """Leftovers of killed builds of an entry (call holding its lock: nobody else is building it).

    Members' leftovers are cleaned under their own locks (:func:`_train_member`).
    """
    old = root.parent / f".{key}.old"  # a swap (files.atomic_dir) killed between its two renames
    if old.is_dir() and not root.exists() and (old / "manifest.json").exists():
        os.replace(old, root)  # the old build, whole: back in place
    members = entry.members()
    for stale in [
        old,
        *root.parent.glob(f".{key}.*.tmp"),
        *(t for t in root.glob(".*.tmp") if not any(t.name.startswith(f".{m}.") for m in members)),
    ]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


# The builds that failed in this process, by (cache, entry), and those not to be tried again here.
_FAILED: dict[tuple[str, str], BaseException] = {}
_NOT_AGAIN: set[tuple[str, str]] = set()


def _failure_key(entry: ZooEntry) -> tuple[str, str]:
    return os.environ.get(ENV_VAR, ""), entry.name


def no_retry(name: str, on: bool = True) -> None:
    """Whether a build of ``name`` that failed in this process is tried again by a later
    :func:`prepare` here (``on``: not; :func:`prepare` raises :class:`BuildFailed` naming the first
    error at once). A notebook builds its models first and its measurement then reports a failure
    once, without a second slow build. ``prepare(force=True)`` always tries again."""
    entry, _ = _split(name)
    (_NOT_AGAIN.add if on else _NOT_AGAIN.discard)(_failure_key(entry))


def prepare(
    name: str, *, force: bool = False, progress: bool = True, accept_terms: bool | None = None
) -> Path:
    """Build an entry if it is not in the cache yet (or ``force``), and return its directory.

    ``force`` rebuilds beside the old build, which stays usable until the new one is complete.
    A build that failed earlier in this process is not tried again after :func:`no_retry`.
    """
    entry, member = _split(name)
    _check_opt_in(entry, accept_terms)
    root = entry_dir(entry)
    key, failure = root.name, _failure_key(entry)
    if not force and (root / "manifest.json").exists():
        return root / member if member else root  # built: reading needs no lock (a read-only cache)
    if not force and failure in _NOT_AGAIN and failure in _FAILED:
        first = _FAILED[failure]
        raise BuildFailed(
            f"{PREFIX}{entry.name} could not be built ({type(first).__name__}: {first}); it was tried "
            f"once in this run and not again. Fix the cause and rerun (`coupling-book zoo prepare "
            f"{entry.name}` shows the build)"
        ) from first
    try:
        with _lock(entry.name):
            _remove_stale_builds(entry, root, key)
            if force or not (root / "manifest.json").exists():
                _build(entry, root, key, progress, force=force)
    except Exception as exc:
        _FAILED[failure] = exc
        raise
    _FAILED.pop(failure, None)
    return root / member if member else root


# --------------------------------------------------------------------------- reading prepared entries
def resolve(
    name: str, revision: str | None = None, *, accept_terms: bool | None = None, progress: bool = True
) -> Path:
    """The local ``save_pretrained`` directory of ``embedded:<name>`` (prepared on first use).

    With ``revision`` (e.g. ``"step512"``), checks that ``<dir>/revisions/<revision>/`` exists and
    still returns ``<dir>``: the loader picks the checkpoint by the local-directory rule.
    """
    path = prepare(name, progress=progress, accept_terms=accept_terms)
    entry, _ = _split(name)
    root = entry_dir(entry)
    damage = _damage(entry, root, json.loads((root / "manifest.json").read_text()))
    if damage:
        raise ZooError(f"{PREFIX}{entry.name} in the cache ({root}) is {damage}")
    if not is_final(revision) and not (path / "revisions" / revision / "config.json").exists():
        label = name if str(name).startswith(PREFIX) else PREFIX + str(name)
        raise ZooError(no_checkpoint(label, revision, revisions(name)))
    return path


def revisions(name: str) -> list[str]:
    """The checkpoints (``step<N>``, in step order) of a prepared run; [] if it keeps only the final model."""
    from coupling_utils.models.training import list_revisions

    return list_revisions(prepare(name, progress=False))


def weights_checksums(name: str) -> dict[str, str]:
    """``{relative path: tensors_sha256}`` of every weight file of a prepared entry (checkpoints too).

    What the pinned checksums of the smoke builds (``tests/pinned/zoo_checksums.json``) compare.
    """
    entry, member = _split(name)
    root = entry_dir(entry, member)
    if not is_ready(name):
        raise ZooError(f"embedded:{name} is not prepared; run `coupling-book zoo prepare {name}` first")
    return {
        f.relative_to(root).as_posix(): tensors_sha256(f)
        for f in sorted(root.rglob("*.safetensors"))
        if not any(part.startswith(".") for part in f.relative_to(root).parts)
    }


def manifest(name: str) -> dict | None:
    """The manifest of a prepared entry (None if it is not prepared)."""
    entry, member = _split(name)
    path = entry_dir(entry) / "manifest.json"
    if not path.exists():
        return None
    man = json.loads(path.read_text())
    if member:
        man = {**man, "member": json.loads((path.parent / member / "member.json").read_text())}
    return man


def family_table(name: str, *, progress: bool = True) -> pd.DataFrame:
    """One row per family member: run, name, n_params, n_layers, d_model, steps, seed, the held-out
    metrics (val_loss/val_acc for LMs, test_acc/val_acc for ViTs), train_seconds, path.

    The family is prepared first if needed.
    """
    entry, member = _split(name)
    if not entry.is_family or member:
        raise ZooError(
            f"{name!r} is not a family; families: "
            + ", ".join(e.name for e in REGISTRY.values() if e.is_family)
        )
    root = prepare(entry.name, progress=progress)
    table = read_parquet(root / "family.parquet")
    table.insert(1, "name", [f"{PREFIX}{entry.name}/{r}" for r in table["run"]])
    table["path"] = [str(root / r) for r in table["run"]]
    return table


def list_entries() -> pd.DataFrame:
    """Every registry entry with its state (ready/missing/opt-in), cost and final metrics."""
    return pd.DataFrame([_entry_row(e) for e in REGISTRY.values()])


def _entry_row(e: ZooEntry) -> dict:
    """One row of :func:`list_entries`."""
    row = {
        "name": f"{PREFIX}{e.name}",
        "kind": e.kind,
        "state": "missing",
        "seconds": None,
        "size_mb": None,
        "metrics": "",
        "expected_cost": e.expected_cost,
        "licence": e.licence,
        "description": e.description,
        "note": "",
    }
    try:
        root = entry_dir(e)
    except ZooError as exc:
        row["state"] = "not installed"
        row["note"] = str(exc)
        return row
    if e.opt_in and os.environ.get(e.opt_in, "") != "1":
        row["state"] = f"opt-in ({e.opt_in}=1)"
    man_path = root / "manifest.json"
    if not man_path.exists() and _is_locked(e.name):
        row["state"] = "building"
    if man_path.exists():
        man = json.loads(man_path.read_text())
        row.update(
            state=_damage(e, root, man) or "ready",
            seconds=man.get("seconds"),
            size_mb=round(man.get("size_bytes", 0) / 2**20, 1),
            metrics=_fmt_metrics(man.get("metrics", {})),
        )
    return row


def _damage(e: ZooEntry, root: Path, man: dict) -> str | None:
    """Why a built entry is not whole (its files no longer add up to the size its manifest
    recorded: truncated or removed weights), or None. Stats every file; reads none."""
    have = _dir_size(root) - (root / "manifest.json").stat().st_size
    if man.get("size_bytes") is None or have == man["size_bytes"]:
        return None
    return (
        f"damaged ({have} of {man['size_bytes']} bytes; "
        f"`coupling-book zoo prepare {e.name} --force` rebuilds it)"
    )


def _fmt_metrics(m: dict) -> str:
    parts = []
    for k in ("val_loss", "unigram_entropy", "val_acc", "test_acc", "n_params", "n_members"):
        v = m.get(k)
        if isinstance(v, float):
            parts.append(f"{k}={v:.3f}" if k != "n_params" else f"{k}={v:,.0f}")
        elif v is not None:
            parts.append(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}")
    for k in ("val_loss_range", "test_acc_range"):
        if k in m:
            parts.append(f"{k}=[{m[k][0]:.3f}, {m[k][1]:.3f}]")
    return ", ".join(parts)


# --------------------------------------------------------------------------- many at once
# Rough single-thread throughputs on a 2-core CPU (measured: pythia-tiny 144 CPU-s; vit-mnist at batch
# 256, 116 CPU-s), used only to order builds longest first; a wrong guess costs some idle time at the
# end, never a wrong result.
_LM_FLOPS_PER_S = 3.3e10
_VIT_FLOPS_PER_S = 3.5e10
_PRETRAINED_SECONDS = {"gguf": 40.0, "copy": 5.0}

Task = tuple[str, str, str | None]  # ("entry", name, None) or ("member", family, run)


def estimated_seconds(kind: str, spec) -> float:
    """A rough build time for one training run (6·params·tokens-style count over a throughput)."""
    if kind.startswith("lm"):
        tokens = spec.steps * spec.batch_size * spec.seq_len
        per_token = 12 * spec.n_layers * spec.d_model**2 + 2 * spec.d_model * spec.vocab_size
        return 6 * tokens * per_token / _LM_FLOPS_PER_S
    patches = (28 // spec.patch_size) ** 2 + 1
    return (
        6 * spec.steps * spec.batch_size * patches * 12 * spec.n_layers * spec.d_model**2 / _VIT_FLOPS_PER_S
    )


def _quiet_worker() -> None:
    """Worker start: no progress bars, whose output would interleave with the other workers'."""
    os.environ.update(TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")


def _build_task(task: Task) -> tuple[str, float]:
    """Run one build task in a worker process: ("entry", name, None) or ("member", family, run)."""
    what, name, run = task
    t0 = time.perf_counter()
    if what == "member":
        _train_member(name, run)
    else:
        prepare(name, progress=False)
    return (f"{name}/{run}" if run else name), time.perf_counter() - t0


def _tasks_of(entry: ZooEntry) -> list[tuple[float, Task]]:
    """The builds an entry that is not ready still needs, each with its estimated seconds."""
    if entry.is_family:
        root = entry_dir(entry)
        return [
            (estimated_seconds(entry.kind, spec), ("member", entry.name, run))
            for run, spec in entry.specs().items()
            if not (root / run / "member.json").exists()
        ]
    if entry.source is not None:
        return [(_PRETRAINED_SECONDS["gguf" if entry.source.gguf else "copy"], ("entry", entry.name, None))]
    return [(estimated_seconds(entry.kind, entry.specs()), ("entry", entry.name, None))]


def _plan(names) -> tuple[dict[str, str], list[tuple[float, Task]], list[str]]:
    """``(status, tasks, families)``: each entry's status ("ready", or why it cannot be built), the
    builds still missing, and the families whose table and manifest are written at the end."""
    status: dict[str, str] = {}
    tasks: list[tuple[float, Task]] = []
    families: list[str] = []
    for name in dict.fromkeys(str(n) for n in names):
        entry, _ = _split(name)
        if entry.name in status:
            continue
        try:
            _check_opt_in(entry, None)
            entry.key()  # raises if a package with weights is not installed
        except ZooError as exc:
            status[entry.name] = str(exc)
            continue
        status[entry.name] = "ready"
        if is_ready(entry.name):
            continue
        if entry.is_family:
            families.append(entry.name)
        tasks += _tasks_of(entry)
    return status, tasks, families


def _run_here(tasks: list[tuple[float, Task]], echo) -> dict[str, str]:
    """Run the tasks one after the other in this process; returns ``{name: error}`` of the failed."""
    failed: dict[str, str] = {}
    for _, task in tasks:
        try:
            label, secs = _build_task(task)
            echo(f"  {label}: built in {secs:.0f} s")
        except Exception as exc:  # noqa: BLE001 - reported per entry, the others go on
            failed[task[1]] = f"{type(exc).__name__}: {exc}"
    return failed


def _run_in_workers(tasks: list[tuple[float, Task]], jobs: int, echo) -> dict[str, str]:
    """Run the tasks in up to ``jobs`` spawned processes; returns ``{name: error}`` of the failed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    failed: dict[str, str] = {}
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by each spawned worker's torch
    try:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(tasks)),
            mp_context=mp.get_context("spawn"),
            initializer=_quiet_worker,
        ) as pool:
            futures = {pool.submit(_build_task, task): task for _, task in tasks}
            for fut in as_completed(futures):
                task = futures[fut]
                try:
                    label, secs = fut.result()
                    echo(f"  {label}: built in {secs:.0f} s")
                except Exception as exc:  # noqa: BLE001
                    failed[task[1]] = f"{type(exc).__name__}: {exc}"
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return failed


def prepare_many(names, *, jobs: int = 1, echo=print) -> dict[str, str]:
    """Prepare several entries, with up to ``jobs`` builds at once; returns ``{name: "ready" | error}``.

    Family members are separate builds, so a family is spread over the workers; everything is
    ordered longest first (:func:`estimated_seconds`). Each build runs in its own process with one
    torch thread (the runs are single-threaded by design), is written atomically and locked, so
    an interrupted call resumes and a concurrent ``prepare`` of the same entry waits instead of
    building it twice. Opt-in entries whose terms are not accepted are skipped (reported, not built).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    status, tasks, families = _plan(names)
    tasks.sort(key=lambda t: -t[0])
    if tasks:
        echo(
            f"building {len(tasks)} embedded model(s) / run(s) with {min(jobs, len(tasks))} worker(s), "
            f"about {sum(t[0] for t in tasks) / 60 / min(jobs, len(tasks)):.0f} min ..."
        )
    if jobs == 1 or len(tasks) <= 1:
        failed = _run_here(tasks, echo)
    else:
        failed = _run_in_workers(tasks, jobs, echo)
    for fam in families:  # the family table and manifest, once all members exist
        if fam not in failed:
            try:
                prepare(fam, progress=False)
            except Exception as exc:  # noqa: BLE001
                failed[fam] = f"{type(exc).__name__}: {exc}"
    for name, err in failed.items():
        status[name] = err
        echo(f"  {name}: FAILED: {err}")
    return status
