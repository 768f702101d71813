"""f02 · Coupling and generalisation (``notebooks/f02_generalization.md``): its parameters and
their checks, its measurement plan (:func:`jobs`), the run that collects it (:func:`run`), the
analyses each section shows, its status rows (:func:`claims`) and the values its prose glues
(:func:`glue_values`).

The notebook is story plus calls: ``results = run(params)`` measures (or reads what a sweep
stored) exactly :func:`jobs`; each section then calls its analysis (:func:`paper_fit`,
:func:`training`, :func:`family_table`, :func:`family_fits`, :func:`hub_fit`,
:func:`scale_answer`, :func:`beyond`), shows its tables and charts, and the status cell reports
:func:`claims` and glues :func:`glue_values` in one call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import leaderboards, plots, scale
from coupling_utils.analysis.data import fig1a_table, join_scores
from coupling_utils.analysis.generalization import (
    FamilyCoupling,
    best_predictor,
    family_jobs,
    family_summary,
    k_for_width,
    learning_curves,
    predictor_comparison,
    r2_difference,
    training_stage,
)
from coupling_utils.analysis.verdicts import Rule, claim
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    ParameterError,
    boolean,
    check_k,
    check_model,
    choice,
    embedded_family,
    integer,
    k_values,
    list_of,
    number,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Options, Result, Settings, collect
from coupling_utils.measurement.jobs import Job

__all__ = [
    "Params",
    "jobs",
    "run",
    "Results",
    "RULES",
    "rule_lines",
    "prompts",
    "family_members",
    "family_widths",
    "scale_ks",
    "scale_prompts",
    "paper_fit",
    "training",
    "family_table",
    "family_fits",
    "hub_fit",
    "scale_answer",
    "beyond",
    "Story",
    "claims",
    "glue_values",
    "assumptions",
]

NOTEBOOK = "f02_generalization"


def _scale_reference_measured(v: Mapping[str, Any]) -> str | None:
    if v["scale_reference"] not in v["scale_models"]:
        return (
            f"parameter 'scale_reference' must be one of scale_models = {v['scale_models']}, "
            f"got {v['scale_reference']!r}"
        )
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_scale_reference_measured,)

    fig1a_y: str = param("score", choice("score", "average"))
    family: str = param("embedded:lm-family", embedded_family)
    hub_models: list = param([], list_of(check_model, min_len=0))
    prompt_source: str = param("corpus", choice("corpus", "prompt_set"))
    n_prompts: int = param(4, integer(min=1))
    prompt_tokens: int = param(32, integer(min=2))
    k: int = param(10, k_values)
    k_per_d: float = param(0.125, number(min=0.001, max=1.0))
    how: str = param("offdiag", choice(*HOWS))
    tokens: str = param("last", choice("last", "all"))
    dtype: str = param("float32", choice(*DTYPES))
    method: str = param("exact", choice(*METHODS))
    init_seed: int = param(0, integer(min=0))
    tail: float = param(0.25, number(min=0.05, max=0.5))
    scale_models: list = param(["embedded:smollm2-135m", "embedded:minilm-l6"], list_of(check_model))
    scale_reference: str = param("embedded:smollm2-135m", check_model)
    scale_k: list = param([10, 30, 50], list_of(check_k))
    scale_prompts: int = param(0, integer(min=0))
    scale_max_tokens: int = param(12, integer(min=2))
    n_resamples: int = param(1000, integer(min=10))
    seed: int = param(0, integer(min=0))
    use_cache: bool = param(True, boolean)


def prompts(p: Params) -> dict[str, str]:
    """The family's and the hub models' prompts: held-out corpus windows or the prompt set."""
    from coupling_utils.analysis.data import load_prompts
    from coupling_utils.analysis.generalization import corpus_prompts

    if p.prompt_source == "corpus":
        return corpus_prompts(p.n_prompts, p.prompt_tokens, seed=p.seed)
    table = load_prompts(n=p.n_prompts, include_demo=False)
    return dict(zip(table["id"], table["text"]))


def family_members(p: Params) -> dict[str, str]:
    """``{run: "embedded:<family>/<run>"}`` from the zoo's registry (nothing is trained here)."""
    from coupling_utils.models import zoo

    name = p.family.removeprefix("embedded:")
    entry = zoo.REGISTRY.get(name)
    if entry is None or not entry.is_family:
        families = ", ".join(e.name for e in zoo.REGISTRY.values() if e.is_family)
        raise ParameterError(
            f"parameter 'family': {p.family!r} is not an embedded family; families: {families}"
        )
    return {run: f"embedded:{name}/{run}" for run in entry.members()}


def family_widths(p: Params) -> dict[str, int]:
    """Each family member's width ``d``, ``{run: d}``, from its recipe (nothing is trained here)."""
    from coupling_utils.models import zoo

    specs = zoo.REGISTRY[p.family.removeprefix("embedded:")].specs()
    return {run: int(specs[run].d_model) for run in family_members(p)}


def scale_ks(p: Params) -> dict[str, list[int]]:
    """The scale question's models with the K values each is measured at: ``scale_models`` at every
    ``scale_k``, each family member at the ``scale_k`` that fit its width."""
    members = family_members(p)
    ks = {name: list(p.scale_k) for name in p.scale_models}
    ks.update({members[run]: [K for K in p.scale_k if d >= K] for run, d in family_widths(p).items()})
    return {name: k for name, k in ks.items() if k}


