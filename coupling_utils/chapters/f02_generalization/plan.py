"""f02's parameters, rules, measurement plan (:func:`jobs`) and the run that collects it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis import scale
from coupling_utils.analysis.generalization import (
    FamilyCoupling,
    family_jobs,
    family_summary,
)
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.stats import Bootstrap
from coupling_utils.analysis.verdicts import Rule
from coupling_utils.chapters import own_claim
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
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
    with_check,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.engine.blocks import LAST_BLOCKS
from coupling_utils.engine.metric import k_for_width
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Loads, Options, Result, Settings, collect
from coupling_utils.measurement.jobs import WEIGHTS, Job

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
    training_family: str = param("embedded:lm-training-family", embedded_family)
    hub_models: list = param([], list_of(check_model, min_len=0))
    prompt_source: str = param("corpus", choice("corpus", "prompt_set"))
    n_prompts: int = param(4, integer(min=1))
    prompt_tokens: int = param(32, integer(min=2))
    k: int = param(10, k_values)
    k_over_d: float = param(0.125, number(min=0.001, max=1.0))
    how: str = param("offdiag", choice(*HOWS))
    tokens: str = param("last", choice("last", "all"))
    dtype: str = param("float32", choice(*DTYPES))
    method: str = param("exact", choice(*METHODS))
    last_block: str = param("final_norm", choice(*LAST_BLOCKS))
    init_seed: int = param(0, integer(min=0))
    tail: float = param(0.25, number(min=0.05, max=0.5))
    scale_models: list = param(["embedded:smollm2-135m", "embedded:minilm-l6"], list_of(check_model))
    scale_reference: str = param("embedded:smollm2-135m", check_model)
    scale_k: list = param([10, 30, 50], list_of(check_top_k))
    scale_prompts: int = param(0, integer(min=0))
    scale_max_tokens: int = param(12, integer(min=2))
    n_resamples: int = param(1000, integer(min=10))
    seed: int = param(0, integer(min=0))
    use_cache: bool = param(True, boolean)

    @property
    def boot(self) -> Bootstrap:
        """The bootstrap of every interval of the chapter: ``n_resamples`` resamples of the models
        drawn with ``seed``, read at 95%."""
        return Bootstrap(self.n_resamples, seed=self.seed)


def prompts(p: Params) -> dict[str, str]:
    """The family's and the hub models' prompts: held-out corpus windows or the prompt set."""
    from coupling_utils.analysis.data import load_prompts
    from coupling_utils.analysis.generalization import corpus_prompts

    if p.prompt_source == "corpus":
        return corpus_prompts(p.n_prompts, p.prompt_tokens, seed=p.seed)
    table = load_prompts(n=p.n_prompts, include_demo=False)
    return dict(zip(table["id"], table["text"]))


def member_models(p: Params, which: str = "family") -> dict[str, str]:
    """``{run: "embedded:<family>/<run>"}`` of the parameter ``which`` ("family" or
    "training_family") from the zoo's registry (nothing is trained here)."""
    from coupling_utils.models import zoo

    family = getattr(p, which)
    name = family.removeprefix("embedded:")
    entry = zoo.REGISTRY.get(name)
    if entry is None or not entry.is_family:
        families = ", ".join(e.name for e in zoo.REGISTRY.values() if e.is_family)
        raise ParameterError(
            f"parameter {which!r}: {family!r} is not an embedded family; families: {families}"
        )
    return {run: f"embedded:{name}/{run}" for run in entry.members()}


def family_widths(p: Params, which: str = "family") -> dict[str, int]:
    """Each member's width ``d``, ``{run: d}``, of the family ``which`` names, from its recipe."""
    from coupling_utils.models import zoo

    specs = zoo.REGISTRY[getattr(p, which).removeprefix("embedded:")].specs()
    return {run: int(specs[run].d_model) for run in member_models(p, which)}


def scale_ks(p: Params) -> dict[str, list[int]]:
    """The scale question's models with the K values each is measured at: ``scale_models`` at every
    ``scale_k``, each family member at the ``scale_k`` that fit its width."""
    members = member_models(p)
    ks = {name: list(p.scale_k) for name in p.scale_models}
    ks.update({members[run]: [K for K in p.scale_k if d >= K] for run, d in family_widths(p).items()})
    return {name: k for name, k in ks.items() if k}


