"""Sweeps: the measurements a notebook needs, run as cluster jobs that fill the cache it reads.

A notebook at a profile (plus ``-p`` overrides) measures a list of models, revisions and twins.
:func:`notebook_jobs` reads that list, the :class:`~coupling_utils.measurement.Job` objects,
from the notebook's chapter module (``coupling_utils.chapters``): ``jobs(params)`` of its
checked parameters, the plan the notebook itself measures, so the sweep and the notebook cannot
disagree (a test runs each notebook after its sweep with model loading forbidden). Nothing here
is specific to a chapter. :func:`plan_sweep` groups the jobs
into :class:`Task` objects, one per (model, revision), so that one cluster job loads or downloads
a checkpoint once (a random-init twin travels with its trained model).

:func:`~coupling_utils.pipeline.sweep_submit.submit` hands the tasks to ``submitit``: on SLURM
as job arrays, one per resource class (memory and time sized per model:
:mod:`~coupling_utils.pipeline.sweep_resources`; ``--partition``, ``--gpus-per-job``,
``--max-parallel`` as the jobs at once in all), on this machine with its local executor,
``max_parallel`` at a time (which also stops them on Ctrl-C); this module is what a sweep is,
and what a worker runs
(:func:`run_task`). Every job writes into the cache the notebook reads (``$COUPLING_CACHE``, which must be a
shared filesystem on a cluster). A resubmission runs only the tasks that are not done and not
running. The state of a sweep lives in ``$COUPLING_CACHE/sweeps/<notebook>-<profile>-<hash of
its values>/``, written when it is first submitted: ``plan.pkl`` (the tasks), ``sweep.json``
(what it is), ``submissions.json`` (which executor job runs which task, and whether Ctrl-C
stopped it) and one ``tasks/<task>.json`` per started task (host, process, SLURM job, start and
end, each job's outcome), from which :func:`~coupling_utils.pipeline.sweep_state.sweep_status`
tells each task's state (:data:`STATES`: done, running, pending, failed, interrupted, missing).
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import math
import os
import pickle
import re
import shlex
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coupling_utils.analysis.prose_list import listed
from coupling_utils.files import (
    CacheError,
    atomic_path,
    atomic_write_text,
    cache_dir,
    file_lock,
    read_json,
    set_aside,
)
from coupling_utils.measurement.jobs import Job
from coupling_utils.provenance import stable_hash

__all__ = [
    "SweepError", "SweepBusy", "Task", "Sweep", "Resources", "EXECUTORS", "STATES",
    "FORWARDED_ENV", "notebook_jobs", "plan_sweep", "record_sweep", "load_sweep", "group_tasks",
    "planned_params", "planned_values", "run_task", "recorded_sweeps", "parse_time",
]  # fmt: skip

EXECUTORS = ("local", "slurm")
STATES = ("done", "running", "pending", "failed", "interrupted", "missing")
SUBMISSIONS = "submissions.json"  # in a sweep's folder: which executor job ran which task (read_submissions)
# environment a worker needs to find the same cache, hub cache and data (never tokens: SLURM passes
# the submitting environment on by default, HF_TOKEN included, without writing it into a script)
FORWARDED_ENV = (
    "COUPLING_CACHE", "COUPLING_BOOK_ROOT", "COUPLING_DATA", "HF_HOME", "HF_HUB_CACHE",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
)  # fmt: skip


class SweepError(ValueError):
    """A sweep cannot be planned or submitted (bad notebook, executor or option)."""


class SweepBusy(RuntimeError):
    """Another ``coupling-book sweep`` is running or submitting this sweep right now."""


# --------------------------------------------------------------------------- the chapters' plans
def _notebook(name: str) -> Path:
    from coupling_utils.pipeline.execution import find_notebooks

    found = find_notebooks([name])
    if len(found) != 1:
        raise SweepError(f"{name!r} names {len(found)} notebooks; name one, e.g. f02")
    return found[0]


def planned_params(notebook: str, profile: str, overrides: Mapping[str, Any] | None = None):
    """What a run of ``notebook`` at ``profile`` with ``overrides`` uses, as its chapter's checked
    ``Params`` (defaults, profile, overrides, as ``coupling-book run`` checks them before a kernel)."""
    from coupling_utils.chapters import chapter
    from coupling_utils.pipeline.execution import _planned_values

    nb = _notebook(notebook)
    return chapter(nb.stem).Params.checked(_planned_values(nb, profile, overrides))


def planned_values(notebook: str, profile: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`planned_params` as a plain dict."""
    return planned_params(notebook, profile, overrides).values()


