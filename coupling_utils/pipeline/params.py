"""Notebook parameters: reading a notebook's ``parameters`` cell, and validating values.

Every notebook has exactly one code cell tagged ``parameters`` holding literal assignments, one
per line, each with a comment. Profiles (``notebooks/profiles/<profile>/<notebook>.yaml``) and
``-p key=value`` overrides are checked against that cell (names and types) before a run, and the
notebook's next cell checks values (ranges, choices, model names) with the ``check_*`` helpers
here, which raise :class:`ParameterError` naming the parameter and the fix.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ParameterError",
    "Parameter",
    "notebook_parameters",
    "check_overrides",
    "check_int",
    "check_float",
    "check_bool",
    "check_str",
    "check_choice",
    "check_list",
    "check_model",
    "check_k",
]


class ParameterError(ValueError):
    """A notebook parameter has a bad name, type or value."""


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any
    comment: str

    @property
    def type_name(self) -> str:
        return _type_name(self.default)


def _type_name(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _read_cells(path: Path) -> list[dict]:
    import jupytext

    nb = jupytext.read(path)
    return [c for c in nb.cells if c.cell_type == "code"]


def notebook_parameters(path: str | Path) -> dict[str, Parameter]:
    """The parameters of a notebook, from its single cell tagged ``parameters``.

    Raises ParameterError if there is not exactly one such cell, if a line is not a literal
    assignment, or if a parameter has no comment.
    """
    path = Path(path)
    cells = [c for c in _read_cells(path) if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ParameterError(
            f"{path.name}: expected exactly one cell tagged 'parameters', found {len(cells)}"
        )
    source = cells[0].source
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"{path.name}: the parameters cell is not valid Python: {exc}") from None
    lines = source.splitlines()
    params: dict[str, Parameter] = {}
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            raise ParameterError(f"{path.name}: parameters cell line {node.lineno} is not 'name = literal'")
        name = node.targets[0].id
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            raise ParameterError(
                f"{path.name}: parameter {name!r} must be a literal (derive values in the next cell)"
            ) from None
        comment = ""
        for line in lines[node.lineno - 1 : node.end_lineno]:
            if "#" in line:
                comment = line.split("#", 1)[1].strip()
        if not comment:
            raise ParameterError(f"{path.name}: parameter {name!r} needs a comment saying what it is")
        params[name] = Parameter(name, value, comment)
    return params


def _compatible(default: Any, value: Any) -> bool:
    d, v = _type_name(default), _type_name(value)
    if d == "None" or v == "None":
        return True
    if d == "float" and v == "int":
        return True
    return d == v


def check_overrides(
    params: dict[str, Parameter], values: dict[str, Any], *, where: str = ""
) -> dict[str, Any]:
    """Check names and types of parameter values against a notebook's parameters cell.

    Returns the values to run with: a single value given to a list parameter (``-p k=30`` where
    the default is ``[10, 30, 50]``) becomes a one-element list, when it has the type of the
    default's elements (any type if the default list is empty).
    """
    prefix = f"{where}: " if where else ""
    out = {}
    for key, value in values.items():
        if key not in params:
            known = ", ".join(sorted(params))
            raise ParameterError(
                f"{prefix}unknown parameter {key!r}; this notebook's parameters are: {known}"
            )
        p = params[key]
        if isinstance(p.default, list) and not isinstance(value, list) and value is not None:
            elements = p.default[:1]
            if not elements or _compatible(elements[0], value):
                value = [value]
        if not _compatible(p.default, value):
            raise ParameterError(
                f"{prefix}parameter {key!r} must be of type {p.type_name} (like its default {p.default!r}), "
                f"got {value!r} of type {_type_name(value)}"
            )
        out[key] = value
    return out


# --- value checks used in notebooks' derived-values cell ---------------------------------------


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


def check_k(name: str, value: Any, d: int | None = None) -> int:
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
