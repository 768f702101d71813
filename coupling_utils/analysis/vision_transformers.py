"""Vision Transformers (chapter f04): ViT coupling against untrained twins, over training, across a family.

The paper states that ViTs show the coupling of LLMs: it emerges in training and goes with how
well a model generalises. This module measures the ViTs trained here (and hub ViTs) on MNIST
test digits through the one measurement loop (:mod:`coupling_utils.measurement`):

- :func:`vit_jobs` and :func:`vit_coupling`: one coupling number per model (mean ``1 − m_K²``
  over block pairs, see :func:`coupling_utils.measurement.coupling_summary`), for a chosen token
  (:func:`coupling_utils.models.images.vit_tokens`: the CLS token by default), with ``K`` per
  model, and optionally each model's **independently seeded twin** (same config, untrained,
  weights drawn under ``init_seed``, which must differ from the seed the run was trained from:
  otherwise the "twin" is the run's own step-0 checkpoint). A job's prompts are the digits
  themselves (:func:`mnist_digits`); they become the model's own input format
  (:func:`digit_inputs`, the job's ``prepare`` step) once it is loaded, so planning reads no
  model and a hub ViT that cannot be reached is recorded as missing instead of stopping the
  others (``Options(on_error="record")``). :func:`condense` turns collected jobs into the tables.
- :func:`twin_gap`: trained minus twin per model, paired over images, with a bootstrap interval.
- :func:`curve_shape`: shape descriptors of a coupling curve over training (rank correlation
  with the step, where the peak lies, the largest fall), for verdicts judged on the shape;
  :func:`describe_curve` puts them into words for the prose.
- :func:`plateau` and :func:`family_members`: whether a run's accuracy had flattened when it
  stopped, and a family's members with ``K`` fixed as a fraction of the width (``K/d``: one rule
  for K; the chance level of ``1 − m²`` still differs by width, so the family is judged on the
  excess over each member's twin); :func:`family_recipes` and
  :func:`run_revisions` plan the same members and checkpoints from the zoo's recipes, before
  anything is trained.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from coupling_utils.engine.metric import k_for_width
from coupling_utils.measurement import Job, Loads, Options, Result, Settings, collect, plan
from coupling_utils.measurement.jobs import WEIGHTS
from coupling_utils.models.images import check_vit_token, image_inputs, mnist_digits, vit_tokens

__all__ = [
    "ViTSetup",
    "ViTCoupling",
    "mnist_digits",
    "digit_inputs",
    "vit_jobs",
    "vit_coupling",
    "condense",
    "training_seed",
    "run_revisions",
    "family_recipes",
    "twin_gap",
    "excess_interval",
    "curve_shape",
    "describe_curve",
    "plateau",
    "family_members",
    "WEIGHTS",
]

SUMMARY_COLUMNS = [
    "model",
    "weights",
    "coupling",
    "coupling_sd",
    "coupling_se",
    "n_prompts",
    "K",
    "how",
    "token",
    "n_layers",
    "d_model",
    "n_params",
    "seconds",
    "cached",
    "note",
]
FAILURE_COLUMNS = ["model", "weights", "error", "message"]


@dataclass
class ViTCoupling:
    """What :func:`vit_coupling` measured (missing models are in ``failures``, not in the tables)."""

    summary: pd.DataFrame  # one row per (model, weights): SUMMARY_COLUMNS
    per_prompt: pd.DataFrame  # model, weights, prompt, coupling
    depthwise: pd.DataFrame  # model, weights, layer_i, layer_j, m, coupling (mean over images and tokens)
    failures: pd.DataFrame  # model, weights, error, message

    @property
    def missing(self) -> list[str]:
        """The models with at least one measurement missing."""
        return list(dict.fromkeys(self.failures["model"]))

    def report(self) -> str:
        """One line per missing measurement, with its reason (empty when nothing is missing)."""
        return "\n".join(
            f"missing {r.model} ({r.weights}): {r.error}: {r.message}" for r in self.failures.itertuples()
        )


def _recipe(name: str):
    """The training spec of an embedded run or family member, from the zoo's recipes (nothing is
    trained); None for a pretrained entry. An unknown name raises the zoo's error."""
    from coupling_utils.models import zoo

    return zoo.training_spec(name)


