"""Running the measurement loop: :func:`run` one job, :func:`collect` many, into a :class:`Collected`.

See :mod:`coupling_utils.measurement.jobs` for the jobs themselves. A job whose measurements
(and extra tables) are stored, made by today's code, loads no model at all; between jobs the
model is released (deleted, ``gc.collect()``, ``torch.cuda.empty_cache()`` when CUDA is there),
unless the next job loads the same reference with the same arguments: then it is kept for it;
a job that fails is recorded with its reason and the others still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from coupling_utils.files import (
    atomic_write_parquet,
    atomic_write_text,
    file_lock,
    read_json,
    read_parquet,
    set_aside,
)
from coupling_utils.measurement.core import measure_with
from coupling_utils.measurement.jobs import Job
from coupling_utils.measurement.options import Options
from coupling_utils.measurement.store import Store
from coupling_utils.measurement.tables import Measurement, columnwise
from coupling_utils.provenance import code_fingerprint

__all__ = ["Result", "Collected", "run", "collect", "release_memory"]


def release_memory() -> None:
    """Free what a released model held: Python's cycles, and CUDA's cached blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _earlier_objects_frozen() -> Iterator[None]:
    """Between the jobs of one :func:`collect`, :func:`release_memory`'s full collection looks only
    at objects made since it began (the models and tables of its jobs), not at the whole heap a
    notebook kernel holds (torch, transformers, pandas, plotting: about half a second a job).
    Left alone where the host froze the heap itself (``gc.freeze``), which it then unfreezes."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()  # what is garbage now is freed now, not kept for the whole loop
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass
class Result:
    """What one job gave: its measurements by part, its extra tables, and how it went."""

    job: Job
    measurements: dict[str, Measurement] = field(default_factory=dict)
    extra: dict[str, pd.DataFrame] = field(default_factory=dict)
    loaded: bool = False  # whether the model was loaded (False: everything was read from the store)
    seconds: float = 0.0
    error: str | None = None  # the exception's type, for a job that failed
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def stale(self) -> bool:
        """Whether some of its numbers were made by other code (reused with reuse_stale=True)."""
        return any(m.stale for m in self.measurements.values())

    @property
    def model(self) -> dict:
        """The measured model's facts (name, n_layers, d_model, n_params, ...)."""
        m = next(iter(self.measurements.values()), None)
        return dict(m.provenance.get("model", {})) if m is not None else {}

    def under(self, last_block: str) -> Result:
        """This result with every measurement's last block under ``last_block`` (``Measurement.under``:
        the job's own map, or the second map it measured beside it with ``last_block_also``)."""
        return dataclasses.replace(
            self, measurements={part: m.under(last_block) for part, m in self.measurements.items()}
        )

    def labelled(self, table: str, part: str | None = None) -> pd.DataFrame:
        """Table ``table`` of measurement ``part`` (or an extra table, part None) with the job's
        labels as the first columns."""
        df = self.extra[table] if part is None else getattr(self.measurements[part], table)
        labels = dict(self.job.labels)
        df = df.assign(**labels)
        return df[[*labels, *[c for c in df.columns if c not in labels]]]


@dataclass
class Collected:
    """The results of :func:`collect`, in job order (failed and missing jobs included)."""

    results: list[Result]

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.ok]

    @property
    def missing(self) -> list[Job]:
        """Jobs without a result (failed, or not measured with ``compute=False``)."""
        return [r.job for r in self.results if not r.ok]

    @property
    def stale(self) -> list[Job]:
        return [r.job for r in self.results if r.ok and r.stale]

    @property
    def failures(self) -> pd.DataFrame:
        """One row per missing job: its labels, ``job`` (readable), ``key``, ``error``, ``message``."""
        rows = [
            {
                **r.job.labels,
                "job": r.job.describe(),
                "key": r.job.key,
                "error": r.error,
                "message": r.message,
            }
            for r in self.results
            if not r.ok
        ]
        return pd.DataFrame(rows, columns=None if rows else ["job", "key", "error", "message"])

    def under(self, last_block: str) -> Collected:
        """These results with the last block under ``last_block`` (:meth:`Result.under`: the jobs'
        own map, or the second one their ``last_block_also`` measured)."""
        return Collected([r.under(last_block) if r.ok else r for r in self.results])

    def table(self, table: str, part: str | None = "measure") -> pd.DataFrame:
        """A table of every successful job, labelled and concatenated (``part=None``: an extra table)."""
        frames = [r.labelled(table, part) for r in self.ok]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def report(self) -> str:
        """Lines a notebook can print: what is missing and why, and what is stale."""
        lines = [f"missing {r.job.describe()}: {r.error}: {r.message}" for r in self.results if not r.ok]
        lines += [f"stale (made by other code, reused) {job.describe()}" for job in self.stale]
        return "\n".join(lines)


