"""Submitting a sweep's job arrays to SLURM: several arrays under ``--max-parallel N`` run at most
N jobs in all (each waits for the one before, and a rerun's first waits for the sweep's arrays
still pending), and a Ctrl-C that arrives while sbatch accepts an array waits until the submission
is recorded, so a rerun does not submit it again, while a second Ctrl-C stops a hung sbatch at
once. SLURM is the stand-in ``sbatch``/``srun``/``sacct``/``scontrol`` below; nothing runs the jobs."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

FAKE_SBATCH = """\
#!{python}
'''sbatch, here: log the script, keep the array's tasks PENDING where the fake sacct reads them,
print the next job id; with FAKE_SBATCH_CTRL_C the user's Ctrl-C reaches the caller (its
process group, as a terminal sends it) once the job is accepted, before the id is printed; with
FAKE_SBATCH_HANG it writes its process id there and hangs (a stuck SLURM controller).'''
import os, re, signal, sys, time
from pathlib import Path

if os.environ.get("FAKE_SBATCH_HANG"):
    Path(os.environ["FAKE_SBATCH_HANG"]).write_text(str(os.getpid()))
    time.sleep(120)
text = Path(sys.argv[-1]).read_text()
log, states = Path(os.environ["FAKE_SLURM_LOG"]), Path(os.environ["FAKE_SLURM_STATES"])
scripts = log.read_text().split("#!/bin/bash")[1:] if log.exists() else []
job = 4242 + len(scripts)
log.write_text((log.read_text() if log.exists() else "") + text)
states.mkdir(exist_ok=True)
m = re.search(r"#SBATCH --array=0-(\\d+)", text)
for name in [f"{{job}}_{{i}}" for i in range(int(m.group(1)) + 1)] if m else [str(job)]:
    (states / name).write_text("PENDING")
