"""Coupling against generalisation: one coupling number per model, for any set of models.

The paper's Fig. 1(a) sets one scalar per model ("coupling") against its Open LLM Leaderboard
score and finds a tighter fit than parameter count, depth or width give. This module makes the
first of the two steps, the number, for any set of models:

- :func:`family_jobs` plans one measurement per model (:func:`coupling_utils.measurement.measure`,
  same prompts, same settings) and :func:`family_coupling` makes them, then
  :func:`family_summary` condenses each model's depth-wise coupling into one number
  (:func:`coupling_utils.measurement.coupling_summary`; the paper's aggregation is not published,
  so ``how`` and ``k`` are the reader's choice), with its spread over prompts. With twins
  (``loads=Loads(weights=WEIGHTS)``) each model's random-init twin (same config, same K, same
  prompts) is measured too, and the summary adds the twin's coupling and the *excess* over it:
  the chance level of ``1 − m²`` depends on the width, K and architecture, so raw coupling
  compares those as much as training. ``k`` may differ per model (:func:`k_for_width` keeps K/d
  fixed across widths).
  A chapter that collects these jobs with others condenses its own results with
  :func:`family_summary`.
- :func:`training_stage`: whether each member of a trained family has reached the flat part
  of its learning curve (the drop of held-out loss over the last stretch of training).

The second step, how well the number predicts a score beside size, depth and width, is
:mod:`coupling_utils.analysis.predictors`.

:func:`corpus_prompts` cuts held-out text (validation plays the local models never saw) into
prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.measurement import Job, Loads, Options, Result, Settings, collect, plan
from coupling_utils.measurement.jobs import WEIGHTS
from coupling_utils.schemas import Schema, check_table

__all__ = [
    "corpus_prompts",
    "family_coupling",
    "family_jobs",
    "family_summary",
    "FamilyCoupling",
    "training_stage",
    "learning_curves",
    "TWIN_COLUMNS",
]


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


@dataclass
class FamilyCoupling:
    """What :func:`family_coupling` measured: per model, per (model, prompt), per (model, block pair).

    With twins (:func:`family_jobs`' ``loads``) the per-prompt and depth-wise tables hold both
    weights (a ``weights`` column: "trained", "random init") and the summary, one row per model,
    adds :data:`TWIN_COLUMNS`.
    """

    summary: pd.DataFrame  # one row per model
    per_prompt: pd.DataFrame  # model, [weights,] prompt, coupling
    depthwise: pd.DataFrame  # model, [weights,] layer_i, layer_j, m, coupling (mean over prompts and tokens)
    lines: list[str] = field(default_factory=list)  # one readable line per job: its coupling or why not

    def report(self) -> str:
        """The lines, one per job, as a notebook prints them."""
        return "\n".join(self.lines)


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
TWIN_COLUMNS = ["twin_coupling", "twin_coupling_sd", "excess", "excess_se", "twin_note"]
"""Summary columns :func:`family_coupling` adds with twins: the random-init twin's
coupling (mean, sd over prompts), the excess ``coupling − twin_coupling`` (mean over prompts of
the paired difference, and its standard error) and why a twin is missing (empty if measured)."""


def family_jobs(
    models: Sequence[Any] | Mapping[str, Any],
    prompts,
    settings: Settings | None = None,
    *,
    k: int | Mapping[str, int] = 10,
    loads: Loads | None = None,
    root: str | Path | None = None,
) -> list[Job]:
    """The jobs that :func:`family_coupling` measures: one per model, labelled ``model``, stored
    under ``root`` (None: nowhere).

    ``loads``: the dtype (default float32), and with ``weights=WEIGHTS`` each model twice
    (labelled ``weights``: trained, then its random init drawn with ``seed``), the twins
    :func:`family_summary` compares (:class:`~coupling_utils.measurement.Loads`; one revision:
    name it in the model's mapping).
    ``settings``: what each model is measured with (None: :class:`Settings`' defaults, the last
    token); its ``k`` is replaced by ``k``: one K for every model, or ``{model name: K}`` (e.g.
    :func:`k_for_width` of each member's width, to compare widths at one K/d).
    """
    loads = Loads() if loads is None else loads
    if loads.weights is not None and tuple(loads.weights) != WEIGHTS:
        raise ValueError(f"loads.weights must be None (no twins) or {WEIGHTS} (twins), got {loads.weights!r}")
    if loads.revisions is not None:
        raise ValueError(
            f"a family measures each model at one revision, got loads.revisions={loads.revisions!r}; name "
            "a model's revision in its mapping ({'name_or_path': ..., 'revision': ...})"
        )
    settings = Settings() if settings is None else settings
    per_model = isinstance(k, Mapping)
    first = next(iter(k.values()), None) if per_model else k
    if first is None:
        raise ValueError("k is an empty mapping; give a K for every model")
    settings = dataclasses.replace(settings, k=(int(first),))
    jobs = plan(models, prompts, settings, loads=loads, root=root)
    if not per_model:
        return jobs
    names = list(dict.fromkeys(j.labels["model"] for j in jobs))
    missing = [n for n in names if n not in k]
    if missing:
        raise ValueError(f"k gives no K for the model(s) {missing}; give one for each of {names}")
    return [
        dataclasses.replace(
            j, settings={"measure": dataclasses.replace(settings, k=(int(k[j.labels["model"]]),))}
        )
        for j in jobs
    ]


def family_coupling(
    jobs: Sequence[Job],
    *,
    how: str = "offdiag",
    options: Options | None = None,
    echo: Callable[[str], None] | None = None,
) -> FamilyCoupling:
    """Measure :func:`family_jobs`' jobs (:func:`~coupling_utils.measurement.collect`) and condense
    each model into one coupling number (:func:`family_summary`).

    ``options``: how the jobs run (:class:`~coupling_utils.measurement.Options`: ``load``,
    ``on_error``, ``reuse_stale``, ...); with ``on_error="record"`` (the default) a model that
    cannot be loaded or measured (gated, out of memory, missing) gets a row with NaN coupling
    and the reason in ``note``, and the others still run. Stored jobs (``root``) are read back
    without loading their model. ``echo(line)``: one line per job as it finishes.
    """

    def say(r: Result) -> None:
        echo(_line(r, how))

    got = collect(jobs, options, callback=None if echo is None else say)
    return family_summary(got.results, how=how)


def family_summary(results: Sequence[Result], *, how: str = "offdiag") -> FamilyCoupling:
    """One coupling number per model from the results of :func:`family_jobs`' jobs.

    The scalar is ``coupling_summary(depthwise, how, k)``: the mean of ``1 − m_K²`` over layer
    pairs (``"offdiag"``: all pairs of different blocks; ``"adjacent"``: neighbouring blocks)
    and over tokens, each prompt counting once. Returns a :class:`FamilyCoupling`: ``summary``
    with one row per model (``model, coupling, coupling_sd, coupling_se, n_prompts, K, how,
    n_layers, d_model, n_params, log10_params, seconds, cached, note``; a failed job or a
    single-block model gets NaN coupling and a note), ``per_prompt``, the mean ``depthwise``
    matrix of each model and one ``lines`` entry per job. With twins (jobs labelled
    ``weights``) the summary adds :data:`TWIN_COLUMNS` (``excess`` = coupling − twin's, paired
    prompt by prompt).
    """
    twins = any("weights" in r.job.labels for r in results)
    rows, per_prompt, depthwise, lines = [], [], [], []
    for r in results:
        row, pp, dw = _condense(r, how=how, whole_model=r.job.settings["measure"].layers is None)
        rows.append(row)
        per_prompt.extend(pp)
        depthwise.extend(dw)
        lines.append(_echo_line(_name(r), row))
    labels = ["model", "weights"] if twins else ["model"]
    per_prompt = (
        pd.concat(per_prompt, ignore_index=True)
        if per_prompt
        else pd.DataFrame(columns=[*labels, "prompt", "coupling"])
    )[[*labels, "prompt", "coupling"]]
    depthwise = (
        pd.concat(depthwise, ignore_index=True)
        if depthwise
        else pd.DataFrame(columns=[*labels, "layer_i", "layer_j", "m", "coupling"])
    )[[*labels, "layer_i", "layer_j", "m", "coupling"]]
    summary = pd.DataFrame(rows)  # every summary column, even where every job failed
    summary = summary.reindex(columns=list(dict.fromkeys([*summary.columns, *SUMMARY_COLUMNS])))
    if not twins:
        return FamilyCoupling(summary.reindex(columns=SUMMARY_COLUMNS), per_prompt, depthwise, lines)
    return FamilyCoupling(_with_twins(summary, per_prompt), per_prompt, depthwise, lines)


def _name(r: Result) -> str:
    """A job's name in :func:`family_summary`'s lines: the model (with its weights, for twins)."""
    return r.job.describe() if "weights" in r.job.labels else r.job.labels["model"]


def _line(r: Result, how: str) -> str:
    row, _, _ = _condense(r, how=how, whole_model=r.job.settings["measure"].layers is None)
    return _echo_line(_name(r), row)


def _with_twins(rows: pd.DataFrame, per_prompt: pd.DataFrame) -> pd.DataFrame:
    """One row per model: the trained model's summary, its twin's coupling and the excess."""
    trained = rows[rows["weights"] == WEIGHTS[0]].reindex(columns=SUMMARY_COLUMNS).reset_index(drop=True)
    twin = rows[rows["weights"] == WEIGHTS[1]].set_index("model")
    paired = (
        per_prompt.pivot_table(index=["model", "prompt"], columns="weights", values="coupling")
        if not per_prompt.empty
        else pd.DataFrame()
    )
    out = []
    for row in trained.to_dict("records"):
        name = row["model"]
        t = twin.loc[name] if name in twin.index else None
        diff = (
            (paired[WEIGHTS[0]] - paired[WEIGHTS[1]]).xs(name, level="model").dropna()
            if set(WEIGHTS) <= set(paired.columns) and name in paired.index.get_level_values("model")
            else pd.Series(dtype=float)
        )
        n = len(diff)
        row.update(
            twin_coupling=float("nan") if t is None else float(t["coupling"]),
            twin_coupling_sd=float("nan") if t is None else float(t["coupling_sd"]),
            excess=float(diff.mean()) if n else float("nan"),
            excess_se=float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
            twin_note="not measured" if t is None else str(t["note"]),
        )
        out.append(row)
    return pd.DataFrame(out).reindex(columns=SUMMARY_COLUMNS + TWIN_COLUMNS)


def _condense(r: Result, *, how: str, whole_model: bool):
    """One model's summary row, per-prompt frame and mean depth-wise matrix (none if left out)."""
    name = r.job.labels["model"]
    k = int(r.job.settings["measure"].k[0])
    weights = {"weights": r.job.labels["weights"]} if "weights" in r.job.labels else {}
    facts = r.model
    size = {
        key: None if facts.get(key) is None else int(facts[key])
        for key in ("n_layers", "d_model", "n_params")
    }
    row = {
        "model": name,
        **weights,
        "K": k,
        "how": how,
        **size,
        "log10_params": float(np.log10(size["n_params"])) if size["n_params"] else float("nan"),
        "seconds": r.seconds,
        "cached": not r.loaded,
    }
    if not r.ok:
        return (
            {**row, "coupling": float("nan"), "n_prompts": 0, "note": f"failed: {r.error}: {r.message}"},
            [],
            [],
        )
    if whole_model and (size["n_layers"] or 0) < 2:  # no pair of blocks to compare
        return {**row, "coupling": float("nan"), "n_prompts": 0, "note": SINGLE_BLOCK}, [], []
    m = r.measurements["measure"]
    by_prompt = m.summary(how=how, k=k, per_prompt=True)
    n = len(by_prompt)
    sd = float(by_prompt.std(ddof=1)) if n > 1 else float("nan")
    row.update(
        coupling=float(by_prompt.mean()),
        coupling_sd=sd,
        coupling_se=sd / np.sqrt(n) if n > 1 else float("nan"),
        n_prompts=n,
        note="",
    )
    pp = pd.DataFrame(
        {
            "model": name,
            **weights,
            "prompt": by_prompt.index.astype(str),
            "coupling": by_prompt.to_numpy(dtype=float),
        }
    )
    dw = m.depthwise[m.depthwise["K"] == k]
    dw = (
        dw.groupby(["layer_i", "layer_j"], as_index=False)[["m", "coupling"]]
        .mean()
        .assign(model=name, **weights)
    )
    return row, [pp], [dw]


SINGLE_BLOCK = "a single block: no pair of blocks to compare"
SIZE_COLUMNS = ("n_layers", "d_model", "n_params")


def _echo_line(name: str, row: dict) -> str:
    if row["note"] == SINGLE_BLOCK:
        return f"{name}: a single block, so no coupling across depth (left out)"
    if row["note"]:
        return f"{name}: {row['note']}"
    cached = " (cached)" if row["cached"] else ""
    took = f"{row['seconds']:.1f} s{cached}"
    return f"{name}: coupling {row['coupling']:.4f} over {row['n_prompts']} prompt(s), {took}"


#: a trained family's members, as training_stage and learning_curves read them
MEMBERS = Schema("members", {"run": "any", "path": "any"}, fix="pass zoo.family_table(...)")
STAGE_COLUMNS = [
    "run",
    "steps",
    "tokens",
    "initial_loss",
    "val_loss",
    "tail_start_loss",
    "tail_drop",
    "tail_share",
    "tail_drop_rel",
    "tail_points",
    "note",
]


def training_stage(members: pd.DataFrame, *, tail: float = 0.25) -> pd.DataFrame:
    """How far along its learning curve each member of a trained family is.

    ``members``: a family table (:func:`coupling_utils.models.zoo.family_table`: ``run`` and
    ``path`` of each member's directory, whose ``losses.parquet`` holds the held-out loss at the
    evaluated steps). Per member: ``initial_loss`` (step 0), final ``val_loss``,
    ``tail_start_loss`` (at the last evaluation at or before ``1 − tail`` of the steps),
    ``tail_drop`` = tail_start_loss − val_loss (nats: how much the loss still fell over the last
    ``tail`` of training), ``tail_share`` = tail_drop / (initial_loss − val_loss), the share
    of the whole descent that came in that stretch, and ``tail_drop_rel`` = tail_drop /
    val_loss, the drop as a fraction of the final loss, and ``tail_points``, the evaluations after the
    stretch's start (a run of 2 steps evaluated at steps 0, 1 and 2 has one: too few to tell a flat
    end from a pause). A flat end has a small drop. The share
    is small for almost any run, since the first steps (from the uniform guess to the unigram
    statistics) make most of the descent; the relative drop is not. A run evaluated only at its
    end (``checkpoints="final"``) gets NaN and a note.
    """
    from coupling_utils.models.training import load_losses

    if not 0 < tail < 1:
        raise ValueError(f"tail must be a fraction of training in (0, 1), got {tail!r}")
    check_table(members, MEMBERS)
    rows = []
    for run, path in members[["run", "path"]].itertuples(index=False):
        curve = load_losses(path).sort_values("step")
        last = curve.iloc[-1]
        steps = int(last["step"])
        row = {"run": run, "steps": steps, "tokens": int(last["tokens"]), "val_loss": float(last["val_loss"])}
        start = curve[curve["step"] == 0]
        before = curve[curve["step"] <= (1 - tail) * steps]
        if start.empty or before.empty or len(curve) < 3:
            rows.append({**row, "note": "evaluated only at its end: no learning curve"})
            continue
        initial, at = float(start["val_loss"].iloc[0]), float(before["val_loss"].iloc[-1])
        points = int((curve["step"] > before["step"].iloc[-1]).sum())
        drop = at - row["val_loss"]
        total = initial - row["val_loss"]
        rows.append(
            {
                **row,
                "initial_loss": initial,
                "tail_start_loss": at,
                "tail_drop": drop,
                "tail_share": drop / total if total > 0 else float("nan"),
                "tail_drop_rel": drop / row["val_loss"],
                "tail_points": points,
                "note": "",
            }
        )
    return pd.DataFrame(rows).reindex(columns=STAGE_COLUMNS)


def learning_curves(members: pd.DataFrame) -> pd.DataFrame:
    """The held-out learning curve of every member: ``run, step, tokens, val_loss, val_acc``
    (from each member's ``losses.parquet``; ``members`` as for :func:`training_stage`)."""
    from coupling_utils.models.training import load_losses

    check_table(members, MEMBERS)
    frames = [
        load_losses(path)[["step", "tokens", "val_loss", "val_acc"]].assign(run=run)
        for run, path in members[["run", "path"]].itertuples(index=False)
    ]
    return pd.concat(frames, ignore_index=True)[["run", "step", "tokens", "val_loss", "val_acc"]]
