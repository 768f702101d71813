"""f04's parameters and their checks (:class:`Params`), its verdict rules (fixed before any
number), its measurement plan (:func:`jobs`: the run over its checkpoints, the run and its twin,
the hub ViTs and their twins, the family and its twins) and :func:`run` (what the story shows,
from the collected jobs alone, as :class:`Results`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.analysis.emergence import step_of
from coupling_utils.analysis.model_names import checkpoints_words, model_words, of_result
from coupling_utils.analysis.verdicts import Rule
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    STEP,
    NotMeasured,
    ParameterError,
    boolean,
    check_model,
    check_top_k,
    choice,
    embedded_family,
    integer,
    k_values,
    list_of,
    number,
    refuse_misfits,
    text,
    vit_token,
    with_check,
)
from coupling_utils.chapters.f04_vision_transformers.exercises import condense_exercises, exercise_jobs
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Job, Options, collect, relabel

NOTEBOOK = "f04_vision_transformers"


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = ()

    model: str = param("embedded:vit-mnist", check_model)
    revisions: list = param([], list_of(text(STEP), min_len=0))
    family: str = param("embedded:vit-family", embedded_family)
    hub_models: list = param([], list_of(check_model, min_len=0))
    n_images: int = param(64, integer(min=2))
    token: str = param("cls", vit_token)
    k: int = param(8, k_values)
    family_k_over_d: float = param(0.125, number(min=0.01, max=1.0))
    how: str = param("offdiag", choice(*HOWS))
    dtype: str = param("float32", choice(*DTYPES))
    method: str = param("exact", choice(*METHODS))
    init_seed: int = param(100, integer(min=0))
    n_resamples: int = param(1000, integer(min=10))
    seed: int = param(0, integer(min=0))
    use_cache: bool = param(True, boolean)


# --------------------------------------------------------------------------- the verdict rules
# the shape of the coupling curve over one run's checkpoints (step 0 = the initialisation):
# rank correlation with the step, last minus first value and largest fall (both as fractions of the
# curve's range) and where the peak is (its step / the last step); each with its interval over the
# test images
EMERGES = Rule(
    yes="spearman >= 0.7 and rise >= 0.5 and max_drop <= 0.3 and peak_fraction >= 0.5",
    partly="spearman >= 0.3 and rise > 0",
)
# trained minus its independently seeded twin, paired over images (mean and 95% interval), set
# against the gap between two untrained draws (the run's own step 0 and the twin)
# (a yes needs the whole interval of the excess above both)
ABOVE_TWIN = Rule(yes="excess > 0 and excess > 2 * abs(init_gap)", partly="excess > 0")
# pretrained hub ViTs (paper profile): no step-0 checkpoint, so the interval alone
HUB_ABOVE_TWIN = Rule(yes="excess > 0", partly="excess > 0")
# the family: Spearman's rho of test accuracy with the coupling in excess of each member's twin
# (a yes needs its whole bootstrap interval at or above 0.5)
FAMILY = Rule(yes="rho_excess >= 0.5", partly="rho_excess > 0")
RULES = {"emerges": EMERGES, "above_twin": ABOVE_TWIN, "hub": HUB_ABOVE_TWIN, "family": FAMILY}

# the chapter's measurements, the ``study`` label of their jobs: the run over its checkpoints,
# the run and its twin, the hub ViTs and their twins, the family and its twins, and the variants
# the exercises' solutions quote (:mod:`.exercises`)
STUDIES = ("training", "twins", "hub", "family", "exercises")
# the family's predictors of test accuracy: {label: column}
PREDICTORS = {
    "excess coupling": "excess coupling",
    "coupling": "coupling",
    "log10 params": "log10 params",
    "depth": "n_layers",
    "width": "d_model",
}


# --------------------------------------------------------------------------- the measurement plan
def vit_setup(p: Params) -> vt.ViTSetup:
    """What every ViT of the chapter shares (:class:`~coupling_utils.analysis.vision_transformers.ViTSetup`):
    ``n_images`` test digits chosen with ``seed``, the token, ``how``, method, dtype, the cache."""
    return vt.ViTSetup(
        n_images=p.n_images, seed=p.seed, token=p.token, how=p.how, method=p.method, dtype=p.dtype,
        cache=cache_dir("f04"),
    )  # fmt: skip


def run_name(p: Params) -> str:
    """The run's name in the tables (``vit-mnist`` for ``embedded:vit-mnist``)."""
    return Path(str(p.model)).name.removeprefix("embedded:")


def run_dir(p: Params) -> Path:
    """The run's directory (an embedded run is trained on first use)."""
    from coupling_utils.models import zoo

    return zoo.resolve(p.model, progress=False) if p.model.startswith("embedded:") else Path(p.model)


