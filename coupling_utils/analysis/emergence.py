"""Emergence during training: measuring checkpoints, and how a quantity grows with the step.

The paper follows Pythia checkpoints and reports that coupling rises about 2.4× from step 128
to step 143000, nearly monotonically, together with straighter token trajectories and
layer-wise exponential growth of the residual steps. This module turns a set of checkpoints
into tidy tables and condenses a curve into the numbers such a claim is about:

- :func:`step_of`, :func:`checkpoint_steps`: revision names (``step<N>``) and their steps;
- :func:`pick_checkpoints`: early / middle / final checkpoints (the paper's circle figures);
- :func:`sweep_checkpoints`: depth-wise coupling, line-shape score, expodistance and step
  sizes at every checkpoint (one :func:`coupling_utils.measurement.measure` call and one
  residual-stream pass per checkpoint and prompt), as a :class:`Sweep` of tidy tables;
- :func:`growth_summary`: ratio final / early, Spearman correlation with the step, and how
  monotone the curve is, per group;
- :func:`relative_curve`: a curve rescaled to its final value against the fraction of
  training, so runs of very different lengths (ours, Pythia's) share one axis.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.measurement import Extra, Job, Options, Settings, collect, plan, relabel
from coupling_utils.measurement.tables import SCHEMAS as MEASURED
from coupling_utils.schemas import Schema, check_table

__all__ = [
    "step_of",
    "checkpoint_steps",
    "pick_checkpoints",
    "graph_checkpoints",
    "growth_summary",
    "log_position",
    "relative_curve",
    "Checkpoints",
    "run_checkpoints",
    "Sweep",
    "sweep_checkpoints",
    "sweep_runs",
    "NoCheckpointMeasured",
    "model_width",
    "main_k",
    "checkpoint_jobs",
    "trajectory_tables",
    "checkpoint_summary",
    "mean_matrices",
    "edge_counts",
    "share_above_one",
    "k_levels",
    "Search",
    "load_search",
    "judge_rows",
    "one_factor_effects",
]

_STEP = re.compile(r"step(\d+)")


# --------------------------------------------------------------------------- checkpoints
def step_of(revision: str | int) -> int:
    """The training step of a revision name: ``"step128"`` -> 128 (an int is returned as is)."""
    if isinstance(revision, (int, np.integer)) and not isinstance(revision, bool):
        if revision < 0:
            raise ValueError(f"a training step cannot be negative, got {revision}")
        return int(revision)
    m = _STEP.fullmatch(str(revision))
    if not m:
        raise ValueError(
            f"revision {revision!r} is not a checkpoint name like 'step128' "
            "(Pythia's and the local training runs' naming)"
        )
    return int(m.group(1))


def checkpoint_steps(revisions: Sequence[str | int]) -> list[int]:
    """Steps of the revisions, validated: no duplicates."""
    steps = [step_of(r) for r in revisions]
    dup = sorted({s for s in steps if steps.count(s) > 1})
    if dup:
        raise ValueError(f"revisions name the same step more than once: {dup}")
    return steps


def pick_checkpoints(steps: Sequence[int], n: int = 3) -> list[int]:
    """``n`` checkpoints spread over training on a log-step axis: the first after step 0,
    the last, and those in between closest to evenly spaced log-steps.

    The paper's circle figures use Pythia's steps 1, 4000 and 143000 (early, mid, final).
    """
    steps = sorted({int(s) for s in steps if int(s) > 0})
    if n < 2:
        raise ValueError(f"n must be at least 2 (early and final), got {n}")
    if len(steps) < n:
        raise ValueError(f"need at least {n} checkpoints after step 0 to pick {n}, got {steps}")
    logs = np.log(steps)
    targets = np.linspace(logs[0], logs[-1], n)
    chosen: list[int] = []
    for t in targets:
        order = np.argsort(np.abs(logs - t), kind="stable")
        chosen.append(next(steps[i] for i in order if steps[i] not in chosen))
    return sorted(chosen)


def graph_checkpoints(
    steps: Sequence[int], requested: Sequence[int] = (), n: int = 3
) -> tuple[list[int], str]:
    """The checkpoints of the layer-coupling graphs, and a note on any that had to be replaced.

    ``requested`` empty: ``n`` checkpoints spread over the log-step axis (:func:`pick_checkpoints`).
    Otherwise each requested step that was not measured (a checkpoint the hub lacked, a run
    of another length) is replaced by the nearest measured step on the log axis, and the note
    says so, so a figure never silently shows other steps than the text names.
    """
    measured = sorted({int(x) for x in steps})
    if not requested:
        return pick_checkpoints(measured, n), ""
    positive = [x for x in measured if x > 0]
    if not positive:
        raise ValueError(f"no checkpoint after step 0 was measured (steps: {measured})")
    chosen, replaced = [], []
    for want in requested:
        want = int(want)
        if want in measured:
            got = want
        else:
            got = min(positive, key=lambda x: (abs(np.log(x) - np.log(max(want, 1))), x))
            replaced.append(f"step {want} → {got}")
        if got not in chosen:
            chosen.append(got)
    note = f"not measured, replaced by the nearest checkpoint: {', '.join(replaced)}" if replaced else ""
    return sorted(chosen), note


@dataclass
class Checkpoints:
    """The checkpoints of one training run: revision names in step order, and (for a local
    run) its directory, its per-checkpoint losses (``training.load_losses``) and its training
    spec (``training_spec.json``: the ``LMSpec`` fields it was trained with)."""

    model: str
    revisions: list[str]
    steps: list[int]
    path: Path | None = None
    losses: pd.DataFrame | None = None
    spec: dict | None = None


def run_checkpoints(model: str, revisions: Sequence[str] = ()) -> Checkpoints:
    """The checkpoints of ``model`` to measure: ``revisions`` if given, else all a local run saved.

    ``model`` is an embedded run (``"embedded:pythia-tiny"``, prepared on first use), a local
    run directory (``<dir>/revisions/step<N>/``, as :mod:`coupling_utils.models.training` writes) or a
    hub id (then ``revisions`` must be listed, e.g. Pythia's ``"step128"``).
    """
    from coupling_utils.models.training import list_revisions

    revisions = list(revisions)
    checkpoint_steps(revisions)
    path = None
    if model.startswith("embedded:"):
        from coupling_utils.models.zoo import resolve

        path = Path(resolve(model, progress=False))
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser()
    if path is None:
        if not revisions:
            raise ValueError(
                f"{model!r} is not a local training run, so its checkpoints cannot be listed; "
                "name them with revisions=[...] (for Pythia: 'step128', ..., 'step143000')"
            )
    else:
        available = list_revisions(path)
        if not available:
            raise ValueError(
                f"{model!r} ({path}) has no checkpoints under revisions/; it is not a training "
                "run with saved checkpoints"
            )
        missing = [r for r in revisions if r not in available]
        if missing:
            raise ValueError(f"{model!r} has no checkpoint(s) {missing}; it has: {', '.join(available)}")
        revisions = revisions or available
    revisions = sorted(revisions, key=step_of)
    losses = None
    if path is not None and (path / "losses.parquet").exists():
        from coupling_utils.models.training import load_losses

        losses = load_losses(path)
    spec = None
    if path is not None and (path / "training_spec.json").exists():
        import json

        spec = json.loads((path / "training_spec.json").read_text()).get("spec")
    return Checkpoints(model, revisions, [step_of(r) for r in revisions], path, losses, spec)


# --------------------------------------------------------------------------- curves
def _groups(df: pd.DataFrame, by):
    if by is None:
        return [((), df)]
    by = [by] if isinstance(by, str) else list(by)
    return [((key,) if not isinstance(key, tuple) else key, g) for key, g in df.groupby(by, sort=True)]


def growth_summary(
    df: pd.DataFrame,
    value: str,
    *,
    step: str = "step",
    by: str | Sequence[str] | None = None,
    early_step: int | None = None,
) -> pd.DataFrame:
    """How ``value`` grows over training, one row per group ``by``.

    ``early_step`` is the reference early checkpoint (the paper: 128); the first checkpoint at
    or after it is used (default: the first checkpoint after step 0). Rows with several values
    per step (e.g. prompts) are averaged first. Columns: early_step, final_step, early, final,
    ratio (final / early), spearman (rank correlation of value with step over checkpoints
    from the early one on, and its p-value spearman_p), rises (fraction of consecutive
    checkpoints where the value goes up), max_drop (largest fall between consecutive
    checkpoints, relative to the curve's range; 0 for a monotone rise), peak_step and peak
    (the largest value and where it lies), peak_position (where the peak lies on the log-step
    axis from the early to the final checkpoint: 0 = at the early one, 1 = at the end),
    final_vs_peak (final / peak: 1 when the curve ends at its top) and n_checkpoints.

    These are the shape descriptors a claim such as "rises progressively" is judged on: a curve
    that peaks early and falls back has a small peak_position and final_vs_peak < 1, whatever
    its two end points say.
    """
    from scipy import stats

    check_table(df, Schema("df", dict.fromkeys((value, step), "any")))
    by_cols = [] if by is None else ([by] if isinstance(by, str) else list(by))
    rows = []
    for key, g in _groups(df, by):
        curve = g.groupby(step, sort=True)[value].mean()
        if not np.isfinite(curve.to_numpy()).all():
            raise ValueError(f"{value!r} has NaN or inf values{_where(by_cols, key)}")
        later = curve[curve.index > 0] if early_step is None else curve[curve.index >= early_step]
        if later.empty:
            raise ValueError(
                f"no checkpoint at or after step {early_step or 1}{_where(by_cols, key)}; "
                f"steps: {list(curve.index)}"
            )
        curve = later
        if len(curve) < 2:
            raise ValueError(
                f"need at least two checkpoints from the early one on{_where(by_cols, key)}, "
                f"got steps {list(curve.index)}"
            )
        v = curve.to_numpy(dtype=float)
        early, final = v[0], v[-1]
        diffs = np.diff(v)
        span = float(np.ptp(v))
        if len(v) >= 3 and span > 0:
            rho, p = stats.spearmanr(curve.index.to_numpy(dtype=float), v)
        else:
            rho, p = (float(np.sign(final - early)) if span > 0 else np.nan), np.nan
        rows.append(
            {
                **dict(zip(by_cols, key)),
                "early_step": int(curve.index[0]),
                "final_step": int(curve.index[-1]),
                "early": float(early),
                "final": float(final),
                "ratio": float(final / early) if early != 0 else np.nan,
                "spearman": float(rho),
                "spearman_p": float(p),
                "rises": float(np.mean(diffs > 0)),
                "max_drop": float(max(0.0, -diffs.min()) / span) if span > 0 else 0.0,
                "peak_step": int(curve.index[int(np.argmax(v))]),
                "peak": float(v.max()),
                "peak_position": (
                    log_position(curve.index[int(np.argmax(v))], curve.index[0], curve.index[-1])
                    if curve.index[0] > 0
                    else np.nan  # no log axis from step 0
                ),
                "final_vs_peak": float(final / v.max()) if v.max() > 0 else np.nan,
                "n_checkpoints": int(len(v)),
            }
        )
    return pd.DataFrame(rows)


def log_position(step: float, first: float, last: float) -> float:
    """Where ``step`` lies on the log-step axis from ``first`` to ``last`` (0 to 1; steps > 0).

    Pythia's checkpoints are log-spaced early, so "the peak is in the last third" means a
    position >= 2/3 on this axis (for steps 1 to 4096: from step 256 on)."""
    if not 0 < first < last:
        raise ValueError(f"need 0 < first < last steps for a log axis, got first={first}, last={last}")
    if not first <= step <= last:
        raise ValueError(f"step {step} lies outside [{first}, {last}]")
    return float(np.log(step / first) / np.log(last / first))


def _where(by_cols, key) -> str:
    return "" if not by_cols else " for " + ", ".join(f"{c}={k!r}" for c, k in zip(by_cols, key))


def relative_curve(
    df: pd.DataFrame, value: str, *, step: str = "step", by: str | Sequence[str] | None = None
) -> pd.DataFrame:
    """The curve averaged per step and rescaled: ``relative`` = value / final value, against
    ``training_fraction`` = step / final step (per group). Steps 0 are dropped (no log axis)."""
    check_table(df, Schema("df", dict.fromkeys((value, step), "any")))
    by_cols = [] if by is None else ([by] if isinstance(by, str) else list(by))
    frames = []
    for key, g in _groups(df, by):
        curve = g.groupby(step, sort=True)[value].mean()
        curve = curve[curve.index > 0]
        if curve.empty:
            continue
        final = float(curve.iloc[-1])
        if final == 0:
            raise ValueError(f"the final value of {value!r} is 0{_where(by_cols, key)}; cannot rescale")
        out = pd.DataFrame(
            {
                step: curve.index.to_numpy(),
                value: curve.to_numpy(),
                "training_fraction": curve.index.to_numpy() / curve.index.max(),
                "relative": curve.to_numpy() / final,
            }
        )
        for c, k in zip(by_cols, key):
            out.insert(0, c, k)
        frames.append(out)
    if not frames:
        raise ValueError("no checkpoint after step 0 to rescale")
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- sweeping checkpoints
@dataclass
class Sweep:
    """Tidy tables of one model measured at several checkpoints (see :func:`sweep_checkpoints`).

    - ``depthwise``: model, revision, step, prompt, token, K, layer_i, layer_j, m, coupling;
    - ``trajectories``: model, revision, step, prompt, token, lss, expodistance_<how>,
      growth_<how> (one row per token);
    - ``step_norms``: model, revision, step, prompt, token, layer, step_norm, relative_step;
    - ``summary``: one row per (model, revision, step, K), see :func:`checkpoint_summary`, with the
      width ``d_model`` of the checkpoint (so K can be read as a fraction K/d of it).
    """

    depthwise: pd.DataFrame
    trajectories: pd.DataFrame
    step_norms: pd.DataFrame
    summary: pd.DataFrame
    provenance: dict = field(default_factory=dict)
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)  # checkpoints not measured, and why


def trajectory_tables(
    lm, prompts: dict[str, str], *, max_tokens: int | None, layers: tuple[int, int] | None, tokens: str
) -> dict[str, pd.DataFrame]:
    """Residual-stream trajectories of the prompts' tokens at one checkpoint: ``trajectories``
    (line-shape score, expodistance, growth per token) and ``step_norms`` (per token and layer)."""
    from coupling_utils.analysis import trajectories as tj
    from coupling_utils.engine.blocks import residual_stream

    trajs, norms = [], []
    for pid, text in prompts.items():
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
        traj = residual_stream(lm, ids)  # [L+1, T, d]
        if tokens == "last":
            traj = traj[:, -1:]
            token_ids = [ids.shape[1] - 1]
        else:
            token_ids = list(range(ids.shape[1]))
        n_steps = (traj.shape[0] - 1) if layers is None else (layers[1] % traj.shape[0]) - layers[0]
        if n_steps >= 3:
            metrics = tj.trajectory_metrics(traj, layers=layers)
        else:  # expodistance needs three steps; a 2-block model has only the line-shape score
            with warnings.catch_warnings():  # the NaN columns below say so; no warning per prompt
                warnings.simplefilter("ignore", tj.ShortWindowWarning)
                metrics = tj.trajectory_metrics(traj, layers=layers, how=())
            for h in tj.EXPODISTANCE_METHODS:
                metrics[f"expodistance_{h}"] = np.nan
                metrics[f"growth_{h}"] = np.nan
        metrics["token"] = np.asarray(token_ids)[metrics["token"].to_numpy()]
        trajs.append(metrics.assign(prompt=pid))
        sn = tj.step_norms(traj, relative=True)
        sn["token"] = np.asarray(token_ids)[sn["token"].to_numpy()]
        norms.append(sn.assign(prompt=pid))
    return {
        "trajectories": pd.concat(trajs, ignore_index=True),
        "step_norms": pd.concat(norms, ignore_index=True),
    }


def checkpoint_jobs(
    model: str,
    revisions: Sequence[str],
    prompts: Any,
    *,
    k: int | Sequence[int] = (10,),
    layers: Sequence[int] | None = None,
    trajectory_layers: tuple[int, int] | None = None,
    trajectory_tokens: str = "all",
    dtype: str = "float32",
    method: str = "exact",
    max_tokens: int | None = None,
    out: str | Path | None = None,
) -> list[Job]:
    """The jobs of :func:`sweep_checkpoints`, one per checkpoint in step order (labels model,
    revision, step): a "depth" measurement and the trajectory tables, stored under ``out``."""
    if isinstance(revisions, str):
        revisions = [revisions]
    revisions = list(revisions)
    if not revisions:
        raise ValueError("revisions is empty; pass checkpoint names like ['step0', 'step128']")
    steps = checkpoint_steps(revisions)
    if trajectory_tokens not in ("all", "last"):
        raise ValueError(f"trajectory_tokens must be 'all' or 'last', got {trajectory_tokens!r}")
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = dict(prompts) if isinstance(prompts, dict) else {str(i): p for i, p in enumerate(prompts)}
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt text")
    ordered = [revisions[i] for i in np.argsort(steps, kind="stable")]
    settings = Settings(layers=layers, tokens="last", k=k, method=method, max_tokens=max_tokens)
    options = {"max_tokens": max_tokens, "layers": trajectory_layers, "tokens": trajectory_tokens}
    extra = Extra("trajectories", trajectory_tables, options, sources=("analysis/trajectories.py",))
    jobs = plan([model], prompts, {"depth": settings}, revisions=ordered, dtype=dtype, root=out, extra=extra)
    return relabel(jobs, lambda job: {"step": step_of(job.revision)})


class NoCheckpointMeasured(RuntimeError):
    """None of a model's checkpoints could be measured (raised by :func:`sweep_checkpoints`)."""


def sweep_checkpoints(
    model: str,
    revisions: Sequence[str],
    prompts: Any,
    *,
    k: int | Sequence[int] = (10,),
    layers: Sequence[int] | None = None,
    how: str = "offdiag",
    trajectory_layers: tuple[int, int] | None = None,
    trajectory_tokens: str = "all",
    dtype: str = "float32",
    method: str = "exact",
    max_tokens: int | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    load: Callable[..., Any] | None = None,
    on_error: str = "raise",
    reuse_stale: bool = False,
) -> Sweep:
    """Measure ``model`` at every checkpoint in ``revisions`` (names like ``"step128"``).

    At each checkpoint: depth-wise coupling of the last token of every prompt over ``layers``
    (``measure``, method ``method``, K in ``k``), and the residual-stream trajectories
    of the prompts' tokens (``trajectory_tokens``: "all" or "last"; ``trajectory_layers``: a
    residual-state window (first, last) for the line-shape score and expodistance, default
    all; expodistance needs three steps and is NaN for shallower windows). ``max_tokens`` cuts
    prompts to their first tokens. ``prompts``: a mapping ``{prompt_id: text}`` or a list of
    texts. ``out``: a directory; each checkpoint's tables are stored under
    ``out/<model>/<revision>/trained/`` and read back on a rerun without loading the model
    (:func:`checkpoint_jobs`). ``load`` replaces ``loading.load_model`` (tests).
    ``on_error="record"``: a checkpoint that fails is listed in ``Sweep.failures`` and left
    out; ``reuse_stale``: reuse measurements made by other code (see ``measure``).
    """
    jobs = checkpoint_jobs(
        model, revisions, prompts, k=k, layers=layers, trajectory_layers=trajectory_layers,
        trajectory_tokens=trajectory_tokens, dtype=dtype, method=method, max_tokens=max_tokens, out=out,
    )  # fmt: skip
    done = collect(
        jobs, Options(load=load, on_error=on_error, reuse_stale=reuse_stale, progress=progress),
        desc=f"checkpoints of {model}",
    )  # fmt: skip
    if not done.ok:
        raise NoCheckpointMeasured(f"{model}: no checkpoint could be measured\n{done.report()}")
    prov = {"model": model, "checkpoints": {}}
    for r in done.ok:
        m = r.measurements["depth"]
        prov["checkpoints"][r.job.revision] = {
            "step": r.job.labels["step"],
            "measure": m.provenance.get("settings", {}),
            "total_block_passes": m.provenance.get("total_block_passes"),
            "code": m.provenance.get("code"),
            "stale": r.stale,
            "d_model": (m.provenance.get("model") or {}).get("d_model"),
        }
    lead = ["model", "revision", "step", "prompt"]
    depthwise = _lead(done.table("depthwise", "depth"), lead)
    trajectories = _lead(done.table("trajectories", None), lead)
    step_norms = _lead(done.table("step_norms", None), lead)
    summary = checkpoint_summary(depthwise, trajectories, how=how)
    width = {rev: c["d_model"] for rev, c in prov["checkpoints"].items()}
    summary.insert(summary.columns.get_loc("K"), "d_model", summary["revision"].map(width).astype(float))
    return Sweep(depthwise, trajectories, step_norms, summary, prov, done.failures)


def sweep_runs(
    runs: Sequence[Checkpoints], prompts: Any, *, panel: str | None = None, on_error: str = "record", **kwargs
) -> Sweep:
    """:func:`sweep_checkpoints` for several runs on the same prompts, as one :class:`Sweep`.

    ``runs``: what :func:`run_checkpoints` gave for each model. ``panel`` labels every table with
    a ``panel`` column (e.g. "held-out text" and "quiz prompts", measured separately and shown
    side by side). With ``on_error="record"`` (the default) a checkpoint that cannot be loaded or
    measured (a revision the hub does not have, a gated repo, out of memory) is listed in
    ``failures`` and left out, and so is a run none of whose checkpoints could be measured, and
    every K larger than a run's width (:func:`model_width`; e.g. the paper's K = 50 on a narrow
    stand-in model), so a notebook shows what is missing instead of aborting. Other keyword
    arguments go to :func:`sweep_checkpoints`. Raises if nothing at all could be measured.
    """
    if on_error not in ("record", "raise"):
        raise ValueError(f"on_error must be 'record' or 'raise', got {on_error!r}")
    k = kwargs.pop("k", (10,))
    ks = [int(k)] if isinstance(k, (int, np.integer)) else [int(x) for x in k]
    sweeps, failures = [], []
    for run in runs:
        width = next((w for w in (model_width(run.model, r) for r in reversed(run.revisions)) if w), None)
        fit = [x for x in ks if width is None or x <= width]
        if len(fit) < len(ks):
            too_big = [x for x in ks if x not in fit]
            message = f"K = {too_big} exceed the width d = {width} of {run.model}: not measured at these K"
            if on_error == "raise":
                raise ValueError(f"{message}; choose K <= {width}")
            failures.append(
                pd.DataFrame([{"model": run.model, "error": "K wider than the model", "message": message}])
            )
            if not fit:
                continue
        try:
            sw = sweep_checkpoints(run.model, run.revisions, prompts, k=fit, on_error=on_error, **kwargs)
        except NoCheckpointMeasured as exc:
            if on_error == "raise":
                raise
            failures.append(
                pd.DataFrame([{"model": run.model, "error": "no checkpoint", "message": str(exc)}])
            )
            continue
        sweeps.append(sw)
        if not sw.failures.empty:
            failures.append(sw.failures.assign(model=run.model))
    if not sweeps:
        detail = "\n".join(str(f["message"].iloc[0]) for f in failures)
        raise RuntimeError(f"none of the runs {[r.model for r in runs]} could be measured\n{detail}")

    def cat(name: str) -> pd.DataFrame:
        out = pd.concat([getattr(sw, name) for sw in sweeps], ignore_index=True)
        return out if panel is None else out.assign(panel=panel)

    failed = pd.concat(failures, ignore_index=True) if failures else pd.DataFrame(columns=["model", "error"])
    return Sweep(
        cat("depthwise"),
        cat("trajectories"),
        cat("step_norms"),
        cat("summary"),
        {sw.provenance["model"]: sw.provenance for sw in sweeps},
        failed if panel is None else failed.assign(panel=panel),
    )


def model_width(model: str, revision: str | None = None) -> int | None:
    """The width d (hidden size) of ``model`` from its config, read without loading weights: an
    embedded name, a local directory, or a hub id in the Hugging Face cache. None if unknown."""
    import json

    try:
        if str(model).startswith("embedded:"):
            from coupling_utils.models.zoo import resolve

            path = Path(resolve(model, progress=False))
        else:
            path = Path(model).expanduser()
        if path.is_dir():
            config = json.loads((path / "config.json").read_text())
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model, revision=revision).to_dict()
    except (OSError, ValueError):  # not found or not readable: measure() then says what is wrong
        return None
    widths = [config.get(key) for key in ("hidden_size", "n_embd", "d_model")]
    return next((int(w) for w in widths if isinstance(w, int) and not isinstance(w, bool)), None)


def main_k(summary: pd.DataFrame, k_main: int, model: str) -> tuple[int, str]:
    """The K of the headline numbers for ``model``: ``k_main`` if it was measured, else the largest
    measured K below it (a K wider than the model is not measured), and a note saying so."""
    measured = sorted(int(x) for x in summary.loc[summary["model"] == model, "K"].unique())
    if not measured:
        raise ValueError(f"{model!r} has no measurement in the summary")
    if k_main in measured:
        return int(k_main), ""
    below = [x for x in measured if x < k_main]
    chosen = below[-1] if below else measured[0]
    return chosen, f"K = {k_main} was not measured for {model} (wider than the model?): using K = {chosen}"


def _lead(df: pd.DataFrame, lead: Sequence[str]) -> pd.DataFrame:
    return df[[*lead, *[c for c in df.columns if c not in lead]]]


def checkpoint_summary(
    depthwise: pd.DataFrame, trajectories: pd.DataFrame | None = None, *, how: str = "offdiag"
) -> pd.DataFrame:
    """One row per (model, revision, step, K): the scalar coupling (``measure.coupling_summary``
    with ``how``: mean 1 − m² over off-diagonal or adjacent layer pairs, prompts counted
    equally) and, from ``trajectories``, the mean line-shape score, expodistances and
    per-layer growth factors over prompts and tokens."""
    from coupling_utils.measurement import coupling_summary

    keys = [c for c in ("model", "revision", "step") if c in depthwise.columns]
    if "step" not in keys:
        raise ValueError("depthwise needs a 'step' column (a Sweep's depthwise table)")
    rows = []
    for key, g in depthwise.groupby(keys, sort=False):
        for K in sorted(g["K"].unique()):
            rows.append(
                {**dict(zip(keys, key)), "K": int(K), "coupling": coupling_summary(g, how=how, k=int(K))}
            )
    summary = pd.DataFrame(rows)
    if trajectories is not None and not trajectories.empty:
        cols = [c for c in trajectories.columns if c == "lss" or c.startswith(("expodistance_", "growth_"))]
        per = (
            trajectories.groupby(keys + ["prompt"], sort=False)[cols]
            .mean()
            .groupby(level=keys, sort=False)
            .mean()
            .reset_index()
        )
        summary = summary.merge(per, on=keys, how="left")
    return summary.sort_values([c for c in ("model", "step", "K") if c in summary.columns], ignore_index=True)


# --------------------------------------------------------------------------- the search of local runs
SEARCH_FOLDER = "f03_search"


@dataclass
class Search:
    """The stored search over local training runs (``scripts/f03_emergence_search.py``).

    - ``runs``: one row per configuration and K: the spec (d_model, n_layers, steps, lr,
      data_tokens, epochs, ...), its cost (train_s, measure_s), losses (val_loss, plateau_drop)
      and the shape of its coupling curve (:func:`growth_summary` columns, step0);
    - ``curves``: config, step, K, coupling, share_m_above_1;
    - ``losses``: each configuration's per-checkpoint losses;
    - ``provenance``: per configuration, the command, commit, date, machine and versions.
    """

    runs: pd.DataFrame
    curves: pd.DataFrame
    losses: pd.DataFrame
    provenance: dict


def load_search(folder: str | Path | None = None) -> Search:
    """Read the search tables from ``folder`` (default: ``data/f03_search``)."""
    import json

    from coupling_utils.files import data_dir

    folder = Path(folder) if folder is not None else data_dir() / SEARCH_FOLDER
    names = ("runs.csv", "curves.csv", "losses.csv", "provenance.json")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the f03 search tables {missing} are not in {folder}; run "
            "`python scripts/f03_emergence_search.py --out <scratch folder>` to make them"
        )
    tables = [pd.read_csv(folder / n) for n in names[:3]]
    provenance = json.loads((folder / "provenance.json").read_text())
    unexplained = sorted(set(tables[0]["config"]) - set(provenance))
    if unexplained:
        raise ValueError(f"{folder}: configurations {unexplained} have no provenance entry")
    return Search(*tables, provenance)


