"""f01 · Coupling across depth and tokens: its parameters
(``notebooks/f01_depth_and_tokens.md``), their checks and its measurement plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    block,
    boolean,
    check_k,
    check_model,
    choice,
    integer,
    k_values,
    list_of,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement.jobs import Job

__all__ = ["Params", "jobs"]

NOTEBOOK = "f01_depth_and_tokens"


def _need_a_prompt(v: Mapping[str, Any]) -> str | None:
    if v.get("n_prompts") == 0 and v.get("include_demo") is False:
        return "parameter 'n_prompts' is 0 and 'include_demo' is false: no prompt to measure"
    return None


def _tile_k_within_k(v: Mapping[str, Any]) -> str | None:
    if v["tile_k"] > max(v["k"]):
        return f"parameter 'tile_k' must be <= max(k) = {max(v['k'])}, got {v['tile_k']}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_need_a_prompt, _tile_k_within_k)

    model: str = param("embedded:smollm2-135m", check_model)
    more_models: list = param(["embedded:minilm-l6"], list_of(check_model, min_len=0))
    include_gemma: bool = param(False, boolean)
    dtype: str = param("float32", choice(*DTYPES))
    n_prompts: int = param(2, integer(min=0))
    include_demo: bool = param(True, boolean)
    max_tokens: int = param(16, integer(min=2))
    k: list = param([10, 30, 50], k_values)
    layers: list = param([], list_of(block, min_len=0))
    tile_layers: list = param([11, 12, 13, 14, 15, 16, 17, 18], list_of(block, min_len=2, max_len=12))
    tile_k: int = param(10, check_k)
    token_layer: int = param(15, block)
    how: str = param("offdiag", choice(*HOWS))
    seed: int = param(0, integer(min=0))
    method: str = param("exact", choice(*METHODS))


def prompts(p: Params) -> dict[str, str]:
    """The prompts every model is measured on: ``{prompt id: text}``."""
    from coupling_utils.analysis.data import load_prompts

    table = load_prompts(n=p.n_prompts, include_demo=p.include_demo)
    return dict(zip(table["id"], table["text"]))


def models(p: Params) -> list[str]:
    """The measured models: ``model`` first, then ``more_models`` (and Gemma when asked)."""
    extra = ["embedded:gemma3-270m"] if p.include_gemma else []
    return list(dict.fromkeys([p.model, *p.more_models, *extra]))


def jobs(p: Params) -> list[Job]:
    """The measurement plan: each model and its random-init twin (``twin_jobs``); the first model
    with its tiles and token block, the others without."""
    from coupling_utils.analysis.depth_and_tokens import twin_jobs

    texts = prompts(p)
    out: list[Job] = []
    for name in models(p):
        first = name == p.model
        out += twin_jobs(
            name, texts, k=p.k, layers=p.layers or None,
            tile_layers=p.tile_layers if first else None, token_layer=p.token_layer if first else None,
            dtype=p.dtype, seed=p.seed, method=p.method, max_tokens=p.max_tokens,
            out=cache_dir("f01", p.method),
        )  # fmt: skip
    return out
