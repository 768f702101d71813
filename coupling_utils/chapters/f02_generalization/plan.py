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
from coupling_utils.analysis.verdicts import Rule
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
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.engine.blocks import LAST_BLOCKS
from coupling_utils.engine.metric import k_for_width
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Options, Result, Settings, collect
from coupling_utils.measurement.jobs import Job

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


def prompts(p: Params) -> dict[str, str]:
    """The family's and the hub models' prompts: held-out corpus windows or the prompt set."""
    from coupling_utils.analysis.data import load_prompts
    from coupling_utils.analysis.generalization import corpus_prompts

    if p.prompt_source == "corpus":
        return corpus_prompts(p.n_prompts, p.prompt_tokens, seed=p.seed)
    table = load_prompts(n=p.n_prompts, include_demo=False)
    return dict(zip(table["id"], table["text"]))


def member_models(p: Params) -> dict[str, str]:
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
    return {run: int(specs[run].d_model) for run in member_models(p)}


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
def _family(p: Params, last_block: str, cache) -> list[Job]:
    """The family's members and twins (K per width) with the last block as ``last_block``."""
    settings = Settings(tokens=p.tokens, method=p.method, max_tokens=p.prompt_tokens, last_block=last_block)
    family_k = {run: k_for_width(d, p.k_over_d) for run, d in family_widths(p).items()}
    return family_jobs(
        member_models(p), prompts(p), settings, k=family_k, dtype=p.dtype, cache=cache, twins=True,
        twin_seed=p.init_seed,
    )  # fmt: skip


def _scale(p: Params, last_block: str, names: list[str], root) -> list[Job]:
    """The scale question's jobs of the models ``names`` with the last block as ``last_block``."""
    ks = {name: k for name, k in scale_ks(p).items() if name in names}
    settings = Settings(method=p.method, max_tokens=p.scale_max_tokens, last_block=last_block)
    return scale.scale_jobs(
        list(ks), scale_prompts(p), k=ks, dtype=p.dtype, seed=p.init_seed, root=root, settings=settings
    )


def _parts(p: Params, *, store: bool) -> dict[str, list[Job]]:
    """The plan by part: "family" (members and twins, K per width), "hub" (``hub_models`` at
    ``k``; empty without them) and "scale" (the scale question), all with the last block as
    ``last_block``; then, for each other map of the last block, "family@<map>" and "scale@<map>"
    (the scale reference only), whose verdicts the status rows compare. ``store``: under the cache."""
    cache = cache_dir("f02") if store else None
    root = cache_dir("f02", "scale") if store else None
    settings = Settings(tokens=p.tokens, method=p.method, max_tokens=p.prompt_tokens, last_block=p.last_block)
    hub = (
        family_jobs(p.hub_models, prompts(p), settings, k=p.k, dtype=p.dtype, cache=cache)
        if p.hub_models
        else []
    )
    parts = {
        "family": _family(p, p.last_block, cache),
        "hub": hub,
        "scale": _scale(p, p.last_block, list(scale_ks(p)), root),
    }
    for other in lb.companions(p.last_block):
        parts[f"family@{other}"] = _family(p, other, cache)
        parts[f"scale@{other}"] = _scale(p, other, [p.scale_reference], root)
    return parts


def jobs(p: Params) -> list[Job]:
    """The measurement plan: the family with its twins (``K`` per width from ``k_over_d``), the
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
    others: dict[str, Results] = field(default_factory=dict)  # under each other map of the last block

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
    )