def checkpoints(p: Params) -> list[str]:
    """The checkpoints measured: ``revisions``, or every checkpoint the run saves (an embedded
    run's from its recipe: nothing is trained to plan)."""
    steps = p.revisions or vt.run_revisions(p.model)
    if not steps:
        raise ValueError(
            f"{p.model} saved no checkpoints; pass a run with revisions or list them in 'revisions'"
        )
    return list(steps)


def family_runs(p: Params) -> pd.DataFrame:
    """The family's members with ``K`` = ``family_k_over_d`` × width, their accuracy and
    plateaus (the family is trained on first use)."""
    return vt.family_members(p.family, k_over_d=p.family_k_over_d)


def jobs(p: Params) -> list[Job]:
    """The measurement plan, every job labelled with its ``study`` (:data:`STUDIES`): each
    checkpoint of the run (trained weights, ``k``); the run and its twin drawn under
    ``init_seed``; each hub ViT and its twin (``k``); each family member and its twin (``K`` =
    ``family_k_over_d`` × width). Every job's prompts are the same ``n_images`` digits, made into
    the model's own input format once it is loaded. Planned from the parameters and the zoo's
    recipes alone: nothing is trained, downloaded or loaded; each job checks ``token`` and ``k``
    against its loaded model (:func:`_check_fits`) before measuring."""
    if not p.use_cache:
        raise ParameterError(
            "parameter 'use_cache' is false: the notebook would not read what a sweep stores; drop the "
            "override"
        )
    s = vit_setup(p)
    members = vt.family_recipes(p.family, k_over_d=p.family_k_over_d)
    twins = {"twins": True, "init_seed": p.init_seed}
    studies = {
        "training": vt.vit_jobs({rev: {"name_or_path": p.model, "revision": rev} for rev in checkpoints(p)},
                                s, k=p.k),
        "twins": vt.vit_jobs({run_name(p): p.model}, s, k=p.k, **twins),
        "hub": vt.vit_jobs({h: h for h in p.hub_models}, s, k=p.k, **twins) if p.hub_models else [],
        "family": vt.vit_jobs(dict(zip(members.run, members.name)), s, k=dict(zip(members.run, members.K)),
                              **twins),
        "exercises": exercise_jobs(p, s, run_name(p), checkpoints(p)),
    }  # fmt: skip
    labelled = [
        job
        for study, planned in studies.items()
        for job in relabel(planned, lambda _, study=study: {"study": study})
    ]
    return with_check(labelled, _check_fits, chain=True, p=p)


def _check_fits(lm, *, p: Params, job: Job) -> None:
    """``token`` (where ``job`` measures at it) and ``k`` (the family's K is a fraction of each
    width) against ``job``'s loaded model, each a ParameterError naming the parameter, the model
    and its grid or width (:func:`jobs` runs the job's own check, an exercise's token, after it).
    A refusal is recorded under the job's key, so only a job whose key holds the parameter may
    refuse it."""
    from coupling_utils.models.images import patch_grid, vit_tokens

    model = str(job.model) + (f" at {job.revision}" if job.revision else "")
    rows, cols = patch_grid(lm)
    position = vit_tokens(p.token)  # [patch + 1] for a patch
    own = isinstance(position, list) and job.settings["measure"].tokens == tuple(position)
    if own and position[0] > rows * cols:
        raise ParameterError(
            f"parameter 'token' names a patch that does not exist, got {p.token!r}: {model} has a "
            f"{rows}×{cols} grid of {rows * cols} patches; choose patch0..patch{rows * cols - 1} (row r, "
            f"column c is patch r·{cols} + c), or 'cls', 'last' or 'mean'"
        )
    if job.labels["study"] != "family":
        for K in p.k if isinstance(p.k, list) else [p.k]:
            check_top_k("k", K, d=int(lm.d_model), model=model)


# --------------------------------------------------------------------------- the results