def scale_prompts(p: Params) -> dict[str, str]:
    """The scale question's prompts: the demo prompt and ``scale_prompts`` of the prompt set."""
    from coupling_utils.analysis.data import load_prompts

    table = load_prompts(n=p.scale_prompts, include_demo=True)
    return dict(zip(table["id"], table["text"]))


# --------------------------------------------------------------------------- the rules, fixed first
# the replotted Fig. 1a: R² of the leaderboard score on the paper's digitised coupling
FIG1A_FIT = Rule(yes="abs(r2 - 0.80) <= 0.02", partly="abs(r2 - 0.80) <= 0.1")
# "more strongly than size": the paired bootstrap interval of R²(coupling) − R²(best size measure)
BEATS_SIZE = Rule(yes="gap_low > 0", partly="gap > 0")
# the family: held-out accuracy rises with coupling *in excess of the twin* (Spearman's rho, 95% interval)
GENERALISES = Rule(yes="rho_low > 0 and n >= 6", partly="rho > 0")
# the family: excess coupling explains accuracy better than the best size measure, with a positive slope
FAMILY_BEATS_SIZE = Rule(yes="gap_low > 0 and slope > 0", partly="gap > 0 and slope > 0")
# hub models measured here: the leaderboard average rises with our coupling (slope's 95% interval)
HUB = Rule(yes="slope_low > 0 and n >= 6", partly="slope > 0")
# beyond the paper: the paper's coupling predicts the leaderboard v2 average (slope's 95% interval)
EXTENSION = Rule(yes="slope_low > 0", partly="slope > 0")
# a family member counts as trained to the flat part of its learning curve when the last
# `tail` of its training lowered held-out loss by less than 5% of its whole descent
FLAT = Rule(yes="tail_share <= 0.05")
RULES = {
    "Fig. 1a fit": FIG1A_FIT,
    "beats size": BEATS_SIZE,
    "family": GENERALISES,
    "family vs size": FAMILY_BEATS_SIZE,
    "hub models": HUB,
    "leaderboard v2": EXTENSION,
    "flat curve": FLAT,
}
"""Each claim's rule by its short name, as "The claim" prints them before any number."""

# the status rows' claims, by the short name the glue and the notebook use
CLAIMS = {
    "fig1a": "coupling predicts the leaderboard average (Fig. 1a, R² over 28 models)",
    "size": "coupling predicts the score better than parameters, depth or width (Fig. 1a models)",
    "family": "more coupled models generalise better (our LM family, excess over twin vs held-out accuracy)",
    "family_size": "coupling beats size as a predictor (our LM family, accuracy)",
    "v2": (
        "Extension (this book's, not the paper's claim): the paper's coupling predicts the leaderboard "
        "v2 average"
    ),
    "scale": (
        "the paper's Fig. 1a axis (0.89–0.955) is the scale of an aggregation that separates "
        "trained from twin"
    ),
    "hub": "coupling measured here predicts the leaderboard (hub models)",
}

# the columns of a predictor comparison the chapter shows, and the size measures coupling must beat
SHOW = [
    "predictor",
    "n",
    "r2",
    "r2_ci_low",
    "r2_ci_high",
    "slope",
    "p",
    "spearman",
    "spearman_ci_low",
    "spearman_ci_high",
    "note",
]
SIZES = ["log10 params", "depth", "width"]
PAPER_PREDICTORS = {
    "coupling": "coupling",
    "log10 params": "log10_params",
    "depth": "n_layers",
    "width": "d_model",
}
FAMILY_PREDICTORS = {
    "excess": "excess",
    "raw coupling": "coupling",
    "twin coupling": "twin_coupling",
    "log10 params": "log10 params",
    "depth": "n_layers",
    "width": "d_model",
}


def rule_lines() -> str:
    """Every claim's rule, one line each (what "The claim" prints)."""
    return "\n".join(f"{name:15s} {rule.text}" for name, rule in RULES.items())


# --------------------------------------------------------------------------- the plan and the run
def _parts(p: Params, *, store: bool) -> dict[str, list[Job]]:
    """The plan by part: "family" (members and twins, K per width), "hub" (``hub_models`` at
    ``k``; empty without them) and "scale" (the scale question); ``store``: under the cache."""
    texts = prompts(p)
    settings = Settings(tokens=p.tokens, method=p.method, max_tokens=p.prompt_tokens)
    cache = cache_dir("f02") if store else None
    family_k = {run: k_for_width(d, p.k_per_d) for run, d in family_widths(p).items()}
    family = family_jobs(
        family_members(p),
        texts,
        settings,
        k=family_k,
        dtype=p.dtype,
        cache=cache,
        twins=True,
        twin_seed=p.init_seed,
    )
    hub = (
        family_jobs(p.hub_models, texts, settings, k=p.k, dtype=p.dtype, cache=cache) if p.hub_models else []
    )
    ks = scale_ks(p)
    scaled = scale.scale_jobs(
        list(ks),
        scale_prompts(p),
        k=ks,
        dtype=p.dtype,
        seed=p.init_seed,
        method=p.method,
        max_tokens=p.scale_max_tokens,
        root=cache_dir("f02", "scale") if store else None,
    )
    return {"family": family, "hub": hub, "scale": scaled}


def jobs(p: Params) -> list[Job]:
    """The measurement plan: the family with its twins (``K`` per width from ``k_per_d``), the
    ``hub_models`` (``k``), and the scale question (``scale.scale_jobs``)."""
    if not p.use_cache:
        raise ParameterError(
            "parameter 'use_cache' is false: the notebook would not read what a sweep stores; drop the "
            "override"
        )
    return [job for part in _parts(p, store=True).values() for job in part]


