"""What a run costs: FLOPs, device and host memory, download size and CPU time, per notebook and profile.

Predicted from the models' configurations (``data/model_configs.csv``: each model is built on
PyTorch's meta device, so its parameters per block and in all are counted exactly without any
weights) and from the engine's throughput measured by ``bench/bench_costs.py``
(``data/benchmarks/costs.csv``). The arithmetic, per measurement of one model on one prompt of
``T`` tokens, over ``L`` measured blocks of width ``d`` with ``P`` parameters each:

- a **block pass** (one VJP or JVP through one block, for all tokens at once) costs
  :func:`pass_flops` = ``2·P·T + 4·T²·d`` FLOPs (matrix products, attention);
- the **exact** method makes ``d`` passes per block (one row of every token's Jacobian each),
  plus one forward pass, then a full SVD of each measured token's ``d × d`` Jacobian
  (``21·d³`` FLOPs, Golub & Van Loan's count for U, Σ and V); where ``measure()`` takes the
  one-token path instead (at most T/2 tokens of a causal model on a CPU, T/16 on a GPU,
  ``engine.one_token.one_token_wins``), ``d``
  **one-token passes** per token and block (:func:`one_token_pass_flops` = ``2·P + 4·T·d``,
  priced at their own measured rate) and a pass over the prefix;
- **matrix-free** makes the Lanczos solver's passes for the largest K plus ``K`` per partner
  block for the tiles (:func:`coupling_utils.engine.spectra.solver_passes`), and no SVD of size d;
- **memory** on the device (the path and the chunk as ``measure()`` chooses them there): the
  weights in the run's dtype; one chunk of products through the block (the block's activations
  per token are about ``P/d`` numbers): the sweep's chunk of ``c`` VJP cotangents over all T tokens
  (``c·T·P/d``, ``c`` from the engine's budget: ``c·T·d`` at most 2^20 numbers on a CPU, 2^24 on a
  GPU) and the T tokens' Jacobians it forms (``T·d²``), or one token's chunk (``c·P/d``), or
  matrix-free's 64 products (``64·T·P/d``); three ``d × d`` float32 matrices per measured token
  (the Jacobian, U, V); and :data:`DEVICE_ALLOWANCE_GB` for the CUDA context and the allocator (an
  allowance, not measured). An estimate, not a bound: against the profiler's count of torch's
  buffers during ``measure()`` on two random SmolLM2-sized blocks (one thread) it gave 204 MiB
  for 233 measured (T = 32, every token), 252 for 257 (34 of 64 tokens), 17 for 10 (the last
  token);
- **host memory** of a GPU run: the weights once, as transformers loads them; of a CPU run, the
  device memory above;
- **download**: the weights in the dtype the repo stores (``torch_dtype``), per (model, revision);
  random-init twins need none.

CPU time divides the pass FLOPs by the throughput measured on one core for that method and path (the
median over the benchmarked block shapes and prompt lengths, in CPU time, so that a shared
machine's waiting is left out) and adds the measured time of a ``d × d`` SVD scaled as ``d³``.
On ``c`` cores it is the one-core time over ``c``: perfect scaling, so a lower bound, with the
one-core time the upper bound; the profiles and the page give both. GPU time is the same
arithmetic at the rates ``bench/gpu_check.py`` measured on a GPU (``rates.gpu_rates``: the all-token
sweep's FLOP rate and the top-50 spectra's seconds per ``d³`` on a bfloat16 Llama-7B-shaped twin),
where that run is recorded; it is a prediction from measured rates, not a measured run of the
profile (the paper's models cannot be loaded here).

Which measurements a notebook makes comes from its chapter's plan, ``jobs(params)``
(``coupling_utils.chapters``), the list the notebook and the sweep use. Embedded models (trained
here) are listed apart: their cost is the zoo's (``coupling-book zoo list``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from coupling_utils.pipeline.model_sizes import GB, ModelSize, model_size
from coupling_utils.pipeline.rates import Rates, cpu_rates, gpu_rates

__all__ = [
    "pass_flops",
    "svd_flops",
    "Work",
    "work_cost",
    "size_cost",
    "one_token_pass_flops",
    "notebook_work",
    "notebook_costs",
    "gpu_fit",
    "profile_costs_table",
    "NEW_DOWNLOAD",
    "duration",
    "cpu_seconds",
    "GPU_SIZES_GB",
    "DEVICE_ALLOWANCE_GB",
    "CHUNK",
    "gpu_time_column",
]

GPU_SIZES_GB = (24, 40, 80)
DEVICE_ALLOWANCE_GB = 1.0  # CUDA context, kernels and allocator slack: an allowance, not a measurement
CHUNK = 64  # products per batch of the matrix-free path (measure()'s chunk_size default)
SVD_FLOPS_PER_D3 = 21  # full SVD (U, S, V) of a square matrix: 4n³ + 8n³ + 9n³ (Golub & Van Loan)


def pass_flops(block_params: int, T: int, d: int) -> float:
    """FLOPs of one block pass over ``T`` tokens: ``2 · block_params · T`` for the matrix
    products and ``4 · T² · d`` for attention's scores and weighted values."""
    return 2.0 * block_params * T + 4.0 * T * T * d