SEARCH_FACTORS = ("d_model", "n_layers", "steps", "lr", "data_tokens")


def one_factor_effects(
    runs: pd.DataFrame, value: str = "final", *, factors: Sequence[str] = SEARCH_FACTORS
) -> pd.DataFrame:
    """The search read one factor at a time: for each factor, the runs that differ only in it.

    ``runs``: one row per configuration (the search's ``runs`` at one K). For every factor, rows
    are grouped by all the other factors; a group with two or more values of the factor is a
    one-factor comparison. Columns: factor, group (the group's number), level (the factor's
    value), config, ``value``, and direction ("higher" / "lower" / "flat": how ``value`` moves
    from the lowest to the highest level of the factor in that group, by the sign of the change).
    """
    check_table(runs, Schema("runs", dict.fromkeys((*factors, "config", value), "any")))
    frames, n = [], 0
    for factor in factors:
        others = [f for f in factors if f != factor]
        for _, g in runs.groupby(others, sort=True, dropna=False):
            if g[factor].nunique() < 2:
                continue
            g = g.sort_values(factor)
            change = float(g[value].iloc[-1] - g[value].iloc[0])
            direction = "higher" if change > 0 else ("lower" if change < 0 else "flat")
            frames.append(
                pd.DataFrame(
                    {
                        "factor": factor,
                        "group": n,
                        "level": g[factor].to_numpy(),
                        "config": g["config"].to_numpy(),
                        value: g[value].to_numpy(),
                        "direction": direction,
                    }
                )
            )
            n += 1
    columns = ["factor", "group", "level", "config", value, "direction"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def judge_rows(rows: pd.DataFrame, rule, *, column: str = "verdict") -> pd.DataFrame:
    """``rows`` with ``column`` = ``rule.judge(row)`` for each row (a :class:`~verdicts.Rule`
    judged on the shape columns each row carries, e.g. the search's runs)."""
    return rows.assign(**{column: [rule.judge(r) for r in rows.to_dict("records")]})


# --------------------------------------------------------------------------- matrices and graphs
def mean_matrices(depthwise: pd.DataFrame, *, by: str | Sequence[str] = "step") -> pd.DataFrame:
    """Depth-wise coupling matrices averaged over prompts and tokens, per group ``by``:
    columns (by..., layer_i, layer_j, m, coupling), ``coupling`` = mean of 1 − m²."""
    by_cols = [by] if isinstance(by, str) else list(by)
    check_table(depthwise, MEASURED["depthwise"].need(*by_cols, "layer_i", "layer_j", "m", "coupling"))
    if "K" in depthwise.columns and depthwise["K"].nunique() > 1 and "K" not in by_cols:
        raise ValueError(f"depthwise mixes K = {sorted(depthwise['K'].unique())}; select one K first")
    return depthwise.groupby([*by_cols, "layer_i", "layer_j"], as_index=False)[["m", "coupling"]].mean()


def share_above_one(
    depthwise: pd.DataFrame, *, by: str | Sequence[str] = ("model", "step", "K")
) -> pd.DataFrame:
    """Per group: how many pair values have m > 1, where ``1 − m²`` is negative (``share_m_above_1``).

    m_K lies in [0, √2], so 1 − m² lies in [−1, 1]. Two unrelated Jacobians give m near 1, and
    above 1 when the K×K block |U₂ᵀ J₁ V₂| carries more off-diagonal energy than its diagonal
    removes, which grows with K/d: a curve of mean 1 − m² below zero is at (or below) the level
    of unrelated matrices, not "anti-coupled". Pairs of a layer with itself are left out.
    """
    by_cols = [by] if isinstance(by, str) else list(by)
    check_table(depthwise, MEASURED["depthwise"].need(*by_cols, "layer_i", "layer_j", "m"))
    off = depthwise[depthwise["layer_i"] != depthwise["layer_j"]]
    return (
        off.assign(share_m_above_1=(off["m"] > 1).astype(float))
        .groupby(by_cols, as_index=False)["share_m_above_1"]
        .mean()
    )


def k_levels(
    summary: pd.DataFrame, depthwise: pd.DataFrame, *, by: str | Sequence[str] = "model"
) -> pd.DataFrame:
    """Per group and K: how the level of 1 − m² depends on K relative to the width.

    Columns: by..., K, d_model, K_over_d, first_step, first (coupling at the first checkpoint,
    for a local run step 0: the random initialisation, where no block is related to another),
    final, lowest (the curve's minimum), share_first and share_final (share of layer pairs
    with m > 1, i.e. 1 − m² < 0, at those checkpoints; :func:`share_above_one`).
    """
    by_cols = [by] if isinstance(by, str) else list(by)
    shares = share_above_one(depthwise, by=[*by_cols, "step", "K"])
    rows = []
    for key, g in summary.groupby([*by_cols, "K"], sort=True):
        curve = g.groupby("step", sort=True)["coupling"].mean()
        share = shares.set_index([*by_cols, "K", "step"])["share_m_above_1"]
        first, last = int(curve.index[0]), int(curve.index[-1])
        d = float(g["d_model"].iloc[0]) if "d_model" in g and g["d_model"].notna().all() else np.nan
        rows.append(
            {
                **dict(zip([*by_cols, "K"], key)),
                "d_model": d,
                "K_over_d": key[-1] / d,
                "first_step": first,
                "first": float(curve.iloc[0]),
                "final": float(curve.iloc[-1]),
                "lowest": float(curve.min()),
                "share_first": float(share.loc[(*key, first)]),
                "share_final": float(share.loc[(*key, last)]),
            }
        )
    return pd.DataFrame(rows)


def edge_counts(
    matrices: pd.DataFrame, threshold: float, *, by: str | Sequence[str] = "step", value: str = "coupling"
) -> pd.DataFrame:
    """Per group: how many unordered layer pairs have (i, j)/(j, i)-averaged ``value`` above
    ``threshold`` (the edges of ``plots.layer_coupling_graph`` with ``symmetrize="mean"``).
    Columns: by..., pairs, edges, density (= edges / pairs)."""
    by_cols = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, g in _groups(matrices, by_cols):
        g = g[g["layer_i"] != g["layer_j"]]
        a = np.minimum(g["layer_i"].to_numpy(), g["layer_j"].to_numpy())
        b = np.maximum(g["layer_i"].to_numpy(), g["layer_j"].to_numpy())
        pairs = (
            pd.DataFrame({"a": a, "b": b, "v": g[value].to_numpy(dtype=float)})
            .groupby(["a", "b"])["v"]
            .mean()
        )
        n_edges = int((pairs > threshold).sum())
        rows.append(
            {
                **dict(zip(by_cols, key)),
                "pairs": int(len(pairs)),
                "edges": n_edges,
                "density": n_edges / len(pairs) if len(pairs) else float("nan"),
            }
        )
    return pd.DataFrame(rows)