@dataclass
class Results:
    """What :func:`run` collected: the prompts, the family with its twins, the hub models (None
    without ``hub_models``), the scale question's candidates, and every missing job."""

    prompts: dict[str, str]
    family: FamilyCoupling
    hub: FamilyCoupling | None
    scale: scale.ScaleMeasurement
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def prompt_table(self) -> pd.DataFrame:
        """The prompts every model is measured on: ``prompt, text``."""
        return pd.DataFrame({"prompt": list(self.prompts), "text": list(self.prompts.values())})


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (one :func:`~coupling_utils.measurement.collect`: what is stored is
    read, the rest measured) and condense each part. With ``use_cache=False`` the same jobs are
    measured without being stored (a run that a sweep cannot feed). ``options``: how they run
    (default: failures are recorded, the other jobs still run)."""
    parts = _parts(p, store=p.use_cache)
    got = collect([job for part in parts.values() for job in part], options, desc="f02")
    done = iter(got.results)
    results: dict[str, list[Result]] = {name: [next(done) for _ in part] for name, part in parts.items()}
    return Results(
        prompts=parts["family"][0].prompts,
        family=family_summary(results["family"], how=p.how),
        hub=family_summary(results["hub"], how=p.how) if p.hub_models else None,
        scale=scale.scale_summary(results["scale"]),
        failures=got.failures,
    )


# --------------------------------------------------------------------------- (a) the paper's points
@dataclass
class PaperFit:
    """The replotted Fig. 1a: its points, every predictor's fit, the best size measure (``rival``)
    and the paired bootstrap ``gap`` R²(coupling) − R²(rival)."""

    points: pd.DataFrame
    fits: pd.DataFrame
    rival: str
    gap: dict[str, float]

    @property
    def by_predictor(self) -> pd.DataFrame:
        return self.fits.set_index("predictor")

    @property
    def r2(self) -> float:
        return float(self.by_predictor.loc["coupling", "r2"])


def paper_fit(p: Params) -> PaperFit:
    """Each predictor of the digitised Fig. 1a score (``fig1a_y``), on the same 28 models."""
    fig = fig1a_table()
    fits = predictor_comparison(fig, p.fig1a_y, PAPER_PREDICTORS, n_resamples=p.n_resamples, seed=p.seed)
    rival = best_predictor(fits, among=SIZES)
    gap = r2_difference(
        fig, p.fig1a_y, "coupling", PAPER_PREDICTORS[rival], n_resamples=p.n_resamples, seed=p.seed
    )
    return PaperFit(fig, fits, rival, gap)


def fig1a_chart(p: Params, paper: PaperFit):
    """Fig. 1a replotted from the digitised points, with its least-squares line."""
    return plots.scatter_fit(
        paper.points,
        "coupling",
        p.fig1a_y,
        label="label",
        title="Fig. 1a replotted (digitised points)",
        x_title="coupling (the paper's per-model number)",
        y_title=f"leaderboard v1 ({p.fig1a_y})",
    )


# --------------------------------------------------------------------------- (b) the family
@dataclass
class Training:
    """The family's members with their held-out scores, how flat each learning curve ends, and
    the curves themselves."""

    members: pd.DataFrame
    stage: pd.DataFrame
    curves: pd.DataFrame

    @property
    def n_flat(self) -> int:
        return int(self.stage["flat"].sum())


def training(p: Params) -> Training:
    """The members (``zoo.family_table``, with tokens per parameter), each member's training
    stage (:func:`training_stage` over the last ``tail``, judged by :data:`FLAT`) and curves."""
    from coupling_utils.models import zoo

    members = zoo.family_table(p.family, progress=False)
    members["tokens per parameter"] = members["tokens"] / members["n_params"]
    stage = training_stage(members, tail=p.tail)
    curves = learning_curves(members)
    stage["flat"] = [FLAT.judge({"tail_share": v}) == "yes" for v in stage["tail_share"]]
    return Training(members, stage, curves)


def members_table(t: Training) -> pd.DataFrame:
    """The members table the chapter shows."""
    columns = [
        "run",
        "n_params",
        "n_layers",
        "d_model",
        "steps",
        "tokens",
        "tokens per parameter",
        "seed",
        "val_loss",
        "val_acc",
    ]
    return t.members[columns].round(4)


def curves_chart(t: Training):
    """Held-out loss of every member against the tokens it has seen."""
    return plots.training_curve(
        t.curves,
        "tokens",
        "val_loss",
        color="run",
        log_step=False,
        title="Held-out loss over training",
        y_title="val_loss",
    )


@dataclass
class Family:
    """The family's coupling joined with its members: ``ours`` (members measured with their twins,
    with ``log10 params``), the members ``left_out`` (with why), each member's ``K``, and the
    measurement itself (its ``per_prompt`` table)."""

    ours: pd.DataFrame
    left_out: list[str]
    ks: dict[str, int]
    measured: FamilyCoupling


def family_table(p: Params, t: Training, results: Results) -> Family:
    """The members with their coupling, their twin's and the excess (members without both are
    left out, with the reason)."""
    members = t.members
    family_k = {run: k_for_width(int(d), p.k_per_d) for run, d in zip(members["run"], members["d_model"])}
    measured = results.family
    summary = measured.summary
    ours = members.merge(
        summary.drop(columns=["n_layers", "d_model", "n_params"]), left_on="run", right_on="model"
    )
    gone = ours[ours.coupling.isna() | ours.twin_coupling.isna()]
    left_out = [
        f"left out {run}: {note or twin_note}"
        for run, note, twin_note in gone[["run", "note", "twin_note"]].itertuples(index=False)
    ]
    ours = ours.dropna(subset=["coupling", "twin_coupling"]).reset_index(drop=True)
    ours["log10 params"] = np.log10(ours["n_params"])
    return Family(ours, left_out, family_k, measured)


def coupling_table(f: Family) -> pd.DataFrame:
    """The family_coupling table the chapter shows."""
    columns = [
        "run",
        "d_model",
        "n_layers",
        "K",
        "coupling",
        "twin_coupling",
        "excess",
        "excess_se",
        "val_loss",
        "val_acc",
    ]
    return f.ours[columns].round(4)


def family_chart(p: Params, f: Family):
    """Held-out accuracy against the excess over the twin (left) and against raw coupling (right)."""
    return plots.scatter_fit(
        f.ours,
        "excess",
        "val_acc",
        label="run",
        title="Excess over the twin vs accuracy",
        x_title="excess coupling (trained − twin)",
        y_title="held-out accuracy",
        width=280,
    ) | plots.scatter_fit(
        f.ours,
        "coupling",
        "val_acc",
        label="run",
        title="Raw coupling vs accuracy",
        x_title=f"raw coupling (mean 1 − m², {p.how})",
        y_title="held-out accuracy",
        width=280,
    )


def per_prompt_chart(f: Family):
    """Each member's and twin's coupling, mean ± s.e. over the prompts."""
    return plots.bars(
        f.measured.per_prompt,
        "model",
        "coupling",
        color="weights",
        title="Coupling per member (mean ± s.e. over prompts)",
        y_title="coupling (mean 1 − m²)",
        x_title="member",
    )


@dataclass
class FamilyFits:
    """Every predictor of held-out accuracy and loss in the family (``fits``); for accuracy
    (``acc``, by predictor) the best size measure (``rival``), the paired ``gap`` R²(excess) −
    R²(rival), Spearman's ``rho`` of the three couplings and the best predictor of all."""

    fits: pd.DataFrame
    acc: pd.DataFrame
    rival: str
    gap: dict[str, float]
    rho: dict[str, float]
    best: str


