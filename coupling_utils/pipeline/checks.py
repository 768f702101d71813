"""The value checks of every notebook parameter, as data: one table the notebooks and the runner share.

A notebook's second cell is one call, ``check_parameters("f01_depth_and_tokens", globals())``,
and ``coupling-book run`` makes the same call on the planned values before it starts a kernel,
so a bad value fails at once with a message naming the parameter. Parameters that mean the same
thing in several notebooks (``model``, ``dtype``, ``k``, ``seed``, ...) share one check in
:data:`COMMON`; the rest are in :data:`SPECIFIC`, and the relations between parameters
(``tile_k <= max(k)``) in :data:`RULES`. ``tests/test_pipeline.py`` checks that every parameter of
every notebook has a check here, so a new parameter cannot go unchecked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from coupling_utils.pipeline.params import (
    ParameterError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_k,
    check_list,
    check_model,
    check_str,
)

__all__ = ["COMMON", "SPECIFIC", "RULES", "check_parameters", "checked_names"]

Check = Callable[[str, Any], Any]
DTYPES = ("float32", "bfloat16", "float16")
METHODS = ("exact", "randomized", "matrix_free")
HOWS = ("offdiag", "adjacent")
STEP = r"step\d+"


def integer(min: int | None = None, max: int | None = None) -> Check:
    return lambda name, value: check_int(name, value, min=min, max=max)


def number(min: float | None = None, max: float | None = None) -> Check:
    return lambda name, value: check_float(name, value, min=min, max=max)


def choice(*options: Any) -> Check:
    return lambda name, value: check_choice(name, value, options)


def text(pattern: str | None = None, *, empty: bool = False) -> Check:
    def check(name: str, value: Any) -> str:
        if empty and value == "":
            return value
        return check_str(name, value, pattern=pattern)

    return check


def list_of(item: Check, *, min_len: int = 1, max_len: int | None = None) -> Check:
    return lambda name, value: check_list(name, value, item, min_len=min_len, max_len=max_len)


def k_values(name: str, value: Any) -> Any:
    """One K, or a list of them (the notebook's default says which)."""
    return check_list(name, value, check_k) if isinstance(value, list) else check_k(name, value)


def embedded_family(name: str, value: Any) -> str:
    check_model(name, value)
    if not value.startswith("embedded:"):
        raise ParameterError(
            f"parameter {name!r} must be an embedded family such as 'embedded:lm-family', got {value!r}"
        )
    return value


def vit_token(name: str, value: Any) -> Any:
    """A ViT token choice: "cls", "mean", "last" or "patch<N>" (see ``models.images.vit_tokens``)."""
    from coupling_utils.models.images import vit_tokens

    try:
        vit_tokens(value)
    except ValueError as exc:
        raise ParameterError(f"parameter {name!r}: {exc}") from exc
    return value


boolean: Check = check_bool
block: Check = integer(min=0)

COMMON: dict[str, Check] = {
    "model": check_model,
    "models": list_of(check_model),
    "more_models": list_of(check_model, min_len=0),
    "hub_models": list_of(check_model, min_len=0),
    "family": embedded_family,
    "revision": text(empty=True),
    "revisions": list_of(text(STEP), min_len=0),
    "dtype": choice(*DTYPES),
    "method": choice(*METHODS),
    "how": choice(*HOWS),
    "k": k_values,
    "seed": integer(min=0),
    "init_seed": integer(min=0),
    "n_prompts": integer(min=0),
    "include_demo": boolean,
    "include_gemma": boolean,
    "max_tokens": integer(min=2),
    "n_resamples": integer(min=10),
    "use_cache": boolean,
    "skip_first_token": boolean,
}

SPECIFIC: dict[str, dict[str, Check]] = {
    "f00_coupling_metric": {
        "prompt": text(),
        "layer": block,
        "noise_levels": list_of(number(min=0.0)),
        "d_toy": integer(min=2),
        "n_random": integer(min=2),
    },
    "f01_depth_and_tokens": {
        "layers": list_of(block, min_len=0),
        "tile_layers": list_of(block, min_len=2, max_len=12),
        "tile_k": check_k,
        "token_layer": block,
    },
    "f02_generalization": {
        "fig1a_y": choice("score", "average"),
        "prompt_source": choice("corpus", "prompt_set"),
        "n_prompts": integer(min=1),
        "prompt_tokens": integer(min=2),
        "tokens": choice("last", "all"),
        "k_per_d": number(min=0.001, max=1.0),
        "tail": number(min=0.05, max=0.5),
        "scale_models": list_of(check_model),
        "scale_reference": check_model,
        "scale_k": list_of(check_k),
        "scale_prompts": integer(min=0),
        "scale_max_tokens": integer(min=2),
    },
    "f03_training_emergence": {
        "n_windows": integer(min=1),
        "window_tokens": integer(min=2),
        "k_main": check_k,
        "early_step": integer(min=1),
        "graph_steps": list_of(integer(min=0), min_len=0, max_len=3),
        "graph_threshold": number(min=0.0, max=1.0),
        "trajectory_tokens": choice("all", "last"),
        "plateau_fraction": number(min=0.05, max=0.95),
    },
    "f04_vision_transformers": {
        "n_images": integer(min=2),
        "token": vit_token,
        "family_k_over_d": number(min=0.01, max=1.0),
    },
    "f05_token_trajectories": {
        "compare_random_init": boolean,
        "prompts": list_of(text()),
        "first_layer": block,
        "last_layer": integer(),
        "linearization": boolean,
        "pca_prompt": integer(min=0),
        "pca_fit": choice("joint", "per_token"),
    },
}


def _need_a_prompt(v: Mapping[str, Any]) -> str | None:
    if v.get("n_prompts") == 0 and v.get("include_demo") is False:
        return "parameter 'n_prompts' is 0 and 'include_demo' is false: no prompt to measure"
    return None


def _tile_k_within_k(v: Mapping[str, Any]) -> str | None:
    if v["tile_k"] > max(v["k"]):
        return f"parameter 'tile_k' must be <= max(k) = {max(v['k'])}, got {v['tile_k']}"
    return None


def _k_main_in_k(v: Mapping[str, Any]) -> str | None:
    if v["k_main"] not in v["k"]:
        return f"parameter 'k_main' must be one of k = {v['k']}, got {v['k_main']}"
    return None


def _three_graph_steps(v: Mapping[str, Any]) -> str | None:
    if v["graph_steps"] and len(v["graph_steps"]) != 3:
        return f"parameter 'graph_steps' must list three steps (or none), got {v['graph_steps']!r}"
    return None


def _k_within_toy(v: Mapping[str, Any]) -> str | None:
    if v["k"] > v["d_toy"]:
        return f"parameter 'k' (K) must be <= d_toy = {v['d_toy']}, got {v['k']}"
    return None


def _scale_reference_measured(v: Mapping[str, Any]) -> str | None:
    if v["scale_reference"] not in v["scale_models"]:
        return (
            f"parameter 'scale_reference' must be one of scale_models = {v['scale_models']}, "
            f"got {v['scale_reference']!r}"
        )
    return None


def _pca_prompt_exists(v: Mapping[str, Any]) -> str | None:
    if v["pca_prompt"] >= len(v["prompts"]):
        return f"parameter 'pca_prompt' must be < len(prompts) = {len(v['prompts'])}, got {v['pca_prompt']}"
    return None


RULES: dict[str, list[Callable[[Mapping[str, Any]], str | None]]] = {
    "f00_coupling_metric": [_k_within_toy],
    "f01_depth_and_tokens": [_need_a_prompt, _tile_k_within_k],
    "f02_generalization": [_scale_reference_measured],
    "f03_training_emergence": [
        _k_main_in_k,
        _three_graph_steps,
    ],  # no quiz prompt is fine: windows are the main panel
    "f05_token_trajectories": [_pca_prompt_exists],
}


def checked_names(notebook: str) -> set[str]:
    """The parameter names this table can check for ``notebook``."""
    return set(COMMON) | set(SPECIFIC.get(notebook, {}))


def check_parameters(notebook: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Check the parameters of ``notebook`` among ``values`` (a dict, or a notebook's ``globals()``).

    Every name that has a check here is checked (notebook-specific checks first, then the common
    ones), then the notebook's rules between parameters. Returns the checked values; raises
    :class:`~coupling_utils.pipeline.params.ParameterError` naming the parameter otherwise.
    """
    if notebook not in SPECIFIC:
        raise ParameterError(f"no parameter checks for notebook {notebook!r}; known: {', '.join(SPECIFIC)}")
    checks = {**COMMON, **SPECIFIC[notebook]}
    out = {name: checks[name](name, values[name]) for name in checks if name in values}
    for rule in RULES.get(notebook, []):
        message = rule(out)
        if message:
            raise ParameterError(message)
    return out