def _stored(job: Job, reuse_stale: bool) -> tuple[dict[str, Measurement], dict[str, pd.DataFrame] | None]:
    """The job's finished measurements (by part) and its extra tables ({} if it has none;
    None if they are not stored)."""
    if not job.storable:
        return {}, None if job.extra is not None else {}
    fingerprint = code_fingerprint()["fingerprint"]
    found = {}
    for part in job.settings:
        m = Store(job.out(part)).finished(fingerprint, reuse_stale=reuse_stale)
        if m is not None:
            found[part] = m
    extra = _stored_extra(job, reuse_stale) if job.extra is not None else {}
    return found, extra


def _stored_extra(job: Job, reuse_stale: bool) -> dict[str, pd.DataFrame] | None:
    """The job's stored extra tables (None: not stored, stored by other code, or damaged since: a
    marker or table that cannot be read is set aside, said, and the tables computed again, as a
    measurement's are)."""
    out = job.extra_out()
    done = read_json(out / "done.json", "stored extra tables' marker")
    if done is None:
        return None
    try:
        made_by = done["code"]["fingerprint"]
        names = done["tables"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"its tables are {names!r}, not a list of names")
        if made_by != job.extra.fingerprint()["fingerprint"] and not reuse_stale:
            return None
        missing = [f"{name}.parquet" for name in names if not (out / f"{name}.parquet").is_file()]
        if missing:
            raise ValueError(f"{', '.join(missing)} missing")
        return {name: columnwise(read_parquet(out / f"{name}.parquet")) for name in names}
    except (KeyError, TypeError, OSError, ValueError) as exc:
        why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        set_aside(out / "done.json", f"the {job.extra.name} tables stored in {out} cannot be read ({why})")
        return None


def _compute_extra(job: Job, model, prompts) -> dict[str, pd.DataFrame]:
    tables = job.extra.fn(model, prompts, **job.extra.options)
    out = job.extra_out()
    if out is None:
        return {name: columnwise(df) for name, df in tables.items()}
    with file_lock(out / ".lock", f"{job.extra.name} into {out}"):
        for name, df in tables.items():
            atomic_write_parquet(df, out / f"{name}.parquet")
        done = {"tables": sorted(tables), "code": job.extra.fingerprint(), "options": job.extra.spec()}
        atomic_write_text(out / "done.json", json.dumps(done, indent=2, default=str))  # after the tables
    return {name: columnwise(read_parquet(out / f"{name}.parquet")) for name in tables}


def _failure_path(job: Job) -> Path | None:
    return None if job.folder is None else job.folder / f"failed-{job.key}.json"


class _Held:
    """A model loaded by one job and kept for the next, when that job loads the same reference
    with the same arguments (f05's variant job measures the trained model again): one load
    instead of two. ``next`` is the next job's :func:`_load_key`; anything else is dropped."""

    def __init__(self):
        self.key: str | None = None
        self.model = None
        self.next: str | None = None

    def take(self, key: str | None):
        """The kept model if it is ``key``'s (then no longer kept); else None, and any kept model
        released before the caller loads its own."""
        if key is None or key != self.key:
            self.drop()
            return None
        model, self.key, self.model = self.model, None, None
        return model

    def keep(self, key: str | None, model) -> bool:
        """Keep ``model`` if the next job loads it (``key``); whether it was kept."""
        if key is None or key != self.next:
            return False
        self.key, self.model = key, model
        return True

    def drop(self) -> None:
        if self.model is not None:
            self.key, self.model = None, None
            release_memory()


def _load_key(job: Job | None) -> str | None:
    """What a job loads (its reference and ``load_model`` arguments), or None for a model given
    already loaded (nothing to keep)."""
    if job is None or not isinstance(job.model, str):
        return None
    return json.dumps([job.model, dict(job.load_kwargs)], sort_keys=True, default=repr)


