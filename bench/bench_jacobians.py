"""Benchmark: reference vs token-diagonal vs top-K matrix-free block Jacobians, side by side.

Run from the repository root (see book/performance.md for the results and how they were made):

    python bench/bench_jacobians.py                     # all three cases
    python bench/bench_jacobians.py --cases neox        # one case
    python bench/bench_jacobians.py --threads 1         # torch threads in every worker

Cases (each method runs in its own subprocess, one after the other, so that its peak memory
is its own; timings of methods in one case are taken in the same run and compared as ratios):

- ``neox``: one block (layer 3) of a randomly initialised GPT-NeoX (d = 512, Pythia-70M's
  configuration) on T = 32 tokens: ``reference_jacobians`` (the authors' method, T·d VJPs),
  ``token_jacobians`` (token-diagonal, d VJPs) and ``matrix_free_topk`` (top-K only).
  Errors are relative to the reference: ``max |J − J_ref| / max |J_ref|`` for the Jacobians,
  and for matrix-free the largest relative error of the top-K singular values.
- ``profile``: a randomly initialised twin of SmolLM2-135M's configuration (30 blocks, d = 576,
  9 heads, 3 KV heads), ``measure(..., tokens="all", k=(10, 30, 50))`` on one 16-token prompt:
  the all-token depth-wise profile. Seconds and peak memory.
- ``matrix_free``: the trained SmolLM2-135M (``embedded:smollm2-135m``), the demo prompt, the
  last token and all 30 blocks: ``measure(method="exact")`` against
  ``measure(method="matrix_free")`` for the settings in ``MATRIX_FREE_SETTINGS`` (K, solver
  and its options, depth window): block passes per layer against d, and the largest difference
  of depth-wise coupling values ``1 − m_K²`` from exact over the layer pairs computed (all
  pairs, or adjacent pairs with ``depth_window=1``). Every product carries a row for every
  token, so the pass counts are those of all T tokens too; the last token alone keeps the
  token-wise table (n·K more products, a different measurement) out of the count.

Peak memory is the worker process's peak resident set size (``resource.getrusage(RUSAGE_SELF)
.ru_maxrss``, Linux KiB), which counts everything torch allocates on the CPU (tracemalloc does
not see torch's allocations); ``base`` is the RSS after the model is built, before timing.
Results go to ``data/benchmarks/<case>.csv`` with provenance columns (machine, threads, torch,
transformers, coupling_utils versions, UTC date, the command).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import neox_model, provenance, rss_mib, smollm2_model  # noqa: E402

CASES = ("neox", "profile", "matrix_free")
DEMO_PROMPT = "What is the capital of France? The capital is"
# matrix-free settings: (K, solver, solver options, depth_window); {} = the solver's defaults
MATRIX_FREE_SETTINGS = (
    (10, "subspace", {"oversample": 10, "n_iter": 4}, None),
    (10, "lanczos", {"block": 5, "steps": 6}, 1),  # few large blocks: inaccurate on flat spectra
    (10, "lanczos", {}, None),  # the defaults: block ceil(K/10), 45 steps
    (10, "lanczos", {}, 1),
    (30, "lanczos", {}, 1),
    (50, "lanczos", {}, 1),
)
MATRIX_FREE_K = (10, 30, 50)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# --------------------------------------------------------------------------- workers
def worker(case: str, method: str, opts: dict, outdir: Path) -> dict:
    """Run one method of one case in this (fresh) process; save its output under outdir."""
    import torch

    torch.set_num_threads(opts["threads"])
    if case == "neox":
        from coupling_utils.engine.jacobians import reference_jacobians, token_jacobians
        from coupling_utils.engine.spectra import Solver, matrix_free_topk

        model = neox_model(6)
        ids = torch.randint(0, 50304, (1, opts["T"]), generator=torch.Generator().manual_seed(1))
        base = rss_mib()
        t0 = time.perf_counter()
        if method == "reference":
            J = reference_jacobians(model, ids, 3)
            passes = J.shape[0] * J.shape[-1]
            torch.save(J, outdir / "J.pt")
        elif method == "token_diagonal":
            J = token_jacobians(model, ids, 3)
            passes = J.shape[-1]
            torch.save(J, outdir / "J.pt")
        else:
            res = matrix_free_topk(
                model,
                ids,
                3,
                opts["K"],
                Solver("subspace", oversample=opts["oversample"], n_iter=opts["n_iter"]),
            )
            passes = res.block_passes
            torch.save(res.svd.S, outdir / "S.pt")
        seconds = time.perf_counter() - t0
    elif case in ("profile", "matrix_free"):
        from coupling_utils.measurement import measure

        if case == "profile":
            model = smollm2_model(30, tie_word_embeddings=True, max_position_embeddings=8192)
            prompts = {
                "random16": torch.randint(0, 49152, (1, 16), generator=torch.Generator().manual_seed(1))
            }
            tokens = "all"
        else:
            from coupling_utils import load_model

            model = load_model("embedded:smollm2-135m")
            prompts = {"demo": DEMO_PROMPT}
            tokens = "last"
        base = rss_mib()
        t0 = time.perf_counter()
        kw = (
            {}
            if method == "exact"
            else {"solver": opts["solver"], "depth_window": opts["depth_window"], **opts["solver_options"]}
        )
        ks = MATRIX_FREE_K if method == "exact" else [opts["kmax"]]
        res = measure(model, prompts, tokens=tokens, k=ks, method=method, out=outdir / "measure", **kw)
        seconds = time.perf_counter() - t0
        passes = int(res.timings["block_passes"].max())
    else:
        raise ValueError(f"unknown case {case!r}")
    return {"seconds": seconds, "peak_rss_mib": _peak_mib(), "base_rss_mib": base, "block_passes": passes}


def run_worker(case: str, method: str, opts: dict, outdir: Path) -> dict:
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        case,
        method,
        "--opts",
        json.dumps(opts),
        "--outdir",
        str(outdir),
    ]
    print(f"[{case}] {method} {opts} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"worker {case}/{method} failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"[{case}] {method}: {result}", flush=True)
    return result


# --------------------------------------------------------------------------- cases
def case_neox(
    tmp: Path, threads: int, T: int = 32, K: int = 10, oversample: int = 10, n_iter: int = 2
) -> list[dict]:
    import torch

    from coupling_utils.engine.spectra import topk_svd

    base = {"threads": threads, "T": T}
    ref = run_worker("neox", "reference", base, tmp / "ref")
    td = run_worker("neox", "token_diagonal", base, tmp / "td")
    mf_opts = {**base, "K": K, "oversample": oversample, "n_iter": n_iter}
    mf = run_worker("neox", "matrix_free", mf_opts, tmp / "mf")
    J_ref, J_td = torch.load(tmp / "ref" / "J.pt"), torch.load(tmp / "td" / "J.pt")
    S_mf = torch.load(tmp / "mf" / "S.pt")
    S_ref = topk_svd(J_ref, K).S
    d = J_ref.shape[-1]
    common = {
        "case": "neox",
        "model": "GPT-NeoX random init (d=512, Pythia-70M config)",
        "layer": 3,
        "T": T,
        "d": d,
    }
    rows = []
    for name, r, err, what, K_ in (
        ("reference (per token, T·d VJPs)", ref, 0.0, "max|ΔJ|/max|J_ref|", None),
        (
            "token-diagonal (d VJPs)",
            td,
            ((J_td - J_ref).abs().max() / J_ref.abs().max()).item(),
            "max|ΔJ|/max|J_ref|",
            None,
        ),
        (
            f"matrix-free top-{K} (oversample {oversample}, n_iter {n_iter})",
            mf,
            ((S_mf - S_ref).abs() / S_ref[..., :1]).max().item(),
            "max|Δσ_i|/σ_1, top K",
            K,
        ),
    ):
        rows.append(
            {
                **common,
                "method": name,
                "K": K_,
                "seconds": r["seconds"],
                "speedup_vs_reference": ref["seconds"] / r["seconds"],
                "block_passes": r["block_passes"],
                "rel_error": err,
                "error_measure": what,
                "peak_rss_mib": r["peak_rss_mib"],
                "base_rss_mib": r["base_rss_mib"],
            }
        )
    return rows


def case_profile(tmp: Path, threads: int) -> list[dict]:
    r = run_worker("profile", "exact", {"threads": threads}, tmp / "profile")
    return [
        {
            "case": "profile",
            "model": "SmolLM2-135M twin, random init (30 blocks, d=576)",
            "T": 16,
            "d": 576,
            "method": "measure(tokens='all', k=(10,30,50), method='exact')",
            "seconds": r["seconds"],
            "block_passes_per_layer": r["block_passes"],
            "peak_rss_mib": r["peak_rss_mib"],
            "base_rss_mib": r["base_rss_mib"],
            "target": "<= 180 s and <= 4096 MiB",
            "meets_target": bool(r["seconds"] <= 180 and r["peak_rss_mib"] <= 4096),
        }
    ]


def case_matrix_free(tmp: Path, threads: int, settings=MATRIX_FREE_SETTINGS) -> list[dict]:
    import pandas as pd

    from coupling_utils.engine.spectra import lanczos_plan, solver_passes

    ex = run_worker("matrix_free", "exact", {"threads": threads}, tmp / "exact")
    dw_ex = pd.read_parquet(tmp / "exact" / "measure" / "depthwise.parquet")
    key = ["prompt", "token", "K", "layer_i", "layer_j"]
    d, L = 576, 30
    model = "SmolLM2-135M-Instruct (embedded:smollm2-135m), last token, 30 blocks"
    none = {"solver": None, "block": None, "steps": None, "oversample": None, "n_iter": None}
    rows = [
        {
            "case": "matrix_free",
            "model": model,
            "method": "exact",
            **none,
            "scope": "all layer pairs",
            "depth_window": None,
            "K": k,
            "solver_passes": None,
            "tile_passes": None,
            "lower_bound_passes": None,
            "block_passes_per_layer": ex["block_passes"],
            "passes_reduction": d / ex["block_passes"],
            "seconds": ex["seconds"],
            "max_abs_coupling_error": 0.0,
            "mean_abs_coupling_error": 0.0,
            "max_abs_m_error": 0.0,
            "peak_rss_mib": ex["peak_rss_mib"],
        }
        for k in MATRIX_FREE_K
    ]
    for kmax, solver, options, window in settings:
        if solver == "lanczos":
            block, steps = lanczos_plan(kmax, d, block=options.get("block"), steps=options.get("steps"))
            opts = {"block": block, "steps": steps}
            name = f"mf_k{kmax}_lanczos_b{block}_s{steps}_w{window}"
        else:
            opts = {"oversample": options.get("oversample", 10), "n_iter": options.get("n_iter", 2)}
            name = f"mf_k{kmax}_subspace_p{opts['oversample']}_q{opts['n_iter']}_w{window}"
        r = run_worker(
            "matrix_free",
            "matrix_free",
            {
                "threads": threads,
                "kmax": kmax,
                "solver": solver,
                "solver_options": opts,
                "depth_window": window,
            },
            tmp / name,
        )
        dw = pd.read_parquet(tmp / name / "measure" / "depthwise.parquet")
        both = dw_ex.merge(dw, on=key, suffixes=("_exact", "_mf"))
        assert len(both) == len(dw)
        both = both[both["layer_i"] != both["layer_j"]]  # the diagonal is 1 by construction
        partners = L - 1 if window is None else 2 * window  # of the middle layers, the most
        s_passes = solver_passes(kmax, solver=solver, d=d, **opts)
        lower = partners * kmax + s_passes
        if r["block_passes"] != lower:
            raise RuntimeError(f"{name}: {r['block_passes']} block passes per layer, expected {lower}")
        sub = both[both["K"] == kmax]
        diff = (sub["coupling_mf"] - sub["coupling_exact"]).abs()
        rows.append(
            {
                "case": "matrix_free",
                "model": model,
                "method": "matrix_free",
                **none,
                "solver": solver,
                **opts,
                "scope": "all layer pairs" if window is None else "adjacent pairs",
                "depth_window": window,
                "K": kmax,
                "solver_passes": s_passes,
                "tile_passes": partners * kmax,
                "lower_bound_passes": lower,
                "block_passes_per_layer": r["block_passes"],
                "passes_reduction": d / r["block_passes"],
                "seconds": r["seconds"],
                "max_abs_coupling_error": float(diff.max()),
                "mean_abs_coupling_error": float(diff.mean()),
                "max_abs_m_error": float((sub["m_mf"] - sub["m_exact"]).abs().max()),
                "peak_rss_mib": r["peak_rss_mib"],
            }
        )
    for row in rows:
        row["target"] = "max coupling error <= 0.01 with >= 5x fewer passes than d"
        row["meets_target"] = bool(
            row["method"] == "matrix_free"
            and row["max_abs_coupling_error"] <= 0.01
            and row["passes_reduction"] >= 5
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from {CASES}")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "data" / "benchmarks"), help="directory for the CSV files")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--opts", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--outdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        result = worker(*args.worker, json.loads(args.opts), Path(args.outdir))
        print(json.dumps(result))
        return 0
    import pandas as pd
    import torch

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {CASES}")
    threads = args.threads or torch.get_num_threads()
    command = "python bench/bench_jacobians.py " + " ".join(argv if argv is not None else sys.argv[1:])
    prov = provenance(command.strip(), threads=threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from coupling_utils.files import atomic_path

    with tempfile.TemporaryDirectory(prefix="bench-jacobians-") as tmp:
        for case in cases:
            fn = {"neox": case_neox, "profile": case_profile, "matrix_free": case_matrix_free}[case]
            df = pd.DataFrame(fn(Path(tmp) / case, threads))
            for key, value in prov.items():
                df[key] = value
            path = out / f"{case}.csv"
            with atomic_path(path) as t:
                df.to_csv(t, index=False, float_format="%.4g")
            with pd.option_context("display.width", 200, "display.max_columns", 20):
                print(df.drop(columns=list(prov)).to_string(index=False))
            print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
