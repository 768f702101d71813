"""Benchmark: the engine's throughput per block pass and per SVD, for the cost model of the profiles.

Run from the repository root (see book/performance.md, "What a run costs"):

    python bench/bench_costs.py                  # one torch thread (the per-core throughput)
    python bench/bench_costs.py --threads 1,2    # several thread counts, each in its own subprocess

Times are the process's CPU time (``time.process_time``), not wall-clock time: on a shared
machine a process waits for a core, and CPU time leaves that wait out (with one thread it is
the time the work takes on one core of its own; ``wall_seconds`` is kept beside it).

For randomly initialised two-block models with the block shapes of small hub models
(Pythia-70M, GPT-2 / Pythia-160M, Qwen1.5-0.5B; the vocabulary is cut to 512 tokens, which
leaves the block's cost unchanged) and prompts of T tokens, it times:

- ``exact``: ``token_jacobians`` of block 0 (d VJPs through the block, batched): seconds per
  block pass = seconds / d;
- ``one_token``: ``one_token_jacobians`` of block 0 for the last token (d VJPs of that token
  alone against its prefix's key/value cache, the path ``measure()`` takes for a few tokens of
  a causal model): seconds per one-token pass = seconds / d, FLOPs per pass as
  ``costs.one_token_pass_flops`` counts them (``2 · block parameters + 4 · T · d``);
- ``matrix_free``: ``matrix_free_topk(K=10)`` of block 0 with the default Lanczos solver:
  seconds / its block passes (JVPs and VJPs);
- ``svd``: ``torch.linalg.svd`` of a d × d float32 matrix (U, S and V), the exact method's
  per-token decomposition;
- ``validate``: a whole ``measure()`` (all 6 blocks of a GPT-2-shaped model, d = 768, one
  16-token prompt, last token, K = 10, 30, 50, exact): the end-to-end time the cost model
  (``coupling_utils.pipeline.costs``) is checked against.

FLOPs per block pass are counted as ``costs.pass_flops`` does (2 · block parameters · T for the
matrix products, plus 4 · T² · d for attention), so ``flops_per_s`` is the throughput the cost
model uses. Results go to ``data/benchmarks/costs.csv`` with provenance columns (machine, threads,
torch, transformers, coupling_utils versions, UTC date, the command).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import provenance  # noqa: E402

# (name, model_type, d, ffn, heads, key/value heads): block shapes of small hub models
SHAPES = (
    ("Pythia-70M block", "gpt_neox", 512, 2048, 8, 8),
    ("GPT-2 / Pythia-160M block", "gpt2", 768, 3072, 12, 12),
    ("Qwen1.5-0.5B block", "qwen2", 1024, 2816, 16, 16),
)
TOKENS = (16, 32)
VOCAB = 512


def _model(model_type: str, d: int, ffn: int, heads: int, kv: int, layers: int = 2):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type == "gpt2":
        kw = dict(n_embd=d, n_layer=layers, n_head=heads, n_inner=ffn, n_positions=256)
    else:
        kw = dict(
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ffn,
            max_position_embeddings=256,
        )
        if model_type != "gpt_neox":
            kw["num_key_value_heads"] = kv
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, **kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)


def _block_params(model) -> int:
    from coupling_utils.engine.architectures import transformer_blocks

    return sum(p.numel() for p in transformer_blocks(model)[0].parameters())


class _Clock:
    """CPU seconds (``time.process_time``) and wall seconds of a ``with`` block."""

    def __enter__(self):
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu = time.process_time() - self.cpu0
        self.wall = time.perf_counter() - self.wall0
        return False


def worker(threads: int) -> list[dict]:
    """Every measurement at ``threads`` torch threads, in this process."""
    import torch

    from coupling_utils.engine.jacobians import token_jacobians
    from coupling_utils.engine.one_token import one_token_jacobians
    from coupling_utils.engine.spectra import matrix_free_topk
    from coupling_utils.measurement import measure
    from coupling_utils.pipeline.costs import one_token_pass_flops, pass_flops

    torch.set_num_threads(threads)
    rows = []
    gen = torch.Generator().manual_seed(1)
    for name, model_type, d, ffn, heads, kv in SHAPES:
        model = _model(model_type, d, ffn, heads, kv)
        p_block = _block_params(model)
        for T in TOKENS:
            ids = torch.randint(0, VOCAB, (1, T), generator=gen)
            flops = pass_flops(p_block, T, d)
            token_jacobians(model, ids[:, :4], 0)  # warm-up (allocations, kernels)
            with _Clock() as c:
                token_jacobians(model, ids, 0)
            rows.append(_row("exact", name, d, p_block, T, d, c, flops))
            one_token_jacobians(model, ids[:, :4], 0, [3])  # warm-up
            with _Clock() as c:
                one_token_jacobians(model, ids, 0, [T - 1])
            rows.append(_row("one_token", name, d, p_block, T, d, c, one_token_pass_flops(p_block, T, d)))
            with _Clock() as c:
                res = matrix_free_topk(model, ids, 0, 10)
            rows.append(_row("matrix_free", name, d, p_block, T, res.block_passes, c, flops))
        A = torch.randn(d, d, generator=gen)
        torch.linalg.svd(A)
        with _Clock() as c:
            for _ in range(3):
                torch.linalg.svd(A)
        rows.append(
            {
                "what": "svd",
                "shape": f"{d} x {d} float32",
                "d": d,
                "seconds": c.cpu / 3,
                "wall_seconds": c.wall / 3,
            }
        )
    model = _model("gpt2", 768, 3072, 12, 12, layers=6)
    ids = torch.randint(0, VOCAB, (1, 16), generator=gen)
    with _Clock() as c:
        measure(model, {"p": ids}, tokens="last", k=(10, 30, 50), method="exact")
    rows.append(
        {
            "what": "validate",
            "shape": "measure(): GPT-2 shape, 6 blocks, d=768, T=16, last token, K=10,30,50, exact",
            "d": 768,
            "block_params": _block_params(model),
            "layers": 6,
            "T": 16,
            "seconds": c.cpu,
            "wall_seconds": c.wall,
        }
    )
    return rows


def _row(what, name, d, p_block, T, passes, clock, flops) -> dict:
    seconds = clock.cpu
    return {
        "what": what,
        "shape": name,
        "d": d,
        "block_params": p_block,
        "T": T,
        "block_passes": int(passes),
        "seconds": seconds,
        "seconds_per_pass": seconds / passes,
        "flops_per_pass": flops,
        "flops_per_s": flops * passes / seconds,
        "wall_seconds": clock.wall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1", help="comma-separated torch thread counts (default 1)")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks"), help="directory for costs.csv")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return 0
    import pandas as pd

    command = "python bench/bench_costs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    frames = []
    for threads in [int(t) for t in args.threads.split(",") if t.strip()]:
        prov = provenance(command.strip(), threads=threads)  # the load when this thread count starts
        print(f"[costs] {threads} thread(s) ...", flush=True)
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(threads)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise RuntimeError(f"worker with {threads} threads failed (exit {proc.returncode})")
        df = pd.DataFrame(json.loads(proc.stdout.strip().splitlines()[-1]))
        for key, value in prov.items():
            df[key] = value
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from coupling_utils.files import atomic_path

    path = out / "costs.csv"
    with atomic_path(path) as t:
        df.to_csv(t, index=False, float_format="%.4g")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["machine", "torch", "transformers", "coupling_utils", "date_utc", "command"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
