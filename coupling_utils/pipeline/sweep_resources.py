"""What each task of a SLURM sweep asks the cluster for, sized per model, and the job arrays
that follow: an array's tasks share one ``--mem`` and ``--time``, so the tasks are grouped by
the resources they need and each group goes as its own array (:func:`slurm_arrays`).

The formulas, all here (a task is one (model, revision): its trained model and random-init twin,
measured one after the other in one process, so it needs what its largest job needs):

- **memory** (host, GB) = ``weights × MEMORY_HEADROOM + PROCESS_GB``, rounded up to a power of
  two (:data:`MEMORY_CLASSES_GB`) so that tasks of similar size share an array. ``weights`` =
  parameters × bytes per parameter of the job's dtype (``model_sizes.BYTES``: 2 for bfloat16, so a 7B
  model's weights are 14 GB); without ``--gpus-per-job`` the measurement runs in host memory, and
  ``weights`` is the cost model's whole device memory (weights, one chunk of products, the
  Jacobians: ``costs.size_cost``). ``MEMORY_HEADROOM`` (1.5) covers what loading copies and the
  allocator keeps; ``PROCESS_GB`` (4) is Python, torch and the CUDA libraries. Allowances, not
  measurements.
- **time** = the cost model's predicted seconds (``costs.cpu_seconds`` at ``rates.gpu_rates()``
  with a GPU, else at one core's rates divided by ``--cpus-per-job``) summed over the task's
  measurements, × ``TIME_HEADROOM`` (2) + ``LOAD_MINUTES`` (10: download and load), rounded up to
  :data:`TIME_CLASSES_MIN`. Where the cost model has no prediction (no GPU run recorded, the
  matrix-free method on a GPU), the time is not sized.
- **parameters**: counted on PyTorch's meta device from the ``config.json`` the worker will load
  (``models.model_config.offline_config``: a built embedded model, a local folder, a hub model in
  the Hugging Face cache), else from the project's table (``model_sizes.model_size``,
  ``data/model_configs.csv``). Neither at hand: the size is unknown offline, and the task gets the
  user's ``--mem-gb``/``--time`` (or SLURM's default memory and 60 minutes), which ``--dry-run`` says.

``--mem-gb`` and ``--time``, when given, override the sizing for every task: the user knows the
cluster's limits and the cost model is an estimate.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from coupling_utils.pipeline.sweep import Resources, Task

__all__ = [
    "MEMORY_HEADROOM", "PROCESS_GB", "TIME_HEADROOM", "LOAD_MINUTES", "MEMORY_CLASSES_GB",
    "TIME_CLASSES_MIN", "Needs", "SlurmArray", "task_needs", "slurm_arrays", "task_size",
]  # fmt: skip

MEMORY_HEADROOM = 1.5
PROCESS_GB = 4.0
TIME_HEADROOM = 2.0
LOAD_MINUTES = 10
MEMORY_CLASSES_GB = tuple(2**i for i in range(2, 13))  # 4 GB ... 4 TB
TIME_CLASSES_MIN = (30, 60, 120, 240, 480, 960, 1440, 2880, 5760, 10080, 20160)  # 30 min ... 14 days


@dataclass(frozen=True)
class Needs:
    """What one task asks for: ``mem_gb`` and ``minutes`` (None: not sized, the user's or
    SLURM's default) and ``why``, the arithmetic in words."""

    mem_gb: int | None
    minutes: int | None
    why: str


@dataclass(frozen=True)
class SlurmArray:
    """One job array: its ``tasks`` and the ``resources`` they share, with each task's ``needs``."""

    resources: Resources
    tasks: tuple[Task, ...]
    needs: tuple[Needs, ...]


def _n(x: float) -> str:
    """A number as the arithmetic in ``why`` shows it: three significant digits, whole above 1000."""
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _count(n: int) -> str:
    """A parameter count: ``6.86B``, ``124M``."""
    return f"{_n(n / 1e9)}B" if n >= 1e9 else f"{_n(n / 1e6)}M"


def _round_up(value: float, classes: Sequence[int]) -> int:
    return next((c for c in classes if c >= value), math.ceil(value))


@functools.cache
def task_size(model: str, revision: str | None):
    """``model_sizes.ModelSize`` of ``model`` at ``revision`` as the module doc says (offline), or None."""
    from coupling_utils.models.model_config import offline_config
    from coupling_utils.pipeline.model_sizes import model_size

    config = offline_config(model, revision)
    counted = _counted(model, config) if config is not None else None
    if counted is not None:
        return counted
    return model_size(model) if not model.startswith("embedded:") else None


def _counted(model: str, config: dict):
    """``config`` built on the meta device and its parameters counted (None: transformers
    cannot build it without remote code, or it has no blocks the engine finds)."""
    import transformers

    from coupling_utils.pipeline.model_sizes import ModelSize, meta_counts

    try:
        fields = {k: v for k, v in config.items() if k != "model_type"}
        built = transformers.AutoConfig.for_model(config["model_type"], **fields)

        def build():
            try:
                return transformers.AutoModelForCausalLM.from_config(built)
            except ValueError:  # not a causal LM (a ViT): its base model
                return transformers.AutoModel.from_config(built)

        n_params, block_params, n_layers = meta_counts(build)
    except Exception:  # noqa: BLE001 - remote code, an unknown architecture: not sized here
        return None
    text = built.get_text_config()
    stored = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return ModelSize(
        model,
        config["model_type"],
        n_layers,
        int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0)),
        n_params,
        block_params,
        stored,
    )