def training_seed(ref: Any) -> int | None:
    """The seed a local run (``embedded:...`` or a run directory) was initialised and trained
    from: an embedded run's recipe, a run directory's ``training_spec.json``; None for anything
    else (a hub model). Nothing is trained or downloaded to tell."""
    name = ref.get("name_or_path") if isinstance(ref, Mapping) else ref
    if not isinstance(name, (str, Path)):
        return None
    name = str(name)
    if name.startswith("embedded:"):
        spec = _recipe(name)
        return None if spec is None else int(spec.seed)
    spec = Path(name).expanduser() / "training_spec.json"
    if not spec.exists():
        return None
    return int(json.loads(spec.read_text())["spec"]["seed"])


def run_revisions(model: str) -> list[str]:
    """The checkpoints a ViT run saves (``step<N>``, in step order): from its recipe for an
    embedded run (so planning trains nothing), listed from its ``revisions/`` for a run directory."""
    from coupling_utils.models import zoo
    from coupling_utils.models.training import list_revisions

    if str(model).startswith("embedded:"):
        return zoo.planned_revisions(model)
    return list_revisions(Path(model).expanduser())


def _twin(name: str, ref: Any, init_seed: int) -> dict:
    """The load arguments of ``ref``'s untrained twin drawn under ``init_seed`` (never the run's own init)."""
    seed = training_seed(ref)
    if seed is not None and seed == init_seed:
        raise ValueError(
            f"init_seed={init_seed} is the seed {name} was initialised from, so its 'random init twin' "
            "would be its own step-0 checkpoint, not an independent draw; choose another init_seed"
        )
    spec = dict(ref) if isinstance(ref, Mapping) else {"name_or_path": ref}
    spec.pop("revision", None)  # the twin of the configuration (every checkpoint shares it)
    return {**spec, "random_init": True, "seed": int(init_seed)}


@dataclass(frozen=True)
class ViTSetup:
    """What every ViT of one comparison shares: the digits (``n_images`` of ``split``, chosen
    with ``seed``), the token whose Jacobians are compared (:func:`vit_tokens`), how block pairs
    make one number (``how``), the SVD ``method``, the weights' ``dtype`` and where measurements
    are stored (``cache``; None: nowhere)."""

    n_images: int = 4
    split: str = "test"
    seed: int = 0
    token: str | int = "cls"
    how: str = "offdiag"
    method: str = "exact"
    dtype: str = "float32"
    cache: str | Path | None = None


def digit_inputs(model, digits: Mapping[str, torch.Tensor]) -> dict[str, dict]:
    """The ViT jobs' ``prepare`` step: the digits (:func:`mnist_digits`) as measure() inputs in the
    loaded ``model``'s own format (:func:`~coupling_utils.models.images.image_inputs`: its size,
    channels and normalisation), ``{id: {"pixel_values": Tensor[1, C, H, W]}}``."""
    pixels = image_inputs(model, torch.stack(list(digits.values())))
    return {pid: {"pixel_values": pixels[j : j + 1]} for j, pid in enumerate(digits)}