def scale_prompts(p: Params) -> dict[str, str]:
    """The scale question's prompts: the demo prompt and ``scale_prompts`` of the prompt set."""
    from coupling_utils.analysis.data import load_prompts

    table = load_prompts(n=p.scale_prompts, include_demo=True)
    return dict(zip(table["id"], table["text"]))


def scale_prompt_words(p: Params) -> str:
    """On which prompts the scale question measures (:func:`scale_prompts`), in words: the demo
    prompt alone, or it and ``scale_prompts`` of the prompt set (values: means over them); each cut
    to at most ``scale_max_tokens`` tokens."""
    n = len(scale_prompts(p))
    cut = f"cut to at most {p.scale_max_tokens} tokens"
    if n == 1:
        return f"on the demo prompt alone ({cut})"
    return (
        f"on {n} prompts, the demo prompt and {n - 1} of the prompt set (each {cut}; values are means "
        "over them)"
    )


# --------------------------------------------------------------------------- the rules, fixed first
# the replotted Fig. 1a: R² of the leaderboard score on the paper's digitised coupling
FIG1A_FIT = Rule(yes="abs(r2 - 0.80) <= 0.02", partly="abs(r2 - 0.80) <= 0.1")
# "more strongly than size": gap = coupling's lead over the size measures, R²(coupling) − the
# highest R² of parameter count, depth and width, an Interval (bootstrap over the models, every
# predictor refitted on each resample and the best size measure taken in each, so no rival is
# chosen on the estimates): yes needs the whole interval above 0; partly: only the estimate is.
# Each size measure alone: the same reading of the paired interval of R²(coupling) − R²(it)
BEATS_SIZE = Rule(yes="gap > 0", partly="gap > 0")
# the family: held-out accuracy rises with coupling *in excess of the twin* (rho: Spearman's rho,
# an Interval, bootstrap over members): yes needs all of it above 0 and 6 members
GENERALISES = Rule(yes="rho > 0 and n >= 6", partly="rho > 0")
# the family: excess coupling explains accuracy better than the size measures (gap: its lead over
# the best of them in each resample, an Interval, as for "beats size"), with a positive slope
FAMILY_BEATS_SIZE = Rule(yes="gap > 0 and slope > 0", partly="gap > 0 and slope > 0")
# the training family (one architecture, only training varies): held-out accuracy rises with the
# excess coupling (rho, an Interval over members); at least 6 members and an accuracy span of 0.2
WITHIN = Rule(yes="rho > 0 and n >= 6 and span >= 0.2", partly="rho > 0")
# hub models measured here: the leaderboard average rises with our coupling (slope's 95% interval)
HUB = Rule(yes="slope_low > 0 and n >= 6", partly="slope > 0")
# beyond the paper: the paper's coupling predicts the leaderboard v2 average (slope's 95% interval)
EXTENSION = Rule(yes="slope_low > 0", partly="slope > 0")
# beyond the paper, per leaderboard task: gap = R²(the paper's coupling) − R²(log10 params) on the
# same models, an Interval (paired bootstrap over the models with that task's score). A task
# counts for coupling only with a yes (the whole interval above 0); the same rule on −gap counts it
# for parameter count; any other task does not separate the two
TASK_VS_SIZE = Rule(yes="gap > 0", partly="gap > 0")
# the best single predictor: lead = R²(the highest) − R²(the best of the others), an Interval
# (bootstrap over the models, every predictor refitted on each resample, the best of the others
# taken in each): the highest is called the best only with a yes (the whole interval above 0)
BEST_PREDICTOR = Rule(yes="lead > 0", partly="lead > 0")
# which leaderboard task the paper's coupling predicts best (worst): lead = the highest (lowest)
# task's R² minus the next's, an Interval (bootstrap over the models with every task of that
# leaderboard, all tasks refitted on each resample, the next taken in each; for the lowest, the
# lowest of the others minus it): a task is named best (worst) only with a yes; otherwise the
# tasks' order is that of the estimates, not separated
TASK_RANK = Rule(yes="lead > 0", partly="lead > 0")
# a family member counts as trained to the flat part of its learning curve when the last
# `tail` of its training moved its held-out loss (down, or up by overfitting) by at most 1% of
# the final loss; a curve with fewer than MIN_TAIL_POINTS evaluations after the stretch's start
# (a run of 2 steps, evaluated at steps 0, 1 and 2) is too short to judge, neither flat nor not
FLAT = Rule(yes="abs(tail_drop_rel) <= 0.01")
MIN_TAIL_POINTS = 2
RULES = {
    "Fig. 1a fit": FIG1A_FIT,
    "beats size": BEATS_SIZE,
    "family": GENERALISES,
    "family vs size": FAMILY_BEATS_SIZE,
    "training family": WITHIN,
    "hub models": HUB,
    "leaderboard v2": EXTENSION,
    "task vs size": TASK_VS_SIZE,
    "best predictor": BEST_PREDICTOR,
    "task ranking": TASK_RANK,
    "flat curve": FLAT,
}
"""Each claim's rule by its short name, as "The claim" prints them before any number."""