def one_token_pass_flops(block_params: int, T: int, d: int) -> float:
    """FLOPs of one block pass of one token against a ``T``-token key/value cache (the one-token
    path, ``engine.one_token``): ``2 · block_params`` and ``4 · T · d`` for its attention row."""
    return 2.0 * block_params + 4.0 * T * d


def svd_flops(d: int) -> float:
    """FLOPs of a full SVD (U, Σ, V) of a ``d × d`` matrix: ``21 d³``."""
    return SVD_FLOPS_PER_D3 * float(d) ** 3


# --------------------------------------------------------------------------- one measurement
@dataclass(frozen=True)
class Work:
    """One model measured on prompts: ``n_prompts`` prompts of ``T`` tokens, ``layers`` blocks,
    ``n_tokens`` measured tokens per prompt and block (1: the last), with ``method`` and ``k``.
    ``download``: whether its weights are downloaded (a random-init twin needs none);
    ``revision``: the checkpoint (each one a download of its own); ``extra_passes``: further
    block passes per prompt (trajectories, linearisation); ``last_blocks``: ``layers`` as given (()
    for all) where the last block is measured twice (``Settings.last_block_also``), else None."""

    model: str
    revision: str | None
    dtype: str
    n_prompts: int
    T: int
    layers: int | None  # None: all blocks
    n_tokens: int
    method: str = "exact"
    k: int = 50
    download: bool = True
    extra_passes: int = 0
    extra_cost: Callable[[int, int], int] | None = None  # block passes per prompt from (n_layers, d)
    what: str = ""
    last_blocks: tuple[int, ...] | None = None

    def blocks(self, n_layers: int) -> int:
        """Blocks measured per prompt on a model of ``n_layers``: ``layers``, the last one twice."""
        seen = {b % n_layers for b in self.last_blocks or range(n_layers)}
        twice = self.last_blocks is not None and n_layers - 1 in seen
        return (n_layers if self.layers is None else int(self.layers)) + int(twice)


@dataclass
class Cost:
    """A :class:`Work`'s predicted cost."""

    work: Work
    size: ModelSize | None
    flops: float = math.nan
    passes: int = 0  # block passes over all T tokens, in all
    svds: int = 0  # d × d SVDs in all
    one_token_passes: int = 0  # block passes of one token against its prefix's cache, in all
    device_gb: float = math.nan
    host_gb: float = math.nan
    download_gb: float = 0.0


def work_cost(work: Work) -> Cost:
    """The FLOPs, passes, SVDs, device memory, host memory and download of one :class:`Work`."""
    size = model_size(work.model)
    return Cost(work, None) if size is None else size_cost(work, size)