def notebook_jobs(notebook: str, profile: str, overrides: Mapping[str, Any] | None = None) -> list[Job]:
    """The measurement jobs ``notebook`` runs at ``profile`` with ``overrides``: its chapter's
    ``jobs(params)`` (see the module doc)."""
    from coupling_utils.chapters import chapter

    nb = _notebook(notebook)
    module = chapter(nb.stem)
    return module.jobs(planned_params(nb.stem, profile, overrides))


# --------------------------------------------------------------------------- tasks and the sweep
@dataclass(frozen=True)
class Task:
    """One cluster job: the jobs of one (model, revision), run one after the other in one process."""

    id: str  # stable: a hash of its jobs' keys
    model: str
    revision: str | None
    jobs: tuple[Job, ...]

    @property
    def name(self) -> str:
        return f"{self.model}@{self.revision or 'main'}"


def group_tasks(jobs: Sequence[Job]) -> list[Task]:
    """One :class:`Task` per (model, revision), in the order the jobs first name them."""
    groups: dict[tuple[str, str | None], list[Job]] = {}
    for job in jobs:
        if not job.storable:
            raise SweepError(
                f"job {job.describe()} stores nothing (a loaded model or no cache folder): a sweep needs "
                "every job to write into the cache"
            )
        groups.setdefault((job.model, job.revision), []).append(job)
    tasks = []
    for (model, revision), group in groups.items():
        tid = stable_hash(sorted(j.key for j in group), 12)
        tasks.append(Task(tid, model, revision, tuple(group)))
    return tasks


@dataclass
class Sweep:
    """A notebook's planned sweep: its tasks and the folder that records their state."""

    notebook: str
    profile: str
    overrides: dict[str, Any]
    tasks: list[Task]
    folder: Path
    info: dict[str, Any] | None = None  # what record() writes into sweep.json

    @property
    def name(self) -> str:
        return self.folder.name

    def record(self) -> Sweep:
        """Write ``plan.pkl`` and ``sweep.json`` (what ``--status`` lists); :func:`submit` does so
        just before it submits: what is only shown, or refused, is not recorded."""
        if self.info is None:  # made by hand, not by record_sweep or load_sweep: nothing to write
            return self
        try:
            (self.folder / "tasks").mkdir(parents=True, exist_ok=True)
            with file_lock(self.folder / ".lock", f"sweep {self.name}"):
                with atomic_path(self.folder / "plan.pkl") as tmp:
                    tmp.write_bytes(pickle.dumps(list(self.tasks)))
                atomic_write_text(self.folder / "sweep.json", json.dumps(self.info, indent=2, default=str))
        except OSError as exc:  # a read-only cache (or --out): say where, and the fix
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise CacheError(
                f"the sweep's record {self.folder} cannot be written ({exc.strerror}), so nothing can be "
                f"submitted from this cache; make {self.folder.parent} writable (chmod -R u+w) or point "
                "$COUPLING_CACHE (for measure: --out) at a folder you can write (--status and --dry-run "
                "only read)"
            ) from exc
        return self

    def task(self, tid: str) -> Task:
        return next(t for t in self.tasks if t.id == tid)


def plan_sweep(
    notebook: str,
    profile: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    root: str | Path | None = None,
) -> Sweep:
    """Plan the sweep of ``notebook`` at ``profile``: its tasks and state folder (recorded when submitted).

    ``root``: where sweep folders live (default ``$COUPLING_CACHE/sweeps``). Recording the plan
    (``plan.pkl``, ``sweep.json``) lets ``sweep_status`` report on it later without the notebook.
    """
    nb = _notebook(notebook)
    overrides = dict(overrides or {})
    values = planned_values(nb.stem, profile, overrides)
    tasks = group_tasks(notebook_jobs(nb.stem, profile, overrides))
    folder = Path(root) if root is not None else cache_dir("sweeps")
    info = {"notebook": nb.stem, "profile": profile, "overrides": overrides, "values": values}
    return record_sweep(folder / f"{nb.stem}-{profile}-{stable_hash(values, 8)}", tasks, info, write=False)


def record_sweep(
    folder: str | Path, tasks: Sequence[Task], info: Mapping[str, Any], *, write: bool = True
) -> Sweep:
    """Record ``tasks`` as a sweep in ``folder`` (``plan.pkl`` and ``sweep.json`` with ``info``:
    ``notebook``, ``profile``, ``overrides`` and anything else worth keeping); ``write=False``:
    not yet (:func:`submit` records a sweep before it submits, so one only shown is not)."""
    info = {**info, "cache": str(cache_dir())}
    info["tasks"] = [{"id": t.id, "name": t.name, "jobs": [j.describe() for j in t.jobs]} for t in tasks]
    overrides = dict(info.get("overrides") or {})
    sweep = Sweep(info["notebook"], info["profile"], overrides, list(tasks), Path(folder), info)
    return sweep.record() if write else sweep