def run(job: Job, options: Options | None = None, held: _Held | None = None) -> Result:
    """Do one job: read what is stored; load the model only for what is missing; release it.

    ``options.load(model, **job.load_kwargs)`` loads a reference (default: ``load_model``);
    ``options.reuse_stale`` reuses results made by other code. A job that raises leaves a
    ``failed-<key>.json`` record (type and message) in its folder, for :func:`collect` with
    ``compute=False``; a later success removes it. ``held`` (from :func:`collect`): a model the
    previous job kept for this one, and where to keep this one's for the next.
    """
    options = options or Options()
    load, reuse_stale = options.load, options.reuse_stale
    t0 = time.perf_counter()
    measurements, extra = _stored(job, reuse_stale)
    if len(measurements) == len(job.settings) and extra is not None:
        return Result(job, measurements, extra, loaded=False, seconds=time.perf_counter() - t0)
    key = _load_key(job)
    try:
        lm = held.take(key) if held is not None else None
        if lm is None:
            lm = _load(job, load)
        done = False
        try:
            if job.check is not None:
                job.check(lm)
            prompts = job.prompts if job.prepare is None else job.prepare(lm, job.prompts)
            for part, settings in job.settings.items():
                if part not in measurements:
                    out = job.out(part)
                    measurements[part] = measure_with(lm, prompts, settings, out=out, options=options)
            if extra is None:
                extra = _compute_extra(job, lm, prompts)
            done = True
        finally:
            kept = done and held is not None and held.keep(key, lm)
            del lm  # the model goes before the next job's arrives (unless that job is its own)
            if not kept:
                release_memory()
    except Exception as exc:
        _record_failure(job, exc)
        raise
    failed = _failure_path(job)
    if failed is not None:
        failed.unlink(missing_ok=True)
    return Result(job, measurements, extra, loaded=True, seconds=time.perf_counter() - t0)


def _load(job: Job, load):
    if not isinstance(job.model, str):
        return job.model  # already loaded
    if load is None:
        from coupling_utils.models.loading import load_model as load
    return load(job.model, **job.load_kwargs)


def _record_failure(job: Job, exc: BaseException) -> None:
    """Leave the reason in the job's folder (best effort: the job's own error is what raises)."""
    path = _failure_path(job)
    if path is not None:
        record = {
            "job": job.describe(),
            "error": type(exc).__name__,
            "message": str(exc),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        }
        with contextlib.suppress(OSError):
            atomic_write_text(path, json.dumps(record, indent=2))


def collect(
    jobs: Sequence[Job],
    options: Options | None = None,
    *,
    desc: str = "jobs",
    callback: Callable[[Result], None] | None = None,
) -> Collected:
    """Run every job (see :func:`run`) and gather the results, in job order.

    ``options`` (:class:`~coupling_utils.measurement.options.Options`): ``on_error="record"``, a
    job that raises (a gated repo, out of memory, a missing model) is recorded with its exception
    type and message (``Collected.failures``, ``report()``) and the others still run; ``"raise"``,
    the first failure propagates. ``compute=False``: nothing is loaded or measured; jobs not
    stored are missing (with a stored failure's reason, if any). ``reuse_stale``: reuse
    measurements made by other code (marked stale) instead of measuring again. ``progress``: a
    bar named ``desc``. ``callback(result)`` runs after each job.
    """
    options = options or Options()
    bar = None
    if options.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc=desc, unit="job")
    results = []
    held = _Held()  # a model kept from one job for the next when both load the same
    with _earlier_objects_frozen():
        for i, job in enumerate(jobs):
            held.next = _load_key(jobs[i + 1]) if i + 1 < len(jobs) else None
            result = _one(job, options, held)
            if held.key is not None and held.key != held.next:
                held.drop()
            results.append(result)
            if callback is not None:
                callback(result)
            if bar is not None:
                bar.update(1)
        held.drop()
    if bar is not None:
        bar.close()
    return Collected(results)


def _one(job: Job, options: Options, held: _Held | None = None) -> Result:
    if not options.compute:
        measurements, extra = _stored(job, options.reuse_stale)
        if len(measurements) == len(job.settings) and extra is not None:
            return Result(job, measurements, extra)
        path = _failure_path(job)
        record = None if path is None else read_json(path, "failure record")
        if record is not None:
            return Result(job, error=record["error"], message=record["message"])
        return Result(job, error="NotMeasured", message="not measured yet (collect with compute=True)")
    try:
        return run(job, options, held)
    except Exception as exc:
        if options.on_error == "raise":
            raise
        result = Result(job, error=type(exc).__name__, message=str(exc))
    release_memory()  # the exception's frames, and the tensors they held, are gone now
    return result
