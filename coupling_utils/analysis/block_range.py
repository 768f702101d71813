"""Whether a block (or residual-state) index that a parameter names exists in the loaded model:
one check of the range, and :class:`ParameterError`, the error every parameter check raises.

It lives here, below the chapters, so that the analysis' own plans (``measure_twins``) refuse a
block in the same words as a chapter or ``coupling-book measure``; :mod:`coupling_utils.chapters.checks`
re-exports all of it. A name that starts with ``-`` is a command-line option and is said as typed
(``--layers``); any other is said as ``parameter 'layers'`` (:func:`subject`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["ParameterError", "subject", "check_block", "check_blocks", "check_state"]


class ParameterError(ValueError):
    """A parameter has a bad name, type or value, or one the model it measures does not fit."""


def subject(name: str) -> str:
    """How a refusal names what was given, the one wording for every check: ``parameter 'k'``, or a
    command-line option as typed (``--k``), so a message says what the user wrote."""
    return name if name.startswith("-") else f"parameter {name!r}"


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
        raise ParameterError(f"{subject(name)} cannot be met, got {value!r}: {where}; choose a deeper model")
    if value >= 0 or (negative and value >= -n_layers):
        bound = f"<= {top if value >= 0 else top - n_layers}"
    else:
        bound = f">= {-n_layers if negative else 0}"
    ends = f", or {-n_layers}..{top - n_layers} counting from the end" if negative else ""
    raise ParameterError(
        f"{subject(name)} must be {bound}, got {value!r}: {where}; choose a block in 0..{top}{ends}"
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
        raise ParameterError(f"{subject(name)} cannot be met, got {value!r}: {where}; choose a deeper model")
    shift = -L - 1 if from_end else 0
    bound = f">= {low + shift}" if v < low else f"<= {high + shift}"
    ends = f", or {low - L - 1}..{high - L - 1} counting from the end (-1: state {L})" if negative else ""
    raise ParameterError(
        f"{subject(name)} must be {bound}, got {value!r}: {where}; choose a state in {low}..{high}{ends}"
    )