RULE_WORDS = {
    "Fig. 1a fit": "r2: the R² of the fit to the paper's digitised Fig. 1a points, against the paper's 0.80",
    "beats size": (
        "gap: coupling's R² minus the highest of parameter count's, depth's and width's, its 95% interval "
        "a bootstrap over the models (all refitted on each resample, the best size measure taken in each); "
        "each size measure alone is read by the same rule on the paired interval of its difference"
    ),
    "family": (
        "rho: Spearman's ρ of excess coupling and held-out accuracy, its 95% interval a bootstrap over "
        "the members; n: the number of members"
    ),
    "family vs size": (
        "as 'beats size', for the excess and held-out accuracy in the family; slope: the slope of held-out "
        "accuracy on the excess"
    ),
    "training family": (
        "as 'family', for the members of one architecture; span: the range of their held-out accuracies"
    ),
    "hub models": (
        "slope: the slope of the v1 average on our coupling, slope_low: the low end of its 95% interval; "
        "n: the number of models"
    ),
    "leaderboard v2": (
        "slope: the slope of the v2 average on the paper's coupling, slope_low: the low end of its 95% "
        "interval"
    ),
    "task vs size": (
        "a leaderboard task counts for coupling if its R² exceeds log parameter count's over the whole "
        "paired 95% interval of the difference (over the models with that task's score), for parameter "
        "count if the whole interval is below 0; otherwise the task does not separate the two"
    ),
    "best predictor": (
        "the predictor with the highest R² is called the best only if its lead over the best of the "
        "others is above 0 over the whole 95% interval (bootstrap over the models, all refitted on each "
        "resample); otherwise it is not separated from the others"
    ),
    "task ranking": (
        "a leaderboard task is named the one coupling predicts best (worst) only if its R² is above (below) "
        "every other task's over the whole 95% interval of the difference to the next (bootstrap over the "
        "models with every task's score, all tasks refitted on each resample); otherwise the order of the "
        "tasks is that of the estimates and does not separate them"
    ),
    "flat curve": (
        "a member's learning curve is flat at its end if, over the last `tail` of its training, its "
        "held-out loss fell (or rose) by at most 1% of its final value; a curve evaluated fewer than "
        f"{MIN_TAIL_POINTS} times after that stretch's start is too short to judge, neither flat nor not"
    ),
}
"""What each rule of :data:`RULES` reads, in plain words (printed below its code form, which says
how a verdict reads intervals)."""