@dataclass
class Results:
    """What the story shows, every number from the collected :func:`jobs`.

    ``over``, ``twins``, ``hub`` (None without ``hub_models``) and ``fam``: the four studies'
    :class:`~coupling_utils.analysis.vision_transformers.ViTCoupling`; ``curve``: the run's
    coupling and accuracy by checkpoint, ``shape`` its descriptors, ``rho_acc`` its Spearman
    correlation with test accuracy, ``run_plateau`` the run's accuracy plateau; ``gap``: the
    run against its twin (a row of ``twin_gap``), ``step0``: the run's first checkpoint as a
    third bar, ``init_gap``: step 0 minus the twin; ``hub_gaps``; ``members`` and their
    accuracy ``curves``; ``vits``: the family's coupling beside the members' table; ``fits``:
    the family's predictors of test accuracy (by predictor); ``log``: a line per job, by study.
    """

    run_name: str
    facts: dict[str, Any]  # the run's n_layers, d_model, grid, patch (pixels), digits (labels), token_words
    over: vt.ViTCoupling
    curve: pd.DataFrame
    shape: dict[str, float]
    rho_acc: float
    run_plateau: dict[str, float]
    twins: vt.ViTCoupling
    gap: pd.Series
    step0: pd.DataFrame
    init_gap: float
    hub: vt.ViTCoupling | None
    hub_gaps: pd.DataFrame | None
    members: pd.DataFrame
    curves: pd.DataFrame
    fam: vt.ViTCoupling
    vits: pd.DataFrame
    fits: pd.DataFrame
    log: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # by study: a line per job
    exercises: dict[str, vt.ViTCoupling] = dataclasses.field(default_factory=dict)  # by variant
    named: dict[str, str] = dataclasses.field(default_factory=dict)  # "run" and each hub ViT, as measured

    @property
    def token_words(self) -> str:
        return self.facts["token_words"]

    @functools.cached_property
    def emerges_values(self) -> dict[str, Any]:
        """What :data:`EMERGES` judges: :attr:`shape` with 95% intervals over the test images
        (images resampled, their mean curve's descriptors recomputed); computed once, however
        often the claims are."""
        from coupling_utils.analysis.training_curves import shape_intervals

        per = self.over.per_prompt.rename(columns={"prompt": "image"})
        per = per.assign(step=per.model.str.removeprefix("step").astype(int))
        names = sorted(EMERGES.names)
        return self.shape | shape_intervals(
            per, "coupling", vt.curve_shape, names, unit="image", n_resamples=500
        )

    @property
    def ends(self) -> tuple[str, str]:
        """The first and the last checkpoint measured."""
        return self.curve.revision.iloc[0], self.curve.revision.iloc[-1]

    def headline(self) -> str:
        """One line: the run, its size and patches, the digits and the token."""
        f = self.facts
        return (
            f"{self.named['run']}: {f['n_layers']} blocks, width {f['d_model']}, a {f['grid'][0]} × "
            f"{f['grid'][1]} grid of {f['patch'][0]} × {f['patch'][1]}-pixel patches; {f['n_images']} "
            f"test digits ({', '.join(map(str, f['digits']))}); measuring {f['token_words']}"
        )

    @property
    def bars(self) -> pd.DataFrame:
        """Per-image coupling of the run, its twin, its step 0 and the hub ViTs, for the bar chart."""
        hub = [self.hub.per_prompt] if self.hub is not None else []
        return pd.concat([self.twins.per_prompt, self.step0] + hub, ignore_index=True)

    @property
    def curve_table(self) -> pd.DataFrame:
        return self.curve[["revision", "step", "coupling", "coupling_sd", "val_acc", "test_acc"]]

    @property
    def twins_table(self) -> pd.DataFrame:
        table = self.bars.pivot_table(index="model", columns="weights", values="coupling", aggfunc="mean")
        return table.reset_index()

    @property
    def members_table(self) -> pd.DataFrame:
        columns = ["run", "d_model", "n_layers", "seed", "steps", "epochs", "K", "val_acc", "test_acc",
                   "plateau_gain", "plateau_share"]  # fmt: skip
        return self.members[columns]

    @property
    def family_table(self) -> pd.DataFrame:
        columns = ["run", "d_model", "n_layers", "K", "coupling", "twin", "excess coupling", "excess_ci_low",
                   "excess_ci_high", "test_acc"]  # fmt: skip
        return self.vits[columns]

    @property
    def predictors_table(self) -> pd.DataFrame:
        columns = ["predictor", "n", "r2", "r2_ci_low", "r2_ci_high", "slope", "p", "spearman",
                   "spearman_ci_low", "spearman_ci_high", "note"]  # fmt: skip
        return self.fits.reset_index()[columns]

    def measured(self, study: str) -> str:
        """A line per job of ``study`` (:data:`STUDIES`): its coupling and time, or why it is missing."""
        return "\n".join(self.log.get(study, []))

    def hub_report(self) -> str:
        """The hub ViTs that are missing, with the reason (empty when none is)."""
        return self.hub.report() if self.hub is not None else ""


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (measured where missing, else read) and derive what the story shows.
    A hub ViT that is missing is recorded (``hub.failures``); any other missing job raises
    :class:`NotMeasured`, naming the reason."""
    done = collect(jobs(p), options, desc=NOTEBOOK)
    refuse_misfits(done.results, NOTEBOOK)  # a parameter the model does not fit: bad input, hub or not
    lost = [r for r in done.results if not r.ok and r.job.labels["study"] != "hub"]
    if lost:
        raise NotMeasured(
            f"{NOTEBOOK} needs every job of its run and family:\n"
            + "\n".join(f"missing {r.job.describe()}: {r.error}: {r.message}" for r in lost)
        )
    s, log = vit_setup(p), {study: [] for study in STUDIES}
    by = {study: [r for r in done.results if r.job.labels["study"] == study] for study in STUDIES}
    studies = {
        study: vt.condense(by[study], s, log[study].append) for study in STUDIES if study != "exercises"
    }
    exercises = condense_exercises(by["exercises"], s, log["exercises"].append)
    return dataclasses.replace(
        _results(p, studies, family_runs(p)), log=log, exercises=exercises, named=_named(by)
    )


def _named(by: Mapping[str, list]) -> dict[str, str]:
    """The models named as measured (:mod:`~coupling_utils.analysis.model_names`): the run over
    its checkpoints (key ``"run"``), the trained weights its twin is set against (key ``"twins"``)
    and each hub ViT measured, by its reference."""
    trained = [r for r in by["training"] if r.ok]
    trained.sort(key=lambda r: step_of(r.job.revision))
    named = {"run": checkpoints_words([of_result(r) for r in trained])}
    for r in by["twins"]:
        if r.ok and r.job.weights == "trained":
            named["twins"] = model_words(of_result(r))
    for r in by["hub"]:
        if r.ok and r.job.weights == "trained":
            named[str(r.job.model)] = model_words(of_result(r))
    return named


def _facts(p: Params) -> dict[str, Any]:
    """The run's size and patch grid (from its files), the digits' labels and the token's words."""
    from coupling_utils.models.images import describe_token, image_format, patch_grid

    fmt = image_format(p.model)
    grid = patch_grid(fmt)
    patch = getattr(fmt.config, "patch_size", 16)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    _, digits = vt.mnist_digits(p.n_images, split="test", seed=p.seed)
    return {
        "n_layers": fmt.config.num_hidden_layers, "d_model": fmt.config.hidden_size, "grid": grid,
        "patch": patch, "n_images": p.n_images, "digits": digits,
        "token_words": describe_token(p.token, grid),
    }  # fmt: skip


