"""How a sweep's tasks are submitted (:func:`submit`): SLURM job arrays, or here (``--executor
local``) submitit's local executor, a few tasks at a time, and what Ctrl-C does to them.

On SLURM the tasks go as one job array per resource class (memory and time sized per model,
:mod:`~coupling_utils.pipeline.sweep_resources`), each within the cluster's MaxArraySize. Under
``--max-parallel N`` each array waits for the one before (``--dependency=afterany``) and has
``%N``, so at most N jobs run at once in all (dividing N among arrays running side by side would
leave an array with no share when there are more arrays than N); a rerun's first array also waits
for the sweep's arrays still pending or running from before (:func:`_after`), so N bounds every
submission of the sweep together. Each array is submitted and recorded with SIGINT and SIGTERM
held (:func:`signals_held`): a Ctrl-C between sbatch accepting it and its record being written
would leave jobs a rerun submits again. A second Ctrl-C abandons the submission at once (a hung
sbatch must not trap the user), saying how to find what sbatch may have accepted.

A worker is three processes: a shell (its setup lines), submitit's controller and the task
(:func:`~coupling_utils.pipeline.sweep.run_task`). A Ctrl-C in a terminal reaches every process of
its foreground group, these included, and the controller would answer with a Python traceback;
so a worker starts ignoring SIGINT (``trap '' INT``, inherited), its task listens again once it
runs, and the sweep stops its workers itself (:func:`stop_workers`): SIGINT to each worker (the
task stops where it is; what it stored stays), SIGKILL to what is left after a grace period, and
each stop recorded, so that ``--status`` reads "stopped on Ctrl-C" and a rerun resumes. SIGTERM
(``kill``, or SLURM's time limit on an allocation the sweep runs in) does the same
(:func:`sigterm_stops`), said as what it was; the worker's shell ignores it too (``trap '' INT
TERM``), else it would die and leave its task, which submitit makes ignore SIGTERM, running unseen.

One sweep is run or submitted by one process at a time (:func:`_holding`): a second
``coupling-book sweep`` of the same sweep, while the first runs its tasks, is refused
(:class:`~coupling_utils.pipeline.sweep.SweepBusy`) instead of running the same tasks again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from coupling_utils.analysis.prose_list import listed
from coupling_utils.pipeline.sweep import (
    Resources,
    Sweep,
    SweepBusy,
    SweepError,
    _now,
    _record_submission,
    _setup_lines,
    run_task,
)
from coupling_utils.pipeline.sweep_state import (
    TaskState,
    live_slurm_arrays,
    summary_line,
    sweep_status,
    task_state,
)

__all__ = ["submit", "run_local", "stop_workers", "Terminated", "sigterm_stops"]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``kill``, a time limit): stops a sweep as Ctrl-C does (:func:`sigterm_stops`)."""


def _terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one does not cut the stopping short
    raise Terminated