def _model_jobs(
    name: str, ref: Any, digits: dict, setup: ViTSetup, *, k: int | Sequence[int], twins: bool, init_seed: int
) -> list[Job]:
    """One model's jobs (trained, and its twin with ``twins``); nothing of the model is read
    here: its inputs are made and its token checked once it is loaded."""
    weights = {"trained": ref}
    if twins:
        weights["random init"] = _twin(name, ref, init_seed)
    check = functools.partial(check_vit_token, token=setup.token)
    ks = [int(k)] if isinstance(k, (int, np.integer)) else [int(x) for x in k]
    settings = Settings(k=ks, tokens=vit_tokens(setup.token), method=setup.method)
    jobs, loads = [], Loads(dtype=setup.dtype)
    for w, spec in weights.items():
        for job in plan({name: spec}, digits, settings, loads=loads, root=setup.cache, check=check):
            jobs.append(dataclasses.replace(job, labels={**job.labels, "weights": w}, prepare=digit_inputs))
    return jobs


def vit_jobs(
    models: Mapping[str, Any],
    setup: ViTSetup | None = None,
    *,
    k: int | Sequence[int] | Mapping[str, int] = 10,
    twins: bool = False,
    init_seed: int = 1,
) -> list[Job]:
    """The jobs of :func:`vit_coupling` (labels ``model`` and ``weights``), e.g. to run them
    elsewhere (one cluster job each) and read them back with ``collect(jobs, Options(compute=False))``.

    Planning reads no model (a hub ViT need not be on this machine): each job's prompts are the
    digits themselves, made into the model's inputs by :func:`digit_inputs` once it is loaded.
    Raises a ValueError for an unknown token or a twin seed equal to a run's training seed."""
    setup = setup or ViTSetup()
    if not models:
        raise ValueError("models is empty; pass at least one {name: reference}")
    vit_tokens(setup.token)  # a bad token fails before any model is read
    digits, _ = mnist_digits(setup.n_images, split=setup.split, seed=setup.seed)
    jobs = []
    for name, ref in models.items():
        model_k = k[name] if isinstance(k, Mapping) else k
        jobs += _model_jobs(name, ref, digits, setup, k=model_k, twins=twins, init_seed=init_seed)
    return jobs


def vit_coupling(
    models: Mapping[str, Any],
    setup: ViTSetup | None = None,
    *,
    k: int | Mapping[str, int] = 10,
    twins: bool = False,
    init_seed: int = 1,
    options: Options | None = None,
    echo: Callable[[str], None] | None = None,
) -> ViTCoupling:
    """Coupling of each ViT in ``models`` (``{name: reference}``) on the same MNIST digits.

    A reference is ``embedded:...``, a run directory, a hub id, or ``load_model``'s arguments as
    a dict (``{"name_or_path": ..., "revision": "step64"}``). ``setup``: the digits, token,
    method, dtype and cache (:class:`ViTSetup`); each model gets the digits in its own input
    format. ``k``: one K, or ``{name: K}`` (e.g. from :func:`family_members`, K fixed as a
    fraction of each width). ``twins``: also measure each model's untrained twin drawn under
    ``init_seed`` (labelled ``weights="random init"``; a ValueError if that is the run's own
    training seed). ``options``: how the jobs run (None: ``Options(on_error="raise")``, the
    first failure propagates); with ``on_error="record"`` a model that cannot be reached, loaded
    or measured is listed in ``failures`` (exception type and message) and the others run.
    ``echo(line)``: one line per model as it is done.
    """
    jobs = vit_jobs(models, setup, k=k, twins=twins, init_seed=init_seed)
    tables = _Tables(setup or ViTSetup(), echo)
    collect(jobs, options or Options(on_error="raise"), callback=tables.add)
    return tables.done()


def condense(
    results: Iterable[Result], setup: ViTSetup, echo: Callable[[str], None] | None = None
) -> ViTCoupling:
    """The :class:`ViTCoupling` of collected ViT jobs (:func:`vit_jobs`), in their order; a job
    without a result is a row of ``failures``. ``echo(line)``: one line per job (its coupling,
    or why it is missing)."""
    tables = _Tables(setup, echo)
    for r in results:
        tables.add(r)
    return tables.done()


