"""Sweeps: a notebook's measurements as submitit jobs, killed, resumed, then read by the notebook.

The end-to-end test runs ``coupling-book sweep f02 --executor local`` on the stand-in hub in a
private cache, kills one worker with SIGKILL while it measures, checks that ``--status`` says so,
resubmits (only the killed task runs again) and then executes the notebook with model loading
counted in its kernel (:mod:`notebook_loads`): it must load nothing. The SLURM path runs against
a stand-in ``sbatch``/``srun``/``sacct`` that executes the job array here, as SLURM would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from notebook_loads import counting_kernel, loads

from coupling_utils.chapters import NAMES as CHAPTERS
from coupling_utils.pipeline import sweep as S
from coupling_utils.pipeline import sweep_state as ST

ROOT = Path(__file__).resolve().parents[1]
HUB = ["openai-community/gpt2", "EleutherAI/pythia-1.4b", "Qwen/Qwen1.5-0.5B"]
F02 = ["-p", f"hub_models=[{', '.join(HUB)}]", "-p", "n_prompts=1", "-p", "prompt_tokens=8"]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A fresh COUPLING_CACHE for measurements and sweeps; the embedded models and the corpus
    tokenizer are shared with the session's cache (linked), so they are built at most once."""
    from coupling_utils.files import cache_dir

    shared = cache_dir()
    mine = tmp_path / "cache"
    mine.mkdir()
    for part in ("zoo", "corpus"):
        (shared / part).mkdir(exist_ok=True)
        (mine / part).symlink_to(shared / part)
    monkeypatch.setenv("COUPLING_CACHE", str(mine))
    return mine


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coupling_utils.pipeline.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        **kw,
    )


# --------------------------------------------------------------------------- unit level
def test_a_corrupt_record_of_submissions_is_moved_aside_and_said(tmp_path, capsys):
    """A sweep's records are read like every other record (files.read_json): one that is not JSON
    is moved aside and named, never silently taken for no submissions and then overwritten."""
    from coupling_utils.pipeline.sweep import Sweep, Task, _record_submission
    from coupling_utils.pipeline.sweep_state import sweep_status

    sweep = Sweep("f00_coupling_metric", "smoke", {}, [], tmp_path)
    (tmp_path / "submissions.json").write_text('{"abc": [{"executor": "slu')  # cut mid-write
    assert sweep_status(sweep) == []
    assert "submissions" in capsys.readouterr().err and list(tmp_path.glob("submissions.json.corrupt-*"))
    _record_submission(sweep, Task("abc", "m", None, ()), "slurm", "42")
    assert json.loads((tmp_path / "submissions.json").read_text())["abc"][0]["job_id"] == "42"


@pytest.mark.parametrize(
    "record",
    [
        '{"abc": {"executor": "slurm"}}',
        '{"abc": [["slurm", "42"]]}',
        '{"abc": [{"executor": "slurm"}]}',
        "[]",
    ],
    ids=["task-not-a-list", "entry-not-an-object", "entry-without-job", "a-list"],
)
def test_a_record_of_submissions_of_another_shape_is_moved_aside_not_a_crash(tmp_path, capsys, record):
    """Valid JSON of another shape (a damaged or hand-edited record) is set aside and said, as a
    corrupt one is: the states, the arrays a rerun waits on and the next record all go on."""
    from coupling_utils.pipeline.sweep import Sweep, Task, _record_submission
    from coupling_utils.pipeline.sweep_state import TaskState, live_slurm_arrays

    sweep = Sweep("f00_coupling_metric", "smoke", {}, [], tmp_path)
    (tmp_path / "submissions.json").write_text(record)
    task = Task("abc", "m", None, ())
    assert live_slurm_arrays(sweep, [TaskState(task, "pending")]) == []
    assert "submissions" in capsys.readouterr().err and list(tmp_path.glob("submissions.json.corrupt-*"))
    _record_submission(sweep, task, "slurm", "42_0")
    assert live_slurm_arrays(sweep, [TaskState(task, "pending")]) == ["42"]


