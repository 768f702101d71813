"""What became of a sweep's tasks: each one's state and why, read from the records a sweep
keeps (:mod:`coupling_utils.pipeline.sweep`: ``submissions.json``, ``tasks/<task>.json``, the
workers' logs and results) and from the cache, without changing any of them.

:func:`sweep_status` gives every task one of :data:`~coupling_utils.pipeline.sweep.STATES`:

- ``done``: every measurement is stored (made by today's code);
- ``running``: its worker process is alive (checked on this host, or asked of SLURM);
- ``pending``: submitted, not started yet (or SLURM cannot say yet: sacct lists a new job late);
- ``failed``: a job raised; the reason is the stored failure record (exception and message);
- ``interrupted``: the worker stopped without a result or a failure record (killed, out of
  memory, out of time, preempted, stopped on Ctrl-C); the reason says what is known (SLURM's
  state, the log);
- ``missing``: never submitted (or measured by other code).
"""

from __future__ import annotations

import os
import pickle
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coupling_utils.analysis.prose_list import listed
from coupling_utils.files import read_json
from coupling_utils.pipeline.sweep import STATES, Sweep, Task, read_submissions

__all__ = ["TaskState", "SLURM_ALIVE", "task_state", "sweep_status", "summary_line", "live_slurm_arrays"]


@dataclass
class TaskState:
    """One task's state (see :data:`STATES`) and why."""

    task: Task
    state: str
    reason: str = ""
    log: str | None = None

    def line(self) -> str:
        tail = f"  {self.reason}" if self.reason else ""
        return f"{self.state:<12} {self.task.name}{tail}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _slurm_state(folder: Path, job_id: str) -> str:
    try:
        import submitit

        return str(submitit.SlurmJob(folder=folder, job_id=job_id).state)
    except Exception as exc:  # no sacct here, or SLURM does not answer
        return f"UNKNOWN ({type(exc).__name__}: {exc})"


SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")


def _alive(record: Mapping[str, Any], folder: Path) -> tuple[bool | None, str]:
    """Whether the process a record names is alive (None: cannot tell from here), and what is known."""
    if record.get("executor") == "slurm" or record.get("slurm_job"):
        job_id = record.get("slurm_job") or record.get("job_id")
        state = _slurm_state(folder / "slurm", str(job_id))
        if state.startswith("UNKNOWN"):
            return None, f"SLURM job {job_id}: state {state}"
        return state.split()[0] in SLURM_ALIVE, f"SLURM job {job_id}: {state}"
    host, pid = record.get("host"), record.get("pid")
    if host != socket.gethostname():
        return None, f"process {pid} on {host} (another host: not checked)"
    return _pid_alive(int(pid)) and _runs_submitit(int(pid)), f"process {pid} on {host}"


def _runs_submitit(pid: int) -> bool:
    """Whether process ``pid`` is a sweep's worker (its command names submitit), not another one
    given the id since (ids are reused, soonest after a reboot); True where /proc cannot say."""
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


_PROGRESS = re.compile(r"\d+%\|")  # a progress bar's line (tqdm's "40%|####  | 2/5"): says nothing


