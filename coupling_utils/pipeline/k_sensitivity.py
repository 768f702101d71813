"""``coupling-book k-sensitivity``: measure the K/d sensitivity curve behind the book's one K/d.

Each model and its random-init twin are measured once, with every K of ``k_policy.GRID`` at once
(one SVD per block gives every K), through the chapters' own planning: ``measurement.plan`` with
``Loads`` of both weights for the language models, ``vision_transformers.vit_jobs`` (its digits,
its CLS token) for the ViT. The rows, one per model, prompt (or image) and K/d, are the
trained model's and its twin's coupling (mean of ``1 − m_K²`` over off-diagonal block pairs of the
last token, or the CLS token) and their difference; they go to ``data/k_sensitivity.csv``, which
the method page draws and ``k_policy.choose`` reads. An embedded family is measured member by
member (``k_policy.voice`` lets the family speak once).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from coupling_utils.analysis import k_policy
from coupling_utils.files import atomic_write_text, cache_dir, data_dir

__all__ = ["SensitivitySettings", "sensitivity_jobs", "measure_sensitivity", "add_k_sensitivity_command"]

LANGUAGE_MODELS = ("embedded:smollm2-135m", "embedded:minilm-l6", "embedded:pythia-tiny")
LANGUAGE_FAMILIES = ("embedded:lm-family", "embedded:lm-training-family")
VITS = ("embedded:vit-mnist",)
VIT_FAMILIES = ("embedded:vit-family",)


def members(families) -> tuple[str, ...]:
    """Every member of the embedded families, as ``embedded:FAMILY/MEMBER`` refs."""
    from coupling_utils.models import zoo

    return tuple(
        f"{zoo.PREFIX}{name}/{m}"
        for name in (f.removeprefix(zoo.PREFIX) for f in families)
        for m in zoo.REGISTRY[name].members()
    )


@dataclass(frozen=True)
class SensitivitySettings:
    """What the curve is measured on: the language models (a training run at its last
    checkpoint; every member of the embedded LM families) on ``n_prompts`` of the prompt set and
    the demo prompt cut to ``max_tokens``; the ViTs (the MNIST ViT and every member of the ViT
    family) on ``n_images`` test digits; twins drawn with ``init_seed``; the language models' last
    block as f01 and f03 read it (``last_block``), the ViTs' as f04 does (the block alone)."""

    models: tuple[str, ...] = LANGUAGE_MODELS + members(LANGUAGE_FAMILIES)
    vits: tuple[str, ...] = VITS + members(VIT_FAMILIES)
    n_prompts: int = 6
    max_tokens: int = 16
    n_images: int = 8
    init_seed: int = 100
    last_block: str = "final_norm"
    dtype: str = "float32"
    grid: tuple[float, ...] = field(default=k_policy.GRID)


def _last_revision(ref: str) -> str | None:
    """The last checkpoint of a local training run (None for a pretrained model)."""
    from coupling_utils.models.training import list_revisions
    from coupling_utils.models.zoo import resolve

    path = Path(resolve(ref, progress=False)) if ref.startswith("embedded:") else Path(ref)
    revisions = list_revisions(path) if path.is_dir() else []
    return revisions[-1] if revisions else None


def _ks(ref: str, revision: str | None, grid) -> tuple[int, dict[float, int]]:
    from coupling_utils.analysis.emergence import model_width

    d = model_width(ref, revision)
    if d is None:
        raise ValueError(
            f"the width of {ref} cannot be read from its config; prepare it first (coupling-book zoo prepare)"
        )
    return d, k_policy.grid_ks(d, grid)


def sensitivity_jobs(
    s: SensitivitySettings, root: Path
) -> dict[str, tuple[list, int, dict[float, int], str | None]]:
    """``{model: (jobs, d, {K/d: K}, revision)}``: each model and its twin, every grid K at once."""
    from coupling_utils.analysis import vision_transformers as vt
    from coupling_utils.analysis.data import load_prompts
    from coupling_utils.measurement import Loads, Settings, plan
    from coupling_utils.measurement.jobs import WEIGHTS

    table = load_prompts(n=s.n_prompts, include_demo=True)
    texts = dict(zip(table["id"], table["text"]))
    out = {}
    for ref in s.models:
        rev = _last_revision(ref)
        d, ks = _ks(ref, rev, s.grid)
        settings = Settings(k=sorted(set(ks.values())), last_block=s.last_block, max_tokens=s.max_tokens)
        loads = Loads(revisions=[rev] if rev else None, weights=WEIGHTS, seed=s.init_seed, dtype=s.dtype)
        out[ref] = (plan({ref: ref}, texts, settings, loads=loads, root=root), d, ks, rev)
    for ref in s.vits:
        rev = _last_revision(ref)
        d, ks = _ks(ref, rev, s.grid)
        setup = vt.ViTSetup(n_images=s.n_images, token="cls", dtype=s.dtype, cache=root)
        jobs = vt.vit_jobs({ref: ref}, setup, k=sorted(set(ks.values())), twins=True, init_seed=s.init_seed)
        out[ref] = (jobs, d, ks, rev)
    return out