def size_cost(work: Work, size: ModelSize, device: str = "cpu") -> Cost:
    """:func:`work_cost` for a model of ``size`` on ``device`` ("cpu", or "cuda" for a GPU's).
    Exact and randomized runs form each selected token's Jacobian as ``measure()`` does there
    (``engine.one_token.choose_path``'s rule): a few tokens of a causal model one at a time
    against the prefix's key/value cache (d one-token passes each, and a pass over the prefix),
    otherwise one all-token sweep (d passes)."""
    import types

    from coupling_utils.engine.architectures import find_architecture
    from coupling_utils.engine.jacobians import _default_chunk
    from coupling_utils.engine.one_token import one_token_wins
    from coupling_utils.engine.spectra import solver_passes

    d, P, T = size.d_model, size.block_params, work.T
    L = work.blocks(size.n_layers)
    causal = find_architecture(types.SimpleNamespace(model_type=size.model_type)).causal == "causal"
    one = 0
    if work.method == "matrix_free":
        per_layer = solver_passes(work.k, d=d) + max(L - 1, 0) * work.k
        svds = 0
        held = CHUNK * T * P / d  # one chunk of products through the block
    elif causal and one_token_wins(work.n_tokens, T, device):
        per_layer = work.n_tokens  # the prefix passes, without gradients
        one = work.n_prompts * L * work.n_tokens * d
        svds = L * work.n_tokens * work.n_prompts
        held = _default_chunk(d, 1, None, device) * P / d  # one chunk of VJPs through one token
    else:
        per_layer = d + 1
        svds = L * work.n_tokens * work.n_prompts
        # one chunk of VJPs through the block over all T tokens, and every token's Jacobian
        held = _default_chunk(d, T, None, device) * T * P / d + T * d * d
    extra = work.extra_passes if work.extra_cost is None else work.extra_cost(size.n_layers, d)
    passes = work.n_prompts * (L * per_layer + extra)
    flops = passes * pass_flops(P, work.T, d) + one * one_token_pass_flops(P, work.T, d) + svds * svd_flops(d)
    weights = size.weights_gb(work.dtype)
    buffers = (held + 3 * work.n_tokens * d * d) * 4 / GB
    download = size.weights_gb(size.stored_dtype) if work.download else 0.0
    return Cost(
        work,
        size,
        flops,
        passes,
        svds,
        one_token_passes=one,
        device_gb=weights + buffers + DEVICE_ALLOWANCE_GB,
        host_gb=weights,
        download_gb=download,
    )


def cpu_seconds(cost: Cost, rates: Rates) -> float:
    """Predicted seconds of a :class:`Cost` at ``rates`` (one core's, or a GPU's: ``rates.gpu_rates``)."""
    if cost.size is None:
        return math.nan
    rate = rates.matrix_free_flops_per_s if cost.work.method == "matrix_free" else rates.exact_flops_per_s
    shape = (cost.size.block_params, cost.work.T, cost.size.d_model)
    pass_part = cost.passes * pass_flops(*shape) / rate
    one_part = 0.0
    if cost.one_token_passes:
        one_part = cost.one_token_passes * one_token_pass_flops(*shape) / rates.one_token_flops_per_s
    return pass_part + one_part + cost.svds * rates.svd_seconds_per_d3 * float(cost.size.d_model) ** 3


# --------------------------------------------------------------------------- what a notebook measures
def _prompt_tokens(text: Any, max_tokens: int | None) -> int:
    """Tokens of a prompt: ``max_tokens`` if set (an upper bound), else about 4/3 per word."""
    if max_tokens:
        return int(max_tokens)
    if hasattr(text, "shape"):
        return int(text.shape[-1])
    return max(1, math.ceil(len(str(text).split()) * 4 / 3))