class _Tables:
    """The tables of a :class:`ViTCoupling`, one job's result at a time."""

    def __init__(self, setup: ViTSetup, echo: Callable[[str], None] | None = None):
        self.setup, self.echo = setup, echo
        self.rows, self.per_prompt, self.depthwise, self.failures = [], [], [], []

    def add(self, r: Result) -> None:
        row, pp, dw = _condense(r, how=self.setup.how, token=self.setup.token)
        if row is None:
            labels = {key: r.job.labels[key] for key in ("model", "weights")}
            self.failures.append({**labels, "error": r.error, "message": r.message})
        else:
            self.rows.append(row)
            self.per_prompt.append(pp)
            self.depthwise.append(dw)
        if self.echo is not None:
            self.echo(_echo_line(r, row))

    def done(self) -> ViTCoupling:
        return ViTCoupling(
            summary=pd.DataFrame(self.rows).reindex(columns=SUMMARY_COLUMNS),
            per_prompt=_concat(self.per_prompt, ["model", "weights", "prompt", "coupling"]),
            depthwise=_concat(self.depthwise, ["model", "weights", "layer_i", "layer_j", "m", "coupling"]),
            failures=pd.DataFrame(self.failures).reindex(columns=FAILURE_COLUMNS),
        )


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def _condense(r: Result, *, how: str, token) -> tuple[dict | None, pd.DataFrame | None, pd.DataFrame | None]:
    """A job's summary row, per-image couplings and mean depth-wise matrix (None for a failed job)."""
    if not r.ok:
        return None, None, None
    labels = {key: r.job.labels[key] for key in ("model", "weights")}
    m = r.measurements["measure"]
    k = int(m.depthwise["K"].iloc[0])
    facts = r.model
    by_image = m.summary(how=how, k=k, per_prompt=True)
    n = len(by_image)
    sd = float(by_image.std(ddof=1)) if n > 1 else float("nan")
    row = {
        **labels,
        "coupling": float(by_image.mean()),
        "coupling_sd": sd,
        "coupling_se": sd / np.sqrt(n) if n > 1 else float("nan"),
        "n_prompts": n,
        "K": k,
        "how": how,
        "token": str(token),
        **{key: facts.get(key) for key in ("n_layers", "d_model", "n_params")},
        "seconds": r.seconds,
        "cached": not r.loaded,
        "note": "stale: made by other code, reused" if r.stale else "",
    }
    pp = pd.DataFrame({"prompt": by_image.index.astype(str), "coupling": by_image.to_numpy(float)}).assign(
        **labels
    )
    dw = m.depthwise[m.depthwise["K"] == k]
    dw = dw.groupby(["layer_i", "layer_j"], as_index=False)[["m", "coupling"]].mean().assign(**labels)
    return row, pp, dw


def _echo_line(r: Result, row: dict | None) -> str:
    name = f"{r.job.labels['model']} ({r.job.labels['weights']})"
    if row is None:
        return f"{name}: missing ({r.error}: {r.message})"
    took = f"{row['seconds']:.1f} s{' (cached)' if row['cached'] else ''}"
    return (
        f"{name}: coupling {row['coupling']:.4f} at K = {row['K']} over {row['n_prompts']} "
        f"image{'' if row['n_prompts'] == 1 else 's'}, {took}"
    )


def excess_interval(gap: Any):
    """A :func:`twin_gap` row's excess (trained − twin) as the rules and words read it: a
    :class:`~coupling_utils.analysis.verdicts.Interval` over its images, widened to hold the estimate
    as a percentile interval may not (none from fewer than ``MIN_UNITS`` images)."""
    from coupling_utils.analysis.verdicts import Interval

    low, high = min(gap.excess_ci_low, gap.excess), max(gap.excess_ci_high, gap.excess)
    return Interval(gap.excess, low, high, over=f"{int(gap.n_images)} images")