def load_sweep(folder: str | Path) -> Sweep:
    """A recorded sweep (its ``plan.pkl`` and ``sweep.json``)."""
    folder = Path(folder)
    info = json.loads((folder / "sweep.json").read_text())
    tasks = pickle.loads((folder / "plan.pkl").read_bytes())
    return Sweep(info["notebook"], info["profile"], info.get("overrides", {}), tasks, folder, info)


def recorded_sweeps(root: str | Path | None = None) -> list[Path]:
    """The sweep folders under ``root`` (default ``$COUPLING_CACHE/sweeps``), oldest first."""
    root = Path(root) if root is not None else cache_dir("sweeps")
    found = list(root.glob("*/sweep.json")) if root.exists() else []
    return [p.parent for p in sorted(found, key=lambda p: p.stat().st_mtime)]


# --------------------------------------------------------------------------- the worker
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _slurm_id() -> str | None:
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and index:
        return f"{array}_{index}"
    return os.environ.get("SLURM_JOB_ID")


def listen_to_ctrl_c() -> None:
    """In a task (:func:`run_task`) whose worker started ignoring
    SIGINT (a local one): stop on it again, once (a second SIGINT, the sweep's after the
    terminal's, does not cut the unwinding short)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt_once)


def _interrupt_once(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_task(task: Task, folder: str) -> dict:
    """Run one task in this process (what a cluster job executes): each job with
    :func:`coupling_utils.measurement.loop.run`, which reads what is stored, measures what is
    missing and leaves a failure record for a job that raises; the others still run. The task's
    marker ``tasks/<id>.json`` says who runs it, and when it ended, with each job's outcome."""
    from coupling_utils.measurement.loop import run

    listen_to_ctrl_c()  # a local worker's task, started deaf to Ctrl-C, stops on it again
    marker = Path(folder) / "tasks" / f"{task.id}.json"
    info = {
        "task": task.name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": _slurm_id(),
        "started": _now(),
        "finished": None,
        "jobs": [],
    }
    atomic_write_text(marker, json.dumps(info, indent=2))
    for job in task.jobs:
        t0 = time.perf_counter()
        timed_out = None
        try:
            result = run(job)
            outcome = {"ok": True, "loaded": result.loaded}
        except Exception as exc:  # recorded by run() in the job's folder too
            outcome = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            if type(exc).__name__ == "UncompletedJobError":  # submitit: SLURM's time limit is near
                timed_out = exc
        info["jobs"].append({"job": job.describe(), "seconds": round(time.perf_counter() - t0, 2), **outcome})
        atomic_write_text(marker, json.dumps(info, indent=2))
        if timed_out is not None:  # start no other job: the worker is about to be killed
            raise timed_out
    info["finished"] = _now()
    atomic_write_text(marker, json.dumps(info, indent=2))
    return info


def _record_submission(
    sweep: Sweep, task: Task, executor: str, job_id: str | None, by: str = "Ctrl-C"
) -> None:
    """Record that ``task`` was submitted as ``job_id``; ``job_id=None``: that its last
    submission was stopped on ``by`` (Ctrl-C or SIGTERM: :mod:`.sweep_submit`)."""
    with file_lock(sweep.folder / ".lock", f"sweep {sweep.name}"):
        subs = read_submissions(sweep.folder)
        entry = {"executor": executor, "job_id": str(job_id), "submitted": _now()}
        if executor == "local" and job_id is not None:
            entry.update(host=socket.gethostname(), pid=int(job_id))
        if job_id is None:
            subs.get(task.id, [{}])[-1].update(stopped=_now(), by=by)
        else:
            subs.setdefault(task.id, []).append(entry)
        atomic_write_text(sweep.folder / SUBMISSIONS, json.dumps(subs, indent=2))


def read_submissions(folder: Path) -> dict[str, list[dict]]:
    """The sweep's record of submissions (``submissions.json`` in the sweep's ``folder``): each
    task's submissions, oldest first. A damaged record (not JSON, or not that shape) is set aside
    as :func:`~coupling_utils.files.read_json` does, and read as none: the tasks' states then come
    from their stored measurements and markers."""
    path = folder / SUBMISSIONS
    subs = read_json(path, "sweep's record of submissions")
    if subs is None:
        return {}
    entry = {"executor", "job_id", "submitted"}
    if not all(
        isinstance(t, list) and t and all(isinstance(e, dict) and entry <= e.keys() for e in t)
        for t in subs.values()
    ):
        set_aside(
            path, f"the sweep's record of submissions {path} is corrupt (not a list of submissions per task)"
        )
        return {}
    return subs


