"""f04 · Vision Transformers: its parameters
(``notebooks/f04_vision_transformers.md``), their checks and its measurement plan."""

from __future__ import annotations

from dataclasses import dataclass

from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    STEP,
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

__all__ = ["Params"]

NOTEBOOK = "f04_vision_transformers"
# why the sweep cannot plan this chapter yet (it has no ``jobs``)
NOT_SWEPT = "it loads each ViT inside the notebook (image preprocessing needs the model)"


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