# the status rows' claims, by the short name the glue and the notebook use
CLAIMS = {
    "fig1a": "coupling predicts the leaderboard average (Fig. 1a, R² over 28 models)",
    "size": "coupling predicts the score better than parameters, depth or width (Fig. 1a models)",
    "family": "more coupled models generalise better (our LM family, excess over twin vs held-out accuracy)",
    "family_size": "coupling beats size as a predictor (our LM family, accuracy)",
    "within": (
        "more coupled models generalise better, size fixed (our training family: one architecture, "
        "only training varies)"
    ),
    "v2": own_claim("Extension", "the paper's coupling predicts the leaderboard v2 average"),
    "scale": own_claim(
        "Extension",
        "the paper's Fig. 1a axis (0.89–0.955) is the scale of an aggregation that separates trained "
        "from twin",
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


def rule_lines(*names: str) -> str:
    """The rules ``names`` (none: every rule), two lines each: its code form, then what it reads in
    plain words."""
    unknown = [name for name in names if name not in RULES]
    if unknown:
        raise ValueError(f"no rule named {unknown}; the rules are {list(RULES)}")
    return "\n".join(
        f"{name:16s} {RULES[name].text}\n{'':16s} ({RULE_WORDS[name]})" for name in names or RULES
    )


# --------------------------------------------------------------------------- the plan and the run
def _family(p: Params, last_block: str, cache, which: str = "family", also: str | None = None) -> list[Job]:
    """The members and twins (K per width) of the family ``which`` names, with the last block as
    ``last_block`` (and once more as ``also``)."""
    settings = Settings(
        tokens=p.tokens,
        method=p.method,
        max_tokens=p.prompt_tokens,
        last_block=last_block,
        last_block_also=also,
    )
    family_k = {run: k_for_width(d, p.k_over_d) for run, d in family_widths(p, which).items()}
    return family_jobs(member_models(p, which), prompts(p), settings, k=family_k, loads=_twins(p), root=cache)


def _scale(p: Params, last_block: str, names: list[str], root, also: str | None = None) -> list[Job]:
    """The scale question's jobs of the models ``names`` with the last block as ``last_block`` (and
    once more as ``also``)."""
    ks = {name: k for name, k in scale_ks(p).items() if name in names}
    settings = Settings(
        method=p.method, max_tokens=p.scale_max_tokens, last_block=last_block, last_block_also=also
    )
    planned = scale.scale_jobs(
        list(ks), scale_prompts(p), k=ks, loads=_twins(p), root=root, settings=settings
    )
    return _checked(planned, "scale_k", ks)


def _check_k(lm, *, name: str, ks: Mapping[str, list[int]], job: Job) -> None:
    """Each K of ``job``'s model (``ks[model]``, parameter ``name``) against the width of the model
    loaded (``lm``; a job's check, before measuring): a ParameterError naming the parameter, the
    model and its width."""
    for K in ks[job.model]:
        check_top_k(name, K, d=int(lm.d_model), model=job.model)


def _checked(jobs: list[Job], name: str, ks: Mapping[str, Any]) -> list[Job]:
    """``jobs`` with :func:`_check_k` of parameter ``name`` at each model's K (``ks[model]``)."""
    listed = {model: k if isinstance(k, list) else [k] for model, k in ks.items()}
    return with_check(jobs, _check_k, name=name, ks=listed)


def _twins(p: Params) -> Loads:
    """Each model beside its random-init twin (drawn with ``init_seed``), in ``dtype``."""
    return Loads(weights=WEIGHTS, seed=p.init_seed, dtype=p.dtype)


def _parts(p: Params, *, store: bool) -> dict[str, list[Job]]:
    """The plan by part: "family" (members and twins, K per width), "training" (the training
    family's, likewise), "hub" (``hub_models`` at ``k``; empty without them) and "scale" (the
    scale question), all with the last block as ``last_block``; the family and the scale reference
    also with the other map of the last block, measured beside it (``lb.beside``), whose verdicts
    the status rows compare; under "excluded", which measures no last block, "family@<map>" and
    "scale@<map>" (the scale reference only) for each measured map. ``store``: under the cache."""
    cache = cache_dir("f02") if store else None
    root = cache_dir("f02", "scale") if store else None
    settings = Settings(tokens=p.tokens, method=p.method, max_tokens=p.prompt_tokens, last_block=p.last_block)
    hub = (
        family_jobs(p.hub_models, prompts(p), settings, k=p.k, loads=Loads(dtype=p.dtype), root=cache)
        if p.hub_models
        else []
    )
    hub = _checked(hub, "k", dict.fromkeys(p.hub_models, p.k))
    beside = lb.beside(p.last_block)  # the family and the scale reference: the other map, same jobs
    scale_parts = [
        _scale(p, p.last_block, [name], root, beside if name == p.scale_reference else None)
        for name in scale_ks(p)
    ]
    parts = {
        "family": _family(p, p.last_block, cache, also=beside),
        "training": _family(p, p.last_block, cache, "training_family"),
        "hub": hub,
        "scale": [job for part in scale_parts for job in part],
    }
    if beside is None:  # "excluded" measures no last block: each measured map in jobs of its own
        for other in lb.companions(p.last_block):
            parts[f"family@{other}"] = _family(p, other, cache)
            parts[f"scale@{other}"] = _scale(p, other, [p.scale_reference], root)
    return parts


def jobs(p: Params) -> list[Job]:
    """The measurement plan: the family and the training family with their twins (``K`` per
    width from ``k_over_d``), the ``hub_models`` (``k``), and the scale question
    (``scale.scale_jobs``)."""
    if not p.use_cache:
        raise ParameterError(
            "parameter 'use_cache' is false: the notebook would not read what a sweep stores; drop the "
            "override"
        )
    return [job for part in _parts(p, store=True).values() for job in part]


@dataclass
class Results:
    """What :func:`run` collected: the prompts, the family with its twins, the hub models (None
    without ``hub_models``), the scale question's candidates, every missing job and the training
    family with its twins (None under the other maps of the last block, where it is not measured)."""

    prompts: dict[str, str]
    family: FamilyCoupling
    hub: FamilyCoupling | None
    scale: scale.ScaleMeasurement
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    training: FamilyCoupling | None = None
    others: dict[str, Results] = field(default_factory=dict)  # under each other map of the last block
    named: pd.DataFrame = field(default_factory=pd.DataFrame)  # every model as measured (:func:`named`)
    # the scale question's prompts (:func:`scale_prompts`), which differ from ``prompts``
    scale_prompts: dict[str, str] = field(default_factory=dict)


def prompts_by_part(p: Params, results: Results) -> pd.DataFrame:
    """Every prompt the chapter measures, one row per prompt and part: ``prompt``, ``measured by``
    (the family and the training family, with the hub models where there are any, on ``prompts``;
    the scale question on its own :func:`scale_prompts`), ``tokens measured (at most)`` (the
    prompt is cut to that many tokens) and ``text``."""
    family = [PARTS["family"], PARTS["training"], *([PARTS["hub"]] if p.hub_models else [])]
    sets = [
        (results.prompts, listed(family), p.prompt_tokens),
        (results.scale_prompts, PARTS["scale"], p.scale_max_tokens),
    ]
    rows = [(pid, part, tokens, text) for given, part, tokens in sets for pid, text in given.items()]
    return pd.DataFrame(rows, columns=["prompt", "measured by", "tokens measured (at most)", "text"])


PARTS = {
    "family": "the family (trained here)",
    "training": "the training family (trained here)",
    "hub": "the hub models",
    "scale": "the scale question",
}
"""The parts of the plan whose models :func:`named` lists, as the table names them."""


def named(results: Mapping[str, list[Result]]) -> pd.DataFrame:
    """Every model of the :data:`PARTS` named as measured, one row per model (trained weights or a
    random-init twin): ``model`` (``model_names.model_words``: the reference, a hub model's revision
    and commit, the source format, the dtype it ran in) and the ``parts`` that measured it."""
    from coupling_utils.analysis.model_names import model_words, of_result

    rows = [(model_words(of_result(r)), PARTS[part]) for part in PARTS for r in results.get(part, [])]
    table = pd.DataFrame(rows, columns=["model", "parts"])
    return (
        table.groupby("model", sort=False)["parts"].agg(lambda p: ", ".join(dict.fromkeys(p))).reset_index()
    )


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (one :func:`~coupling_utils.measurement.collect`: what is stored is
    read, the rest measured) and condense each part. With ``use_cache=False`` the same jobs are
    measured without being stored (a run that a sweep cannot feed). ``options``: how they run
    (default: failures are recorded, the other jobs still run)."""
    parts = _parts(p, store=p.use_cache)
    got = collect([job for part in parts.values() for job in part], options, desc="f02")
    refuse_misfits(got.results, NOTEBOOK)  # a K wider than its model: bad input, not a missing model
    done = iter(got.results)
    results: dict[str, list[Result]] = {name: [next(done) for _ in part] for name, part in parts.items()}
    beside = lb.beside(p.last_block)
    if beside is not None:  # the other map, from the same jobs: the family and the scale reference
        results[f"family@{beside}"] = [r.under(beside) for r in results["family"]]
        ref = [r for r in results["scale"] if r.job.labels["model"] == p.scale_reference]
        results[f"scale@{beside}"] = [r.under(beside) for r in ref]
    others = {
        other: Results(
            prompts=parts["family"][0].prompts,
            family=family_summary(results[f"family@{other}"], how=p.how),
            hub=None,
            scale=scale.scale_summary(results[f"scale@{other}"]),
        )
        for other in lb.companions(p.last_block)
    }
    return Results(
        prompts=parts["family"][0].prompts,
        family=family_summary(results["family"], how=p.how),
        hub=family_summary(results["hub"], how=p.how) if p.hub_models else None,
        scale=scale.scale_summary(results["scale"]),
        failures=got.failures,
        others=others,
        training=family_summary(results["training"], how=p.how),
        named=named(results),
        scale_prompts=parts["scale"][0].prompts if parts["scale"] else {},
    )
