"""Notebook parameters: reading a notebook's ``parameters`` cell, and validating values.

Every notebook has exactly one code cell tagged ``parameters`` holding literal assignments, one
per line, each with a comment. Profiles (``notebooks/profiles/<profile>/<notebook>.yaml``) and
``-p key=value`` overrides are checked against that cell (names and types) before a run, and the
notebook's next cell checks values (ranges, choices, model names) through its chapter's
``Params`` (:mod:`coupling_utils.chapters`), which raise ``ParameterError`` naming the parameter
and the fix.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coupling_utils.chapters.checks import ParameterError

__all__ = ["Parameter", "notebook_parameters", "check_overrides"]


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