def test_a_submission_slurm_cannot_tell_about_is_pending_not_interrupted(tmp_path, monkeypatch):
    """sacct lists a job some time after sbatch accepted it (submitit then says UNKNOWN), and an
    array task's state can be read while it is rewritten: a task whose job SLURM cannot report is
    pending, as a running one whose state is unknown stays running; "interrupted" (was) would
    have a rerun submit it again beside the live job."""
    from coupling_utils.pipeline.sweep import Sweep, Task, _record_submission
    from coupling_utils.pipeline.sweep_state import task_state

    monkeypatch.setattr(ST, "_slurm_state", lambda folder, job_id: "UNKNOWN")
    monkeypatch.setattr(
        "coupling_utils.measurement.collect", lambda *a, **k: SimpleNamespace(missing=[1], results=[])
    )
    sweep = Sweep("f00_coupling_metric", "smoke", {}, [], tmp_path)
    task = Task("abc", "m", None, ())
    _record_submission(sweep, task, "slurm", "4242_1")
    state = task_state(sweep, task)
    assert state.state == "pending" and "SLURM job 4242_1: state UNKNOWN" in state.reason, state.line()
    monkeypatch.setattr(ST, "_slurm_state", lambda folder, job_id: "COMPLETED")
    assert task_state(sweep, task).state == "interrupted"  # SLURM says it ended, never started