def family_fits(p: Params, f: Family) -> FamilyFits:
    """The same comparison of predictors as for the paper's points, for accuracy and loss."""
    fits = pd.concat(
        [
            predictor_comparison(f.ours, y, FAMILY_PREDICTORS, n_resamples=p.n_resamples, seed=p.seed)
            for y in ("val_acc", "val_loss")
        ],
        ignore_index=True,
    )
    acc = fits[fits.y == "val_acc"].set_index("predictor")
    rival = best_predictor(acc.reset_index(), among=SIZES)
    gap = r2_difference(
        f.ours, "val_acc", "excess", FAMILY_PREDICTORS[rival], n_resamples=p.n_resamples, seed=p.seed
    )
    rho = {name: float(acc.loc[name, "spearman"]) for name in ("excess", "raw coupling", "twin coupling")}
    return FamilyFits(fits, acc, rival, gap, rho, best_predictor(acc.reset_index()))


# --------------------------------------------------------------------------- (c) the hub models
@dataclass
class Hub:
    """The hub models measured here: the measurement (its lines, one per model), the models left
    out, and (with at least 3 v1 averages) the models joined with their scores and the paper's
    coupling (``table``) and every predictor of the v1 average (``fits``); both None otherwise."""

    measured: FamilyCoupling
    missing: pd.DataFrame
    table: pd.DataFrame | None
    fits: pd.DataFrame | None

    @property
    def n_measured(self) -> int:
        return len(self.measured.summary) - len(self.missing)

    @property
    def coupling(self) -> pd.Series | None:
        """The fit of the v1 average on our coupling (None without one)."""
        return None if self.fits is None else self.fits.set_index("predictor").loc["coupling"]


def hub_fit(p: Params, results: Results, paper: PaperFit) -> Hub | None:
    """Our coupling of the hub models against their leaderboard v1 average and the paper's
    coupling (None without ``hub_models``)."""
    if results.hub is None:
        return None
    summary = results.hub.summary
    missing = summary[summary.coupling.isna()]
    hub = join_scores(summary.dropna(subset=["coupling"]), model_col="model", metadata=False, warn=False)
    hub = hub.merge(
        paper.points[["model_id", "label", "coupling", "log10_params", "n_layers", "d_model"]].rename(
            columns={"coupling": "paper_coupling"}
        ),
        on="model_id",
        how="left",
        suffixes=("", "_paper"),
    )
    if hub["average"].notna().sum() < 3:
        return Hub(results.hub, missing, None, None)
    fits = predictor_comparison(hub, "average", PAPER_PREDICTORS, n_resamples=p.n_resamples, seed=p.seed)
    return Hub(results.hub, missing, hub, fits)


def hub_chart(hub: Hub):
    """Our coupling against the v1 average (left) and against the paper's coupling (right)."""
    return plots.scatter_fit(
        hub.table.dropna(subset=["average"]),
        "coupling",
        "average",
        label="model_id",
        title="Hub models: our coupling",
        y_title="leaderboard v1 average",
        width=280,
    ) | plots.scatter_fit(
        hub.table.dropna(subset=["paper_coupling"]),
        "paper_coupling",
        "coupling",
        label="label",
        title="Our coupling vs the paper's",
        x_title="the paper's coupling (digitised)",
        y_title="our coupling",
        width=280,
    )