@contextlib.contextmanager
def sigterm_stops():
    """Within the block, SIGTERM raises :class:`Terminated` (a KeyboardInterrupt): the local
    workers are stopped and recorded as on Ctrl-C, instead of this process dying at once and
    leaving them running (a submitit task ignores SIGTERM). Only in the main thread."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL or not _main_thread():
        yield
        return
    signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _holding(sweep: Sweep):
    """Record ``sweep`` and hold its run lock (``.run.lock``, naming the holder) while the block
    runs or submits its tasks; another process holding it: :class:`SweepBusy`, nothing done."""
    import fcntl

    sweep.record()
    with open(sweep.folder / ".run.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise SweepBusy(
                f"sweep {sweep.name} is being run or submitted right now by {holder}; a second run "
                "would start the same tasks again. Follow it with --status, or wait for it to end "
                "(or stop it) and rerun this command: it then runs what is left"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"`coupling-book` process {os.getpid()} on {socket.gethostname()} (since {_now()})\n")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_local(submitit, sweep: Sweep, todo, resources: Resources, echo, poll_s: float) -> list[TaskState]:
    """Run the tasks ``todo`` of ``sweep`` here, ``resources.max_parallel`` (default 1) at a time,
    until they have ended; on Ctrl-C, stop the running ones (:func:`stop_workers`) and re-raise."""
    ex = submitit.LocalExecutor(folder=sweep.folder / "local")
    # the worker's shell ignores the terminal's Ctrl-C and a SIGTERM to the group (module doc): it
    # stays, so that stop_workers finds the worker's processes below it
    setup = ["trap '' INT TERM", *_setup_lines()]
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
    except KeyboardInterrupt as exc:
        by = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        stopped = [task.name for task, _ in running.values()]
        stop_workers(sweep, running, by=by)
        echo(
            f"stopped on {by}: "
            + (f"{listed(stopped)} (running, stopped)" if stopped else "no task was running")
            + (f"; {len(queue)} task(s) not started" if queue else "")
        )
        raise
    return sweep_status(sweep)


def stop_workers(
    sweep: Sweep, running: Mapping[str, tuple], grace_s: float = 10.0, by: str = "Ctrl-C"
) -> None:
    """Stop the ``running`` workers (``{task id: (task, submitit job)}``) of ``sweep``: SIGINT to
    each one's processes (repeated: a task that is still starting listens only once it runs, and
    then takes the first one), SIGKILL to what is left after ``grace_s``; each recorded as stopped
    on ``by`` (Ctrl-C or SIGTERM)."""
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline and not all(job.done() for _, job in running.values()):
            for _, job in running.values():
                _signal_tree(int(job.job_id), signal.SIGINT)
            time.sleep(0.2)
    except KeyboardInterrupt:  # a second Ctrl-C (or a SIGTERM after it): stop waiting
        pass
    for task, job in running.values():
        if not job.done():
            _signal_tree(int(job.job_id), signal.SIGKILL)
        _record_submission(sweep, task, "local", None, by=by)


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

    ``resources.executor="slurm"``: job arrays (see the module doc), returned at once:
    follow it with :func:`sweep_status`. ``"local"``: the tasks run on this machine,
    ``max_parallel`` (default 1) at a time, and this call returns when they have ended.
    ``dry_run``: say what would be submitted (and, for SLURM, the batch script) without submitting.
    """
    resources = resources or Resources()
    states = sweep_status(sweep)
    if not _todo(states):
        echo(f"{sweep.name}: nothing to submit (its {_tasks(len(states))}: {summary_line(states)})")
        return states
    resources.check_here(dry_run=dry_run)
    submitit = None if dry_run and resources.executor == "local" else _import_submitit()
    if dry_run:
        return _dry_run(submitit, sweep, states, resources, echo, live_slurm_arrays(sweep, states))
    with _holding(sweep):
        states = sweep_status(sweep)  # again, holding the lock: another run may have started some
        todo = _todo(states, echo)
        if not todo:
            echo(f"{sweep.name}: nothing to submit (its {_tasks(len(states))}: {summary_line(states)})")
            return states
        if resources.executor == "slurm":
            return _submit_slurm(submitit, sweep, todo, resources, echo, live_slurm_arrays(sweep, states))
        return run_local(submitit, sweep, todo, resources, echo, poll_s)


def _tasks(n: int) -> str:
    return f"{n} task" + ("" if n == 1 else "s")


def _todo(states: list[TaskState], echo: Callable[[str], None] | None = None) -> list:
    """The tasks to submit (failed, interrupted or missing); ``echo``: say which are skipped."""
    for s in states:
        if echo is not None and s.state not in ("failed", "interrupted", "missing"):
            echo(f"skip  {s.line()}")
    return [s.task for s in states if s.state in ("failed", "interrupted", "missing")]


def max_array_size() -> int:
    """The most tasks one SLURM job array may hold: the cluster's MaxArraySize (``scontrol show
    config``; its largest index is one less), else SLURM's default, 1001. A sweep with more tasks
    is submitted as several arrays (under ``--max-parallel``, one after the other: :func:`_chained`)."""
    import subprocess

    try:
        said = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 1001
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", said.stdout, re.MULTILINE)
    return max(1, int(found[1])) if found else 1001


def _arrays(todo: list, resources: Resources) -> list:
    """``todo`` as job arrays (:func:`~coupling_utils.pipeline.sweep_resources.slurm_arrays`): one
    or more per resource class, each of at most :func:`max_array_size` tasks."""
    from coupling_utils.pipeline.sweep_resources import slurm_arrays

    return slurm_arrays(todo, resources, max_array_size())


def _chained(resources: Resources, arrays: list) -> bool:
    """Whether each array waits for the one before (``--dependency=afterany``): several arrays
    under ``--max-parallel N``, each with its own ``%N``, would otherwise run N per array at once."""
    return resources.max_parallel is not None and len(arrays) > 1


def _after(i: int, resources: Resources, earlier: list[str], previous: str) -> list[str]:
    """The jobs array ``i`` waits for (``--dependency=afterany``) under ``--max-parallel``: the
    array before it (``previous``); the first array, the sweep's ``earlier`` arrays still pending
    or running (a rerun: else both submissions' N jobs would run at once). Without
    ``--max-parallel`` none: nothing bounds the jobs at once, and waiting would only delay them."""
    if resources.max_parallel is None:
        return []
    return [previous] if i else list(earlier)


def _array_parameters(
    sweep: Sweep, array, i: int, resources: Resources, earlier: list[str], previous: str
) -> dict:
    """The sbatch parameters of array ``i`` (``array``): its resources, and the jobs it waits for
    (:func:`_after`); for the submission and for the dry run's batch script alike."""
    params = array.resources.slurm_parameters(sweep, len(array.tasks))
    after = _after(i, resources, earlier, previous)
    if after:
        params["dependency"] = "afterany:" + ":".join(after)
    return params


