"""Coupling against generalisation: one coupling number per model, and how well it predicts scores.

The paper's Fig. 1(a) sets one scalar per model ("coupling") against its Open LLM Leaderboard
score and finds a tighter fit than parameter count, depth or width give. This module does the
two steps for any set of models:

- :func:`family_coupling`: measure each model (:func:`coupling_utils.measurement.measure`) on the
  same prompts and condense its depth-wise coupling into one number
  (:func:`coupling_utils.measurement.coupling_summary`; the paper's aggregation is not published,
  so ``how`` and ``k`` are the reader's choice), with its spread over prompts.
- :func:`predictor_comparison`: R², slope, p and rank correlations of a score on each
  predictor (:func:`coupling_utils.analysis.stats.compare_predictors`, on the same rows), plus seeded
  bootstrap confidence intervals of R² and Spearman's rho, which matter with few models.
- :func:`r2_difference`: whether one predictor beats another on the same models (a paired
  bootstrap of the R² difference), and :func:`agreement`, the status verdict ("yes" /
  "partly" / "no") such an interval supports.

:func:`corpus_prompts` cuts held-out text (validation plays the local models never saw) into
prompts.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

__all__ = [
    "corpus_prompts",
    "family_coupling",
    "FamilyCoupling",
    "predictor_comparison",
    "best_predictor",
    "r2_difference",
    "agreement",
]

Predictor = str | Callable[[pd.DataFrame], pd.Series]


def corpus_prompts(n: int, n_tokens: int, *, vocab_size: int = 2048, seed: int = 0) -> dict[str, str]:
    """``n`` prompts of about ``n_tokens`` tokens from the held-out plays of the training corpus.

    The local language models (``embedded:lm-family``, ``embedded:pythia-*``) are trained on the
    other plays, so these are unseen text in their own domain. Windows start at seeded random
    positions of the validation split and are decoded back to text, so each model tokenises them
    with its own tokenizer. Returns ``{"val-<start>": text}``.
    """
    from coupling_utils.models.corpus import tokenized_corpus

    if n < 1 or n_tokens < 2:
        raise ValueError(f"need n >= 1 prompts of n_tokens >= 2 tokens, got n={n}, n_tokens={n_tokens}")
    tc = tokenized_corpus(vocab_size)
    ids = tc.val_ids
    if len(ids) < n_tokens + 1:
        raise ValueError(f"the validation split has only {len(ids)} tokens; ask for fewer than that")
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(len(ids) - n_tokens, size=n, replace=False))
    return {f"val-{int(s)}": tc.tokenizer.decode(ids[s : s + n_tokens].tolist()) for s in starts}


def _size(lm) -> dict[str, Any]:
    """Depth, width and parameter count of a LoadedModel or a bare Hugging Face model."""
    model = getattr(lm, "model", lm)
    cfg = getattr(model, "config", None)
    n_layers = getattr(lm, "n_layers", None)
    d_model = getattr(lm, "d_model", None)
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        n_layers = n_layers or getattr(cfg, attr, None)
    for attr in ("hidden_size", "n_embd", "d_model"):
        d_model = d_model or getattr(cfg, attr, None)
    n_params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None
    return {
        key: None if v is None else int(v)
        for key, v in {"n_layers": n_layers, "d_model": d_model, "n_params": n_params}.items()
    }


def _digest(obj) -> str:
    """A stable hash of prompts and settings (strings, numbers, lists, dicts and tensors)."""
    h = hashlib.sha256()

    def feed(o):
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous()
            h.update(f"T{tuple(t.shape)}{t.dtype}".encode())
            h.update(t.numpy().tobytes())
        elif isinstance(o, Mapping):
            h.update(b"{")
            for key in sorted(o, key=str):
                feed(str(key))
                feed(o[key])
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for v in o:
                feed(v)
            h.update(b"]")
        else:
            h.update(repr(o).encode())

    feed(obj)
    return h.hexdigest()[:16]


def _fingerprint(ref: str) -> str:
    """What identifies a model reference's weights: the zoo entry's keyed path, a local path's
    config time, or the hub id itself."""
    if ref.startswith("embedded:"):
        from coupling_utils.models import zoo

        return str(zoo.entry_path(ref))
    path = Path(ref).expanduser()
    if path.exists():
        config = path / "config.json" if path.is_dir() else path
        return f"{path.resolve()}@{config.stat().st_mtime_ns if config.exists() else 0}"
    return ref


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-60:]


@dataclass
class FamilyCoupling:
    """What :func:`family_coupling` measured: per model, per (model, prompt), per (model, block pair)."""

    summary: pd.DataFrame  # one row per model
    per_prompt: pd.DataFrame  # model, prompt, coupling
    depthwise: pd.DataFrame  # model, layer_i, layer_j, m, coupling (K = k, mean over prompts and tokens)


SUMMARY_COLUMNS = [
    "model",
    "coupling",
    "coupling_sd",
    "coupling_se",
    "n_prompts",
    "K",
    "how",
    "n_layers",
    "d_model",
    "n_params",
    "log10_params",
    "seconds",
    "cached",
    "note",
]


def _load_spec(ref) -> dict | None:
    """``load_model`` keyword arguments for a model reference, or None for a loaded model."""
    if isinstance(ref, str):
        return {"name_or_path": ref}
    if isinstance(ref, Mapping):
        if "name_or_path" not in ref:
            raise ValueError(
                f"a model given as a mapping needs 'name_or_path' (load_model's arguments), got {dict(ref)}"
            )
        return dict(ref)
    return None


def family_coupling(
    models: Sequence[Any] | Mapping[str, Any],
    prompts,
    *,
    k: int = 10,
    how: str = "offdiag",
    tokens="last",
    layers=None,
    method: str = "exact",
    dtype: str = "float32",
    max_tokens: int | None = None,
    load: Callable[..., Any] | None = None,
    echo: Callable[[str], None] | None = None,
    cache: str | Path | None = None,
    **measure_kwargs,
) -> FamilyCoupling:
    """One coupling number per model, measured the same way on the same prompts.

    ``models``: a list, or a mapping ``{name: model}``, of model references (``embedded:...``,
    local directories, hub ids), of ``load_model`` keyword dicts (``{"name_or_path": ...,
    "revision": "step64", "random_init": True}``), or of already loaded models. References are
    loaded with ``load_model(..., dtype=dtype)`` (or ``load(**kwargs)``). ``prompts``: what
    :func:`~coupling_utils.measurement.measure` takes. The scalar is ``coupling_summary(depthwise,
    how, k)``: the mean of ``1 − m_K²`` over layer pairs (``"offdiag"``: all pairs of different
    blocks; ``"adjacent"``: neighbouring blocks) and over tokens, each prompt counting once.

    ``cache``: a directory where each referenced model's measurement is kept (keyed by the
    model's identity, the prompts and every setting), so a rerun reads it instead of
    measuring again; loaded model objects are always measured.

    Returns a :class:`FamilyCoupling`: ``summary`` with one row per model (``model, coupling,
    coupling_sd, coupling_se, n_prompts, K, how, n_layers, d_model, n_params, log10_params,
    seconds, cached, note``; a single-block model gets NaN coupling and a note), ``per_prompt``
    and the mean ``depthwise`` matrix of each model. Models are loaded one at a time and
    released before the next.
    """
    from coupling_utils.files import atomic_write_text
    from coupling_utils.measurement import Measurement, measure

    def label(i, m):
        if isinstance(m, str):
            return m
        if isinstance(m, Mapping):
            return "@".join(str(v) for v in (m.get("name_or_path"), m.get("revision")) if v)
        return getattr(m, "name", None) or f"model-{i}"

    items = (
        list(models.items())
        if isinstance(models, Mapping)
        else [(label(i, m), m) for i, m in enumerate(models)]
    )
    if not items:
        raise ValueError("models is empty; pass at least one model")
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    settings = {
        "k": [int(k)],
        "tokens": tokens,
        "layers": None if layers is None else list(layers),
        "method": method,
        "max_tokens": max_tokens,
        **measure_kwargs,
    }
    rows, per_prompt, depthwise = [], [], []
    for name, ref in items:
        start = time.perf_counter()
        spec = _load_spec(ref)
        out = None
        if cache is not None and spec is not None:
            ident = {**spec, "name_or_path": _fingerprint(spec["name_or_path"]), "dtype": dtype}
            key = _digest({"model": ident, "settings": settings, "prompts": prompts})
            out = Path(cache) / f"{_slug(str(spec['name_or_path']))}-{key}"
        cached = out is not None and (out / "provenance.json").exists() and (out / "size.json").exists()
        if cached:
            m = Measurement.load(out)
            size = json.loads((out / "size.json").read_text())
        else:
            if spec is None:
                lm = ref
            elif load is not None:
                lm = load(**spec)
            else:
                from coupling_utils.models.loading import load_model

                lm = load_model(**{"dtype": dtype, **spec})
            size = _size(lm)
            if layers is None and (size["n_layers"] or 0) < 2:  # no pair of blocks to compare
                rows.append(
                    {
                        "model": name,
                        "coupling": float("nan"),
                        "n_prompts": 0,
                        "K": int(k),
                        "how": how,
                        **size,
                        "log10_params": float(np.log10(size["n_params"]))
                        if size["n_params"]
                        else float("nan"),
                        "seconds": time.perf_counter() - start,
                        "cached": False,
                        "note": "a single block: no pair of blocks to compare",
                    }
                )
                if echo is not None:
                    echo(f"{name}: a single block, so no coupling across depth (left out)")
                continue
            m = measure(lm, prompts, out=out, **settings)
            if out is not None:
                atomic_write_text(out / "size.json", json.dumps(size))
            del lm
        by_prompt = m.summary(how=how, k=int(k), per_prompt=True)
        seconds = time.perf_counter() - start
        n = len(by_prompt)
        sd = float(by_prompt.std(ddof=1)) if n > 1 else float("nan")
        rows.append(
            {
                "model": name,
                "coupling": float(by_prompt.mean()),
                "coupling_sd": sd,
                "coupling_se": sd / np.sqrt(n) if n > 1 else float("nan"),
                "n_prompts": n,
                "K": int(k),
                "how": how,
                **size,
                "log10_params": float(np.log10(size["n_params"])) if size["n_params"] else float("nan"),
                "seconds": seconds,
                "cached": cached,
                "note": "",
            }
        )
        per_prompt.append(
            pd.DataFrame(
                {
                    "model": name,
                    "prompt": by_prompt.index.astype(str),
                    "coupling": by_prompt.to_numpy(dtype=float),
                }
            )
        )
        dw = m.depthwise[m.depthwise["K"] == int(k)]
        depthwise.append(
            dw.groupby(["layer_i", "layer_j"], as_index=False)[["m", "coupling"]].mean().assign(model=name)
        )
        if echo is not None:
            echo(
                f"{name}: coupling {rows[-1]['coupling']:.4f} over {n} prompt(s), {seconds:.1f} s"
                + (" (cached)" if cached else "")
            )
        del m
    per_prompt = (
        pd.concat(per_prompt, ignore_index=True)
        if per_prompt
        else pd.DataFrame(columns=["model", "prompt", "coupling"])
    )
    depthwise = (
        pd.concat(depthwise, ignore_index=True)
        if depthwise
        else pd.DataFrame(columns=["layer_i", "layer_j", "m", "coupling", "model"])
    )[["model", "layer_i", "layer_j", "m", "coupling"]]
    return FamilyCoupling(pd.DataFrame(rows).reindex(columns=SUMMARY_COLUMNS), per_prompt, depthwise)


def _values(df: pd.DataFrame, x: Predictor) -> pd.Series:
    return pd.to_numeric(pd.Series(x(df), index=df.index) if callable(x) else df[x], errors="coerce")


def predictor_comparison(
    df: pd.DataFrame,
    y: str,
    predictors: Mapping[str, Predictor],
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """How well each predictor explains ``y``: OLS R², slope, p, rank correlations, bootstrap CIs.

    All predictors are fitted on the same rows (complete for ``y`` and every predictor), so
    their R² compare. Adds percentile-bootstrap intervals (``n_resamples`` resamples of the
    rows, seeded) for R² and Spearman's rho: ``r2_ci_low/high``, ``spearman_ci_low/high``.
    A predictor that takes one value only on these rows (e.g. depth in a family of equally deep
    models) gets NaN statistics and a ``note`` instead of an error.
    """
    from coupling_utils.analysis.stats import bootstrap_ci, compare_predictors

    if not predictors:
        raise ValueError("predictor_comparison needs at least one predictor")
    cols = {label: _values(df, x) for label, x in predictors.items()}
    work = pd.DataFrame(cols, index=df.index).astype(float)
    work[y] = pd.to_numeric(df[y], errors="coerce").astype(float)
    work = work[np.isfinite(work.to_numpy()).all(axis=1)].reset_index(drop=True)
    if len(work) < 3:
        raise ValueError(f"need at least 3 models with {y!r} and every predictor, got {len(work)}")
    usable = [label for label in predictors if work[label].nunique() > 1]
    rows = []
    if usable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant resamples: scipy warns, the bootstrap skips them
            table = compare_predictors(work, y, {label: label for label in usable}, level=level)
            for label in usable:

                def stat(d: pd.DataFrame, label=label) -> dict[str, float]:
                    x, v = d[label].to_numpy(), d[y].to_numpy()
                    if np.ptp(x) == 0 or np.ptp(v) == 0:
                        return {"r2": np.nan, "spearman": np.nan}
                    r = np.corrcoef(x, v)[0, 1]
                    rho = pd.Series(x).rank().corr(pd.Series(v).rank())
                    return {"r2": r * r, "spearman": rho}

                ci = bootstrap_ci(
                    work[[label, y]], stat, n_resamples=n_resamples, level=level, seed=seed
                ).set_index("statistic")
                row = table[table.predictor == label].iloc[0].to_dict()
                row.update(
                    {
                        "r2_ci_low": ci.loc["r2", "ci_low"],
                        "r2_ci_high": ci.loc["r2", "ci_high"],
                        "spearman_ci_low": ci.loc["spearman", "ci_low"],
                        "spearman_ci_high": ci.loc["spearman", "ci_high"],
                        "note": "",
                    }
                )
                rows.append(row)
    for label in predictors:
        if label not in usable:
            rows.append(
                {
                    "predictor": label,
                    "y": y,
                    "n": len(work),
                    "level": level,
                    "note": f"constant over these {len(work)} models: no fit",
                }
            )
    order = {label: i for i, label in enumerate(predictors)}
    columns = [
        "predictor",
        "y",
        "n",
        "r2",
        "r2_ci_low",
        "r2_ci_high",
        "slope",
        "slope_ci_low",
        "slope_ci_high",
        "p",
        "spearman",
        "spearman_ci_low",
        "spearman_ci_high",
        "spearman_p",
        "kendall",
        "kendall_p",
        "level",
        "note",
    ]
    out = pd.DataFrame(rows).reindex(columns=columns)
    return out.sort_values("predictor", key=lambda s: s.map(order)).reset_index(drop=True)


def best_predictor(comparison: pd.DataFrame) -> str:
    """The predictor with the highest R² in a :func:`predictor_comparison` table."""
    fitted = comparison.dropna(subset=["r2"])
    if fitted.empty:
        raise ValueError("no predictor could be fitted")
    return str(fitted.loc[fitted["r2"].idxmax(), "predictor"])


def _r2(x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1] ** 2)


def r2_difference(
    df: pd.DataFrame,
    y: str,
    a: Predictor,
    b: Predictor,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """``R²(y ~ a) − R²(y ~ b)`` on the same rows, with a paired percentile-bootstrap interval.

    Both fits see the same resampled models, so the interval says whether ``a`` explains ``y``
    better than ``b`` beyond what the choice of models does (an interval above 0), rather than
    comparing two separate intervals. Returns ``estimate, ci_low, ci_high, n, level``.
    """
    from coupling_utils.analysis.stats import bootstrap_ci

    work = pd.DataFrame(
        {"a": _values(df, a), "b": _values(df, b), "y": pd.to_numeric(df[y], errors="coerce")}
    ).astype(float)
    work = work[np.isfinite(work.to_numpy()).all(axis=1)].reset_index(drop=True)
    if len(work) < 3:
        raise ValueError(f"need at least 3 complete rows to compare R², got {len(work)}")

    def diff(d: pd.DataFrame) -> float:
        return _r2(d.a.to_numpy(), d.y.to_numpy()) - _r2(d.b.to_numpy(), d.y.to_numpy())

    ci = bootstrap_ci(work, diff, n_resamples=n_resamples, level=level, seed=seed).iloc[0]
    return {
        "estimate": float(ci["estimate"]),
        "ci_low": float(ci["ci_low"]),
        "ci_high": float(ci["ci_high"]),
        "n": len(work),
        "level": level,
    }


def agreement(
    estimate: float,
    ci_low: float,
    ci_high: float,
    *,
    expected_sign: int = 1,
    n: int | None = None,
    min_n: int = 6,
) -> str:
    """Status verdict for a directional claim from an estimate and its interval.

    "yes": the interval lies on the expected side of 0; "partly": the estimate does but the
    interval reaches 0 (or is unknown), or there are fewer than ``min_n`` models (``n``), too
    few for a bootstrap interval to mean much; "no": the estimate is on the other side (or
    missing).
    """
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be 1 or -1, got {expected_sign}")
    e, lo, hi = (expected_sign * v for v in (estimate, ci_low, ci_high))
    if not np.isfinite(e) or e <= 0:
        return "no"
    if np.isfinite(lo) and np.isfinite(hi) and min(lo, hi) > 0 and (n is None or n >= min_n):
        return "yes"
    return "partly"