# --------------------------------------------------------------------------- the scale question
AXIS_RULES = scale.axis_rules()
"""When a candidate is compatible with each figure's axis (``scale.axis_rule``)."""


def axis_lines() -> str:
    """Each figure's axis rule, one line each (what the scale section prints)."""
    return "\n".join(
        f"{name} ({scale.AXES[name][0]}–{scale.AXES[name][1]}): {rule.text}"
        for name, rule in AXIS_RULES.items()
    )


@dataclass
class ScaleAnswer:
    """The scale question judged: every candidate (``judged``), those ``compatible`` with each
    axis, this book's number at the largest K (``book``), the counts of compatible candidates,
    and the candidate that comes closest to Fig. 1a without separating trained from twin."""

    measured: scale.ScaleMeasurement
    judged: pd.DataFrame
    compatible: pd.DataFrame
    book: pd.Series | None
    n_1a: int
    n_1b: int
    miss: pd.Series | None
    n_miss: int


def scale_answer(p: Params, results: Results) -> ScaleAnswer:
    """Every candidate of ``scale_reference`` and its twin judged by :data:`AXIS_RULES`."""
    judged = scale.judge(results.scale.values, p.scale_reference)
    compatible = scale.compatible(judged)
    book = scale.book_choice(judged, max(p.scale_k))
    n_1a, n_1b = int((judged["Fig. 1a"] == "yes").sum()), int((judged["Fig. 1b"] == "yes").sum())
    miss = scale.closest_miss(judged, "Fig. 1a")
    n_miss = int((judged["Fig. 1a on scale"] & (judged["Fig. 1a"] != "yes")).sum())
    return ScaleAnswer(results.scale, judged, compatible, book, n_1a, n_1b, miss, n_miss)


def scale_chart(p: Params, s: ScaleAnswer):
    """Every candidate for the reference model (filled) and its twin (hollow)."""
    return scale.scale_chart(
        s.judged,
        reference=p.scale_reference.removeprefix("embedded:"),
        title="Every candidate per-model number: trained vs twin",
    )


# --------------------------------------------------------------------------- beyond the paper
@dataclass
class Beyond:
    """The paper's coupling against each leaderboard task (``task_fits``, v1 and v2) and against
    the mean of all tasks but one (``drop_one``, v1 then v2)."""

    task_fits: pd.DataFrame
    drop_one: pd.DataFrame

    def fit(self, version: str) -> pd.Series:
        """The fit of leaderboard ``version``'s average."""
        return self.task_fits.set_index(["version", "task"]).loc[(version, "average")]

    @property
    def tasks(self) -> pd.DataFrame:
        """The fits of single tasks (no averages)."""
        return self.task_fits[self.task_fits.task != "average"]


def beyond(p: Params) -> Beyond:
    """Each task's fit on the paper's coupling, and each leave-one-task-out average's."""
    task_fits = pd.concat(
        [leaderboards.task_fits(v, n_resamples=p.n_resamples, seed=p.seed) for v in ("v1", "v2")],
        ignore_index=True,
    )
    left_out_v2 = leaderboards.drop_one("v2", n_resamples=p.n_resamples, seed=p.seed)
    left_out_v1 = leaderboards.drop_one("v1", n_resamples=p.n_resamples, seed=p.seed)
    return Beyond(task_fits, pd.concat([left_out_v1, left_out_v2], ignore_index=True))


def tasks_chart(b: Beyond):
    """R² of each leaderboard task on the paper's coupling, beside log parameter count."""
    df = b.task_fits.melt(
        id_vars=["version", "name"], value_vars=["r2", "size_r2"], var_name="predictor", value_name="R²"
    ).replace({"predictor": {"r2": "coupling (paper's)", "size_r2": "log10 params"}})
    df["task"] = df["version"] + " " + df["name"]
    return plots.bars(
        df,
        "task",
        "R²",
        color="predictor",
        title="R² of each leaderboard task",
        x_title="leaderboard and task",
        y_title="R² over the Fig. 1a models",
    )


# --------------------------------------------------------------------------- status and glue
@dataclass
class Story:
    """Every section's analysis, which the status rows, the glued values and the assumptions read."""

    paper: PaperFit
    training: Training
    family: Family
    fits: FamilyFits
    hub: Hub | None
    scale: ScaleAnswer
    beyond: Beyond

    @property
    def hub_coupling(self) -> pd.Series | None:
        """The hub models' fit of the v1 average on our coupling (None: not measured or too few)."""
        return None if self.hub is None else self.hub.coupling


def claims(p: Params, story: Story) -> list[dict[str, Any]]:
    """The status rows, each judged by its rule (pass them to ``pipeline.status.report``)."""
    rows = [*_paper_claims(p, story.paper), *_family_claims(p, story), *_beyond_claims(p, story)]
    fit = story.hub_coupling
    if fit is not None:
        rows.append(
            claim(
                CLAIMS["hub"],
                paper=0.80,
                rule=HUB,
                values={"slope": fit["slope"], "slope_low": fit["slope_ci_low"], "n": fit["n"]},
                ours=f"R² {fit['r2']:.3f}, slope {fit['slope']:.3g}",
                note=f"{int(fit['n'])} models with a v1 score; K = {p.k}",
            )
        )
    return rows


