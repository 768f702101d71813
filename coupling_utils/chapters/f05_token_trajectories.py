"""f05 · Token trajectories: its parameters
(``notebooks/f05_token_trajectories.md``), their checks and its measurement plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coupling_utils.chapters.checks import DTYPES, block, boolean, check_model, choice, integer, list_of, text
from coupling_utils.chapters.params import ChapterParams, param

__all__ = ["Params"]

NOTEBOOK = "f05_token_trajectories"
# why the sweep cannot plan this chapter yet (it has no ``jobs``)
NOT_SWEPT = "it loads its model and twin inside the notebook (trajectories, linearisation)"


def _pca_prompt_exists(v: Mapping[str, Any]) -> str | None:
    if v["pca_prompt"] >= len(v["prompts"]):
        return f"parameter 'pca_prompt' must be < len(prompts) = {len(v['prompts'])}, got {v['pca_prompt']}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_pca_prompt_exists,)

    model: str = param("embedded:smollm2-135m", check_model)
    revision: str = param("", text(empty=True))
    dtype: str = param("float32", choice(*DTYPES))
    compare_random_init: bool = param(True, boolean)
    seed: int = param(0, integer(min=0))
    prompts: list = param(
        [
            "What is the capital of France? The capital is",
            "The quick brown fox jumps over the lazy dog because it",
        ],
        list_of(text()),
    )
    skip_first_token: bool = param(True, boolean)
    first_layer: int = param(0, block)
    last_layer: int = param(-1, integer())
    linearization: bool = param(True, boolean)
    pca_prompt: int = param(0, integer(min=0))
    pca_fit: str = param("joint", choice("joint", "per_token"))
