"""f00 · Jacobians and the coupling metric: its parameters
(``notebooks/f00_coupling_metric.md``), their checks and its measurement plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coupling_utils.chapters.checks import (
    DTYPES,
    block,
    check_model,
    choice,
    integer,
    k_values,
    list_of,
    number,
    text,
)
from coupling_utils.chapters.params import ChapterParams, param

__all__ = ["Params"]

NOTEBOOK = "f00_coupling_metric"
# why the sweep cannot plan this chapter yet (it has no ``jobs``)
NOT_SWEPT = "it loads its one model inside the notebook (Jacobians of two blocks)"


def _k_within_toy(v: Mapping[str, Any]) -> str | None:
    if v["k"] > v["d_toy"]:
        return f"parameter 'k' (K) must be <= d_toy = {v['d_toy']}, got {v['k']}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_k_within_toy,)

    model: str = param("embedded:smollm2-135m", check_model)
    revision: str = param("", text(empty=True))
    dtype: str = param("float32", choice(*DTYPES))
    prompt: str = param("What is the capital of France? The capital is", text())
    layer: int = param(10, block)
    k: int = param(10, k_values)
    noise_levels: list = param([0.0, 0.1, 0.3, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0], list_of(number(min=0.0)))
    d_toy: int = param(64, integer(min=2))
    n_random: int = param(200, integer(min=2))
    seed: int = param(0, integer(min=0))
