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
    "check_block",
    "check_blocks",
    "check_state",
    "refuse_misfits",
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


def _subject(name: str) -> str:
    """How a message names what was given: ``parameter 'k'``, or a command-line option as typed (``--k``)."""
    return name if name.startswith("-") else f"parameter {name!r}"


def check_top_k(name: str, value: Any, d: int | None = None, model: str | None = None) -> int:
    """A top-K size: a positive integer, at most the Jacobian size ``d`` when known; ``model``
    (its name, once loaded) makes the message say whose width it is and what to choose."""
    check_int(name, value, min=1)
    if d is not None and value > d:
        fix = f": {model} is {d} wide; choose K <= {d}" if model else ""
        raise ParameterError(f"{_subject(name)} (K) must be <= the model width d={d}, got {value!r}{fix}")
    return value


def check_block(
    name: str,
    value: int,
    model: str,
    n_layers: int,
    *,
    last: int | None = None,
    negative: bool = False,
    why: str = "",
) -> int:
    """A block index against a loaded model of ``n_layers`` blocks, as a non-negative index.

    ``last``: the last block the parameter may name (default the model's last; e.g. one less
    when the next block is needed too, said by ``why``); ``negative``: indices from the end
    (-1 the last block) are accepted. The message names the parameter, the model, its depth and
    the range to choose from."""
    top = n_layers - 1 if last is None else last
    from_end = negative and -n_layers <= value <= top - n_layers
    if 0 <= value <= top or from_end:
        return value % n_layers
    where = f"{model} has {n_layers} block{'' if n_layers == 1 else 's'} (0..{n_layers - 1}){why}"
    if top < 0:
        raise ParameterError(f"{_subject(name)} cannot be met, got {value!r}: {where}; choose a deeper model")
    if value >= 0 or (negative and value >= -n_layers):
        bound = f"<= {top if value >= 0 else top - n_layers}"
    else:
        bound = f">= {-n_layers if negative else 0}"
    ends = f", or {-n_layers}..{top - n_layers} counting from the end" if negative else ""
    raise ParameterError(
        f"{_subject(name)} must be {bound}, got {value!r}: {where}; choose a block in 0..{top}{ends}"
    )


def check_blocks(name: str, values: Iterable[int], model: str, n_layers: int, **kw: Any) -> list[int]:
    """:func:`check_block` for each of ``values`` (the message names the list's parameter)."""
    return [check_block(name, int(v), model, n_layers, **kw) for v in values]


def check_state(
    name: str, value: int, model: str, n_layers: int, *, low: int = 0, high: int | None = None,
    negative: bool = False, why: str = "",
) -> int:  # fmt: skip
    """A residual-state index (0: the input of the first block .. ``n_layers``: the output of the
    last) against a loaded model, as a non-negative index: :func:`check_block` for the states
    between blocks. ``low``..``high`` (default 0..``n_layers``): the states the parameter may name
    (said by ``why``); ``negative``: -1 is the last state."""
    L, high = n_layers, n_layers if high is None else high
    from_end = negative and value < 0
    v = value + L + 1 if from_end else value
    if low <= v <= high:
        return v
    where = f"{model} has {L} block{'' if L == 1 else 's'}, so residual states 0..{L}{why}"
    if low > high:
        raise ParameterError(f"{_subject(name)} cannot be met, got {value!r}: {where}; choose a deeper model")
    shift = -L - 1 if from_end else 0
    bound = f">= {low + shift}" if v < low else f"<= {high + shift}"
    ends = f", or {low - L - 1}..{high - L - 1} counting from the end (-1: state {L})" if negative else ""
    raise ParameterError(
        f"{_subject(name)} must be {bound}, got {value!r}: {where}; choose a state in {low}..{high}{ends}"
    )


def refuse_misfits(results: Iterable[Any], chapter: str) -> None:
    """Raise :class:`NotMeasured` naming each of ``results`` (a chapter's collected jobs) whose
    check refused a parameter its loaded model does not fit (a ParameterError): bad input, which a
    chapter refuses even where it shows the other jobs without a failed one."""
    from coupling_utils.measurement import Collected

    misfits = Collected([r for r in results if not r.ok and r.error == ParameterError.__name__])
    if misfits.results:
        raise NotMeasured(f"{chapter}: a parameter does not fit the model it measures\n{misfits.report()}")


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
