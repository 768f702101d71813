"""f03 · Emergence during training: its parameters
(``notebooks/f03_training_emergence.md``), their checks and its measurement plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    STEP,
    boolean,
    check_k,
    check_model,
    choice,
    integer,
    k_values,
    list_of,
    number,
    text,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement.jobs import Job

__all__ = ["Params", "jobs"]

NOTEBOOK = "f03_training_emergence"


def _k_main_in_k(v: Mapping[str, Any]) -> str | None:
    if v["k_main"] not in v["k"]:
        return f"parameter 'k_main' must be one of k = {v['k']}, got {v['k_main']}"
    return None


def _three_graph_steps(v: Mapping[str, Any]) -> str | None:
    if v["graph_steps"] and len(v["graph_steps"]) != 3:
        return f"parameter 'graph_steps' must list three steps (or none), got {v['graph_steps']!r}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_k_main_in_k, _three_graph_steps)

    models: list = param(["embedded:pythia-tiny"], list_of(check_model))
    revisions: list = param([], list_of(text(STEP), min_len=0))
    dtype: str = param("float32", choice(*DTYPES))
    n_windows: int = param(8, integer(min=1))
    window_tokens: int = param(32, integer(min=2))
    n_prompts: int = param(2, integer(min=0))
    include_demo: bool = param(True, boolean)
    max_tokens: int = param(24, integer(min=2))
    k: list = param([2, 4, 16], k_values)
    k_main: int = param(4, check_k)
    how: str = param("offdiag", choice(*HOWS))
    early_step: int = param(1, integer(min=1))
    graph_steps: list = param([], list_of(integer(min=0), min_len=0, max_len=3))
    graph_threshold: float = param(0.4, number(min=0.0, max=1.0))
    plateau_fraction: float = param(0.25, number(min=0.05, max=0.95))
    trajectory_tokens: str = param("all", choice("all", "last"))
    skip_first_token: bool = param(True, boolean)
    method: str = param("exact", choice(*METHODS))


def prompts(p: Params) -> dict[str, str]:
    """The quiz prompts: ``n_prompts`` of the prompt set, and the demo prompt when asked."""
    from coupling_utils.analysis.data import load_prompts

    table = load_prompts(n=p.n_prompts, include_demo=p.include_demo)
    return dict(zip(table["id"], table["text"]))


def jobs(p: Params) -> list[Job]:
    """The measurement plan: each run's checkpoints (``run_checkpoints``), each measured with
    ``checkpoint_jobs`` as the notebook's ``sweep_checkpoints`` call does."""
    from coupling_utils.analysis import emergence

    texts = prompts(p)
    out: list[Job] = []
    for m in p.models:
        runs = emergence.run_checkpoints(m, p.revisions)
        out += emergence.checkpoint_jobs(
            m, runs.revisions, texts, k=p.k, dtype=p.dtype, method=p.method,
            max_tokens=p.max_tokens, trajectory_tokens=p.trajectory_tokens,
            out=cache_dir("f03", p.method),
        )  # fmt: skip
    return out