def twin_gap(
    result: ViTCoupling, *, n_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> pd.DataFrame:
    """Trained minus random-init twin per model, paired over images, with a bootstrap interval.

    One row per model measured both ways: ``model, trained, twin, excess`` (trained − twin,
    mean over images), ``excess_ci_low/high`` (percentile bootstrap of the mean paired
    difference, resampling images), ``n_images``, ``K``, ``d_model``, ``n_layers``.
    """
    from coupling_utils.analysis.stats import mean_ci

    pp = result.per_prompt
    rows = []
    for model, g in pp.groupby("model", sort=False):
        paired = g.pivot(index="prompt", columns="weights", values="coupling")
        if set(WEIGHTS) - set(paired.columns):
            continue
        paired = paired.dropna()
        diff = (paired["trained"] - paired["random init"]).to_frame("difference").reset_index()
        if len(diff) >= 2:
            ci = mean_ci(diff["difference"], n_resamples=n_resamples, level=level, seed=seed)
            low, high = float(ci.ci_low), float(ci.ci_high)
        else:
            low = high = float("nan")
        facts = result.summary[(result.summary.model == model) & (result.summary.weights == "trained")].iloc[
            0
        ]
        rows.append(
            {
                "model": model,
                "trained": float(paired["trained"].mean()),
                "twin": float(paired["random init"].mean()),
                "excess": float(diff["difference"].mean()),
                "excess_ci_low": low,
                "excess_ci_high": high,
                "n_images": len(diff),
                "K": int(facts.K),
                "d_model": facts.d_model,
                "n_layers": facts.n_layers,
            }
        )
    columns = ["model", "trained", "twin", "excess", "excess_ci_low", "excess_ci_high", "n_images", "K",
               "d_model", "n_layers"]  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=columns)


def curve_shape(curve: pd.DataFrame, value: str = "coupling", *, step: str = "step") -> dict[str, float]:
    """Shape descriptors of ``value`` over training, from the first checkpoint (the init) on.

    ``init`` and ``final`` (first and last checkpoint), ``rise`` = (final − init) / the curve's
    range (1: from its lowest to its highest value, −1: the reverse, 0 for a flat curve; unlike
    ``ratio`` = final / init, it keeps its meaning when ``1 − m²`` is near 0 or negative), ``spearman``
    (rank correlation with the step over every checkpoint), ``rises`` (fraction of consecutive
    checkpoints that go up), ``max_drop`` (largest fall between consecutive checkpoints, as a
    fraction of the curve's range: 0 for a monotone rise), ``peak`` and ``peak_step``, and
    ``peak_fraction`` = peak_step / final step (1: the peak is at the end; on a linear step axis,
    unlike emergence's ``peak_position`` on the log-step axis), ``n_checkpoints``.
    """
    from coupling_utils.analysis.emergence import growth_summary

    if curve.empty:
        raise ValueError("the curve has no checkpoints")
    first = int(curve[step].min())
    g = growth_summary(curve, value, step=step, early_step=first).iloc[0]
    means = curve.groupby(step)[value].mean()
    peak_step = int(means.idxmax())
    span = float(means.max() - means.min())
    return {
        "init": float(g["early"]),
        "final": float(g["final"]),
        "rise": float(g["final"] - g["early"]) / span if span > 0 else 0.0,
        "ratio": float(g["ratio"]),
        "spearman": float(g["spearman"]),
        "rises": float(g["rises"]),
        "max_drop": float(g["max_drop"]),
        "peak": float(means.max()),
        "peak_step": peak_step,
        "peak_fraction": peak_step / float(g["final_step"]) if g["final_step"] else float("nan"),
        "n_checkpoints": int(g["n_checkpoints"]),
    }