if os.environ.get("FAKE_SBATCH_CTRL_C"):
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(1)
print(f"Submitted batch job {{job}}", flush=True)
"""
FAKE_SACCT = """\
#!/bin/sh
echo "JobID|State|NodeList"
for f in "$FAKE_SLURM_STATES"/*; do echo "$(basename "$f")|$(cat "$f")|localhost"; done
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """The stand-in SLURM on the PATH, MaxArraySize 2; a private cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(python=sys.executable))
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sacct").write_text(FAKE_SACCT)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize            = 2'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "sbatch.log"))
    monkeypatch.setenv("FAKE_SLURM_STATES", str(tmp_path / "states"))
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    import submitit

    submitit.SlurmJob.watcher.clear()  # shared: job ids (4242, ...) another test's fake SLURM ended
    return tmp_path


def _sweep(folder: Path):
    """A recorded sweep of three small tasks (hand-made jobs, nothing measured)."""
    from coupling_utils.measurement import Job, Settings
    from coupling_utils.pipeline.sweep import Task, record_sweep

    settings = Settings(k=(4,), max_tokens=8)
    tasks = [
        Task(f"t{i}", m, None, (Job(m, {"p": "a b"}, settings, {"dtype": "float32"}, root=folder / "m"),))
        for i, m in enumerate(["nobody/model-a", "nobody/model-b", "nobody/model-c"])
    ]
    return record_sweep(folder / "sweep", tasks, {"notebook": "f00_coupling_metric", "profile": "smoke"})


def _scripts(folder: Path) -> list[str]:
    return (folder / "sbatch.log").read_text().split("#!/bin/bash")[1:]


def test_several_arrays_under_max_parallel_run_one_after_the_other(fake_slurm):
    """Three tasks, two arrays (MaxArraySize 2) under --max-parallel 1: the second waits for the
    first (``--dependency=afterany``), so one job runs at a time (was: %1 each, two at once);
    without --max-parallel they are not chained."""
    from coupling_utils.pipeline.sweep import Resources
    from coupling_utils.pipeline.sweep_submit import submit

    sweep = _sweep(fake_slurm)
    submit(sweep, Resources(executor="slurm", max_parallel=1), echo=lambda line: None)
    first, second = _scripts(fake_slurm)
    assert "--array=0-1%1" in first and "--dependency" not in first
    assert "#SBATCH --dependency=afterany:4242\n" in second, second
    said: list[str] = []
    (sweep.folder / "submissions.json").unlink()
    submit(sweep, Resources(executor="slurm"), dry_run=True, echo=said.append)
    assert "--dependency" not in "\n".join(said) and "waits for the one before" not in "\n".join(said)


def test_ctrl_c_as_sbatch_accepts_waits_for_the_record(fake_slurm, monkeypatch):
    """Ctrl-C while sbatch is accepting the first array: the sweep stops only once that
    array's submission is recorded, so a rerun sees it pending and submits nothing again
    (was: the job went unrecorded and the rerun submitted it a second time)."""
    from coupling_utils.pipeline.sweep import Resources, load_sweep
    from coupling_utils.pipeline.sweep_state import sweep_status
    from coupling_utils.pipeline.sweep_submit import submit

    sweep = _sweep(fake_slurm)
    monkeypatch.setenv("FAKE_SBATCH_CTRL_C", "1")  # the fake sbatch sends SIGINT to this process
    with pytest.raises(KeyboardInterrupt):
        submit(sweep, Resources(executor="slurm"), echo=lambda line: None)
    assert len(_scripts(fake_slurm)) == 1  # stopped after the first array: the second not submitted
    recorded = json.loads((sweep.folder / "submissions.json").read_text())
    assert [tries[0]["job_id"] for tries in recorded.values()] == ["4242_0", "4242_1"], recorded
    states = [s.state for s in sweep_status(load_sweep(sweep.folder))]
    assert states == ["pending", "pending", "missing"], states


def test_a_rerun_under_max_parallel_waits_for_the_sweeps_earlier_arrays(fake_slurm):
    """A rerun that submits what is left while the sweep's earlier array is still pending: under
    --max-parallel its first array waits for that one (``afterany``), so N bounds both
    submissions together (was: no dependency, 2N jobs at once), and says so, --dry-run too; the
    pending tasks are not submitted again. Without --max-parallel nothing waits (nothing bounds
    the jobs at once), and the output says that too."""
    import dataclasses

    from coupling_utils.pipeline.sweep import Resources
    from coupling_utils.pipeline.sweep_submit import submit

    sweep = _sweep(fake_slurm)
    first = dataclasses.replace(sweep, tasks=sweep.tasks[:2])  # the sweep as first planned: one array
    submit(first, Resources(executor="slurm", max_parallel=2), echo=lambda line: None)
    bound = Resources(executor="slurm", max_parallel=2)
    shown: list[str] = []
    submit(sweep, bound, dry_run=True, echo=shown.append)
    text = "\n".join(shown)
    assert "#SBATCH --dependency=afterany:4242\n" in text, text
    assert "waits for the sweep's earlier arrays still pending or running (SLURM job 4242)" in text, text
    unbound: list[str] = []
    submit(sweep, Resources(executor="slurm"), dry_run=True, echo=unbound.append)
    assert "--dependency" not in "\n".join(unbound)
    assert any("without --max-parallel the new arrays do not wait" in line for line in unbound), unbound
    said: list[str] = []
    submit(sweep, bound, echo=said.append)
    rerun = _scripts(fake_slurm)[1]
    assert "#SBATCH --dependency=afterany:4242\n" in rerun, rerun
    assert any("waits for the sweep's earlier arrays" in line for line in said), said
    recorded = json.loads((sweep.folder / "submissions.json").read_text())
    assert {tid: [t["job_id"] for t in tries] for tid, tries in recorded.items()} == {
        "t0": ["4242_0"],
        "t1": ["4242_1"],
        "t2": ["4243"],  # one task: submitit submits it as a job, not an array
    }, recorded


HUNG_SUBMIT = """\
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_sweep_arrays import _sweep
from coupling_utils.pipeline.sweep import Resources
from coupling_utils.pipeline.sweep_submit import submit

submit(_sweep(Path({folder!r})), Resources(executor="slurm"), echo=lambda line: None)
"""


def _wait_for(what, timeout_s: float = 60.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    return None


def test_a_second_ctrl_c_abandons_a_hung_sbatch_at_once(fake_slurm):
    """sbatch hangs (a stuck controller): the first Ctrl-C (to the process group, as a terminal
    sends it) says the submission is being finished and that a second abandons it; the second
    stops at once (exit 130, no traceback), kills sbatch and says how to find what it may have
    accepted (was: both Ctrl-Cs held until sbatch answered, so the user was trapped)."""
    import signal
    import subprocess

    from coupling_utils.pipeline.sweep_state import _pid_alive

    pid_file, err = fake_slurm / "sbatch.pid", fake_slurm / "stderr.txt"
    script = fake_slurm / "hung_submit.py"
    script.write_text(HUNG_SUBMIT.format(tests=str(Path(__file__).parent), folder=str(fake_slurm)))
    env = {**os.environ, "FAKE_SBATCH_HANG": str(pid_file)}
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stderr=stderr, start_new_session=True)
    try:
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text()), "sbatch never started"
        sbatch = int(pid_file.read_text())
        os.killpg(proc.pid, signal.SIGINT)
        assert _wait_for(lambda: "press Ctrl-C again to abandon" in err.read_text(), 10), err.read_text()
        assert proc.poll() is None and _pid_alive(sbatch)  # the first Ctrl-C waits for sbatch
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=10) == 130, err.read_text()
        said = err.read_text()
        assert "abandoned on a second Ctrl-C" in said and "squeue -u $USER --name coupling-f00-smoke" in said
        assert "Traceback" not in said, said
        assert _wait_for(lambda: not _pid_alive(sbatch), 10), "sbatch was left hanging"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
