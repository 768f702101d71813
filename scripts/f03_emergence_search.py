"""f03's search: in which small local run does coupling emerge over training, if any?

Trains each configuration of :data:`CONFIGS` (a Pythia-style GPT-NeoX on the Shakespeare corpus,
checkpoints on Pythia's schedule), measures the depth-wise coupling of the last token at every
checkpoint on held-out windows (the validation plays, never trained on), and condenses each curve
into its shape (:func:`coupling_utils.analysis.emergence.growth_summary`: rank correlation with the
step, where the peak lies on the log-step axis, final / early, final / peak). The judgement is
:data:`RULE`, the rule chapter f03 states for "coupling rises progressively".

It writes ``data/f03_search/``: ``runs.csv`` (one row per configuration and K: the spec, cost,
losses, plateau and shape), ``curves.csv`` (coupling per configuration, K and checkpoint),
``losses.csv`` (train/validation loss per configuration and checkpoint) and
``provenance.json`` (the command, commit, machine and library versions of each configuration's
row). Runs and measurements are kept under ``--out`` and reused, so the search resumes and a
configuration can be added later. Run it niced, one configuration at a time, small ones first::

    nice -n 10 .venv/bin/python scripts/f03_emergence_search.py --out /tmp/f03-search --only w64-l4-s1024
    nice -n 10 .venv/bin/python scripts/f03_emergence_search.py --out /tmp/f03-search   # all of CONFIGS
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in the log
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", message="only 2 steps in the layer window")  # 2-block runs: no expodistance
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coupling_utils.analysis import emergence  # noqa: E402
from coupling_utils.analysis.generalization import corpus_prompts  # noqa: E402
from coupling_utils.analysis.verdicts import Rule  # noqa: E402
from coupling_utils.files import atomic_dir, atomic_path, atomic_write_text  # noqa: E402
from coupling_utils.models.corpus import tokenized_corpus  # noqa: E402
from coupling_utils.models.training import LMSpec, load_losses, train_lm, val_loss_plateau  # noqa: E402
from coupling_utils.provenance import versions  # noqa: E402

# f03's rule for "coupling rises progressively" (the chapter states the same rule and applies it to
# this table): judged on the curve's shape from step 1 to the end at K = d/16.
RULE = Rule(
    yes="spearman >= 0.7 and ratio >= 1.5 and peak_position >= 2/3",
    partly="spearman >= 0.3 and ratio > 1 and peak_position >= 1/3",
)

# The common settings of every configuration (those of embedded:pythia-tiny before the search).
BASE = dict(n_heads=4, seq_len=64, batch_size=16, warmup=50, n_linear=8, eval_windows=64, threads=1)

# name -> LMSpec fields: one factor at a time around the first rows (width, depth, steps, learning
# rate, data amount), cheapest first.
CONFIGS: dict[str, dict] = {
    "w64-l2-s1024": dict(d_model=64, n_layers=2, steps=1024, lr=3e-3),
    "w64-l4-s1024": dict(d_model=64, n_layers=4, steps=1024, lr=3e-3),
    "w64-l4-s2048": dict(d_model=64, n_layers=4, steps=2048, lr=3e-3),
    "w64-l4-s4096": dict(d_model=64, n_layers=4, steps=4096, lr=3e-3),
    "w64-l8-s1024": dict(d_model=64, n_layers=8, steps=1024, lr=3e-3),
    "w64-l4-s1024-lr1e-3": dict(d_model=64, n_layers=4, steps=1024, lr=1e-3),
    "w64-l4-s1024-data10": dict(d_model=64, n_layers=4, steps=1024, lr=3e-3, train_tokens=163_840),
    "w128-l4-s1024": dict(d_model=128, n_layers=4, steps=1024, lr=3e-3),  # the default before the search
}

N_WINDOWS, WINDOW_TOKENS, SEED = 8, 32, 0  # held-out windows measured at every checkpoint


def k_values(d_model: int) -> list[int]:
    """K at fixed fractions of the width (d/32 ... d/4), and K = 10 (the old default)."""
    return sorted({max(2, d_model // 32), d_model // 16, d_model // 8, d_model // 4, 10})


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def train(name: str, spec: LMSpec, out: Path) -> tuple[Path, dict]:
    """Train ``spec`` into ``out/runs/<name>`` unless it is there (written atomically: a killed
    run leaves a temporary folder, removed by the next one)."""
    run = out / "runs" / name
    if (run / "done.json").exists():
        return run, json.loads((run / "done.json").read_text())
    for stale in run.parent.glob(f".{name}.*tmp"):  # a killed run's folder (also the old fixed name)
        shutil.rmtree(stale, ignore_errors=True)
    load0 = os.getloadavg()
    with atomic_dir(run) as tmp:
        metrics = train_lm(spec, tmp, progress=False, desc=name)
        metrics["loadavg_before"], metrics["loadavg_after"] = list(load0), list(os.getloadavg())
        (tmp / "done.json").write_text(json.dumps(metrics, indent=2, default=float))
    return run, metrics


def search_one(name: str, out: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    spec = LMSpec(**{**BASE, **CONFIGS[name]})
    t0 = time.perf_counter()
    run, metrics = train(name, spec, out)
    print(
        f"{name}: trained ({metrics['train_seconds']:.0f} s), val loss {metrics['val_loss']:.3f}", flush=True
    )
    ks = k_values(spec.d_model)
    data_tokens = int(tokenized_corpus(spec.vocab_size).train_ids[: spec.train_tokens].size)
    prompts = corpus_prompts(N_WINDOWS, WINDOW_TOKENS, vocab_size=spec.vocab_size, seed=SEED)
    checkpoints = emergence.run_checkpoints(str(run))
    t1 = time.perf_counter()
    settings = emergence.SweepSettings(k=ks, max_tokens=WINDOW_TOKENS)
    sweep = emergence.sweep_checkpoints(
        str(run), checkpoints.revisions, prompts, settings, out=out / "measure"
    )
    measure_s = time.perf_counter() - t1
    first_time = run / "measure_seconds.json"  # a rerun reads stored measurements: keep the first cost
    if first_time.exists():
        measure_s = json.loads(first_time.read_text())["seconds"]
    else:
        first_time.write_text(json.dumps({"seconds": measure_s, "loadavg": list(os.getloadavg())}))
    summary = sweep.summary.assign(model=name)
    above = emergence.share_above_one(sweep.depthwise.assign(model=name), by=["model", "step", "K"])
    curves = summary[["model", "step", "K", "coupling"]].merge(above, on=["model", "step", "K"])
    curves = curves.rename(columns={"model": "config"}).assign(d_model=spec.d_model)
    losses = load_losses(run).assign(config=name)
    plateau = val_loss_plateau(losses)
    growth = emergence.growth_summary(summary, "coupling", by="K", early_step=1)
    step0 = summary[summary.step == 0].set_index("K").coupling
    rows = []
    for g in growth.itertuples(index=False):
        values = g._asdict()
        rows.append(
            {
                "config": name,
                **{
                    f: getattr(spec, f)
                    for f in ("d_model", "n_layers", "steps", "lr", "batch_size", "seq_len")
                },
                "tokens_seen": int(metrics["tokens"]),
                "data_tokens": data_tokens,
                "epochs": round(metrics["tokens"] / data_tokens, 3),
                "n_params": metrics["n_params"],
                "K": int(g.K),
                "K_over_d": g.K / spec.d_model,
                "step0": float(step0.get(g.K)),
                **{
                    c: values[c]
                    for c in (
                        "early",
                        "final",
                        "ratio",
                        "spearman",
                        "peak_step",
                        "peak",
                        "peak_position",
                        "final_vs_peak",
                        "max_drop",
                    )
                },
                "verdict": RULE.judge(values),
                "val_loss": metrics["val_loss"],
                "unigram_entropy": metrics["unigram_entropy"],
                "plateau_drop": plateau["relative_drop"],
                "train_s": round(metrics["train_seconds"], 1),
                "train_cpu_s": round(metrics["cpu_seconds"], 1),
                "measure_s": round(measure_s, 1),
            }
        )
    prov = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": _git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "loadavg_train": [metrics.get("loadavg_before"), metrics.get("loadavg_after")],
        "spec": spec.to_dict(),
        "windows": {"n": N_WINDOWS, "tokens": WINDOW_TOKENS, "seed": SEED, "source": "validation plays"},
        "K": ks,
        "rule": RULE.text,
        "versions": versions(),
        "seconds_total": round(time.perf_counter() - t0, 1),
    }
    return pd.DataFrame(rows), curves, losses, prov


def _merge(path: Path, new: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=new.columns)
    old = old[~old["config"].isin(names)]
    order = {n: i for i, n in enumerate(CONFIGS)}
    both = pd.concat([old, new], ignore_index=True)
    key = both["config"].map(order).fillna(len(order))
    return (
        both.assign(_o=key).sort_values(["_o", *[c for c in ("K", "step") if c in both]]).drop(columns="_o")
    )


def main(argv=None) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="scratch folder for the runs and measurements")
    ap.add_argument("--only", default="", help="comma-separated configuration names (default: all, in order)")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "f03_search", help="where the tables go")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    args.data.mkdir(parents=True, exist_ok=True)
    prov_path = args.data / "provenance.json"
    for name in names:
        runs, curves, losses, prov = search_one(name, args.out)
        for table, frame in (("runs", runs), ("curves", curves), ("losses", losses)):
            path = args.data / f"{table}.csv"
            with atomic_path(path) as tmp:
                _merge(path, frame, [name]).to_csv(tmp, index=False, float_format="%.6g")
        all_prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
        all_prov[name] = prov
        atomic_write_text(prov_path, json.dumps(all_prov, indent=2, default=str))
        main_k = runs.query("K == d_model // 16").iloc[0]
        print(
            f"{name}: K={main_k.K} step0 {main_k.step0:.3f} early {main_k.early:.3f} peak {main_k.peak:.3f} "
            f"@ {main_k.peak_step} (pos {main_k.peak_position:.2f}) final {main_k.final:.3f} rho "
            f"{main_k.spearman:.2f} -> {main_k.verdict}; measured in {main_k.measure_s:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