def describe_curve(shape: dict[str, float]) -> str:
    """Words for a coupling curve's shape (:func:`curve_shape`), chosen from its descriptors, to
    complete "over training the coupling ...": where it ends against its start, where its peak is."""
    init, final, peak = shape["init"], shape["final"], shape["peak"]
    at_end = shape["peak_fraction"] >= 0.9
    drop = shape["max_drop"]
    dip = f", with a fall of {drop:.0%} of its range along the way" if drop > 0.3 else ""
    if final > init:
        if at_end:
            return f"rises and is highest at the end of training{dip}"
        return (
            f"rises to a peak of {peak:.3f} at step {shape['peak_step']} and falls back to {final:.3f} "
            "by the end, still above its start"
        )
    if final < init:
        if peak > init:
            return f"peaks at step {shape['peak_step']} and ends below its value at initialisation"
        return "falls below its value at initialisation"
    return "ends where it started"


def plateau(accuracy: pd.DataFrame, metric: str = "val_acc", *, tail: float = 1 / 3) -> dict[str, float]:
    """How much ``metric`` still rose over the last ``tail`` of training (0: flat at the end).

    ``gain`` = the metric at the last checkpoint minus its value at the last checkpoint at or
    before ``(1 - tail)`` of the final step (``from_step``); ``share`` = that gain as a fraction
    of the whole rise from the first checkpoint to the last (NaN if it did not rise); ``final``
    is the last value.
    """
    if not 0 < tail < 1:
        raise ValueError(f"tail must be a fraction of training between 0 and 1, got {tail}")
    acc = accuracy.dropna(subset=[metric]).sort_values("step")
    if len(acc) < 2:
        raise ValueError(f"need at least two checkpoints with {metric!r} to judge a plateau, got {len(acc)}")
    first, last = acc.iloc[0], acc.iloc[-1]
    before = acc[acc.step <= (1 - tail) * last.step]
    if before.empty:
        raise ValueError(
            f"no checkpoint at or before step {(1 - tail) * last.step:.0f}; steps: {list(acc.step)}"
        )
    ref = before.iloc[-1]
    gain = float(last[metric] - ref[metric])
    rise = float(last[metric] - first[metric])
    return {
        "final": float(last[metric]),
        "from_step": int(ref.step),
        "gain": gain,
        "share": gain / rise if rise > 0 else float("nan"),
    }


def family_recipes(family: str, *, k_over_d: float) -> pd.DataFrame:
    """An embedded ViT family's members as its recipes plan them (nothing is trained): ``run``,
    ``name`` (``embedded:<family>/<run>``), ``d_model``, ``n_layers``, ``seed`` and ``K``
    (:func:`k_for_width`), in the order of :func:`family_members`."""
    from coupling_utils.models import zoo

    entry = zoo.REGISTRY[family.removeprefix(zoo.PREFIX)]
    rows = [
        {"run": run, "name": f"{zoo.PREFIX}{entry.name}/{run}", "d_model": int(spec.d_model),
         "n_layers": int(spec.n_layers), "seed": int(spec.seed)}
        for run, spec in entry.specs().items()
    ]  # fmt: skip
    table = pd.DataFrame(rows)
    table["K"] = [k_for_width(d, k_over_d) for d in table["d_model"]]
    return table


def family_members(family: str, *, k_over_d: float, metric: str = "val_acc") -> pd.DataFrame:
    """An embedded ViT family's members (:func:`coupling_utils.models.zoo.family_table`) with
    ``K`` (:func:`k_for_width`) and how flat ``metric`` was at the end (:func:`plateau`:
    ``plateau_gain``, ``plateau_share``, ``plateau_from``); the family is trained on first use."""
    from coupling_utils.models import zoo
    from coupling_utils.models.vit_training import load_accuracy

    table = zoo.family_table(family, progress=False)
    table["K"] = [k_for_width(int(d), k_over_d) for d in table["d_model"]]
    flat = [plateau(load_accuracy(path), metric) for path in table["path"]]
    table["plateau_gain"] = [f["gain"] for f in flat]
    table["plateau_share"] = [f["share"] for f in flat]
    table["plateau_from"] = [f["from_step"] for f in flat]
    return table
