"""The GPU check: one prepared run (at most about 8 minutes) on a CUDA machine.

Run from the repository root on a machine with a CUDA GPU and a CUDA build of torch:

    python bench/gpu_check.py               # the real check; writes data/benchmarks/gpu_check.csv
    python bench/gpu_check.py --dry-run     # on any CPU: tiny sizes, says what it would do

What it does:

1. **Every chapter's ``paper`` profile on the stand-in hub** (``tests/support/standin_hub.py``:
   tiny random models under every repo id the profiles name, so no download), with the prompt
   overrides of ``tests/profile_overrides.yaml``, each notebook in its own papermill kernel on
   the GPU: seconds and status per chapter. This checks that the paper path runs on CUDA; the
   stand-in models are tiny, so these seconds are not the paper's cost.
2. **The engine on random-init twins of paper-size configurations**: a Llama-style model with
   d = 4096, 32 blocks, 32 heads, d_ff = 11008 (Llama-2-7B's shape), in bfloat16 and, where
   bitsandbytes is installed, 4-bit (NF4, computed in bfloat16); prompts of T = 16 and 128
   random tokens. For block 15: the authors' reference for one token (d VJPs over all T), the
   one-token path (``one_token.one_token_jacobians``) for the last token and, at T = 128, for the
   last T/16 tokens (the break-even ``one_token_wins`` assumes on an accelerator), the all-token
   sweep (``jacobians.token_jacobians``) and the top-50 spectra; seconds per block, and the
   predicted seconds of a whole 32-block ``measure`` (per block × 32), with peak GPU memory. Each
   path's last-token Jacobian is compared with the reference's (``max_rel_diff_vs_reference``:
   in bfloat16 the two differ by rounding; a wrong cut or slope would differ by order one).
   Beside the spectra ``exact_topk`` chooses, "spectra candidate" rows time other ways to them on
   the first :data:`CANDIDATE_MATRICES` of the same matrices (``gram.gram_topk_batched``; block
   Lanczos in float64, ``spectra.topk_svd``; cuSOLVER's ``gesvdj``), each with the largest
   difference of any coupling value from the chosen one (``max_metric_diff``).
3. **The one-token path on a Falcon-7B-wide block** loaded with SDPA and with eager attention
   (:func:`falcon_rows`): torch has no vmap batching rule for SDPA's backward, so this says what
   that costs on the GPU.

Each step has a time budget (``--budget``, seconds in all); what does not fit is recorded as
"skipped: budget". ``--dry-run`` runs step 2 for real on a tiny configuration (d = 64, 2 blocks,
on the CPU) and lists the notebooks of step 1 without running them, so CI can check the script
in seconds. The CSV (one row per measurement, with its provenance) is what
``book/performance.md`` shows beside the cost model's prediction; a dry run writes its CSV
only where ``--out`` says (never over the committed file by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from _common import provenance  # noqa: E402

OUT = ROOT / "data" / "benchmarks" / "gpu_check.csv"
PAPER = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=11008)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
TS, TINY_TS = (16, 128), (8,)
# the spectra are timed on at most this many of a sweep's T matrices (the last ones): their time is
# per matrix (the cost model divides by ``matrices``), and on an H200 one d = 4096 matrix took about
# a second, so all 128 would take the 4-bit twin's share of the budget
SPECTRA_MATRICES = 8
# the spectra candidates are judged on the first few of those (a Jacobi SVD of a d = 4096 matrix
# may take seconds): their rows say per how many matrices they were timed
CANDIDATE_MATRICES = 4
FALCON = dict(hidden_size=4544, num_attention_heads=71, num_hidden_layers=2)  # Falcon-7B's width
TINY_FALCON = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)


class Budget:
    """Seconds left of the whole run."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def notebook_rows(dry_run: bool, budget: Budget, share: float, jobs: int = 1, emit=None) -> list[dict]:
    """Step 1: each chapter's paper profile on the stand-in hub (listed only, in a dry run).

    ``jobs`` notebooks run at a time (each in its own kernel); ``emit(rows)`` is called after
    each one, so a run stopped from outside keeps what finished."""
    import yaml

    from coupling_utils.pipeline.execution import notebook_paths

    overrides = yaml.safe_load((ROOT / "tests" / "profile_overrides.yaml").read_text())
    notebooks = notebook_paths(ROOT)
    if dry_run:
        for nb in notebooks:
            print(f"would run {nb.stem} at the paper profile on the stand-in hub ({overrides[nb.stem]})")
        return [
            {"step": "paper profile", "name": nb.stem, "status": "dry run: not run", "seconds": None}
            for nb in notebooks
        ]
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from support.standin_hub import write_standin_hub

    from coupling_utils.pipeline.execution import run_notebook

    rows, stop = [], budget.left() * (1 - share)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        hub = Path(tmp) / "hub"
        try:
            write_standin_hub(hub)
        except Exception as exc:  # noqa: BLE001 - recorded; step 2 still runs
            status = f"failed: the stand-in hub could not be written: {type(exc).__name__}: {exc}"[:200]
            print(status, flush=True)
            return [{"step": "paper profile", "name": nb.stem, "status": status} for nb in notebooks]
        os.environ.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1", COUPLING_CACHE=str(Path(tmp) / "cache"))

        def one(nb: Path) -> dict:
            if budget.left() < stop:
                return {"step": "paper profile", "name": nb.stem, "status": "skipped: budget"}
            r = run_notebook(nb, "paper", overrides[nb.stem], Path(tmp) / "out")
            status = r.status if r.status == "ok" else f"{r.status}: {r.error}"[:1000]
            print(f"{nb.stem}: {status} in {r.seconds:.1f} s", flush=True)
            return {"step": "paper profile", "name": nb.stem, "status": status, "seconds": r.seconds}

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in as_completed([pool.submit(one, nb) for nb in notebooks]):
                rows.append(future.result())
                if emit is not None:
                    emit(rows)
    order = [nb.stem for nb in notebooks]
    return sorted(rows, key=lambda r: order.index(r["name"]))