# tokens of a model-prepared input (an image made into the model's own format): a ViT-B/16 at 224 px
PREPARED_TOKENS = 1 + (224 // 16) ** 2


def _job_tokens(job, prompts: Mapping, max_tokens: int | None) -> int:
    """Tokens per input of a job: its prompts' (see :func:`_prompt_tokens`), or, for inputs the
    loaded model prepares (images), :data:`PREPARED_TOKENS`."""
    if job.prepare is not None:
        return PREPARED_TOKENS
    return max(_prompt_tokens(p, max_tokens) for p in prompts.values())


def works(jobs) -> list[Work]:
    """One :class:`Work` per measured part of each job (its extra tables counted with it), or,
    for a job that only computes extra tables, one for those."""
    out = []
    for job in jobs:
        prompts = job.prompts if isinstance(job.prompts, Mapping) else dict(enumerate(job.prompts))
        for part, s in job.settings.items():
            T = _job_tokens(job, prompts, s.max_tokens)
            n_tok = T if s.tokens == "all" else (1 if s.tokens == "last" else len(s.tokens))
            out.append(
                Work(
                    job.model,
                    job.revision,
                    job.load_kwargs.get("dtype", "float32"),
                    len(prompts),
                    T,
                    None if s.layers is None else len(s.layers),
                    n_tok,
                    s.method,
                    max(s.k),
                    download=job.weights == "trained",
                    extra_passes=0 if job.extra is None else 1,
                    extra_cost=None if job.extra is None else job.extra.passes,
                    what=part,
                    last_blocks=None if s.last_block_also is None else tuple(s.layers or ()),
                )
            )
        if not job.settings and job.extra is not None:  # a job that only computes extra tables
            T = _job_tokens(job, prompts, None)
            out.append(
                Work(
                    job.model, job.revision, job.load_kwargs.get("dtype", "float32"), len(prompts), T, 0, 0,
                    download=job.weights == "trained", extra_passes=1, extra_cost=job.extra.passes,
                    what=job.extra.name,
                )
            )  # fmt: skip
    return out


def notebook_work(notebook: str, profile: str, overrides: Mapping[str, Any] | None = None) -> list[Work]:
    """The measurements ``notebook`` makes at ``profile`` (with ``overrides``): its chapter's
    ``jobs(params)``, the list the notebook and the sweep read."""
    from coupling_utils.chapters import chapter
    from coupling_utils.pipeline.sweep import _notebook, planned_params

    stem = _notebook(notebook).stem
    params = planned_params(stem, profile, overrides)
    return works(chapter(stem).jobs(params))


# --------------------------------------------------------------------------- tables
def gpu_fit(cost: Cost, gpu_gb: float) -> str:
    """Whether a measurement fits on a GPU of ``gpu_gb`` GB: "yes" at its dtype, else the
    lightest quantization that fits ("8bit", "4bit"), else "no"."""
    if cost.size is None:
        return "?"
    if cost.device_gb <= gpu_gb:
        return "yes"
    other = cost.device_gb - cost.size.weights_gb(cost.work.dtype)
    for q in ("8bit", "4bit"):
        if cost.size.weights_gb(q) + other <= gpu_gb:
            return q
    return "no"


NEW_DOWNLOAD = "download not in an earlier notebook (GB)"
"""The cost table's column of what a notebook downloads that no notebook above it (at the same
profile) does: its sum is the profile's download with each checkpoint counted once."""


@dataclass
class NotebookCost:
    """One notebook at one profile: its measurements' costs and the totals."""

    notebook: str
    profile: str
    costs: list[Cost]
    embedded: list[str] = field(default_factory=list)  # embedded models: the zoo's cost, not counted here
    unknown: list[str] = field(default_factory=list)  # hub models without a model_configs.csv row

    def downloads(self) -> dict[tuple[str, str | None], float]:
        """``{(model, revision): GB}`` of every checkpoint this notebook downloads (each once)."""
        out: dict[tuple[str, str | None], float] = {}
        for c in self.costs:
            if c.size is not None and c.work.download:
                key = (c.work.model, c.work.revision)
                out[key] = max(out.get(key, 0.0), c.download_gb)
        return out

    def totals(
        self, rates: Rates | None = None, gpu: Rates | None = None, seen: Collection[tuple] = ()
    ) -> dict[str, Any]:
        """The table's row (``seen``: the checkpoints notebooks above it download, for NEW_DOWNLOAD)."""
        known = [c for c in self.costs if c.size is not None]
        on_gpu = [size_cost(c.work, c.size, "cuda") for c in known]  # the GPU's path rule and chunks
        loads = self.downloads()
        big = max(on_gpu, key=lambda c: c.device_gb, default=None)
        row: dict[str, Any] = {
            "notebook": self.notebook,
            "profile": self.profile,
            "hub models": len({c.work.model for c in known}),
            "checkpoints": len(loads),
            "TFLOP": sum(c.flops for c in known) / 1e12,
            "GPU memory (GB)": None if big is None else big.device_gb,
            "largest": None if big is None else big.work.model,
            "host memory (GB)": max((c.host_gb for c in known), default=0.0),
            "download (GB)": sum(loads.values()),
            NEW_DOWNLOAD: sum(gb for key, gb in loads.items() if key not in seen),
        }
        for gb in GPU_SIZES_GB:
            worst = [c for c in on_gpu if gpu_fit(c, gb) != "yes"]
            names = sorted({c.work.model.split("/")[-1] + f" ({gpu_fit(c, gb)})" for c in worst})
            row[f"{gb} GB GPU"] = "all" if not worst else "all but " + ", ".join(names)
        if rates is not None:
            row["one-core seconds"] = sum(cpu_seconds(c, rates) for c in known)
        if gpu is not None:
            row["GPU seconds"] = sum(cpu_seconds(c, gpu) for c in on_gpu)
        if self.embedded:
            row["embedded (zoo cost)"] = ", ".join(self.embedded)
        return row


def notebook_costs(notebook: str, profile: str, overrides: Mapping[str, Any] | None = None) -> NotebookCost:
    """The predicted cost of every measurement ``notebook`` makes at ``profile``."""
    from coupling_utils.pipeline.sweep import _notebook

    stem = _notebook(notebook).stem
    works = notebook_work(stem, profile, overrides)
    costs, embedded, unknown = [], [], []
    for w in works:
        if w.model.startswith("embedded:"):
            embedded.append(w.model.split("/")[0])
            continue
        cost = work_cost(w)
        if cost.size is None:
            unknown.append(w.model)
        costs.append(cost)
    return NotebookCost(stem, profile, costs, list(dict.fromkeys(embedded)), list(dict.fromkeys(unknown)))


def duration(seconds: float) -> str:
    """``seconds`` in words, two significant digits: "about 25 min", "about 3.1 h", "about 12 days"."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 60:
        return "under a minute"
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size or unit == "min":
            return f"about {float(f'{seconds / size:.2g}'):g} {unit}"
    raise AssertionError("unreachable")


def _sig(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}") if x and math.isfinite(x) else x


def gpu_time_column(gpu: Rates) -> str:
    """The cost table's GPU time column: named as predicted, and from which GPU's measured rates."""
    return f"GPU time (predicted from {gpu.machine or 'a GPU'}'s measured rates)"


def profile_costs_table(
    profiles: Sequence[str] = ("paper", "laptop"),
    notebooks: Sequence[str] | None = None,
    cores: int = 4,
    bench: pd.DataFrame | None = None,
    gpu_check: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The performance page's table: one row per (notebook, profile), numbers to three significant
    digits, CPU time on ``cores`` cores (perfect scaling) and on one core in words (:func:`duration`),
    and, where ``bench/gpu_check.py`` has measured a GPU, the time predicted at that GPU's measured
    rates (:func:`gpu_time_column`)."""
    from coupling_utils.pipeline.execution import notebook_paths

    rates, gpu = cpu_rates(bench), gpu_rates(gpu_check)
    names = [p.stem for p in notebook_paths()] if notebooks is None else list(notebooks)
    rows = []
    for profile in profiles:
        seen: set[tuple[str, str | None]] = set()  # the checkpoints an earlier notebook downloads
        for nb in names:
            cost = notebook_costs(nb, profile)
            row = cost.totals(rates, gpu, seen)
            seen |= set(cost.downloads())
            seconds = row.pop("one-core seconds")
            for key in ("TFLOP", "GPU memory (GB)", "host memory (GB)", "download (GB)", NEW_DOWNLOAD):
                row[key] = _sig(row[key]) if row[key] is not None else None
            row[f"{cores}-core CPU time"] = duration(seconds / cores)
            row["1-core CPU time"] = duration(seconds)
            if gpu is not None:  # a prediction at the rates measured there, never a measured run
                row[gpu_time_column(gpu)] = duration(row.pop("GPU seconds"))
            row.setdefault("embedded (zoo cost)", "")
            rows.append(row)
    return pd.DataFrame(rows)


EXPECTED_TIME = "# expected time on a 4-core CPU: "


def expected_time_line(row: Mapping[str, Any]) -> str:
    """The comment line a ``laptop`` profile file states its time in, from its row of
    :func:`profile_costs_table`."""
    four, one = row["4-core CPU time"], row["1-core CPU time"]
    span = (
        f"{one} (on one core already)"
        if four == one
        else f"{four} (the 4 cores scaling perfectly) to {one} (one core)"
    )
    line = f"{EXPECTED_TIME}{span}, predicted from the engine's measured throughput"
    line += " (book/performance.md, What a run costs)"
    if row.get("embedded (zoo cost)"):
        line += f"; plus the embedded models' own cost ({row['embedded (zoo cost)']}: coupling-book zoo list)"
    return line


def state_laptop_times(table: pd.DataFrame, folder: str | Path | None = None) -> list[Path]:
    """Rewrite the expected-time line of every ``laptop`` profile file from ``table`` (the profile
    files state what the cost model predicts, never a typed guess); returns the files changed."""

    from coupling_utils.files import atomic_write_text
    from coupling_utils.pipeline.execution import repo_root

    rows = table[table.profile == "laptop"].set_index("notebook")
    changed = []
    for path in sorted(Path(folder or repo_root() / "notebooks" / "profiles" / "laptop").glob("*.yaml")):
        if path.stem not in rows.index:
            raise ValueError(f"{path.name}: no laptop row in the cost table for {path.stem}")
        text = path.read_text()
        line = expected_time_line(rows.loc[path.stem])
        if not re.search(f"^{re.escape(EXPECTED_TIME)}.*$", text, flags=re.M):
            raise ValueError(
                f"{path.name} has no line starting with {EXPECTED_TIME!r}: add one after its comment"
            )
        new = re.sub(f"^{re.escape(EXPECTED_TIME)}.*$", lambda _, line=line: line, text, count=1, flags=re.M)
        if new != text:
            atomic_write_text(path, new)
            changed.append(path)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``data/benchmarks/profile_costs.csv`` (the performance page's table), state each
    ``laptop`` profile's predicted time in its file, and print the table."""
    import argparse

    from coupling_utils.files import atomic_path, data_dir

    ap = argparse.ArgumentParser(prog="python -m coupling_utils.pipeline.costs", description=main.__doc__)
    ap.add_argument("--out", default=str(data_dir() / "benchmarks" / "profile_costs.csv"))
    args = ap.parse_args(argv)
    table = profile_costs_table()
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_colwidth", 60):
        print(table.to_string(index=False))
    print(f"wrote {args.out}")
    for path in state_laptop_times(table):
        print(f"stated the predicted time in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
