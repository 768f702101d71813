"""Emergence during training: the checkpoints of a run, and measuring them.

The paper follows Pythia checkpoints and reports that coupling rises about 2.4× from step 128
to step 143000, together with straighter token trajectories and layer-wise exponential growth
of the residual steps. This module turns a set of checkpoints into tidy tables:

- :func:`step_of`, :func:`checkpoint_steps`: revision names (``step<N>``) and their steps;
  :func:`pick_checkpoints`, :func:`graph_checkpoints`: those of the paper's circle figures;
- :func:`run_checkpoints`: the checkpoints (and losses, spec) of a local run or a hub model;
- :func:`checkpoint_jobs`, :func:`sweep_checkpoints`: depth-wise coupling, line-shape score,
  expodistance and step sizes at every checkpoint (:class:`SweepSettings`), as a
  :class:`CheckpointTables`; :func:`runs_jobs`, :func:`runs_sweep`, :func:`sweep_runs`: several runs.

Curve shapes are in :mod:`.training_curves`, matrices and graphs in :mod:`.layer_graphs`, the
search of local runs in :mod:`.emergence_search`; their names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis.emergence_search import (
    SEARCH_FACTORS,
    SEARCH_FOLDER,
    Search,
    load_search,
    one_factor_effects,
)
from coupling_utils.analysis.layer_graphs import edge_counts, k_levels, mean_matrices, share_above_one
from coupling_utils.analysis.training_curves import growth_summary, judge_rows, log_position, relative_curve
from coupling_utils.measurement import Extra, Job, Loads, Options, Settings, collect, plan, relabel
from coupling_utils.measurement.loop import Collected

__all__ = [
    "step_of",
    "checkpoint_steps",
    "pick_checkpoints",
    "graph_checkpoints",
    "Checkpoints",
    "run_checkpoints",
    "SweepSettings",
    "CheckpointTables",
    "checkpoint_jobs",
    "NoCheckpointMeasured",
    "sweep_of",
    "sweep_checkpoints",
    "run_width",
    "fitting_k",
    "runs_jobs",
    "runs_sweep",
    "sweep_runs",
    "model_width",
    "main_k",
    "checkpoint_summary",
    "growth_summary",
    "log_position",
    "relative_curve",
    "judge_rows",
    "mean_matrices",
    "share_above_one",
    "k_levels",
    "edge_counts",
    "SEARCH_FOLDER",
    "SEARCH_FACTORS",
    "Search",
    "load_search",
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


def run_checkpoints(model: str, revisions: Sequence[str] = (), *, prepare: bool = True) -> Checkpoints:
    """The checkpoints of ``model`` to measure: ``revisions`` if given, else all the run saves.

    ``model`` is an embedded run (``"embedded:pythia-tiny"``: its checkpoints from its recipe,
    :func:`~coupling_utils.models.zoo.planned_revisions`; the run is prepared on first use, so its
    path, losses and spec are filled, unless ``prepare`` is False: a plan then trains nothing and
    reads nothing of a build), a local run directory (``<dir>/revisions/step<N>/``, as
    :mod:`coupling_utils.models.training` writes) or a hub id (then ``revisions`` must be listed,
    e.g. Pythia's ``"step128"``).
    """
    from coupling_utils.models.training import list_revisions

    revisions = list(revisions)
    checkpoint_steps(revisions)
    path, available, where = None, None, ""
    if model.startswith("embedded:"):
        from coupling_utils.models import zoo

        available, where = zoo.planned_revisions(model), "its recipe keeps only the final model"
        if prepare:
            path = Path(zoo.resolve(model, progress=False))
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser()
        available, where = list_revisions(path), f"{path} has none under revisions/"
    elif not revisions:
        raise ValueError(
            f"{model!r} is not a local training run, so its checkpoints cannot be listed; "
            "name them with revisions=[...] (for Pythia: 'step128', ..., 'step143000')"
        )
    if available is not None:
        if not available:
            raise ValueError(
                f"{model!r} saved no checkpoints ({where}); it is not a training run with saved checkpoints"
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


# --------------------------------------------------------------------------- sweeping checkpoints
@dataclass(frozen=True)
class SweepSettings:
    """What is measured at every checkpoint, and how the scalar coupling is taken.

    ``k``: K values of the depth-wise coupling of the last token over ``layers`` (None: all),
    Jacobian SVDs by ``method``; ``trajectory_tokens`` ("all" or "last") and
    ``trajectory_layers`` (a residual-state window (first, last), default all): the tokens and
    window of the line-shape score and expodistance (expodistance needs three steps and is NaN
    for shallower windows); ``max_tokens`` cuts prompts to their first tokens; ``dtype``: the
    weights'; ``last_block`` and ``last_block_also``: what the last block's Jacobian is, as in
    ``Settings``; ``how``: the pairs of :func:`checkpoint_summary` (not part of what is stored)."""

    k: int | Sequence[int] = (10,)
    layers: Sequence[int] | None = None
    how: str = "offdiag"
    trajectory_layers: tuple[int, int] | None = None
    trajectory_tokens: str = "all"
    dtype: str = "float32"
    method: str = "exact"
    max_tokens: int | None = None
    last_block: str = "block"
    last_block_also: str | None = None

    def __post_init__(self):
        if self.trajectory_tokens not in ("all", "last"):
            raise ValueError(f"trajectory_tokens must be 'all' or 'last', got {self.trajectory_tokens!r}")

    @property
    def ks(self) -> list[int]:
        """The K values as a list of ints."""
        k = self.k
        return [int(k)] if isinstance(k, (int, np.integer)) else [int(x) for x in k]

    def but(self, **changes: Any) -> SweepSettings:
        """A copy with ``changes`` (e.g. ``settings.but(k=[2, 4])``)."""
        return dataclasses.replace(self, **changes)


@dataclass
class CheckpointTables:
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


def checkpoint_jobs(
    model: str,
    revisions: Sequence[str],
    prompts: Any,
    settings: SweepSettings | None = None,
    *,
    root: str | Path | None = None,
) -> list[Job]:
    """The jobs of :func:`sweep_checkpoints`, one per checkpoint in step order (labels model,
    revision, step): a "depth" measurement and the trajectory tables, stored under ``root``
    (``root/<model>/<revision>/trained/``; None: nothing is stored)."""
    s = settings or SweepSettings()
    if isinstance(revisions, str):
        revisions = [revisions]
    revisions = list(revisions)
    if not revisions:
        raise ValueError("revisions is empty; pass checkpoint names like ['step0', 'step128']")
    steps = checkpoint_steps(revisions)
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = dict(prompts) if isinstance(prompts, dict) else {str(i): p for i, p in enumerate(prompts)}
    if not prompts:
        raise ValueError("prompts is empty; pass at least one prompt text")
    ordered = [revisions[i] for i in np.argsort(steps, kind="stable")]
    measured = Settings(
        layers=s.layers,
        tokens="last",
        k=s.k,
        method=s.method,
        max_tokens=s.max_tokens,
        last_block=s.last_block,
        last_block_also=s.last_block_also,
    )
    from coupling_utils.analysis.trajectories import checkpoint_trajectories

    options = {"max_tokens": s.max_tokens, "layers": s.trajectory_layers, "tokens": s.trajectory_tokens}
    extra = Extra("trajectories", checkpoint_trajectories, options, sources=("analysis/trajectories.py",))
    loads = Loads(revisions=ordered, dtype=s.dtype)
    jobs = plan([model], prompts, {"depth": measured}, loads=loads, root=root, extra=extra)
    return relabel(jobs, lambda job: {"step": step_of(job.revision)})


class NoCheckpointMeasured(RuntimeError):
    """None of a model's checkpoints could be measured (raised by :func:`sweep_of`)."""


def _checkpoint_provenance(done: Collected, model: str) -> dict:
    """Per measured checkpoint: its step, settings, cost, code, staleness and width."""
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
    return prov


def sweep_of(done: Collected, model: str, *, how: str = "offdiag") -> CheckpointTables:
    """The :class:`CheckpointTables` of ``model`` from its collected :func:`checkpoint_jobs` (failed ones in
    ``failures``); the summary takes ``how`` pairs. Raises :class:`NoCheckpointMeasured` if none
    was measured."""
    if not done.ok:
        raise NoCheckpointMeasured(f"{model}: no checkpoint could be measured\n{done.report()}")
    prov = _checkpoint_provenance(done, model)
    lead = ["model", "revision", "step", "prompt"]
    depthwise = _lead(done.table("depthwise", "depth"), lead)
    trajectories = _lead(done.table("trajectories", None), lead)
    step_norms = _lead(done.table("step_norms", None), lead)
    summary = checkpoint_summary(depthwise, trajectories, how=how)
    width = {rev: c["d_model"] for rev, c in prov["checkpoints"].items()}
    summary.insert(summary.columns.get_loc("K"), "d_model", summary["revision"].map(width).astype(float))
    return CheckpointTables(depthwise, trajectories, step_norms, summary, prov, done.failures)


def sweep_checkpoints(
    model: str,
    revisions: Sequence[str],
    prompts: Any,
    settings: SweepSettings | None = None,
    *,
    out: str | Path | None = None,
    options: Options | None = None,
) -> CheckpointTables:
    """Measure ``model`` at every checkpoint in ``revisions`` (names like ``"step128"``) on
    ``prompts`` (a mapping ``{prompt_id: text}`` or a list of texts), as ``settings`` says.

    ``out``: a directory; each checkpoint's tables are stored under
    ``out/<model>/<revision>/trained/`` and read back on a rerun without loading the model
    (:func:`checkpoint_jobs`). ``options``: how the jobs run (default: the first failure
    raises); with ``on_error="record"`` a checkpoint that fails is listed in
    ``CheckpointTables.failures`` and left out.
    """
    s = settings or SweepSettings()
    jobs = checkpoint_jobs(model, revisions, prompts, s, root=out)
    done = collect(jobs, options or Options(on_error="raise"), desc=f"checkpoints of {model}")
    return sweep_of(done, model, how=s.how)


def run_width(run: Checkpoints) -> int | None:
    """The width of ``run``: :func:`model_width` of its last checkpoint that has one (None: unknown)."""
    return next((w for w in (model_width(run.model, r) for r in reversed(run.revisions)) if w), None)


def fitting_k(run: Checkpoints, k: int | Sequence[int]) -> tuple[list[int], str]:
    """The K values that fit ``run``'s width (:func:`run_width`; unknown: all), and a message
    naming those that do not ("" if all fit)."""
    ks, width = SweepSettings(k=k).ks, run_width(run)
    fit = [x for x in ks if width is None or x <= width]
    if len(fit) == len(ks):
        return fit, ""
    too_big = [x for x in ks if x not in fit]
    return fit, f"K = {too_big} exceed the width d = {width} of {run.model}: not measured at these K"


def runs_jobs(
    runs: Sequence[Checkpoints], prompts: Any, settings: SweepSettings | None = None, *, out=None
) -> list[Job]:
    """The jobs of :func:`sweep_runs`: each run's :func:`checkpoint_jobs` at the K that fit it."""
    s, jobs = settings or SweepSettings(), []
    for run in runs:
        fit, _ = fitting_k(run, s.k)
        if fit:
            jobs += checkpoint_jobs(run.model, run.revisions, prompts, s.but(k=fit), root=out)
    return jobs


def _failure(model: str, error: str, message: str) -> pd.DataFrame:
    return pd.DataFrame([{"model": model, "error": error, "message": message}])


def runs_sweep(
    done: Collected,
    runs: Sequence[Checkpoints],
    settings: SweepSettings | None = None,
    *,
    panel: str | None = None,
    on_error: str = "record",
) -> CheckpointTables:
    """The :class:`CheckpointTables` of several runs from their collected :func:`runs_jobs` (see
    :func:`sweep_runs`). ``on_error="raise"``: a K wider than a run, or a run with no checkpoint
    measured, raises instead of being listed in ``failures``."""
    s = settings or SweepSettings()
    sweeps, failures = [], []
    for run in runs:
        fit, message = fitting_k(run, s.k)
        if message:
            if on_error == "raise":
                raise ValueError(f"{message}; choose K <= {run_width(run)}")
            failures.append(_failure(run.model, "K wider than the model", message))
        if not fit:
            continue
        mine = Collected([r for r in done.results if r.job.labels.get("model") == run.model])
        try:
            sw = sweep_of(mine, run.model, how=s.how)
        except NoCheckpointMeasured as exc:
            if on_error == "raise":
                raise
            failures.append(_failure(run.model, "no checkpoint", str(exc)))
            continue
        sweeps.append(sw)
        if not sw.failures.empty:
            failures.append(sw.failures.assign(model=run.model))
    if not sweeps:
        detail = "\n".join(str(f["message"].iloc[0]) for f in failures)
        raise RuntimeError(f"none of the runs {[r.model for r in runs]} could be measured\n{detail}")
    return _combined(sweeps, failures, panel)


def _combined(
    sweeps: list[CheckpointTables], failures: list[pd.DataFrame], panel: str | None
) -> CheckpointTables:
    """One :class:`CheckpointTables` of several, every table labelled with ``panel`` (when given)."""

    def cat(name: str) -> pd.DataFrame:
        out = pd.concat([getattr(sw, name) for sw in sweeps], ignore_index=True)
        return out if panel is None else out.assign(panel=panel)

    failed = pd.concat(failures, ignore_index=True) if failures else pd.DataFrame(columns=["model", "error"])
    return CheckpointTables(
        cat("depthwise"),
        cat("trajectories"),
        cat("step_norms"),
        cat("summary"),
        {sw.provenance["model"]: sw.provenance for sw in sweeps},
        failed if panel is None else failed.assign(panel=panel),
    )


def sweep_runs(
    runs: Sequence[Checkpoints],
    prompts: Any,
    settings: SweepSettings | None = None,
    *,
    panel: str | None = None,
    out: str | Path | None = None,
    options: Options | None = None,
) -> CheckpointTables:
    """:func:`sweep_checkpoints` for several runs on the same prompts, as one :class:`CheckpointTables`.

    ``runs``: what :func:`run_checkpoints` gave for each model. ``panel`` labels every table with
    a ``panel`` column (e.g. "held-out text" and "quiz prompts", measured separately and shown
    side by side). With ``options.on_error="record"`` (the default) a checkpoint that cannot be
    loaded or measured (a revision the hub does not have, a gated repo, out of memory) is listed
    in ``failures`` and left out, and so is a run none of whose checkpoints could be measured,
    and every K larger than a run's width (:func:`fitting_k`; e.g. the paper's K = 50 on a
    narrow stand-in model), so a notebook shows what is missing instead of aborting. Raises if
    nothing at all could be measured.
    """
    s, options = settings or SweepSettings(), options or Options()
    if options.on_error == "raise":  # a K wider than a run is refused before anything is measured
        for run in runs:
            fit, message = fitting_k(run, s.k)
            if message:
                raise ValueError(f"{message}; choose K <= {run_width(run)}")
    done = collect(runs_jobs(runs, prompts, s, out=out), options, desc="checkpoints")
    return runs_sweep(done, runs, s, panel=panel, on_error=options.on_error)


def model_width(model: str, revision: str | None = None) -> int | None:
    """The width d (hidden size) of ``model`` (at ``revision``) from its config, read without
    loading weights: an embedded training run's from its recipe (``d_model``, its config's hidden
    size), so planning trains nothing; else the config at hand
    (:func:`~coupling_utils.models.model_config.offline_config`: a local folder's, a hub model's
    in the Hugging Face cache); else a packaged embedded model's once built, or a hub model's
    recorded config (``data/model_configs.csv``) before asking the hub. None if unknown."""
    from coupling_utils.models.model_config import offline_config

    model = str(model)
    try:
        if model.startswith("embedded:"):
            from coupling_utils.models import zoo

            spec = zoo.training_spec(model)
            if spec is not None and not isinstance(spec, dict):
                return int(spec.d_model)
            if offline_config(model, revision) is None:
                zoo.resolve(model, progress=False)  # a packaged model, built once
        elif offline_config(model, revision) is None and not Path(model).expanduser().exists():
            recorded = _recorded_width(model)
            if recorded is not None:
                return recorded
            from transformers import AutoConfig

            return _width(AutoConfig.from_pretrained(model, revision=revision).to_dict())
    except (OSError, ValueError):  # not found or not readable: measure() then says what is wrong
        return None
    return _width(offline_config(model, revision) or {})


def _width(config: dict) -> int | None:
    """The residual width a config declares (its text model's where it has one)."""
    from coupling_utils.models.model_config import text_config

    keys = ("hidden_size", "n_embd", "d_model")
    widths = [part.get(key) for part in (text_config(config), config) for key in keys]
    return next((int(w) for w in widths if isinstance(w, int) and not isinstance(w, bool)), None)


def _recorded_width(model: str) -> int | None:
    """``d_model`` of ``model``'s row in ``data/model_configs.csv`` (None without a row)."""
    from coupling_utils.analysis.data import read_table

    rows = read_table("model_configs.csv")
    row = rows[rows.model_id == model]
    return int(row.d_model.iloc[0]) if len(row) else None


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
        raise ValueError("depthwise needs a 'step' column (the depthwise table of CheckpointTables)")
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