# --------------------------------------------------------------------------- submitting
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_time(text: str | int | None) -> int | None:
    """A SLURM time limit in minutes: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` or ``D-H:M:S``
    (as ``sbatch --time`` reads them; seconds round up)."""
    if text is None:
        return None
    if isinstance(text, int) and not isinstance(text, bool):
        minutes = text
    else:
        m = _TIME.fullmatch(str(text).strip())
        if m is None:
            raise SweepError(f"time {text!r}: use minutes, HH:MM:SS or D-HH:MM (as sbatch --time reads them)")
        days, a, b, c = m.groups()
        if days is None:  # M | M:S | H:M:S
            h, mi, sec = (a, b, c) if c is not None else (0, a, b or 0)
        else:  # D-H | D-H:M | D-H:M:S
            h, mi, sec = a, b or 0, c or 0
        minutes = int(days or 0) * 1440 + int(h) * 60 + int(mi) + (int(sec) > 0)
    if minutes < 1:
        raise SweepError(f"time {text!r} is less than a minute")
    return minutes


def _setup_lines() -> list[str]:
    """Shell lines that give the worker this process's cache and hub settings (absolute paths)."""
    env = {"COUPLING_CACHE": str(cache_dir())}
    for key in FORWARDED_ENV:
        if key in os.environ and key not in env:
            env[key] = os.environ[key]
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


@dataclass(frozen=True)
class Resources:
    """Where and with what a sweep's tasks run: the ``executor`` ("local" or "slurm") and, for
    SLURM, ``partition``, ``account``, ``gpus_per_job``, ``cpus_per_job``, ``mem_gb``,
    ``time_limit`` (as ``sbatch --time`` reads it) and ``max_parallel`` (the array's ``%N``; for
    the local executor, how many tasks run at once, default 1). Checked when made."""

    executor: str = "local"
    partition: str | None = None
    account: str | None = None
    gpus_per_job: int | None = None
    cpus_per_job: int | None = None
    mem_gb: float | None = None
    time_limit: str | int | None = None
    max_parallel: int | None = None

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise SweepError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        counts = {  # option as typed: (value, what it counts, the least it may be)
            "--max-parallel": (self.max_parallel, "jobs at once", 1),
            "--gpus-per-job": (self.gpus_per_job, "GPUs each job gets", 0),
            "--cpus-per-job": (self.cpus_per_job, "CPUs each job gets", 1),
            "--mem-gb": (self.mem_gb, "GB of memory each job gets", 1),
        }
        for option, (v, what, least) in counts.items():
            if v is not None and (isinstance(v, bool) or v < least):
                raise SweepError(f"{option} ({what}) must be {least} or more, got {v!r}")
        slurm = ("--partition", "--account", "--cpus-per-job", "--mem-gb")
        values = (self.partition, self.account, self.cpus_per_job, self.mem_gb)
        given = [option for option, v in zip(slurm, values) if v is not None]
        if self.executor == "local" and given:
            many = len(given) > 1
            raise SweepError(
                f"{listed(given)} {'are SLURM options' if many else 'is a SLURM option'}, which "
                f"--executor local does not use; drop {'them' if many else 'it'}, or use --executor slurm"
            )
        parse_time(self.time_limit)  # a bad time fails here, before anything is submitted

    def check_here(self, *, dry_run: bool = False) -> None:
        """Refuse what this machine cannot run, before anything is created or submitted: SLURM
        (not a dry run) needs ``sbatch`` and ``srun`` (which submitit checks for) on the PATH."""
        import shutil

        absent = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
        if self.executor == "slurm" and not dry_run and absent:
            raise SweepError(
                f"--executor slurm submits with SLURM's sbatch and srun, and this machine has no "
                f"{absent[0]} on its PATH{' (nor srun)' if absent[1:] else ''}; run the command on the "
                "cluster's login node (where SLURM is a module: `module load slurm` first), or use "
                "--executor local (or, for measure, none); --dry-run shows the batch script here"
            )

    @property
    def minutes(self) -> int | None:
        return parse_time(self.time_limit)

    def slurm_parameters(self, sweep: Sweep, n_tasks: int) -> dict[str, Any]:
        """submitit's SlurmExecutor parameters for ``n_tasks`` tasks of ``sweep``."""
        params: dict[str, Any] = {
            "job_name": f"coupling-{sweep.notebook[:3]}-{sweep.profile}",
            "time": self.minutes or 60,
            "setup": _setup_lines(),
            "array_parallelism": self.max_parallel or n_tasks,
        }
        optional = {
            "partition": self.partition,
            "gpus_per_node": int(self.gpus_per_job) if self.gpus_per_job else None,
            "cpus_per_task": int(self.cpus_per_job) if self.cpus_per_job else None,
            "mem": f"{math.ceil(self.mem_gb * 1024)}M" if self.mem_gb else None,  # 1.5 GB: 1536M
            "account": self.account,
        }
        params.update({k: v for k, v in optional.items() if v})
        return params
