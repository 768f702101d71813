"""What the benchmark scripts share: their random-init models, memory measures and the
provenance every CSV row carries.

The models are built from fixed configurations and ``torch.manual_seed(0)``, so a benchmark
measures the same weights run after run; what differs between scripts (the number of blocks,
the attention implementation, a tied head) is an argument, never a copy of the builder.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The checkout the benchmarks run from (whose commit each row records)."""


def rss_mib() -> float:
    """This process's resident set size in MiB (Linux ``/proc``; NaN elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


CPU_STAT = Path("/proc/stat")


def cpu_jiffies(stat_text: str) -> tuple[int, int]:
    """``(busy, total)`` clock ticks of all CPUs together since boot, from the text of Linux's
    ``/proc/stat`` (its aggregate ``cpu`` line: user nice system idle iowait irq softirq steal
    guest guest_nice). Busy is user + nice + system + irq + softirq + steal (guest time is
    already inside user and nice); total adds idle and iowait. A ``ValueError`` names a text
    without that line."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:9]] + [0] * (9 - len(fields))
            user, nice, system, idle, iowait, irq, softirq, steal = ticks[:8]
            busy = user + nice + system + irq + softirq + steal
            return busy, busy + idle + iowait
    raise ValueError("/proc/stat text has no aggregate 'cpu' line: not a Linux /proc/stat")


def read_cpu_jiffies(path: Path = CPU_STAT) -> tuple[int, int] | None:
    """:func:`cpu_jiffies` of the machine now; None where there is no ``/proc/stat`` (not Linux)."""
    try:
        return cpu_jiffies(Path(path).read_text())
    except (OSError, ValueError):
        return None


def other_cpu(before, after, own_cpu_seconds: float, hz: float | None = None) -> tuple[float, float]:
    """``(seconds, share)``: the CPU time that processes other than a run used between two
    :func:`cpu_jiffies` snapshots taken around it, and that time over the machine's capacity in
    the interval (all its cores' ticks, busy or idle: 0 = nothing else ran, 1 = every core was
    busy with others the whole time). Other = all busy ticks over ``hz`` (``SC_CLK_TCK``) minus
    ``own_cpu_seconds`` (the run's own user + system time, from rusage); clipped at 0, since the
    ticks are sampled (10 ms granularity) where rusage is not, so a quiet interval can come out
    slightly negative. (NaN, NaN) where a snapshot is missing."""
    if before is None or after is None:
        return math.nan, math.nan
    hz = float(hz or os.sysconf("SC_CLK_TCK"))
    busy, total = (after[0] - before[0]) / hz, (after[1] - before[1]) / hz
    other = max(0.0, busy - own_cpu_seconds)
    return other, (other / total if total > 0 else math.nan)


def peak_tensor_mib(fn) -> tuple[object, float]:
    """``(fn(), peak)``: the largest total of torch's CPU buffers alive during ``fn`` above those
    alive before it, in MiB, from the profiler's allocation records (an op's own allocations net
    of its frees, at its start; frees outside any op, at theirs).

    Deterministic, unlike the resident set size: the allocator keeps freed pages or returns them
    to the system as it likes, and the same code's RSS peak varied by 25 % between runs. Run it
    apart from a timed run (the profiler slows every op); one thread (other threads' records are
    not counted).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    records = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    live = peak = 0
    for _, size in records:
        live += size
        peak = max(peak, live)
    return out, peak / 2**20


def _random_model(cfg, attention: str | None):
    import torch
    from transformers import AutoModelForCausalLM

    if attention is not None:
        cfg._attn_implementation_internal = attention
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)


def smollm2_model(layers: int, *, attention: str | None = None, **config):
    """A random-init Llama model with SmolLM2-135M's block shape (d = 576, 9 heads, 3 key-value
    heads, d_ff = 1536, RoPE θ = 1e5) and ``layers`` blocks; ``attention`` the implementation
    (None: transformers' default); ``config`` overrides the rest of the configuration."""
    from transformers import LlamaConfig

    base = dict(
        hidden_size=576,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        rope_theta=100000.0,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
    )
    return _random_model(LlamaConfig(**{**base, **config}), attention)


def neox_model(layers: int, *, attention: str | None = None):
    """A random-init GPT-NeoX with Pythia-70M's configuration (d = 512, 8 heads, d_ff = 2048,
    rotary on a quarter of each head) and ``layers`` blocks."""
    from transformers import GPTNeoXConfig

    cfg = GPTNeoXConfig(
        hidden_size=512,
        num_hidden_layers=layers,
        num_attention_heads=8,
        intermediate_size=2048,
        rotary_pct=0.25,
        vocab_size=50304,
        max_position_embeddings=2048,
    )
    return _random_model(cfg, attention)


def provenance(command: str, *, threads: int | None = None, device: str | None = None) -> dict:
    """The columns every benchmark row carries: the machine and its load when the run started,
    the torch threads (if fixed), the device (if not the CPU), library versions, the code's
    commit (:func:`commit`), date, command."""
    from coupling_utils.provenance import cpu_name, versions

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = {} if device is None else {"device": device}
    out["machine"] = f"{os.cpu_count()} CPU ({cpu_name()}), load {load:.1f} at start"
    if threads is not None:
        out["torch_threads"] = threads
    v = versions()
    out.update({k: v[k] for k in ("torch", "transformers", "coupling_utils")})
    out["commit"] = commit()
    out["date_utc"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    out["command"] = command
    return out


def commit(repo: Path = REPO) -> str:
    """The commit of the code a benchmark ran (12 hex digits), with ``+changes`` when tracked files
    differ from it, the benchmarks' own results (``data/benchmarks/``) apart: a benchmark run after
    another has rewritten its CSV runs the same code; ``unknown`` outside a git checkout (e.g. a
    copied tree without ``.git``)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!data/benchmarks")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+changes" if changed else head