def _dead_pid() -> int:
    """The id of a process that has ended (a record naming it names no live worker)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _f03_sweep(root=None) -> S.Sweep:
    from coupling_utils.pipeline.execution import parse_override

    return S.plan_sweep("f03", "paper", dict(parse_override(p) for p in F03[4::2]), root=root)


def test_status_says_what_became_of_a_task(standin_hub, private_cache, monkeypatch):
    """--status from what the records say: a task whose worker ran to its end and whose measurements
    are gone is missing (was: "submitted, but its job ended before starting"); a worker that died
    on an error before its task ran (submitit's result) failed, with that error (was: interrupted,
    the last log line a progress bar); a log's last line that says something, not a progress bar;
    a worker's process id given to another program since is not a running worker; a damaged
    stored measurement fails its task, the others still listed (was: --status stopped
    on "an unexpected error ... likely a bug")."""
    import pickle
    import socket

    sweep = _f03_sweep().record()
    ran, crashed = sweep.tasks
    pid = _dead_pid()
    S._record_submission(sweep, ran, "local", str(pid))
    marker = {"task": ran.name, "host": socket.gethostname(), "pid": pid, "jobs": []}
    marker.update(started=S._now(), finished=S._now())
    (sweep.folder / "tasks" / f"{ran.id}.json").write_text(json.dumps(marker))
    S._record_submission(sweep, crashed, "local", str(pid + 1000000))
    logs = sweep.folder / "local"
    logs.mkdir()
    tb = "Traceback (most recent call last):\n  File x, line 1\nSyntaxError: invalid syntax\n"
    (logs / f"{pid + 1000000}_0_result.pkl").write_bytes(pickle.dumps(("error", tb)))
    (logs / f"{pid + 1000000}_0_log.err").write_text(
        "RuntimeError: no GPU\nLoading: 100%|####| 28/28 [00:00]\r\n"
    )
    states = [(s.state, s.reason) for s in ST.sweep_status(sweep)]
    assert states == [
        ("missing", "measured by other code or deleted since it ran: submit again"),
        ("failed", "its worker failed before the task could start: SyntaxError: invalid syntax"),
    ]
    (logs / f"{pid + 1000000}_0_result.pkl").unlink()  # no result: what its log says last
    assert (
        ST.sweep_status(sweep)[1].reason
        == "submitted, but its job ended before starting: RuntimeError: no GPU"
    )
    # a record naming a process id now given to another program (this one): not the worker, which
    # is gone (was: "running" for ever, and never submitted again)
    marker.update(pid=os.getpid(), finished=None)
    (sweep.folder / "tasks" / f"{ran.id}.json").write_text(json.dumps(marker))
    state = ST.sweep_status(sweep)[0]
    assert state.state == "interrupted" and "stopped without finishing" in state.reason, state.line()

    def damaged(*args, **kwargs):
        raise OSError("Parquet magic bytes not found in footer: /cache/f03/x/depthwise.parquet")

    monkeypatch.setattr("coupling_utils.measurement.collect", damaged)
    (state,) = {(s.state, s.reason) for s in ST.sweep_status(sweep)}
    assert state[0] == "failed" and "cannot be read (OSError: Parquet magic" in state[1]
    assert "remove that measurement's folder and submit again" in state[1]


def test_a_second_run_of_a_sweep_being_run_is_refused(standin_hub, private_cache, capsys):
    """Two `sweep`s of one sweep at once: the second is refused, naming the first and what to do
    (was: both ran every task not yet started, each twice over); nothing is submitted."""
    from coupling_utils.pipeline.cli import main
    from coupling_utils.pipeline.sweep_submit import _holding

    sweep = _f03_sweep()
    with _holding(sweep):
        assert main(["sweep", *F03, "--executor", "local"]) == 1
    err = capsys.readouterr().err
    assert f"error: sweep {sweep.name} is being run or submitted right now by `coupling-book` process " in err
    assert f"process {os.getpid()} on " in err and "Follow it with --status" in err and "Traceback" not in err
    assert not (sweep.folder / "submissions.json").exists()


def test_a_read_only_sweep_record_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    """A cache one cannot write (a read-only mount: root is refused too) stops a submission with a
    CacheError (exit 2) naming the sweep's folder and the fix (was: a bare OSError, exit 1)."""
    import errno

    from coupling_utils.files import CacheError

    def read_only(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(S, "atomic_path", read_only)
    sweep = S.record_sweep(
        tmp_path / "sweeps" / "s", [], {"notebook": "f00", "profile": "smoke"}, write=False
    )
    with pytest.raises(
        CacheError, match=r"sweeps/s cannot be written \(Read-only file system\).*COUPLING_CACHE"
    ):
        sweep.record()


def test_a_task_out_of_time_starts_no_other_job(standin_hub, private_cache, tmp_path, monkeypatch):
    """SLURM's warning before the time limit reaches a job as submitit's UncompletedJobError (a job
    that cannot be requeued): the task records it and stops (was: it went on to its next job,
    to be killed in the middle of it)."""
    from coupling_utils.measurement import loop

    task = S.group_tasks(S.notebook_jobs("f01", "paper"))[0]  # a trained model and its twin
    assert len(task.jobs) > 1

    class UncompletedJobError(Exception):
        pass

    ran = []

    def out_of_time(job):
        ran.append(job)
        raise UncompletedJobError("Job not requeued because: timed-out and not checkpointable.")

    monkeypatch.setattr(loop, "run", out_of_time)
    with pytest.raises(UncompletedJobError):
        S.run_task(task, str(tmp_path))
    assert len(ran) == 1
    marker = json.loads((tmp_path / "tasks" / f"{task.id}.json").read_text())
    assert marker["finished"] is None and marker["jobs"][0]["error"] == "UncompletedJobError"


def test_one_reason_of_many_jobs_is_said_once_and_memory_is_not_rounded_down(private_cache):
    from types import SimpleNamespace as NS

    def failed(name):
        return NS(ok=False, error="ModelNotFoundError", message="gone", job=NS(describe=lambda: name))

    text = ST._failures([failed("m, trained"), failed("m, random init"), NS(ok=True)])
    assert text == "m, trained and m, random init: ModelNotFoundError: gone"
    sweep = S.Sweep("f00_coupling_metric", "smoke", {}, [], private_cache / "sweeps" / "s")
    assert S.Resources(executor="slurm", mem_gb=1.5).slurm_parameters(sweep, 2)["mem"] == "1536M"  # was 1GB


def test_time_limits_read_like_sbatch():
    assert [S.parse_time(t) for t in ("30", "4:00:00", "90:30", "1-0", "1-2:30", "0:0:1", 45)] == [
        30, 240, 91, 1440, 1590, 1, 45,
    ]  # fmt: skip
    for bad in ("soon", "1:2:3:4", "0"):
        with pytest.raises(S.SweepError, match="time"):
            S.parse_time(bad)


def test_the_paper_profiles_give_one_task_per_model_and_revision(standin_hub):
    f01 = S.group_tasks(S.notebook_jobs("f01", "paper"))
    values = S.planned_values("f01", "paper")
    models = list(dict.fromkeys([values["model"], *values["more_models"]]))
    assert [t.model for t in f01] == models and len(models) == 28
    # each task: the trained model and its random-init twin, loaded in one job
    assert all({j.weights for j in t.jobs} == {"trained", "random init"} for t in f01)
    f03 = S.group_tasks(S.notebook_jobs("f03", "paper"))
    v3 = S.planned_values("f03", "paper")
    assert [(t.model, t.revision) for t in f03] == [(m, r) for m in v3["models"] for r in v3["revisions"]]
    assert len({t.id for t in f03}) == len(f03) == 26


def test_task_ids_follow_the_measurements(standin_hub, private_cache):
    a = S.group_tasks(S.notebook_jobs("f03", "paper"))
    b = S.group_tasks(S.notebook_jobs("f03", "paper", {"k": [10], "k_main": 10}))
    c = S.group_tasks(S.notebook_jobs("f03", "paper"))
    assert [t.id for t in a] == [t.id for t in c]
    assert not {t.id for t in a} & {t.id for t in b}


# --------------------------------------------------------------------------- end to end, local
def _wait_for_marker(folder: Path, name: str, proc: subprocess.Popen, timeout: float = 600) -> dict:
    """The running marker of the task named ``name`` as soon as its worker has started."""
    sweep_json = folder / "sweep.json"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if sweep_json.exists():
            tid = next(t["id"] for t in json.loads(sweep_json.read_text())["tasks"] if t["name"] == name)
            marker = folder / "tasks" / f"{tid}.json"
            if marker.exists():
                info = json.loads(marker.read_text())
                if info["finished"] is None:
                    return info
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended before {name} started:\n{proc.stdout.read()}")
        time.sleep(0.02)
    raise AssertionError(f"{name} did not start within {timeout} s")


def test_a_sweep_resumes_after_a_killed_job_and_the_notebook_then_loads_no_model(
    standin_hub, private_cache, tmp_path, monkeypatch
):
    args = ["sweep", "f02", "--profile", "smoke", *F02, "--executor", "local", "--max-parallel", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "coupling_utils.pipeline.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    folders = []
    while not folders and proc.poll() is None:
        folders = list((private_cache / "sweeps").glob("f02_generalization-smoke-*"))
        time.sleep(0.05)
    folder = folders[0]
    victim = f"{HUB[0]}@main"
    marker = _wait_for_marker(folder, victim, proc)
    os.kill(marker["pid"], signal.SIGKILL)  # as the OOM killer or a preemption would
    out = proc.communicate(timeout=900)[0]
    assert proc.returncode == 1, out
    assert re.search(rf"interrupted\s+{re.escape(victim)}.*stopped without finishing", out), out

    status = _cli("sweep", "f02", "--profile", "smoke", *F02, "--status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:] if line.strip()]
    # a task that left a log is followed by an indented "log: PATH" line (whether the killed
    # worker's log exists yet depends on timing)
    lines = {row[1]: row[0] for row in rows if row[0] != "log:"}
    assert lines.pop(victim) == "interrupted" and set(lines.values()) == {"done"}, status.stdout
    # the three smoke family members, the four smoke training-family members, the hub models and the
    # scale question's own model, less the victim
    n_done = 3 + 4 + len(HUB) + 1 - 1
    assert len(lines) == n_done, status.stdout

    again = _cli(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    started = [line.split(None, 1)[1] for line in again.stdout.splitlines() if line.startswith("started")]
    assert started == [victim], again.stdout  # only the killed task runs again
    assert f"{n_done + 1} done" in again.stdout  # every task, the victim rerun included

    env = counting_kernel(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from coupling_utils.pipeline.execution import find_notebooks, parse_override, run_notebook

    overrides = dict(parse_override(p) for p in F02[1::2])
    result = run_notebook(find_notebooks(["f02"])[0], "smoke", overrides, tmp_path / "executed")
    assert result.status == "ok", result.error
    assert loads(env) == []  # everything the notebook needed was measured by the sweep


def test_the_load_counter_sees_a_kernel_load(standin_hub, tmp_path, monkeypatch):
    """The counter the test above relies on does see loads in a papermill kernel."""
    import nbformat
    import papermill

    env = counting_kernel(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"from coupling_utils import load_model\nlm = load_model({HUB[0]!r}, device='cpu')"
        )
    ]
    nbformat.write(nb, tmp_path / "load.ipynb")
    papermill.execute_notebook(
        str(tmp_path / "load.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False
    )
    assert loads(env)[0] == ["load_model", HUB[0]]
    assert any(kind == "from_pretrained" for kind, _ in loads(env))


# --------------------------------------------------------------------------- SLURM
FAKE_SBATCH = """\
#!{python}
'''sbatch, here: record the script, print the job id and return; a detached process then runs
the array's tasks one after the other, keeping each one's state where the fake sacct reads it.'''
import os, re, subprocess, sys
from pathlib import Path
from types import SimpleNamespace

script, job = sys.argv[-1], "4242"
text = Path(script).read_text()
log, states = Path(os.environ["FAKE_SLURM_LOG"]), Path(os.environ["FAKE_SLURM_STATES"])
log.write_text((log.read_text() if log.exists() else "") + text)
m = re.search(r"#SBATCH --array=0-(\\d+)", text)
n = int(m.group(1)) + 1 if m else 1
states.mkdir(exist_ok=True)

def put(i, state):  # atomically: a sacct reading a half-written state would see none
    tmp = states / f".{{job}}_{{i}}.tmp"
    tmp.write_text(state)
    os.replace(tmp, states / f"{{job}}_{{i}}")

for i in range(n):
    put(i, "PENDING")
if os.fork() == 0:  # the "cluster": after sbatch has returned (and closed its output)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    for i in range(n):
        put(i, "RUNNING")
        env = dict(os.environ, SLURM_JOB_ID=str(5000 + i), SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=str(i),
                   SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                   SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost")
        rc = subprocess.run(["bash", script], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode
        put(i, "COMPLETED" if rc == 0 else "FAILED")
    os._exit(0)
print(f"Submitted batch job {{job}}", flush=True)
"""
FAKE_SRUN = """\
#!{python}
'''srun, here: run the command with its output and error where srun's options say.'''
import os, subprocess, sys

args, files = sys.argv[1:], {{}}
while args and args[0].startswith("--"):
    opt = args.pop(0)
    if opt in ("--output", "--error"):
        files[opt] = (args.pop(0).replace("%A", os.environ["SLURM_ARRAY_JOB_ID"])
                      .replace("%a", os.environ["SLURM_ARRAY_TASK_ID"]).replace("%t", "0"))
with open(files["--output"], "a") as out, open(files["--error"], "a") as err:
    sys.exit(subprocess.run(args, stdout=out, stderr=err).returncode)
"""
FAKE_SACCT = """\
#!/bin/sh
# sacct, here: the states the fake sbatch keeps
echo "JobID|State|NodeList"
for f in "$FAKE_SLURM_STATES"/*; do echo "$(basename "$f")|$(cat "$f")|localhost"; done
"""


def test_slurm_job_array_runs_every_task_and_resubmits_only_what_is_missing(
    standin_hub, private_cache, tmp_path, monkeypatch
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(python=sys.executable))
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "sacct").write_text(FAKE_SACCT)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "sbatch.log"))
    monkeypatch.setenv("FAKE_SLURM_STATES", str(tmp_path / "slurm-states"))
    revs = "revisions=[step1, step128]"
    args = ["sweep", "f03", "--profile", "paper", "-p", "models=[EleutherAI/pythia-6.9b]", "-p", revs]
    args += ["-p", "n_prompts=0", "-p", "max_tokens=6", "-p", "k=[4]", "-p", "k_main=4", "-p", "early_step=1"]
    slurm = ["--executor", "slurm", "--partition", "gpu", "--gpus-per-job", "1", "--time", "2:00:00"]
    first = _cli(*args, *slurm, "--max-parallel", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    script = (tmp_path / "sbatch.log").read_text()
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --time=120",
        "--array=0-1%1",
    ):
        assert line in script, script
    assert f"export COUPLING_CACHE={private_cache}" in script and "HF_TOKEN" not in script
    sweep = S.load_sweep(next((private_cache / "sweeps").glob("f03_training_emergence-paper-*")))
    seen, t0 = set(), time.monotonic()
    while time.monotonic() - t0 < 600:  # the array runs after sbatch has returned, as on a cluster
        states = [s.state for s in ST.sweep_status(sweep)]
        seen |= set(states)
        if states == ["done", "done"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the array did not finish within 600 s ({states}): the machine is very slow or it hangs")
    status = _cli(*args, "--status")
    assert "2 done" in status.stdout, status.stdout
    assert seen <= {"pending", "running", "done"}, status.stdout
    assert json.loads(next((private_cache / "sweeps").glob("*/tasks/*.json")).read_text())[
        "slurm_job"
    ].startswith("4242_")
    again = _cli(*args, *slurm)
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout
    assert script == (tmp_path / "sbatch.log").read_text()  # nothing was submitted again


def test_dry_run_shows_the_batch_script_without_submitting(standin_hub, private_cache):
    out = _cli(
        "sweep", "f03", "--profile", "paper", "--executor", "slurm", "--partition", "a100", "--dry-run"
    )
    assert out.returncode == 0, out.stderr
    assert "would submit 26 task(s)" in out.stdout and "#SBATCH --partition=a100" in out.stdout
    assert "--array=0-25%26" in out.stdout  # the stand-in models are alike: one resource class
    # each task sized from the config.json the worker loads (the stand-in's: a tiny model)
    sized = "array 1 of 1: 26 tasks, memory 8 GB (sized per model), time 30 min (sized per model)"
    assert sized in out.stdout, out.stdout
    assert re.search(r"EleutherAI/pythia-6\.9b@step1 \(2 job\(s\)\): [\d.]+M parameters", out.stdout)
    assert f"{sys.executable} -u -m submitit.core._submit " in out.stdout  # what is submitted, as it is
    assert not list((private_cache / "sweeps").glob("*/submissions.json"))


def test_a_sweep_larger_than_the_clusters_arrays_goes_as_several(
    standin_hub, private_cache, tmp_path, monkeypatch
):
    """More tasks than the cluster's MaxArraySize (``scontrol show config``): several job arrays,
    each within it (was: one array sbatch refuses; SLURM's default allows 1001 tasks)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize            = 1'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = _cli("sweep", *F03, "--executor", "slurm", "--dry-run")
    assert out.returncode == 0, out.stderr
    said = "would submit 2 task(s) as 2 SLURM job arrays (grouped by the resources they need; MaxArraySize 1)"
    assert said in out.stdout, out.stdout
    assert out.stdout.count("#SBATCH --array=0-0%1") == 2, out.stdout


def test_slurm_refusals_are_said_and_leave_nothing_behind(standin_hub, private_cache, tmp_path, monkeypatch):
    """No srun beside sbatch (submitit needs both), or sbatch refusing the array (a partition the
    cluster lacks): one paragraph with sbatch's reason and the fix, exit 2, nothing recorded as
    submitted and no pickled task left (was: "an unexpected error ... likely a bug", exit 1)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    slurm = ["--executor", "slurm", "--partition", "gpu"]
    out = _cli("sweep", *F03, *slurm)
    assert out.returncode == 2 and "has no srun on its PATH" in out.stderr, out.stderr
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    out = _cli("sweep", *F03, *slurm)
    assert out.returncode == 2, out.stdout + out.stderr
    said = (
        "sbatch refused the job array of 2 tasks (sbatch: error: invalid partition specified: gpu); nothing"
    )
    assert said in out.stderr and "sinfo" in out.stderr and "Traceback" not in out.stderr, out.stderr
    folder = next(private_cache.glob("sweeps/f03_*"))
    assert not list(folder.glob("slurm/*.pkl")) and not (folder / "submissions.json").exists()


# f03 at the paper profile, cut to one stand-in model at two revisions: two small tasks
F03 = [
    "f03",
    "--profile",
    "paper",
    "-p",
    "models=[EleutherAI/pythia-6.9b]",
    "-p",
    "revisions=[step1, step128]",
]
F03 += ["-p", "n_prompts=0", "-p", "max_tokens=6", "-p", "k=[4]", "-p", "k_main=4", "-p", "early_step=1"]
_F03_TASKS = [("EleutherAI/pythia-6.9b", "step1"), ("EleutherAI/pythia-6.9b", "step128")]


def test_bad_options_are_named_as_typed_and_only_a_submission_is_recorded(standin_hub, private_cache, capsys):
    """A sweep refused for its options, or only shown (--dry-run), is not recorded: --status
    lists what was submitted, nothing else. Options are named as they are typed."""
    from coupling_utils.pipeline.cli import main

    assert main(["sweep", *F03, "--max-parallel", "0"]) == 2
    assert "--max-parallel (jobs at once) must be 1 or more, got 0" in capsys.readouterr().err
    assert main(["sweep", *F03, "--gpus-per-job", "-1"]) == 2
    assert "--gpus-per-job" in capsys.readouterr().err
    assert main(["sweep", *F03, "--mem-gb", "8"]) == 2  # SLURM's, and the executor is local
    assert "--mem-gb is a SLURM option" in capsys.readouterr().err
    assert main(["sweep", *F03, "--dry-run"]) == 0
    assert "would run" in capsys.readouterr().out
    assert main(["sweep", *F03, "--executor", "slurm", "--dry-run"]) == 0
    assert "would submit 2 task(s)" in capsys.readouterr().out
    assert main(["sweep", "--status"]) == 0
    assert "no sweeps recorded" in capsys.readouterr().out
    assert not list(private_cache.glob("sweeps/*/sweep.json"))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_local_workers_quietly_and_a_rerun_resumes(sig, standin_hub, private_cache):
    """Ctrl-C in a terminal reaches its whole process group (the sweep and its workers): the
    sweep stops its workers and ends with exit status 130 and one line, no traceback (the local
    workers ignore the terminal's SIGINT; the sweep stops them); --status says the task was
    stopped on Ctrl-C, and a rerun runs it again (a rerun after an interrupted worker is tested
    to the end above, after a SIGKILL). SIGTERM to the group (``kill``, a SLURM time limit on the
    allocation a local sweep runs in) does the same, said as SIGTERM, exit 143 (was: the sweep
    died silently and its worker, which submitit makes ignore SIGTERM, ran on unseen)."""
    by, rc, said = {
        signal.SIGINT: ("Ctrl-C", 130, "interrupted: stopped on Ctrl-C"),
        signal.SIGTERM: ("SIGTERM", 143, "terminated: stopped on SIGTERM"),
    }[sig]
    args = ["sweep", *F03, "--executor", "local"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "coupling_utils.pipeline.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    subs, t0 = [], time.monotonic()
    while not subs and proc.poll() is None and time.monotonic() - t0 < 600:
        subs = list(private_cache.glob("sweeps/*/submissions.json"))  # a worker was started
        time.sleep(0.05)
    assert subs, proc.communicate()
    _wait_for_marker(subs[0].parent, f"{_F03_TASKS[0][0]}@{_F03_TASKS[0][1]}", proc)  # the task runs
    os.killpg(proc.pid, sig)  # what Ctrl-C does (or a time limit, `kill`)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == rc, out + err
    assert said in err and "Traceback" not in out + err, err
    assert f"stopped on {by}: {_F03_TASKS[0][0]}@step1 (running, stopped); 1 task(s) not started" in out
    (tries,) = json.loads(subs[0].read_text()).values()
    assert tries[-1]["stopped"] and tries[-1]["by"] == by and not ST._pid_alive(tries[-1]["pid"])
    time.sleep(1)  # a worker left running would still be there after its parent has gone
    for marker in subs[0].parent.glob("tasks/*.json"):  # no worker is left running
        assert not ST._pid_alive(json.loads(marker.read_text())["pid"])
    status = _cli("sweep", *F03, "--status")
    assert re.search(rf"interrupted\s+\S+@step1\s+stopped on {by}", status.stdout), status.stdout
    assert "1 interrupted, 1 missing" in status.stdout, status.stdout
    again = _cli(*args, "--dry-run")  # a rerun runs both (measuring them takes minutes here)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.findall(r"would run\s+(\S+)", again.stdout) == [f"{m}@{r}" for m, r in _F03_TASKS], again.stdout


# the default profile is left out: planning f03 there trains embedded:pythia-tiny (minutes)
@pytest.mark.parametrize("profile", ["smoke", "laptop", "paper"])
@pytest.mark.parametrize("name", CHAPTERS)
def test_the_sweep_and_the_cost_model_read_the_chapters_plan(name, profile, standin_hub):
    """For every chapter and profile: the sweep's jobs are the chapter's plan, job for job, and
    the cost model counts one work item per measured part (or extra table) of those same jobs."""
    from coupling_utils.chapters import chapter
    from coupling_utils.pipeline import costs

    plan = chapter(name).jobs(S.planned_params(name, profile))
    assert plan, f"{name} at {profile} plans no measurement"
    swept = [job for task in S.group_tasks(S.notebook_jobs(name, profile)) for job in task.jobs]
    assert sorted(j.key for j in swept) == sorted(j.key for j in plan)
    parts = [(j.model, j.revision, p) for j in plan for p in (j.settings or [j.extra.name])]
    assert [(w.model, w.revision, w.what) for w in costs.notebook_work(name, profile)] == parts


def test_status_names_a_damaged_sweep_record_and_lists_the_others(tmp_path, monkeypatch, capsys):
    """`sweep --status` over a cache holding a damaged record (a truncated sweep.json or plan.pkl):
    each damaged one is named with the fix, the others are listed, exit 1 (was: "an unexpected
    error ... likely a bug" and nothing listed)."""
    from coupling_utils.pipeline.cli import main

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    S.record_sweep(tmp_path / "sweeps" / "good", [], {"notebook": "f00", "profile": "smoke"})
    for name, files in {
        "a-json": {"sweep.json": b"{", "plan.pkl": b""},
        "b-pkl": {"sweep.json": b"{}"},
    }.items():
        for file, content in {"plan.pkl": b"\x80\x04", **files}.items():
            (tmp_path / "sweeps" / name).mkdir(parents=True, exist_ok=True)
            (tmp_path / "sweeps" / name / file).write_bytes(content)
    assert main(["sweep", "--status"]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: the sweep record in ") for line in lines), err
    assert all("cannot be read" in line and "remove that folder" in line for line in lines)
    assert "Traceback" not in err and "bug" not in err and "good" in out, out
