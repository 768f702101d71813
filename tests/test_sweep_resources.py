"""Per-model resources of a SLURM sweep: memory and time sized from each model's parameters and
the cost model, one job array per resource class, the user's flags as an override, and a
model whose size is unknown offline left to those flags, as ``--dry-run`` says."""

from __future__ import annotations

import pytest

from coupling_utils.measurement import Job, Settings
from coupling_utils.pipeline import sweep_resources as R
from coupling_utils.pipeline.model_sizes import ModelSize
from coupling_utils.pipeline.sweep import Resources, Sweep, Task

SIZES = {  # parameters, block parameters, width, depth: a Llama-7B shape and a small model
    "big/llama-7b": ModelSize("big/llama-7b", "llama", 32, 4096, 7_000_000_000, 202_000_000, "bfloat16"),
    "small/gpt2": ModelSize("small/gpt2", "gpt2", 12, 768, 124_000_000, 7_000_000, "float32"),
}


def _task(model: str, root, dtype: str = "bfloat16") -> Task:
    settings = Settings(k=(4,), max_tokens=64, tokens="all")  # 8 prompts, every token's Jacobian
    prompts = {f"p{i}": "one two three" for i in range(8)}
    jobs = tuple(
        Job(model, prompts, settings, {"dtype": dtype, "random_init": w, "seed": 0}, root=root)
        for w in (False, True)
    )
    return Task(model.replace("/", "-"), model, None, jobs)


@pytest.fixture
def sizes(monkeypatch):
    monkeypatch.setattr(R, "task_size", lambda model, revision: SIZES.get(model))


def test_each_model_gets_the_memory_and_time_of_its_size(sizes, tmp_path):
    """A 7B model in bfloat16: 14 GB of weights × 1.5 + 4 GB = 25 GB, so the 32 GB class; a
    124M one 8 GB; each class its own array, the bigger model given more time
    (was: every task the same --mem-gb and --time)."""
    tasks = [_task("big/llama-7b", tmp_path), _task("small/gpt2", tmp_path), _task("big/llama-7b", tmp_path)]
    gpu = Resources(executor="slurm", gpus_per_job=1)
    arrays = R.slurm_arrays(tasks, gpu, max_size=1001)
    assert [[t.model for t in a.tasks] for a in arrays] == [["big/llama-7b"] * 2, ["small/gpt2"]]
    big, small = (a.resources for a in arrays)
    assert (big.mem_gb, small.mem_gb) == (32, 8)  # 0.25 GB × 1.5 + 4 GB = 4.4 GB: the 8 GB class
    assert big.minutes > small.minutes >= R.LOAD_MINUTES  # the cost model's time, with loading
    assert big.minutes in R.TIME_CLASSES_MIN and small.minutes in R.TIME_CLASSES_MIN
    why = arrays[0].needs[0].why
    assert "7B parameters (bfloat16): weights 14 GB × 1.5 + 4 GB = 25 GB, so 32 GB" in why, why
    assert "on the GPU × 2 + 10 min loading" in why, why
    # without a GPU the measurement's buffers are in host memory too: never less
    cpu = R.task_needs(tasks[0], Resources(executor="slurm"))
    assert cpu.mem_gb >= 32 and "weights and buffers" in cpu.why
    # array sizes: a class larger than MaxArraySize is cut, still within its class
    cut = R.slurm_arrays(tasks, gpu, max_size=1)
    assert [len(a.tasks) for a in cut] == [1, 1, 1] and cut[1].resources.mem_gb == 32


def test_the_users_flags_override_the_sizing_and_a_model_unknown_offline_falls_back(sizes, tmp_path):
    tasks = [_task("big/llama-7b", tmp_path), _task("small/gpt2", tmp_path), _task("gone/x", tmp_path)]
    given = Resources(executor="slurm", gpus_per_job=1, mem_gb=48, time_limit="3:00:00")
    (one,) = R.slurm_arrays(tasks, given, max_size=1001)  # both given: one array, as before
    assert (one.resources.mem_gb, one.resources.minutes) == (48, 180) and len(one.tasks) == 3
    mem_only = R.slurm_arrays(tasks, Resources(executor="slurm", gpus_per_job=1, mem_gb=48), 1001)
    assert {a.resources.mem_gb for a in mem_only} == {48} and len(mem_only) == 3  # times still sized
    unknown = R.slurm_arrays(tasks, Resources(executor="slurm", gpus_per_job=1), 1001)[-1]
    assert [t.model for t in unknown.tasks] == ["gone/x"]
    assert unknown.resources.mem_gb is None and unknown.resources.time_limit is None
    assert unknown.needs[0].why.startswith("size unknown offline (no config.json at hand")


def test_dry_run_shows_each_arrays_resources_and_why(sizes, tmp_path, monkeypatch):
    from coupling_utils.pipeline.sweep_submit import submit

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    tasks = [_task("big/llama-7b", tmp_path), _task("gone/x", tmp_path)]
    sweep = Sweep("f00_coupling_metric", "smoke", {}, tasks, tmp_path / "sweep")
    said: list[str] = []
    submit(sweep, Resources(executor="slurm", gpus_per_job=1), dry_run=True, echo=said.append)
    text = "\n".join(said)
    assert "would submit 2 task(s) as 2 SLURM job arrays (grouped by the resources they need" in text
    assert "array 1 of 2: 1 task, memory 32 GB (sized per model), time " in text, text
    assert "#SBATCH --mem=32768M" in text and text.count("#SBATCH --mem=") == 1, text
    assert "array 2 of 2: 1 task, SLURM's default memory (not sized: give --mem-gb)" in text
    assert "time 60 min (the default: no prediction; give --time)" in text
    assert "  gone/x@main (2 job(s)): size unknown offline" in text
    said.clear()
    submit(sweep, Resources(executor="slurm", gpus_per_job=1, mem_gb=20), dry_run=True, echo=said.append)
    assert "memory 20 GB (--mem-gb, as given)" in "\n".join(said)


def test_sizes_are_counted_from_the_config_at_hand(standin_hub):
    """The stand-in hub's config.json (a tiny model under Pythia-6.9B's id) is what the worker
    loads, so it is what is counted; a model neither cached nor in the table is unknown."""
    size = R.task_size("EleutherAI/pythia-6.9b", "step1")
    assert size is not None and size.d_model == 64 and size.n_params < 10_000_000
    assert R.task_size("nobody/no-such-model", None) is None
