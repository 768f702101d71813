"""f04 · Vision Transformers (``notebooks/f04_vision_transformers.md``): its parameters and their
checks, its measurement plan (:func:`jobs`: the run over its checkpoints, the run and its twin,
the hub ViTs and their twins, the family and its twins), :func:`run` (what the story shows,
from the collected jobs alone), its verdict rules and claims, its figures and the values its
prose glues."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import vision_transformers as vt
from coupling_utils.analysis.verdicts import Rule, claim
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    STEP,
    NotMeasured,
    ParameterError,
    boolean,
    check_model,
    choice,
    embedded_family,
    integer,
    k_values,
    list_of,
    number,
    text,
    vit_token,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Job, Options, collect, relabel

__all__ = [
    "Params",
    "EMERGES",
    "ABOVE_TWIN",
    "HUB_ABOVE_TWIN",
    "FAMILY",
    "STUDIES",
    "vit_setup",
    "run_name",
    "checkpoints",
    "family_runs",
    "jobs",
    "NotMeasured",
    "Results",
    "run",
    "claims",
    "assumption",
    "glue_values",
    "training_figure",
    "depthwise_steps_figure",
    "twins_figure",
    "depthwise_twins_figure",
    "family_training_figure",
    "family_figure",
]

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
    n_images: int = param(4, integer(min=2))
    token: str = param("cls", vit_token)
    k: int = param(16, k_values)
    family_k_over_d: float = param(0.25, number(min=0.01, max=1.0))
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
# curve's range) and where the peak is (its step / the last step)
EMERGES = Rule(
    yes="spearman >= 0.7 and rise >= 0.5 and max_drop <= 0.3 and peak_position >= 0.5",
    partly="spearman >= 0.3 and rise > 0",
)
# trained minus its independently seeded twin, paired over images (mean and 95% interval), set
# against the gap between two untrained draws (the run's own step 0 and the twin)
ABOVE_TWIN = Rule(yes="excess_ci_low > 0 and excess > 2 * abs(init_gap)", partly="excess > 0")
# pretrained hub ViTs (paper profile): no step-0 checkpoint, so the interval alone
HUB_ABOVE_TWIN = Rule(yes="excess_ci_low > 0", partly="excess > 0")
# the family: Spearman's rho of test accuracy with the coupling in excess of each member's twin
FAMILY = Rule(yes="rho_excess >= 0.5 and rho_excess_ci_low > 0", partly="rho_excess > 0")
RULES = {"emerges": EMERGES, "above_twin": ABOVE_TWIN, "hub": HUB_ABOVE_TWIN, "family": FAMILY}

# the chapter's measurements, the ``study`` label of their jobs: the run over its checkpoints,
# the run and its twin, the hub ViTs and their twins, the family and its twins
STUDIES = ("training", "twins", "hub", "family")
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
    recipes alone: nothing is trained, downloaded or loaded."""
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
    }  # fmt: skip
    return [
        job
        for study, planned in studies.items()
        for job in relabel(planned, lambda _, study=study: {"study": study})
    ]


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
    facts: dict[str, Any]  # the run's n_layers, d_model, grid, digits (labels) and token_words
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

    @property
    def token_words(self) -> str:
        return self.facts["token_words"]

    @property
    def ends(self) -> tuple[str, str]:
        """The first and the last checkpoint measured."""
        return self.curve.revision.iloc[0], self.curve.revision.iloc[-1]

    def headline(self) -> str:
        """One line: the run, its size and patches, the digits and the token."""
        f = self.facts
        return (
            f"{self.run_name}: {f['n_layers']} blocks, width {f['d_model']}, {f['grid']} patches; "
            f"{f['n_images']} test digits {f['digits']}; measuring {f['token_words']}"
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
    lost = [r for r in done.results if not r.ok and r.job.labels["study"] != "hub"]
    if lost:
        raise NotMeasured(
            f"{NOTEBOOK} needs every job of its run and family:\n"
            + "\n".join(f"missing {r.job.describe()}: {r.error}: {r.message}" for r in lost)
        )
    s, log = vit_setup(p), {study: [] for study in STUDIES}
    studies = {
        study: vt.condense([r for r in done.results if r.job.labels["study"] == study], s, log[study].append)
        for study in STUDIES
    }
    return dataclasses.replace(_results(p, studies, family_runs(p)), log=log)


def _facts(p: Params) -> dict[str, Any]:
    """The run's size and patch grid (from its files), the digits' labels and the token's words."""
    from coupling_utils.models.images import describe_token, image_format, patch_grid

    fmt = image_format(p.model)
    grid = patch_grid(fmt)
    _, digits = vt.mnist_digits(p.n_images, split="test", seed=p.seed)
    return {
        "n_layers": fmt.config.num_hidden_layers, "d_model": fmt.config.hidden_size, "grid": grid,
        "n_images": p.n_images, "digits": digits, "token_words": describe_token(p.token, grid),
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
    from coupling_utils.analysis.generalization import predictor_comparison
    from coupling_utils.models.vit_training import load_accuracy

    curves = pd.concat(
        [load_accuracy(path).assign(run=r) for r, path in zip(members.run, members.path)], ignore_index=True
    )
    vits = members.merge(vt.twin_gap(fam, n_resamples=p.n_resamples, seed=p.seed), left_on="run",
                         right_on="model", suffixes=("", "_measured"))  # fmt: skip
    vits = vits.rename(columns={"trained": "coupling", "excess": "excess coupling"})
    vits["log10 params"] = np.log10(vits["n_params"])
    fits = predictor_comparison(vits, "test_acc", PREDICTORS, n_resamples=p.n_resamples, seed=p.seed)
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


# --------------------------------------------------------------------------- claims and glue
def twin_values(r: Results) -> dict[str, Any]:
    """What :data:`ABOVE_TWIN` judges: the run's excess over its twin, its interval, the init gap."""
    return {"excess": r.gap.excess, "excess_ci_low": r.gap.excess_ci_low, "init_gap": r.init_gap}


def family_values(r: Results) -> dict[str, Any]:
    """What :data:`FAMILY` judges: Spearman's rho of test accuracy with the excess coupling."""
    return {
        "rho_excess": r.fits.loc["excess coupling", "spearman"],
        "rho_excess_ci_low": r.fits.loc["excess coupling", "spearman_ci_low"],
    }


def claims(p: Params, r: Results) -> list[dict[str, Any]]:
    """The reproduction-status rows (for ``pipeline.status.report``): emergence, the run against
    its twin, each hub ViT measured against its twin, and the family."""
    shape, gap, fam = r.shape, r.gap, family_values(r)
    note = f"{p.n_images} test digits, {r.token_words}, K = {p.k}"
    rows = [
        claim("coupling emerges during ViT training", paper="emerges over training (no numbers published)",
              rule=EMERGES, values=shape,
              ours=f"{shape['init']:.3f} → {shape['final']:.3f}, peak {shape['peak']:.3f} at step "
                   f"{shape['peak_step']}, ρ(step) {shape['spearman']:.2f}",
              note=f"{r.run_name}, {len(r.curve)} checkpoints; {note}"),
        claim("a trained ViT is more coupled than its untrained twin",
              paper="coupling absent at initialisation", rule=ABOVE_TWIN, values=twin_values(r),
              ours=f"{gap.trained:.3f} vs twin {gap.twin:.3f} (step 0: {r.step0.coupling.mean():.3f})",
              note=f"{r.run_name}; paired over {int(gap.n_images)} images, excess interval "
                   f"[{gap.excess_ci_low:.3f}, {gap.excess_ci_high:.3f}]; twin seed {p.init_seed}; {note}"),
    ]  # fmt: skip
    for h in r.hub_gaps.itertuples() if r.hub_gaps is not None else ():
        rows.append(claim(f"pretrained {h.model} is more coupled than its untrained twin",
                          paper="coupling absent at initialisation", rule=HUB_ABOVE_TWIN,
                          values={"excess": h.excess, "excess_ci_low": h.excess_ci_low},
                          ours=f"{h.trained:.3f} vs twin {h.twin:.3f}",
                          note=f"paired over {h.n_images} images; {note}"))  # fmt: skip
    rows.append(claim("more coupled ViTs generalise better (family, test accuracy)",
                      paper="coupling relates to generalisation", rule=FAMILY, values=fam,
                      ours=f"ρ(excess) {fam['rho_excess']:.2f}; "
                           f"raw ρ {r.fits.loc['coupling', 'spearman']:.2f}",
                      note=f"{len(r.vits)} ViTs trained here on MNIST (last third of training: at most "
                           f"{100 * r.members.plateau_share.max():.1f}% of each one's accuracy rise), "
                           f"K/d = {p.family_k_over_d}; {p.n_images} test digits, "
                           f"{r.token_words}"))  # fmt: skip
    return rows


ASSUMPTIONS = {
    "f04_twin_above_zero": "the untrained twin's coupling is clearly above 0",
    "f04_family_plateau": "every family member's validation accuracy rose by less than 5% of its whole rise "
    "over its last third of training (each was trained to its plateau)",
}


def assumption(key: str, r: Results) -> tuple[str, bool, str]:
    """``(key, holds, text)`` of an assumption the prose makes about this run's numbers, for
    ``verdicts.assume`` next to that prose."""
    holds = {
        "f04_twin_above_zero": lambda: r.gap.twin > 0.005,
        "f04_family_plateau": lambda: bool((r.members.plateau_share < 0.05).all()),
    }[key]()
    return key, holds, ASSUMPTIONS[key]


def glue_values(p: Params, r: Results) -> dict[str, Any]:
    """Every value the prose glues, by name (``glue:md`` values as Markdown)."""
    from IPython.display import Markdown

    shape = r.shape
    values: dict[str, Any] = {f"f04_rule_{key}": Markdown(rule.text) for key, rule in RULES.items()}
    values |= {
        "f04_token": Markdown(r.token_words),
        "f04_digits": Markdown(", ".join(map(str, r.facts["digits"]))),
        "f04_n_images": p.n_images,
        "f04_init_seed": p.init_seed,
        "f04_k_over_d": p.family_k_over_d,
        "f04_n_tokens": 1 + int(np.prod(r.facts["grid"])),
    }
    values |= {f"f04_{key}": shape[key] for key in ("init", "final", "rise", "spearman", "max_drop", "peak",
                                                      "peak_position")}  # fmt: skip
    values |= {
        "f04_peak_step": shape["peak_step"],
        "f04_final_step": int(r.curve.step.max()),
        "f04_final_acc": float(r.curve.test_acc.iloc[-1]),
        "f04_rho_acc": r.rho_acc,
        "f04_run_plateau_gain": 100 * r.run_plateau["gain"],
        "f04_run_plateau_from": r.run_plateau["from_step"],
        "f04_emerges": Markdown(f"**{EMERGES.judge(shape)}**"),
        "f04_shape_words": Markdown(vt.describe_curve(shape)),
    }
    return values | _twin_glue(r) | _family_glue(r) | {"f04_hub_missing": Markdown(_hub_missing(r))}


def _twin_glue(r: Results) -> dict[str, Any]:
    from IPython.display import Markdown

    gap, init_gap = r.gap, r.init_gap
    return {
        "f04_trained": float(gap.trained),
        "f04_twin": float(gap.twin),
        "f04_step0": float(r.step0.coupling.mean()),
        "f04_excess": float(gap.excess),
        "f04_excess_low": float(gap.excess_ci_low),
        "f04_excess_high": float(gap.excess_ci_high),
        "f04_init_gap": init_gap,
        "f04_above_twin": Markdown(f"**{ABOVE_TWIN.judge(twin_values(r))}**"),
        "f04_twin_word": Markdown("above" if gap.excess > 0 else "below"),
        "f04_excess_abs": abs(float(gap.excess)),
        "f04_gap_ratio": float(abs(gap.excess) / abs(init_gap)) if init_gap else float("inf"),
    }


def _family_glue(r: Results) -> dict[str, Any]:
    from IPython.display import Markdown

    fits, vits = r.fits, r.vits
    values = {
        "f04_plateau_share_max": 100 * float(r.members.plateau_share.max()),
        "f04_plateau_gain_max": 100 * float(r.members.plateau_gain.max()),
        "f04_family_n": len(vits),
        "f04_acc_low": float(vits.test_acc.min()),
        "f04_acc_high": float(vits.test_acc.max()),
    }
    for label, key in (("excess coupling", "excess"), ("coupling", "raw")):
        values[f"f04_rho_{key}"] = float(fits.loc[label, "spearman"])
        values[f"f04_rho_{key}_low"] = float(fits.loc[label, "spearman_ci_low"])
        values[f"f04_rho_{key}_high"] = float(fits.loc[label, "spearman_ci_high"])
    values["f04_family"] = Markdown(f"**{FAMILY.judge(family_values(r))}**")
    signs = np.sign(fits.loc["excess coupling", "spearman"]) * np.sign(fits.loc["coupling", "spearman"])
    values["f04_sign_words"] = Markdown(
        "agree in sign" if signs > 0 else
        "disagree in sign, and the excess decides, as stated before the result" if signs < 0
        else "do not both have a sign (one is 0), and the excess decides"
    )  # fmt: skip
    fitted = fits.dropna(subset=["r2"])
    values["f04_best"] = Markdown(f"{fitted.r2.idxmax()!s} (R² = {fitted.r2.max():.2f})")
    return values


def _hub_missing(r: Results) -> str:
    """ "Not measured in this run: ..." for hub ViTs that are missing (empty when none is)."""
    hub = r.hub
    if hub is None or not len(hub.failures):
        return ""
    missing = "; ".join(f"{m} ({hub.failures[hub.failures.model == m].error.iloc[0]})" for m in hub.missing)
    return f"Not measured in this run: {missing}."


# --------------------------------------------------------------------------- figures
# each returns show()'s arguments: the chart, its name, caption and alt text
def training_figure(p: Params, r: Results) -> dict[str, Any]:
    """Coupling (top) and accuracy (bottom) at every checkpoint of the run."""
    from coupling_utils.analysis import plots

    curve, shape = r.curve, r.shape
    coupling = plots.training_curve(
        curve,
        "step",
        "coupling",
        title=f"{r.run_name}: coupling over training",
        y_title=f"coupling (mean 1 − m², K = {p.k})",
    )
    accuracy = plots.training_curve(
        curve.melt(
            id_vars="step", value_vars=["val_acc", "test_acc"], var_name="split", value_name="accuracy"
        ),
        "step",
        "accuracy",
        color="split",
        title=f"{r.run_name}: accuracy over training",
        y_title="MNIST accuracy",
    )
    return dict(
        chart=coupling & accuracy, name="fig-f04-training",
        caption=f"Coupling of {r.token_words} (top) and accuracy (bottom) at every checkpoint of one MNIST "
                "ViT; step 0 is the random initialisation.",
        alt=f"Two line charts over training steps on a log scale. Top: coupling goes from "
            f"{shape['init']:.3f} at step 0 to {shape['final']:.3f} at step {int(curve.step.max())}, highest "
            f"({shape['peak']:.3f}) at step {shape['peak_step']}. Bottom: validation and test accuracy "
            f"rising to {curve.test_acc.iloc[-1]:.3f}.",
    )  # fmt: skip


def depthwise_steps_figure(p: Params, r: Results) -> dict[str, Any]:
    """The depth-wise coupling matrix at the first and the last checkpoint."""
    from coupling_utils.analysis import plots

    first, last = r.ends
    ends = r.over.depthwise[r.over.depthwise.model.isin([first, last])]
    return dict(
        chart=plots.coupling_heatmap(ends, "layer_j", "layer_i", "m", facet="model", columns=2, size=200,
                                     title="Depth-wise coupling 1 − m², first and last checkpoint"),
        name="fig-f04-depthwise-steps",
        caption=f"Depth-wise coupling $1 - m_K^2$ between blocks $i$ and $j$ at {first} and {last} (mean "
                "over images; the diagonal is grey).",
        alt=f"Two heatmaps of block-pair coupling, {first} and {last}, blocks 0 to "
            f"{int(ends.layer_i.max())} on both axes.",
    )  # fmt: skip


def twins_figure(p: Params, r: Results) -> dict[str, Any]:
    """Each trained ViT beside its twin and, for the run, its own step 0."""
    from coupling_utils.analysis import plots

    gap = r.gap
    return dict(
        chart=plots.bars(r.bars, "model", "coupling", color="weights",
                         title="Trained vs untrained (mean ± s.e. over images)",
                         y_title=f"coupling (mean 1 − m², K = {p.k})", x_title=None),
        name="fig-f04-twins",
        caption="Coupling of each trained ViT beside its untrained twin (another seed) and, for the run "
                "trained here, its own step-0 initialisation; error bars: standard error over images.",
        alt=f"Bar chart: {r.run_name} trained {gap.trained:.3f}, random-init twin {gap.twin:.3f}, its "
            f"step 0 {r.step0.coupling.mean():.3f}"
            + ("; plus the hub ViTs measured." if r.hub is not None else "."),
    )  # fmt: skip


def depthwise_twins_figure(p: Params, r: Results) -> dict[str, Any]:
    """The depth-wise coupling matrix of the run, trained and its twin."""
    from coupling_utils.analysis import plots

    return dict(
        chart=plots.coupling_heatmap(r.twins.depthwise, "layer_j", "layer_i", "m", facet="weights", columns=2,
                                     size=200, title="Depth-wise coupling 1 − m², trained and random init"),
        name="fig-f04-depthwise-twins",
        caption=f"Depth-wise coupling of {r.run_name} trained and of its untrained twin (mean over images).",
        alt=f"Two heatmaps of block-pair coupling for {r.run_name}: trained and random init.",
    )  # fmt: skip


def family_training_figure(p: Params, r: Results) -> dict[str, Any]:
    """Validation accuracy of every family member during training."""
    from coupling_utils.analysis import plots

    members = r.members
    return dict(
        chart=plots.training_curve(r.curves.dropna(subset=["val_acc"]), "step", "val_acc", color="run",
                                   log_step=False, title="ViT family: validation accuracy during training",
                                   y_title="validation accuracy"),
        name="fig-f04-family-training",
        caption="Validation accuracy of every family member during training, on one recipe.",
        alt=f"Line chart of {len(members)} runs' validation accuracy over training steps, ending between "
            f"{members.val_acc.min():.3f} and {members.val_acc.max():.3f}.",
    )  # fmt: skip


def family_figure(p: Params, r: Results) -> dict[str, Any]:
    """Test accuracy of each member against its excess coupling (left) and its raw coupling (right)."""
    from coupling_utils.analysis import plots

    vits = r.vits
    raw = plots.scatter_fit(
        vits,
        "coupling",
        "test_acc",
        label="run",
        title="Raw coupling",
        width=280,
        x_title=f"coupling (mean 1 − m², K/d = {p.family_k_over_d})",
        y_title="MNIST test accuracy",
    )
    excess = plots.scatter_fit(
        vits,
        "excess coupling",
        "test_acc",
        label="run",
        title="In excess of the twin",
        width=280,
        x_title="coupling − twin's coupling",
        y_title="MNIST test accuracy",
    )
    return dict(
        chart=excess | raw, name="fig-f04-family",
        caption="Test accuracy of each family member against its coupling in excess of its own untrained "
                "twin (left, which carries the verdict) and against the raw coupling (right).",
        alt=f"Two scatter plots of {len(vits)} ViTs, test accuracy from {vits.test_acc.min():.3f} to "
            f"{vits.test_acc.max():.3f} on y; x is the excess coupling (left) and the raw coupling (right).",
    )  # fmt: skip
