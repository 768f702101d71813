"""How a sweep's tasks are submitted (:func:`submit`): one SLURM job array, or here (``--executor
local``) submitit's local executor, a few tasks at a time, and what Ctrl-C does to them.

A worker is three processes: a shell (its setup lines), submitit's controller and the task
(:func:`~coupling_utils.pipeline.sweep.run_task`). A Ctrl-C in a terminal reaches every process of
its foreground group, these included, and the controller would answer with a Python traceback;
so a worker starts ignoring SIGINT (``trap '' INT``, inherited), its task listens again once it
runs, and the sweep stops its workers itself (:func:`stop_workers`): SIGINT to each worker (the
task stops where it is; what it stored stays), SIGKILL to what is left after a grace period, and
each stop recorded, so that ``--status`` reads "stopped on Ctrl-C" and a rerun resumes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coupling_utils.pipeline.sweep import (
    Resources,
    Sweep,
    SweepError,
    TaskState,
    _record_submission,
    _setup_lines,
    run_task,
    sweep_status,
    task_state,
)

__all__ = ["submit", "run_local", "stop_workers"]


def run_local(submitit, sweep: Sweep, todo, resources: Resources, echo, poll_s: float) -> list[TaskState]:
    """Run the tasks ``todo`` of ``sweep`` here, ``resources.max_parallel`` (default 1) at a time,
    until they have ended; on Ctrl-C, stop the running ones (:func:`stop_workers`) and re-raise."""
    ex = submitit.LocalExecutor(folder=sweep.record().folder / "local")  # recorded: it is submitted
    setup = ["trap '' INT", *_setup_lines()]  # the worker ignores the terminal's Ctrl-C (module doc)
    params: dict[str, Any] = {"timeout_min": resources.minutes or 24 * 60, "setup": setup}
    if resources.gpus_per_job:
        params["gpus_per_node"] = int(resources.gpus_per_job)
    ex.update_parameters(**params)
    queue, running = list(todo), {}
    try:
        while queue or running:
            while queue and len(running) < (resources.max_parallel or 1):
                task = queue.pop(0)
                running[task.id] = (task, ex.submit(run_task, task, str(sweep.folder)))
                _record_submission(sweep, task, "local", running[task.id][1].job_id)
                echo(f"started  {task.name}")
            for tid, (task, job) in list(running.items()):
                if job.done():
                    del running[tid]
                    echo(task_state(sweep, task).line())
            if running:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        stop_workers(sweep, running)
        raise
    return sweep_status(sweep)


def stop_workers(sweep: Sweep, running: Mapping[str, tuple], grace_s: float = 10.0) -> None:
    """Stop the ``running`` workers (``{task id: (task, submitit job)}``) of ``sweep``: SIGINT to
    each one's processes (repeated: a task that is still starting listens only once it runs, and
    then takes the first one), SIGKILL to what is left after ``grace_s``; each recorded as stopped."""
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline and not all(job.done() for _, job in running.values()):
            for _, job in running.values():
                _signal_tree(int(job.job_id), signal.SIGINT)
            time.sleep(0.2)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        pass
    for task, job in running.values():
        if not job.done():
            _signal_tree(int(job.job_id), signal.SIGKILL)
        _record_submission(sweep, task, "local", None)


def _signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and its descendants (found in Linux's /proc; elsewhere ``pid`` alone)."""
    with contextlib.suppress(OSError):  # ended meanwhile, or no /proc
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            _signal_tree(int(child), sig)
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _import_submitit():
    try:
        import submitit
    except ImportError as exc:
        raise SweepError(
            "sweeps need submitit: pip install 'submitit>=1.5' (or the project's extra: "
            "pip install -e '.[cluster]')"
        ) from exc
    return submitit


def submit(
    sweep: Sweep,
    resources: Resources | None = None,
    *,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
    poll_s: float = 0.5,
) -> list[TaskState]:
    """Submit the tasks of ``sweep`` that are not done, running or pending; return the states after.

    ``resources.executor="slurm"``: one job array (see :class:`Resources`), returned at once:
    follow it with :func:`sweep_status`. ``"local"``: the tasks run on this machine,
    ``max_parallel`` (default 1) at a time, and this call returns when they have ended.
    ``dry_run``: say what would be submitted (and, for SLURM, the batch script) without submitting.
    """
    resources = resources or Resources()
    states = sweep_status(sweep)
    todo = [s.task for s in states if s.state in ("failed", "interrupted", "missing")]
    for s in states:
        if s.state not in ("failed", "interrupted", "missing"):
            echo(f"skip  {s.line()}")
    if not todo:
        echo(f"{sweep.name}: nothing to submit ({len(states)} tasks)")
        return states
    resources.check_here(dry_run=dry_run)
    submitit = None if dry_run and resources.executor == "local" else _import_submitit()
    if resources.executor == "slurm":
        return _submit_slurm(
            submitit, sweep, todo, resources.slurm_parameters(sweep, len(todo)), dry_run, echo
        )
    if dry_run:
        for t in todo:
            echo(f"would run  {t.name} ({len(t.jobs)} job(s))")
        return states
    return run_local(submitit, sweep, todo, resources, echo, poll_s)


def _submit_slurm(submitit, sweep, todo, params: dict[str, Any], dry_run: bool, echo) -> list[TaskState]:
    if dry_run:
        from submitit.slurm.slurm import _make_sbatch_string

        script = _make_sbatch_string(
            command="python -u -m submitit.core._submit <folder>", folder=sweep.folder / "slurm",
            map_count=len(todo), **params,
        )  # fmt: skip
        echo(f"would submit {len(todo)} task(s) as one SLURM job array:")
        for t in todo:
            echo(f"  {t.name} ({len(t.jobs)} job(s))")
        echo(script)
        return sweep_status(sweep)
    ex = submitit.SlurmExecutor(folder=sweep.record().folder / "slurm")
    ex.update_parameters(**params)
    jobs = ex.map_array(run_task, todo, [str(sweep.folder)] * len(todo))
    for task, job in zip(todo, jobs):
        _record_submission(sweep, task, "slurm", job.job_id)
        echo(f"submitted  {task.name}  (SLURM job {job.job_id})")
    return sweep_status(sweep)
