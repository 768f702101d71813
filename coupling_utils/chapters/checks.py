"""Checks of parameter values: one function per kind of value, each raising :class:`ParameterError`.

A failed check names the parameter, what it must be and the value it got, so a notebook, a
profile or a ``-p`` override that is wrong fails before any work with a message that says how
to fix it. The chapters' parameter classes (:mod:`coupling_utils.chapters.params`) attach one of
these to every field; :data:`COMMON` holds the checks of names that mean the same thing in every
chapter (``model``, ``dtype``, ``k``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "ParameterError",
    "NotMeasured",
    "Check",
    "check_int",
    "check_float",
    "check_bool",
    "check_str",
    "check_choice",
    "check_list",
    "check_model",
    "check_top_k",
    "integer",
    "number",
    "choice",
    "text",
    "list_of",
    "k_values",
    "embedded_family",
    "vit_token",
    "boolean",
    "block",
    "COMMON",
    "DTYPES",
    "METHODS",
    "HOWS",
    "STEP",
]


class ParameterError(ValueError):
    """A chapter parameter has a bad name, type or value."""


class NotMeasured(RuntimeError):
    """A job of a chapter's plan has no result (it failed, or was not measured yet): the chapter's
    ``run`` raises it, naming the job and the reason, rather than show a partial story."""


def _fail(name: str, message: str, value: Any) -> ParameterError:
    return ParameterError(f"parameter {name!r} {message}, got {value!r}")


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, "must be an integer", value)
    if min is not None and value < min:
        raise _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
        raise _fail(name, f"must be <= {max}", value)
    return value


def check_float(name: str, value: Any, *, min: float | None = None, max: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(name, "must be a number", value)
    if min is not None and value < min:
        raise _fail(name, f"must be >= {min}", value)
    if max is not None and value > max:
        raise _fail(name, f"must be <= {max}", value)
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "must be true or false", value)
    return value


def check_str(name: str, value: Any, *, pattern: str | None = None) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(name, "must be a non-empty string", value)
    if pattern is not None and not re.fullmatch(pattern, value):
        raise _fail(name, f"must match {pattern!r}", value)
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    choices = list(choices)
    if value not in choices:
        raise _fail(name, f"must be one of {choices}", value)
    return value


def check_list(
    name: str,
    value: Any,
    item: Callable[[str, Any], Any] | None = None,
    *,
    min_len: int = 1,
    max_len: int | None = None,
) -> list:
    if not isinstance(value, (list, tuple)):
        raise _fail(name, "must be a list", value)
    if len(value) < min_len:
        raise _fail(name, f"must have at least {min_len} item(s)", value)
    if max_len is not None and len(value) > max_len:
        raise _fail(name, f"must have at most {max_len} item(s)", value)
    if item is None:
        return list(value)
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def check_top_k(name: str, value: Any, d: int | None = None) -> int:
    """A top-K size: a positive integer, at most the Jacobian size ``d`` when known."""
    check_int(name, value, min=1)
    if d is not None and value > d:
        raise _fail(name, f"(K) must be <= the model width d={d}", value)
    return value


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?")


def check_model(name: str, value: Any) -> str:
    """A model reference: ``embedded:<name>`` (known to the zoo), a local directory or file, or a hub id."""
    check_str(name, value)
    if value.startswith("embedded:"):
        from coupling_utils.models import zoo

        known = zoo.names()
        if value.split(":", 1)[1] not in known and value not in known:
            raise _fail(name, "is not a known embedded model; known: " + ", ".join(sorted(known)), value)
        return value
    if Path(value).expanduser().exists():
        return value
    if value.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(value):
        raise _fail(
            name, "is neither an existing local path nor a Hugging Face hub id like 'org/name'", value
        )
    return value


# --- checks as values: what a parameter field carries ---------------------------------------
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
    return check_list(name, value, check_top_k) if isinstance(value, list) else check_top_k(name, value)


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