def _paper_claims(p: Params, paper: PaperFit) -> list[dict[str, Any]]:
    fig_r2, gap, rival = paper.r2, paper.gap, paper.rival
    return [
        claim(
            CLAIMS["fig1a"],
            paper=0.80,
            rule=FIG1A_FIT,
            values={"r2": fig_r2},
            ours=round(fig_r2, 3),
            kind="replot",
            note=f"the paper's digitised points replotted (y = {p.fig1a_y}); not a measurement",
        ),
        claim(
            CLAIMS["size"],
            paper="higher R² than each (values not published)",
            rule=BEATS_SIZE,
            values={"gap": gap["estimate"], "gap_low": gap["ci_low"]},
            ours=f"R² {fig_r2:.3f} vs {rival} {paper.by_predictor.loc[rival, 'r2']:.3f}",
            kind="replot",
            note=f"the paper's digitised coupling; paired bootstrap ΔR² {gap['estimate']:.3f} "
            f"[{gap['ci_low']:.3f}, {gap['ci_high']:.3f}]",
        ),
    ]


def _family_claims(p: Params, story: Story) -> list[dict[str, Any]]:
    ours, fits, stage = story.family.ours, story.fits, story.training.stage
    ex, rho, gap = fits.acc.loc["excess"], fits.rho, fits.gap
    return [
        claim(
            CLAIMS["family"],
            paper="positive correlation with performance",
            rule=GENERALISES,
            values={"rho": ex["spearman"], "rho_low": ex["spearman_ci_low"], "n": len(ours)},
            ours=f"Spearman ρ {ex['spearman']:.2f} [{ex['spearman_ci_low']:.2f}, "
            f"{ex['spearman_ci_high']:.2f}]",
            note=f"{len(ours)} models trained here, K/d = {p.k_per_d}; raw coupling ρ "
            f"{rho['raw coupling']:.2f}, "
            f"twins ρ {rho['twin coupling']:.2f}; {story.training.n_flat} of {len(stage)} learning "
            f"curves flat",
        ),
        claim(
            CLAIMS["family_size"],
            paper="higher R² than parameters, depth, width",
            rule=FAMILY_BEATS_SIZE,
            values={"gap": gap["estimate"], "gap_low": gap["ci_low"], "slope": ex["slope"]},
            ours=f"R² {ex['r2']:.3f} (excess) vs {fits.rival} {fits.acc.loc[fits.rival, 'r2']:.3f}",
            note=f"paired bootstrap ΔR² {gap['estimate']:.3f} [{gap['ci_low']:.3f}, {gap['ci_high']:.3f}]",
        ),
    ]


def _beyond_claims(p: Params, story: Story) -> list[dict[str, Any]]:
    v2, v1, s = story.beyond.fit("v2"), story.beyond.fit("v1"), story.scale
    return [
        claim(
            CLAIMS["v2"],
            paper="not studied",
            rule=EXTENSION,
            values={"slope": v2.slope, "slope_low": v2.slope_ci_low},
            ours=f"R² {v2.r2:.3f} over {int(v2.n)} models (v1: {v1.r2:.3f})",
            kind="replot",
            note=f"the paper's digitised coupling against v2; log params R² {v2.size_r2:.3f}",
        ),
        claim(
            CLAIMS["scale"],
            paper="0.89–0.955 (aggregation not published)",
            rule=Rule(yes="n_compatible >= 1"),
            values={"n_compatible": s.n_1a},
            ours=f"{s.n_1a} of {len(s.judged)} candidates; {s.n_1b} fit Fig. 1b's axis",
            note=f"judged on {p.scale_reference} and its twin; rule: {AXIS_RULES['Fig. 1a'].text}",
        ),
    ]


def glue_values(p: Params, story: Story, status: pd.DataFrame) -> dict[str, Any]:
    """Every value the prose glues, by name (``status``: what ``report`` returned for
    :func:`claims`, whose verdicts the prose quotes)."""
    verdict = dict(zip(status.claim, status.agree))
    return {
        **_paper_glue(story.paper),
        **_training_glue(p, story.training),
        **_family_ks_glue(p, story.training, story.family),
        **_fits_glue(story.family, story.fits),
        **_width_glue(story.family, story.fits),
        **_scale_glue(p, story.scale),
        **_beyond_glue(story.paper, story.beyond),
        **_verdict_glue(story, verdict),
    }


def _paper_glue(paper: PaperFit) -> dict[str, Any]:
    fits, gap = paper.by_predictor, paper.gap
    return {
        "f02_fig1a_r2": float(fits.loc["coupling", "r2"]),
        "f02_fig1a_n": int(fits.loc["coupling", "n"]),
        "f02_fig1a_rival": Markdown(paper.rival),
        "f02_fig1a_rival_r2": float(fits.loc[paper.rival, "r2"]),
        "f02_fig1a_gap": gap["estimate"],
        "f02_fig1a_gap_low": gap["ci_low"],
        "f02_fig1a_gap_high": gap["ci_high"],
        "f02_fig1a_separates": Markdown(
            "lies above 0: coupling is the better predictor of the two"
            if gap["ci_low"] > 0
            else "includes 0: these 28 models do not separate the two predictors"
        ),
    }


def _training_glue(p: Params, t: Training) -> dict[str, Any]:
    stage, members, n_flat = t.stage, t.members, t.n_flat
    return {
        "f02_n_members": len(stage),
        "f02_n_flat": n_flat,
        "f02_tail": p.tail,
        "f02_worst_tail_share": float(stage["tail_share"].max()),
        "f02_worst_tail_drop": float(stage["tail_drop"].max()),
        "f02_loss_low": float(members["val_loss"].min()),
        "f02_loss_high": float(members["val_loss"].max()),
        "f02_tpp": float(members["tokens per parameter"].median()),
        "f02_stage_sentence": Markdown(
            "every member's curve is flat at its end by that rule"
            if n_flat == len(stage)
            else f"only {n_flat} of {len(stage)} curves are flat at their end by that rule: the others "
            f"were still "
            "descending, so the comparison below is partly one of how far training got"
        ),
    }