def random_llama(shape: dict, dtype, device: str, quantize: bool):
    """A random-init Llama-style model (``shape``) on ``device``; 4-bit NF4 blocks if ``quantize``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if quantize:
        import bitsandbytes as bnb  # first: a missing bitsandbytes is recorded before the twin is built

    cfg = LlamaConfig(**shape, num_key_value_heads=shape["num_attention_heads"], vocab_size=32000)
    cfg._attn_implementation_internal = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    if quantize:
        for block in model.model.layers:
            for name, lin in list(block.named_modules()):
                if isinstance(lin, torch.nn.Linear):
                    q = bnb.nn.Linear4bit(
                        lin.in_features, lin.out_features, bias=False, compute_dtype=dtype, quant_type="nf4"
                    )
                    q.weight = bnb.nn.Params4bit(lin.weight.data.cpu(), requires_grad=False, quant_type="nf4")
                    parent, _, attr = name.rpartition(".")
                    setattr(block.get_submodule(parent) if parent else block, attr, q.to(device))
    return model


def _timed(fn, device: str):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return out, time.perf_counter() - t0, peak


def _block_rows(model, T, layer, base, budget, device, dry_run, quantize, warm_up) -> list[dict]:
    """Step 2 for one prompt length: each method on block ``layer`` of ``model``, timed, with
    its FLOPs against the GEMM rate (bfloat16 only), and the top-50 spectra of the all-token
    Jacobians (seconds for the last :data:`SPECTRA_MATRICES` of them, and how they were computed)."""
    import torch
    from bench_engine import block_flops, block_params, gemm_rate, one_token_flops

    from coupling_utils.engine.gram import exact_topk
    from coupling_utils.engine.jacobians import reference_jacobians, token_jacobians
    from coupling_utils.engine.one_token import one_token_jacobians

    d = model.config.hidden_size
    P = block_params(model)
    ids = torch.randint(0, 32000, (1, T), generator=torch.Generator().manual_seed(1)).to(device)
    methods = {
        "reference (1 token)": (reference_jacobians, dict(tokens=[T - 1]), block_flops(P, T, d)),
        "one_token (1 token)": (one_token_jacobians, dict(tokens=[T - 1]), one_token_flops(P, T, d)),
        "all_tokens: Jacobians": (token_jacobians, {}, block_flops(P, T, d)),
    }
    if warm_up:  # untimed: CUDA context, cuBLAS handles and kernel selection
        for fn, kw, _ in methods.values():
            fn(model, ids, layer, **kw)
    n_few = T // 16  # the one-token path's break-even with the sweep on an accelerator (one_token_wins)
    if n_few > 1:
        tokens = list(range(T - n_few, T))
        methods[f"one_token ({n_few} tokens)"] = (
            one_token_jacobians,
            dict(tokens=tokens),
            n_few * one_token_flops(P, T, d),
        )
    rate = gemm_rate(T, d, torch.bfloat16, device)
    rows, reference = [], None
    for method, (fn, kw, pass_flops) in methods.items():
        if budget.left() < 30 and not dry_run:
            rows.append({**base, "T": T, "method": method, "status": "skipped: budget"})
            continue
        J, seconds, peak = _timed(lambda fn=fn, kw=kw: fn(model, ids, layer, **kw), device)
        row = {**base, "T": T, "method": method, "status": "ok", "seconds": seconds, "peak_gib": peak}
        last = J[-1].float()  # the last token's J_tt − I, by each method: agreement with the reference
        if method.startswith("reference"):
            reference = last
        elif reference is not None:
            row["max_rel_diff_vs_reference"] = float((last - reference).abs().max() / reference.abs().max())
        if not quantize:  # a 4-bit block's work is not its matmuls' FLOPs
            flops = d * pass_flops
            row.update(flops=flops, flops_per_s=flops / seconds, gemm_flops_per_s=rate)
            row["gemm_fraction"] = row["flops_per_s"] / rate
        rows.append(row)
        if method.startswith("all_tokens"):
            n = min(T, SPECTRA_MATRICES)
            Js = J[-n:].float()
            (top, how), s_seconds, s_peak = _timed(lambda Js=Js: exact_topk(Js, 50), device)
            rows.append(
                {**base, "T": T, "method": f"top-50 spectra ({how}, {n} matrices)", "status": "ok",
                 "seconds": s_seconds, "peak_gib": s_peak, "matrices": n}
            )  # fmt: skip
            if budget.left() > 60 or dry_run:
                m = min(n, CANDIDATE_MATRICES)
                chosen = type(top)(*(x[:m] for x in top))
                rows += _spectra_candidates(Js[:m], chosen, {**base, "T": T}, device)
        print(f"{base['dtype']} T={T} {method}: {seconds:.2f} s", flush=True)
    return rows


def _spectra_candidates(Js, chosen, base: dict, device: str) -> list[dict]:
    """Other ways to the top-50 triplets of the same matrices, timed beside ``exact_topk``'s
    choice (``chosen``) and judged by the largest difference of any coupling value m_K (K = 10,
    30, 50) from it: ``gram.gram_topk_batched`` (a float32 Gram's full eigh refined in float64)
    and, on CUDA, cuSOLVER's Jacobi SVD (``gesvdj``). The spectra are most of a GPU measure; these
    rows say whether ``exact_topk`` should choose otherwise there. Named "spectra candidate" so
    that the cost model (``rates.gpu_rates``) reads only the chosen method's rows."""
    import torch

    from coupling_utils.engine.gram import gram_topk_batched
    from coupling_utils.engine.metric import SVD, coupling_matrix
    from coupling_utils.engine.spectra import topk_svd

    def gesvdj():
        U, S, Vh = torch.linalg.svd(Js, full_matrices=False, driver="gesvdj")
        return SVD(U[..., :50], S[..., :50], Vh[..., :50, :])

    k_max = min(50, Js.shape[-1])
    candidates = {
        "gram_topk_batched (float32 Gram, full eigh, float64 refinement)": lambda: gram_topk_batched(
            Js, k_max
        )
    }
    # block Lanczos on the formed matrices in float64 (GEMMs and small QRs only), 90 steps of
    # ``spectra.topk_svd``'s default block: its default 45 left a coupling value 5e-3 off on a flat
    # spectrum at d = 576 where 90 came within 3e-7, as the full SVD (random U diag(σ) Vᵀ, ad hoc)
    candidates["block Lanczos (spectra.topk_svd, float64, 90 steps)"] = lambda: SVD(
        *(x.float() for x in topk_svd(Js.double(), k_max, "lanczos", steps=90))
    )
    if device == "cuda":
        candidates["full SVD, cuSOLVER gesvdj"] = gesvdj
    rows, n = [], Js.shape[0]
    for label, fn in candidates.items():
        row = {**base, "method": f"spectra candidate: {label}, {n} matrices", "matrices": n}
        try:
            top, seconds, peak = _timed(fn, device)
        except Exception as exc:  # noqa: BLE001 - recorded: a driver this torch or GPU lacks
            rows.append({**row, "status": f"failed: {type(exc).__name__}: {exc}"[:1000]})
            continue
        diff = max(
            float((coupling_matrix(Js, k, svds=top) - coupling_matrix(Js, k, svds=chosen)).abs().max())
            for k in (10, 30, 50)
            if k <= k_max
        )
        rows.append({**row, "status": "ok", "seconds": seconds, "peak_gib": peak, "max_metric_diff": diff})
        print(
            f"{base['dtype']} T={base['T']} {row['method']}: {seconds:.2f} s, metric diff {diff:.1e}",
            flush=True,
        )
    return rows


def engine_rows(dry_run: bool, budget: Budget) -> list[dict]:
    """Step 2: the engine's methods on one block of each paper-size twin, per dtype and T.

    Each method runs once untimed at the smallest T first (CUDA context, cuBLAS handles and
    kernel selection are not the method's cost). FLOPs are counted as ``bench/bench_engine.py``
    counts them (d passes of the block's forward FLOPs; one token's forward against a T-token
    cache for the one-token path), beside the GEMM rate measured in the same run."""
    import torch

    device = "cpu" if dry_run else "cuda"
    shape, ts = (TINY, TINY_TS) if dry_run else (PAPER, TS)
    layer, L = shape["num_hidden_layers"] // 2, shape["num_hidden_layers"]
    variants = [("bfloat16", False), ("4bit", True)]
    rows = []
    for label, quantize in variants:
        base = {"step": "engine", "name": f"Llama-style d={shape['hidden_size']}, {L} blocks", "dtype": label}
        if budget.left() < 60 and not dry_run:
            rows.append({**base, "status": "skipped: budget"})
            continue
        try:
            model = random_llama(shape, torch.bfloat16, device, quantize)
        except Exception as exc:  # noqa: BLE001 - recorded: bitsandbytes missing or unusable here
            rows.append({**base, "status": f"skipped: {type(exc).__name__}: {exc}"[:200]})
            print(rows[-1]["status"], flush=True)
            continue
        for i, T in enumerate(ts):
            rows += _block_rows(model, T, layer, base, budget, device, dry_run, quantize, warm_up=i == 0)
        model = None  # free the twin before the next one
        if device == "cuda":
            torch.cuda.empty_cache()
    for r in rows:
        if r.get("seconds") is not None and r.get("method"):
            r["measure_seconds_predicted"] = r["seconds"] * L  # every block, one prompt
    return rows


def falcon_rows(dry_run: bool, budget: Budget) -> list[dict]:
    """The one-token path on a Falcon-7B-wide block (random init, 2 blocks, multi-query, parallel
    attention and MLP; bfloat16, T = 128), loaded with SDPA attention and with eager attention.

    A Falcon keeps its own attention in one-token mode, and torch has no vmap batching rule for
    SDPA's backward, so the d products of one token may run one by one there (torch warns "There
    is a performance drop"); on a CPU at d = 256 it cost nothing measurable (stop note 47). These
    rows time both, say whether torch warned, and give the two Jacobians' largest difference."""
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, FalconConfig

    from coupling_utils.engine.one_token import one_token_jacobians

    device = "cpu" if dry_run else "cuda"
    shape, T = (TINY_FALCON, 8) if dry_run else (FALCON, 128)
    name = f"Falcon-style d={shape['hidden_size']}, {shape['num_hidden_layers']} blocks"
    base = {"step": "engine", "name": name, "dtype": "bfloat16", "T": T}
    if budget.left() < 60 and not dry_run:
        return [{**base, "status": "skipped: budget"}]
    cfg = FalconConfig(**shape, multi_query=True, parallel_attn=True, bias=False, vocab_size=65024)
    ids = torch.randint(0, 65024, (1, T), generator=torch.Generator().manual_seed(1)).to(device)
    rows, first = [], None
    for attention in ("sdpa", "eager"):
        row = {**base, "method": f"one_token (1 token), Falcon with {attention} attention"}
        try:
            torch.manual_seed(0)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(
                    cfg, dtype=torch.bfloat16, attn_implementation=attention
                )
            model.eval().requires_grad_(False)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                one_token_jacobians(model, ids, 0, [T - 1])  # untimed: kernels and handles
                J, seconds, peak = _timed(lambda m=model: one_token_jacobians(m, ids, 0, [T - 1]), device)
        except Exception as exc:  # noqa: BLE001 - recorded: this transformers' Falcon or its attention
            rows.append({**row, "status": f"failed: {type(exc).__name__}: {exc}"[:1000]})
            print(rows[-1]["status"], flush=True)
            continue
        slow = any("performance drop" in str(w.message) for w in seen)
        row.update(
            status="ok",
            seconds=seconds,
            peak_gib=peak,
            note="torch warned of a performance drop (no vmap batching rule)" if slow else "",
        )
        if first is None:
            first = J
        else:
            row["max_rel_diff_vs_reference"] = float((J - first).abs().max() / first.abs().max())
        rows.append(row)
        print(
            f"Falcon {attention} T={T} one token: {seconds:.2f} s{' (vmap fallback warned)' if slow else ''}",
            flush=True,
        )
        model = None
    return rows


STEPS = {"notebooks": "paper profile", "engine": "engine"}


class BadOut(Exception):
    """``--out`` cannot be written, or its earlier rows cannot be read: said before the run."""


def kept_rows(out: Path | None, step: str):
    """The rows of the steps not run now, from ``out`` as written by an earlier run (each row
    keeps its own provenance), so one step can be rerun without losing the other's. Checks
    first that ``out``'s folder can be written (a run must not end on a file it cannot write)."""
    import pandas as pd

    if out is None:
        return None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}."):
            pass
    except OSError as exc:
        raise BadOut(
            f"--out {out}: its folder cannot be written ({exc.strerror}); pass a writable --out"
        ) from exc
    if step == "all" or not out.exists():
        return None
    try:
        df = pd.read_csv(out)
        return df[df["step"] != STEPS[step]]
    except (ValueError, KeyError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise BadOut(
            f"--out {out}: not a table written by this script ({type(exc).__name__}: {exc}), so the other "
            f"step's rows cannot be kept; pass another --out, or --step all to write a new one"
        ) from exc


def write_table(kept, rows: list[dict], prov: dict, out: Path | None):
    """The table of ``rows`` (with this run's provenance) after ``kept``; written to ``out``
    atomically when given."""
    import pandas as pd

    df = pd.DataFrame(rows)
    for key, value in prov.items():
        df[key] = value
    if kept is not None and len(kept):
        df = pd.concat([df, kept], ignore_index=True)
        df = df.sort_values(
            "step", key=lambda c: c.map({v: i for i, v in enumerate(STEPS.values())}), kind="stable"
        )
    if out is not None:
        from coupling_utils.files import atomic_path

        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as t:
            df.to_csv(t, index=False, float_format="%.4g")
    return df


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="on a CPU: tiny sizes, notebooks listed only")
    ap.add_argument(
        "--out", default=None, help=f"the CSV (default {OUT.relative_to(ROOT)}; none in a dry run)"
    )
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    ap.add_argument(
        "--step",
        choices=["all", *STEPS],
        default="all",
        help="run one step only; the other step's rows in --out are kept (default all)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="notebooks run at a time in step 1 (default 1)")
    ap.add_argument("--notebook-share", type=float, default=0.5, help="share of the budget for step 1")
    args = ap.parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device is visible to torch (torch.cuda.is_available() is False). "
            "Run it on a machine with a CUDA GPU and a CUDA build of torch, or pass --dry-run to "
            "check the script on this CPU.",
            file=sys.stderr,
        )
        return 2
    command = ("python bench/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    prov = provenance(
        command, device="dry run on a CPU (tiny sizes: not a GPU measurement)" if args.dry_run else gpu
    )
    budget = Budget(args.budget)
    out = Path(args.out) if args.out else (None if args.dry_run else OUT)
    try:
        kept = kept_rows(out, args.step)
    except BadOut as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2

    def emit(rows: list[dict]):
        if out is not None:
            write_table(kept, rows, prov, out)

    rows = []
    if args.step in ("all", "notebooks"):
        rows += notebook_rows(args.dry_run, budget, args.notebook_share, args.jobs, emit)
    if args.step in ("all", "engine"):
        rows += engine_rows(args.dry_run, budget)
        rows += falcon_rows(args.dry_run, budget)
    df = write_table(kept, rows, prov, out)
    if out is not None:
        print(f"wrote {out}")
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 12, "display.max_colwidth", 50):
        print(df.drop(columns=[c for c in prov if c in df]).to_string(index=False))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: the CSV (written whole, after each notebook) holds what finished
        print("gpu_check: interrupted; --out holds the notebooks that finished, if any", file=sys.stderr)
        sys.exit(130)