def _earlier_line(earlier: list[str], resources: Resources) -> str | None:
    """What a rerun does about the sweep's ``earlier`` arrays still pending or running."""
    if not earlier:
        return None
    ids = f"SLURM job{'s' if earlier[1:] else ''} {', '.join(earlier)}"
    if resources.max_parallel is None:
        return (
            f"the sweep's earlier arrays ({ids}) still have tasks pending or running (not submitted "
            "again); without --max-parallel the new arrays do not wait for them"
        )
    return (
        f"the first array waits for the sweep's earlier arrays still pending or running ({ids}), so "
        f"at most {resources.max_parallel} jobs run at once across both submissions"
    )


def _array_line(i: int, arrays: list, given: Resources, earlier: list[str]) -> str:
    """What array ``i`` asks for and why: sized, as given, or left to SLURM's defaults."""
    res, n = arrays[i].resources, len(arrays[i].tasks)
    if given.mem_gb is not None:
        mem = f"memory {res.mem_gb:g} GB (--mem-gb, as given)"
    elif res.mem_gb is not None:
        mem = f"memory {res.mem_gb:g} GB (sized per model)"
    else:
        mem = "SLURM's default memory (not sized: give --mem-gb)"
    if given.time_limit is not None:
        time = f"time {res.minutes} min (--time, as given)"
    elif res.time_limit is not None:
        time = f"time {res.minutes} min (sized per model)"
    else:
        time = "time 60 min (the default: no prediction; give --time)"
    if not _after(i, given, earlier, ""):  # the rule the submission follows
        after = ""
    elif i:
        after = f", after array {i} has ended"
    else:
        after = f", after the sweep's earlier arrays ({', '.join(earlier)}) have ended"
    return f"array {i + 1} of {len(arrays)}: {_tasks(n)}, {mem}, {time}{after}"


def _dry_run(
    submitit, sweep: Sweep, states, resources: Resources, echo, earlier: list[str]
) -> list[TaskState]:
    """What :func:`submit` would do (for SLURM, each array's resources, why, and batch script);
    ``earlier``: the sweep's arrays still pending or running (:func:`_after`)."""
    todo = _todo(states, echo)
    if resources.executor == "local":
        for t in todo:
            echo(f"would run  {t.name} ({len(t.jobs)} job(s))")
        return states
    from submitit.slurm.slurm import _make_sbatch_string

    folder = (sweep.folder / "slurm").absolute()  # as submitit's SlurmExecutor makes its command
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    arrays = _arrays(todo, resources)
    many = f"{len(arrays)} SLURM job arrays" if arrays[1:] else "one SLURM job array"
    by = f"grouped by the resources they need; MaxArraySize {max_array_size()}"
    echo(f"would submit {len(todo)} task(s) as {many} ({by}):")
    if _chained(resources, arrays):
        echo(f"  each array waits for the one before, so at most {resources.max_parallel} jobs run at once")
    if _earlier_line(earlier, resources):
        echo(f"  {_earlier_line(earlier, resources)}")
    for i, array in enumerate(arrays):
        echo(_array_line(i, arrays, resources, earlier))
        for t, needs in zip(array.tasks, array.needs):
            echo(f"  {t.name} ({len(t.jobs)} job(s)): {needs.why}")
        params = _array_parameters(sweep, array, i, resources, earlier, f"<array {i}>")
        echo(_make_sbatch_string(command=command, folder=folder, map_count=len(array.tasks), **params))
    return states


@contextlib.contextmanager
def signals_held(lost: str = "nothing was being submitted"):
    """Within the block, SIGINT and SIGTERM wait; after it they take effect as usual. Around
    sbatch and the record of what it accepted: a Ctrl-C between the two would leave a job
    submitted and not recorded, which the next run would submit again. The main thread blocks
    them, a mask sbatch inherits, so the terminal's Ctrl-C does not cut it short either. A thread
    hears them meanwhile (:func:`_take_held`), since the main thread, waiting for sbatch, runs no
    Python handler: the first is said and kept for the block's end, a second abandons the
    submission at once (:func:`_held`; ``lost``: what may then be unrecorded). Only in the main
    thread."""
    if not _main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    caught: list[int] = []  # heard by the thread (each one counts: the second abandons)
    late: list[int] = []  # seen by the Python handler (in the main thread, once sbatch is done)
    swapped = [s for s in held if signal.getsignal(s) is not None]  # None: not Python's to restore
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    # whichever thread the kernel hands a signal to, Python's C handler writes its number to
    # wake_w, where the thread reads it
    wake_before = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    before = {s: signal.signal(s, lambda signum, frame: late.append(signum)) for s in swapped}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    done = threading.Event()
    taker = threading.Thread(target=_take_held, args=(swapped, wake_r, done, caught, lost), daemon=True)
    taker.start()
    try:
        yield
    finally:
        done.set()
        taker.join()
        signal.set_wakeup_fd(wake_before)
        with contextlib.suppress(BlockingIOError):  # one that came as the thread stopped
            caught += [s for s in os.read(wake_r, 64) if s in swapped]
        os.close(wake_r)
        os.close(wake_w)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that waited arrives now, in `late`
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught or late):  # as usual now, once
            signal.raise_signal(sig)