def _family_ks_glue(p: Params, t: Training, f: Family) -> dict[str, Any]:
    members = t.members
    by_width = {int(d): f.ks[r] for r, d in zip(members["run"], members["d_model"])}
    return {
        "f02_k_per_d": p.k_per_d,
        "f02_family_ks": Markdown(", ".join(f"{K} at d = {d}" for d, K in sorted(by_width.items()))),
    }


def _fits_glue(f: Family, fits: FamilyFits) -> dict[str, Any]:
    ours, acc, rho, gap = f.ours, fits.acc, fits.rho, fits.gap
    same_sign = np.sign(rho["excess"]) == np.sign(rho["raw coupling"])
    above = ours["excess"] > 0
    clear = ours["excess"] > 2 * ours["excess_se"]
    return {
        "f02_family_n": len(ours),
        "f02_excess_rho": rho["excess"],
        "f02_excess_rho_low": float(acc.loc["excess", "spearman_ci_low"]),
        "f02_excess_rho_high": float(acc.loc["excess", "spearman_ci_high"]),
        "f02_excess_r2": float(acc.loc["excess", "r2"]),
        "f02_raw_rho": rho["raw coupling"],
        "f02_twin_rho": rho["twin coupling"],
        "f02_family_rival": Markdown(fits.rival),
        "f02_family_rival_r2": float(acc.loc[fits.rival, "r2"]),
        "f02_family_gap": gap["estimate"],
        "f02_family_gap_low": gap["ci_low"],
        "f02_family_gap_high": gap["ci_high"],
        "f02_family_best": Markdown(fits.best),
        "f02_family_best_r2": float(acc.loc[fits.best, "r2"]),
        "f02_sign_carrier": Markdown(
            f"Raw and excess coupling correlate with accuracy in the same direction "
            f"({'positive' if rho['excess'] > 0 else 'negative'}), so by the rule stated above the sign "
            f"is carried "
            "by what training added"
            if same_sign
            else f"Raw coupling correlates with accuracy "
            f"{'positively' if rho['raw coupling'] > 0 else 'negatively'}, "
            f"the excess {'positively' if rho['excess'] > 0 else 'negatively'}: by the rule stated above "
            f"the raw "
            "sign is the chance level's, not training's"
        ),
        "f02_above_twin": Markdown(
            "Every trained member is more coupled than its twin"
            if above.all()
            else f"{int(above.sum())} of {len(ours)} trained members are more coupled than their twins "
            f"({int(clear.sum())} by more than two standard errors)"
        ),
    }


def _width_glue(f: Family, fits: FamilyFits) -> dict[str, Any]:
    by_width = f.ours.groupby("d_model").agg(
        ex_lo=("excess", "min"), ex_hi=("excess", "max"), acc_lo=("val_acc", "min"), acc_hi=("val_acc", "max")
    )
    split = (
        len(by_width) == 2
        and (
            by_width.ex_hi.iloc[1] < by_width.ex_lo.iloc[0] or by_width.ex_hi.iloc[0] < by_width.ex_lo.iloc[1]
        )
        and (
            by_width.acc_hi.iloc[0] < by_width.acc_lo.iloc[1]
            or by_width.acc_hi.iloc[1] < by_width.acc_lo.iloc[0]
        )
    )
    return {
        "f02_width_split": Markdown(
            "By width: "
            + "; ".join(
                f"at d = {d} the excess spans {r.ex_lo:.3f} to {r.ex_hi:.3f} and accuracy "
                f"{r.acc_lo:.3f} to {r.acc_hi:.3f}"
                for d, r in by_width.iterrows()
            )
            + ". "
            + (
                "The two widths do not overlap in either, so the family's correlation is a comparison of "
                "the two widths: "
                "it cannot tell coupling from width."
                if split
                else "The widths overlap, so the correlation is not only a comparison of the two widths."
            )
        ),
        "f02_sign_word": Markdown(
            "positive, the direction the paper reports"
            if fits.rho["excess"] > 0
            else "negative, the opposite of the paper's direction"
        ),
    }