def _log_tail(folder: Path, submission: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """The worker's stderr log (submitit's) and its last non-empty line that is not a progress bar."""
    if not submission:
        return None, ""
    logs = sorted((folder / submission["executor"]).glob(f"{submission['job_id']}_*_log.err"))
    if not logs:
        return None, ""
    text = logs[0].read_text(errors="replace").replace("\r", "\n")
    lines = [x for x in text.splitlines() if x.strip() and not _PROGRESS.search(x)]
    return str(logs[0]), (lines[-1].strip()[:200] if lines else "")


def _worker_error(folder: Path, submission: Mapping[str, Any]) -> str | None:
    """The last line of the error a worker ended on before its task ran (submitit's result
    pickle: an import error, a bad environment), or None (it succeeded, or left no result)."""
    path = folder / submission["executor"] / f"{submission['job_id']}_0_result.pkl"
    try:
        outcome, value = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - none, cut short, or not submitit's: nothing to say
        return None
    lines = [x.strip() for x in str(value).splitlines() if x.strip()]
    return (lines[-1][:300] if lines else "an error") if outcome == "error" else None


def task_state(sweep: Sweep, task: Task, submissions: Mapping[str, list] | None = None) -> TaskState:
    """The state of one task (see the module doc for the order in which states are decided)."""
    from coupling_utils.measurement import Options, collect

    try:
        done = collect(list(task.jobs), Options(compute=False))
    except Exception as exc:  # noqa: BLE001 - a damaged stored table: say so, list the other tasks
        why = f"a stored measurement of it cannot be read ({type(exc).__name__}: {exc})"
        return TaskState(task, "failed", f"{why}; remove that measurement's folder and submit again")
    if not done.missing:
        return TaskState(task, "done")
    if submissions is None:
        submissions = read_submissions(sweep.folder)
    tries = submissions.get(task.id, [])
    last = tries[-1] if tries else None
    marker = read_json(sweep.folder / "tasks" / f"{task.id}.json", "sweep task's record")
    log, tail = _log_tail(sweep.folder, last)
    if marker is not None and marker.get("finished") is None:
        alive, what = _alive(marker, sweep.folder)
        if alive or alive is None:
            return TaskState(
                task, "running", what if alive is None else f"{what} since {marker['started']}", log
            )
    ran = marker is not None and (last is None or marker["started"] >= last["submitted"])
    if last is not None and not ran:
        alive, what = _alive(last, sweep.folder)
        if alive or alive is None:  # None: cannot tell (sacct lists a new job late): not resubmitted
            return TaskState(task, "pending", f"submitted {last['submitted']} ({what})", log)
    reasons = _failures(done.results)
    if reasons:
        return TaskState(task, "failed", reasons, log)
    return _ended(sweep, task, last, marker if ran else None, log, tail)


def _ended(sweep: Sweep, task: Task, last, marker, log: str | None, tail: str) -> TaskState:
    """The state of a task that is not done, running, pending or failed, from its last
    submission ``last`` and the marker its worker left since (``marker``; None: none since)."""
    ran = marker is not None
    if last is not None and last.get("stopped") and not (ran and marker.get("finished")):
        when = f"while it ran (since {marker['started']})" if ran else "before it started"
        by = last.get("by", "Ctrl-C")
        return TaskState(task, "interrupted", f"stopped on {by} {last['stopped']}, {when}", log)
    if ran and marker.get("finished") is None:
        _, what = _alive(marker, sweep.folder)
        reason = (
            f"the worker ({what}) stopped without finishing (killed, out of memory, out of time or "
            "preempted)" + (f"; last log line: {tail}" if tail else "")
        )
        return TaskState(task, "interrupted", reason, log)
    if ran:  # its worker finished, yet a measurement is not there
        return TaskState(task, "missing", "measured by other code or deleted since it ran: submit again", log)
    if last is not None:
        crashed = _worker_error(sweep.folder, last)
        if crashed:
            return TaskState(task, "failed", f"its worker failed before the task could start: {crashed}", log)
        why = "submitted, but its job ended before starting" + (f": {tail}" if tail else "")
        return TaskState(task, "interrupted", why, log)
    return TaskState(task, "missing", "not submitted")


def _failures(results) -> str:
    """The stored failures of a task's jobs, one clause per distinct reason (a model that cannot
    be loaded fails its trained and its random-init job alike: said once, naming both)."""
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if not r.ok and r.error != "NotMeasured":
            by_reason.setdefault(f"{r.error}: {r.message}", []).append(r.job.describe())
    return "; ".join(f"{listed(jobs)}: {why}" for why, jobs in by_reason.items())


def sweep_status(sweep: Sweep) -> list[TaskState]:
    """The state of every task of ``sweep``, in task order."""
    submissions = read_submissions(sweep.folder)
    return [task_state(sweep, t, submissions) for t in sweep.tasks]


def summary_line(states: Sequence[TaskState]) -> str:
    """``3 done, 1 failed`` in the order of :data:`STATES`."""
    counts = {s: sum(1 for x in states if x.state == s) for s in STATES}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no tasks"


def live_slurm_arrays(sweep: Sweep, states: Sequence[TaskState]) -> list[str]:
    """The SLURM array (or job) ids behind the tasks ``states`` reads as pending or running, from
    the sweep's records (each one's last submission; a running task's own marker too), in the
    order first named: what a rerun under ``--max-parallel`` waits for."""
    submissions = read_submissions(sweep.folder)
    found: dict[str, None] = {}
    for s in states:
        if s.state not in ("pending", "running"):
            continue
        tries = submissions.get(s.task.id) or [{}]
        named = [tries[-1].get("job_id") if tries[-1].get("executor") == "slurm" else None]
        if s.state == "running":
            marker = read_json(sweep.folder / "tasks" / f"{s.task.id}.json", "sweep task's record") or {}
            named.append(marker.get("slurm_job"))
        for job_id in named:
            if job_id and str(job_id) != "None":
                found.setdefault(str(job_id).split("_")[0], None)
    return list(found)
