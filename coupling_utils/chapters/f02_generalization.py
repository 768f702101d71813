"""f02 · Coupling and generalisation: its parameters
(``notebooks/f02_generalization.md``), their checks and its measurement plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
from coupling_utils.measurement.jobs import Job

__all__ = ["Params", "jobs"]

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


def jobs(p: Params) -> list[Job]:
    """The measurement plan: the family with its twins (``K`` per width from ``k_per_d``), the
    ``hub_models`` (``k``), and the scale question (``scale.scale_jobs``)."""
    from coupling_utils.analysis import scale
    from coupling_utils.analysis.generalization import family_jobs, k_for_width

    if not p.use_cache:
        raise ParameterError(
            "parameter 'use_cache' is false: the notebook would not read what a sweep stores; drop the "
            "override"
        )
    texts = prompts(p)
    kw = dict(
        tokens=p.tokens, method=p.method, dtype=p.dtype, max_tokens=p.prompt_tokens, cache=cache_dir("f02")
    )
    family_k = {run: k_for_width(d, p.k_per_d) for run, d in family_widths(p).items()}
    out = family_jobs(family_members(p), texts, k=family_k, twins=True, twin_seed=p.init_seed, **kw)
    if p.hub_models:
        out += family_jobs(p.hub_models, texts, k=p.k, **kw)
    ks = scale_ks(p)
    out += scale.scale_jobs(
        list(ks), scale_prompts(p), k=ks, dtype=p.dtype, seed=p.init_seed, method=p.method,
        max_tokens=p.scale_max_tokens, root=cache_dir("f02", "scale"),
    )  # fmt: skip
    return out