def _take_held(held, wake_r: int, done: threading.Event, caught: list[int], lost: str) -> None:
    """The thread that hears the signals :func:`signals_held` holds (``held``, which only it
    does not block; read back from the wakeup pipe ``wake_r``) until ``done``."""
    import select

    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    while not done.is_set():
        if select.select([wake_r], [], [], 0.1)[0]:
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(wake_r, 64):
                    if signum in held:
                        _held(signum, caught, lost)


def _held(signum: int, caught: list[int], lost: str) -> None:
    """A held signal: the first is kept for the block's end, and said; a second abandons the
    submission at once (exit 130 or 143): sbatch (a child of this process) is killed, and what
    it may have accepted (``lost``) is said, since a hung SLURM controller must not trap the user.
    Records are written atomically, so exiting here leaves none half-written."""
    what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    caught.append(signum)
    if len(caught) == 1:
        print(
            f"\n{what}: finishing and recording the job array being submitted, so that it is not "
            "left submitted and unrecorded; press Ctrl-C again to abandon it now",
            file=sys.stderr,
            flush=True,
        )
        return
    print(f"\nabandoned on a second {what} while submitting: {lost}", file=sys.stderr, flush=True)
    for pid in _children():
        _signal_tree(pid, signal.SIGKILL)  # sbatch holds these signals too: only SIGKILL stops it
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(130 if signum == signal.SIGINT else 143)


def _children() -> list[int]:
    """This process's child processes (Linux's /proc; elsewhere none)."""
    found: list[int] = []
    for path in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(pid) for pid in path.read_text().split()]
    return found


def _submit_slurm(submitit, sweep, todo, resources: Resources, echo, earlier: list[str]) -> list[TaskState]:
    """Submit ``todo`` as job arrays (:func:`_arrays`), each recorded as sbatch accepts it;
    ``earlier``: the sweep's arrays still pending or running, which the first may wait for."""
    folder = sweep.folder / "slurm"
    arrays = _arrays(todo, resources)
    if _earlier_line(earlier, resources):
        echo(_earlier_line(earlier, resources))
    submitted, previous = 0, ""
    for i, array in enumerate(arrays):
        part = list(array.tasks)
        params = _array_parameters(sweep, array, i, resources, earlier, previous)
        ex = submitit.SlurmExecutor(folder=folder)
        ex.update_parameters(**params)
        before = set(folder.glob("*.pkl"))
        lost = (
            f"if sbatch accepted that array ({_tasks(len(part))}), its jobs may be unrecorded, and a "
            f"rerun would submit them again: find them with `squeue -u $USER --name {params['job_name']}` "
            "(the ones `--status` does not name) and cancel them (`scancel JOBID`) before rerunning"
        )
        with signals_held(lost):
            try:
                jobs = ex.map_array(run_task, part, [str(sweep.folder)] * len(part))
            except submitit.core.utils.FailedJobError as exc:  # sbatch said no: its reason, nothing left
                for pending in set(folder.glob("*.pkl")) - before:  # the tasks submitit pickled for it
                    pending.unlink(missing_ok=True)
                raise _refused(exc, len(part), submitted) from None
            for task, job in zip(part, jobs):
                _record_submission(sweep, task, "slurm", job.job_id)
        for task, job in zip(part, jobs):
            echo(f"submitted  {task.name}  (SLURM job {job.job_id})")
        previous = str(jobs[0].job_id).split("_")[0]
        submitted += len(part)
    return sweep_status(sweep)


def _refused(exc: Exception, n: int, submitted: int) -> SweepError:
    """sbatch's refusal of an array of ``n`` tasks (after ``submitted`` others), with the fix."""
    said = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    before = (
        f"the {_tasks(submitted)} before it were submitted (a rerun submits only the rest)"
        if submitted
        else "nothing was submitted"
    )
    return SweepError(
        f"sbatch refused the job array of {_tasks(n)} ({said}); {before}. Check --partition, --account, "
        "--time, --gpus-per-job, --cpus-per-job and --mem-gb against what the cluster offers "
        "(`sinfo -s` lists its partitions and their time limits), then rerun"
    )