def _rows(collected, ref: str, d: int, ks: dict[float, int], revision: str | None) -> pd.DataFrame:
    """One row per prompt and K/d: trained and twin coupling, paired by prompt."""
    from coupling_utils.measurement import coupling_summary
    from coupling_utils.measurement.jobs import WEIGHTS

    if collected.missing:
        raise RuntimeError(f"measuring {ref} failed:\n{collected.report()}")
    depth = collected.table("depthwise")
    frames = []
    for r, k in ks.items():
        by = {
            w: coupling_summary(
                depth[depth["weights"] == w].drop(columns="weights"), "offdiag", k, per_prompt=True
            )
            for w in WEIGHTS
        }
        pair = pd.DataFrame({"coupling_trained": by["trained"], "coupling_twin": by["random init"]})
        frames.append(pair.rename_axis("prompt").reset_index().assign(k_over_d=r, K=k))
    rows = pd.concat(frames, ignore_index=True)
    rows["excess"] = rows["coupling_trained"] - rows["coupling_twin"]
    return rows.assign(model=ref, revision=revision or "", d_model=d)


def measure_sensitivity(s: SensitivitySettings | None = None, *, echo=print) -> pd.DataFrame:
    """Measure every model of ``s`` and its twin; the rows of ``data/k_sensitivity.csv``."""
    from coupling_utils.measurement import Options, collect
    from coupling_utils.provenance import code_fingerprint

    s = s or SensitivitySettings()
    root = cache_dir("k_sensitivity")
    day = time.strftime("%Y-%m-%d", time.gmtime())
    stamp = f"coupling-book k-sensitivity, code {code_fingerprint()['fingerprint']}, {day}"
    frames = []
    for ref, (jobs, d, ks, rev) in sensitivity_jobs(s, root).items():
        t0 = time.perf_counter()
        done = collect(jobs, Options(on_error="record"), desc=ref)
        frames.append(_rows(done, ref, d, ks, rev))
        echo(f"{ref} (d = {d}): {len(jobs)} measurements in {time.perf_counter() - t0:.0f} s")
    rows = pd.concat(frames, ignore_index=True)
    rows["input"] = ["images" if m in s.vits else "prompts" for m in rows["model"]]
    rows["last_block"] = ["block" if m in s.vits else s.last_block for m in rows["model"]]
    rows["init_seed"] = s.init_seed
    rows["source"] = stamp
    return rows[[c.name for c in _schema().columns]]


def _schema():
    from coupling_utils.analysis.data import SCHEMAS

    return SCHEMAS["k_sensitivity.csv"]


MNIST_TEST = 10_000  # digits in the test split of the pinned MNIST file (models.vit_training)


def add_k_sensitivity_command(subparsers) -> argparse.ArgumentParser:
    """Add ``k-sensitivity`` (measure the curve, write the CSV, print the chosen K/d)."""
    from coupling_utils.pipeline.cli_paths import path_option

    p = subparsers.add_parser(
        "k-sensitivity",
        help="measure the K/d sensitivity curve (data/k_sensitivity.csv) and print the chosen K/d",
    )
    p.add_argument(
        "--out", type=path_option, help="the CSV to write (default: data/k_sensitivity.csv of the book)"
    )
    p.add_argument(
        "--n-prompts",
        type=int,
        default=SensitivitySettings.n_prompts,
        help="prompts of the prompt set (0: only the demo prompt)",
    )
    p.add_argument(
        "--n-images",
        type=int,
        default=SensitivitySettings.n_images,
        help=f"test digits for the ViT (1 to {MNIST_TEST})",
    )
    p.set_defaults(func=run_k_sensitivity)
    return p


def _checked_options(args) -> Path:
    """Refuse bad options before any model is measured; the CSV to write."""
    from coupling_utils.chapters.checks import ParameterError
    from coupling_utils.pipeline.cli_paths import check_target

    default = SensitivitySettings
    if args.n_prompts < 0:
        raise ParameterError(
            f"--n-prompts {args.n_prompts} is negative: give 0 or more (default {default.n_prompts})"
        )
    if not 1 <= args.n_images <= MNIST_TEST:
        raise ParameterError(
            f"--n-images {args.n_images} is out of range: give 1 to {MNIST_TEST} (default {default.n_images})"
        )
    if args.out is None:
        return data_dir() / "k_sensitivity.csv"
    return check_target(args.out, "--out", "file", "k_sensitivity.csv")


def run_k_sensitivity(args) -> int:
    """Run ``k-sensitivity``; returns the exit status."""
    out = _checked_options(args)
    s = SensitivitySettings(n_prompts=args.n_prompts, n_images=args.n_images)
    rows = measure_sensitivity(s)
    atomic_write_text(out, rows.to_csv(index=False))
    try:
        decision = k_policy.decide(k_policy.curve(rows))
    except k_policy.NoChoiceError as exc:
        print(f"wrote {out} ({len(rows)} rows); {exc}")
        return 0
    print(f"wrote {out} ({len(rows)} rows); choose() gives K/d = {decision.k_over_d:g}")
    print(decision.share.to_string())
    if decision.left_out:
        print(f"left out (largest excess not clear of 0): {', '.join(decision.left_out)}")
    return 0