def task_needs(task: Task, resources: Resources) -> Needs:
    """The memory and time ``task`` needs on SLURM under ``resources`` (the module doc's formulas)."""
    from coupling_utils.pipeline import costs, model_sizes

    size = task_size(task.model, task.revision)
    if size is None:
        why = "size unknown offline (no config.json at hand, no row in data/model_configs.csv)"
        return Needs(None, None, why)
    gpu = bool(resources.gpus_per_job)
    try:
        sized = [costs.size_cost(w, size, "cuda" if gpu else "cpu") for w in costs.works(task.jobs)]
    except Exception as exc:  # noqa: BLE001 - an architecture the cost model does not know
        return Needs(None, None, f"not sized: the cost model cannot price it ({type(exc).__name__}: {exc})")
    if not sized:
        return Needs(None, None, "not sized: its jobs measure nothing the cost model prices")
    held = max((c.host_gb if gpu else c.device_gb) for c in sized)
    dtype = max((c.work.dtype for c in sized), key=lambda d: model_sizes.BYTES.get(d, 4))
    raw_gb = held * MEMORY_HEADROOM + PROCESS_GB
    mem = _round_up(raw_gb, MEMORY_CLASSES_GB)
    what = "weights" if gpu else "weights and buffers"
    why = (
        f"{_count(size.n_params)} parameters ({dtype}): {what} {_n(held)} GB × {MEMORY_HEADROOM} "
        f"+ {PROCESS_GB:g} GB = {_n(raw_gb)} GB, so {mem} GB"
    )
    seconds = _predicted_seconds(sized, resources)
    if seconds is None:
        return Needs(mem, None, f"{why}; time not predicted ({'no GPU rate' if gpu else 'no rate'})")
    raw_min = seconds / 60 * TIME_HEADROOM + LOAD_MINUTES
    minutes = _round_up(raw_min, TIME_CLASSES_MIN)
    where = "GPU" if gpu else f"{resources.cpus_per_job or 1} core(s)"
    why += (
        f"; predicted {_n(seconds / 60)} min on the {where} × {TIME_HEADROOM:g} + {LOAD_MINUTES} min "
        f"loading = {_n(raw_min)} min, so {minutes} min"
    )
    return Needs(mem, minutes, why)


def _predicted_seconds(sized, resources: Resources) -> float | None:
    """The cost model's seconds for the costs ``sized``, or None where it has no prediction."""
    from coupling_utils.pipeline.costs import cpu_seconds
    from coupling_utils.pipeline.rates import cpu_rates, gpu_rates

    if resources.gpus_per_job:
        rates, cores = gpu_rates(), 1
    else:
        rates, cores = cpu_rates(), resources.cpus_per_job or 1
    if rates is None:
        return None
    total = sum(cpu_seconds(c, rates) for c in sized) / cores
    return None if math.isnan(total) else total


def slurm_arrays(tasks: Sequence[Task], resources: Resources, max_size: int) -> list[SlurmArray]:
    """``tasks`` as job arrays of at most ``max_size`` tasks, one or more per resource class, in
    the order the classes first appear; ``--mem-gb``/``--time`` given override the sizing."""
    classes: dict[tuple, list[tuple[Task, Needs]]] = {}
    for task in tasks:
        needs = task_needs(task, resources)
        mem = resources.mem_gb if resources.mem_gb is not None else needs.mem_gb
        time = resources.time_limit if resources.time_limit is not None else needs.minutes
        classes.setdefault((mem, time), []).append((task, needs))
    arrays = []
    for (mem, time), members in classes.items():
        res = dataclasses.replace(resources, mem_gb=mem, time_limit=time)
        for i in range(0, len(members), max_size):
            part = members[i : i + max_size]
            arrays.append(SlurmArray(res, tuple(t for t, _ in part), tuple(n for _, n in part)))
    return arrays