def _scale_glue(p: Params, s: ScaleAnswer) -> dict[str, Any]:
    book, miss, n_1a, n_1b, n_miss = s.book, s.miss, s.n_1a, s.n_1b, s.n_miss
    return {
        "f02_scale_ks": Markdown(", ".join(map(str, p.scale_k))),
        "f02_scale_reference": Markdown(p.scale_reference.removeprefix("embedded:")),
        "f02_scale_n": len(s.judged),
        "f02_scale_n_1a": n_1a,
        "f02_scale_n_1b": n_1b,
        "f02_scale_n_1a_scale": n_miss,
        "f02_scale_1a_example": Markdown(
            f"{n_miss} candidate(s) put the trained model on Fig. 1a's scale but do not "
            f"separate it from its twin; the one that comes closest ({scale.candidate_label(miss)}, "
            f"{miss.denominator} "
            f"denominator, {miss.form}) gives {miss.trained:.3f} for the trained model and "
            f"{miss.twin:.3f} for the twin"
            if miss is not None
            else "no candidate puts the trained model on Fig. 1a's scale"
        ),
        "f02_scale_book_trained": float(book.trained) if book is not None else float("nan"),
        "f02_scale_book_twin": float(book.twin) if book is not None else float("nan"),
        "f02_scale_book_k": int(max(p.scale_k)),
        "f02_scale_book_1b": Markdown(
            (
                "is compatible with Fig. 1b's axis"
                if book["Fig. 1b"] == "yes"
                else "is not compatible with Fig. 1b's axis"
            )
            + (" and with Fig. 1a's" if book["Fig. 1a"] == "yes" else " and not with Fig. 1a's")
        )
        if book is not None
        else Markdown("was not computed in this run"),
        "f02_scale_1a_sentence": Markdown(
            "The candidates that reach Fig. 1a's scale do not tell a trained model from a random one, so "
            "that axis "
            "is not reproduced by any aggregation we could find"
            if n_1a == 0
            else f"{n_1a} candidate(s) reach Fig. 1a's scale and separate the trained model from its "
            f"twin (the "
            "`scale_compatible` table): that axis could be one of them"
        ),
        "f02_scale_conclusion": Markdown(
            (
                f"{n_1a} candidate(s) are compatible with Fig. 1a's axis. "
                if n_1a
                else "No candidate is compatible with Fig. 1a's axis. "
            )
            + (f"{n_1b} are compatible with Fig. 1b's." if n_1b else "None is compatible with Fig. 1b's.")
        ),
    }


def _beyond_glue(paper: PaperFit, b: Beyond) -> dict[str, Any]:
    v2, v1, tasks = b.fit("v2"), b.fit("v1"), b.tasks
    out = {
        "f02_v2_r2": float(v2.r2),
        "f02_v2_r2_low": float(v2.r2_ci_low),
        "f02_v2_r2_high": float(v2.r2_ci_high),
        "f02_v2_size_r2": float(v2.size_r2),
        "f02_v2_n": int(v2.n),
        "f02_v1_r2": float(v1.r2),
        "f02_v1_n": int(v1.n),
    }
    for v in ("v1", "v2"):
        t = tasks[tasks.version == v].sort_values("r2")
        out[f"f02_{v}_best_task"] = Markdown(t.iloc[-1]["name"])
        out[f"f02_{v}_best_task_r2"] = float(t.iloc[-1]["r2"])
        out[f"f02_{v}_worst_task"] = Markdown(t.iloc[0]["name"])
        out[f"f02_{v}_worst_task_r2"] = float(t.iloc[0]["r2"])
    drop = b.drop_one[b.drop_one.version == "v1"]
    carrier = drop[drop.left_out != "none"].sort_values("r2_change").iloc[0]
    out.update(
        {
            "f02_tasks_beats_size": int((tasks.r2 > tasks.size_r2).sum()),
            "f02_tasks_n": len(tasks),
            "f02_v2_vs_v1": Markdown("weaker than" if v2.r2 < v1.r2 else "at least as strong as"),
            "f02_snapshot_word": Markdown(
                "the fit survives the snapshot change"
                if abs(v1.r2 - paper.r2) <= 0.1
                else "the fit moves by more than 0.1 with the snapshot"
            ),
            "f02_v1_carrier_sentence": Markdown(
                f"Leaving {carrier['name']} out of the v1 average lowers the fit most (by "
                f"{-carrier['r2_change']:.3f}): "
                "it is the task that carries it"
                if carrier["r2_change"] < 0
                else "Leaving any single task out of the v1 average does not lower the fit: no one task "
                "carries it"
            ),
        }
    )
    return out


def _verdict_glue(story: Story, verdict: Mapping[str, str]) -> dict[str, Any]:
    fit = story.hub_coupling
    out = {
        f"f02_verdict_{name}": Markdown(verdict[CLAIMS[key]])
        for name, key in (
            ("fig1a", "fig1a"),
            ("size", "size"),
            ("family", "family"),
            ("family_size", "family_size"),
            ("v2", "v2"),
            ("scale", "scale"),
        )
    }
    out["f02_hub_sentence"] = Markdown(
        "**Not reproduced here.** The measurement of the 28 hub models needs a GPU and the hub "
        "(`--profile paper`); "
        "this run does not include it."
        if fit is None
        else f"**The hub models** ({verdict[CLAIMS['hub']]}): our coupling of {int(fit['n'])} hub models "
        f"with a v1 "
        f"score explains $R^2$ = {fit['r2']:.3f} of the leaderboard average."
    )
    return out


def assumptions(story: Story) -> list[tuple[str, bool, str]]:
    """``(key, holds, text)`` of every sentence that assumes something of this run's numbers
    (for ``verdicts.assume``)."""
    s, t = story.scale, story.training
    book, judged = s.book, s.judged
    tokens = judged[judged.view == "tokens"]
    return [
        (
            "f02-trace-blind",
            s.n_1a == 0,
            "no candidate both reaches Fig. 1a's scale and separates the trained model from its twin",
        ),
        (
            "f02-book-choice-separates",
            book is not None and book["trained"] - book["twin"] > 0.03,
            "this book's number separates the trained model from its twin by more than 0.03",
        ),
        (
            "f02-book-choice-on-1b",
            book is not None and bool(book["Fig. 1b on scale"]),
            "this book's number lies on Fig. 1b's scale (the scale section's closing paragraph)",
        ),
        (
            "f02-family-flat",
            t.n_flat == len(t.stage),
            "every member ends on the flat part of its learning curve (the family's introduction)",
        ),
        (
            "f02-twins-tokenwise",
            bool((tokens.twin > tokens.trained).mean() > 0.9),
            "in (nearly) every token-wise candidate the twin is more coupled than the trained model",
        ),
    ]