def _training(p: Params, over: vt.ViTCoupling) -> tuple[pd.DataFrame, dict[str, float]]:
    """The run's coupling curve with its recorded accuracy, and the run's plateau."""
    from coupling_utils.models.vit_training import load_accuracy

    accuracy = load_accuracy(run_dir(p))
    curve = over.summary.rename(columns={"model": "revision"})
    curve["step"] = curve.revision.str.removeprefix("step").astype(int)
    curve = curve.merge(accuracy[["step", "val_acc", "test_acc"]], on="step", how="left")
    return curve, vt.plateau(accuracy)


def _family(
    p: Params, members: pd.DataFrame, fam: vt.ViTCoupling
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The members' accuracy curves, their coupling beside the members' table, and the predictors."""
    from coupling_utils.analysis.predictors import predictor_comparison
    from coupling_utils.analysis.stats import Bootstrap
    from coupling_utils.models.vit_training import load_accuracy

    curves = pd.concat(
        [load_accuracy(path).assign(run=r) for r, path in zip(members.run, members.path)], ignore_index=True
    )
    vits = members.merge(vt.twin_gap(fam, n_resamples=p.n_resamples, seed=p.seed), left_on="run",
                         right_on="model", suffixes=("", "_measured"))  # fmt: skip
    vits = vits.rename(columns={"trained": "coupling", "excess": "excess coupling"})
    vits["log10 params"] = np.log10(vits["n_params"])
    fits = predictor_comparison(
        vits, "test_acc", PREDICTORS, Bootstrap(n_resamples=p.n_resamples, seed=p.seed)
    )
    return curves, vits, fits.set_index("predictor")


def _results(p: Params, studies: Mapping[str, vt.ViTCoupling], members: pd.DataFrame) -> Results:
    """Every table and number of the story from the four studies, computed as the notebook always has."""
    over, twins = studies["training"], studies["twins"]
    hub = studies["hub"] if p.hub_models else None
    curve, run_plateau = _training(p, over)
    shape = vt.curve_shape(curve)
    rho_acc = float(curve[["test_acc", "coupling"]].corr(method="spearman").iloc[0, 1])
    gap = vt.twin_gap(twins, n_resamples=p.n_resamples, seed=p.seed).iloc[0]
    first = curve.revision.iloc[0]
    step0 = over.per_prompt[over.per_prompt.model == first].assign(
        model=run_name(p), weights=f"{first} (own init)"
    )
    init_gap = float(step0.coupling.mean() - gap.twin)
    hub_gaps = vt.twin_gap(hub, n_resamples=p.n_resamples, seed=p.seed) if hub is not None else None
    curves, vits, fits = _family(p, members, studies["family"])
    return Results(
        run_name(p), _facts(p), over, curve, shape, rho_acc, run_plateau, twins, gap, step0, init_gap, hub,
        hub_gaps, members, curves, studies["family"], vits, fits,
    )  # fmt: skip
