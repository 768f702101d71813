"""Table schemas and the one check of a DataFrame's columns against them, used by every layer.

A :class:`Schema` names a table and its columns with a dtype kind each; each table's schema is
declared once, next to the code that makes the table (the measurement tables in
``measurement/tables.py``, the data files in ``analysis/data.py``, ...). A function that needs
only some of a table's columns checks those (:meth:`Schema.need`). :func:`check_table` raises a
:class:`TableError` naming the table, the missing columns (with the ones it has) or the columns of
the wrong dtype, and how to get the right table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import pandas as pd
from pandas.api import types as pdt

__all__ = ["KINDS", "Schema", "TableError", "check_table"]


def _is_int(s) -> bool:
    return pdt.is_integer_dtype(s) and not pdt.is_bool_dtype(s)


def _is_number(s) -> bool:
    return pdt.is_numeric_dtype(s) and not pdt.is_bool_dtype(s)


def _is_str(s) -> bool:
    return pdt.is_string_dtype(s) or pdt.is_object_dtype(s) or isinstance(s.dtype, pd.CategoricalDtype)


#: dtype kind -> test of a column
KINDS = {
    "any": lambda s: True,
    "int": _is_int,
    "float": pdt.is_float_dtype,
    "number": _is_number,  # int or float, not bool
    "str": _is_str,  # string, object or categorical
    "bool": pdt.is_bool_dtype,
}


class TableError(ValueError):
    """A table lacks columns its reader needs, or has one of the wrong dtype (the message says which)."""


@dataclass(frozen=True)
class Schema:
    """A table: its name (as messages should call it), its columns with their dtype kinds
    (:data:`KINDS`), and what to do to get a right one (``fix``, e.g. "pass Measurement.depthwise")."""

    name: str
    columns: Mapping[str, str] = field(default_factory=dict)
    fix: str = ""

    def __post_init__(self):
        unknown = sorted({k for k in self.columns.values() if k not in KINDS})
        if unknown:
            raise ValueError(f"schema {self.name!r}: unknown dtype kind(s) {unknown}; use {list(KINDS)}")
        object.__setattr__(self, "columns", MappingProxyType(dict(self.columns)))

    def need(self, *names: str | None, fix: str | None = None, **kinds: str) -> Schema:
        """The part of this table a reader needs: the columns ``names`` (in that order; a name
        this schema does not declare, such as a label column added later, is of kind "any";
        None is skipped) and ``kinds`` (column=kind, e.g. the caller's value column)."""
        cols = {n: self.columns.get(n, "any") for n in names if n is not None}
        cols.update(kinds)
        return Schema(self.name, cols, self.fix if fix is None else fix)


def check_table(df: pd.DataFrame, schema: Schema, *, error: type[TableError] = TableError) -> pd.DataFrame:
    """``df``, unchanged, once it has every column of ``schema`` with the declared dtype kind.

    Raises ``error`` (a :class:`TableError`, a ValueError) naming the table, the missing
    columns and the columns it has, or the columns of the wrong dtype, and ``schema.fix``.
    """
    if not isinstance(df, pd.DataFrame):
        raise error(f"{schema.name}: expected a pandas DataFrame, got {type(df).__name__}")
    fix = f"; {schema.fix}" if schema.fix else ""
    missing = [c for c in schema.columns if c not in df.columns]
    if missing:
        raise error(f"{schema.name}: missing column(s) {missing}; it has {list(df.columns)}{fix}")
    wrong = [
        f"{c!r} is {df[c].dtype}, not {kind}" for c, kind in schema.columns.items() if not KINDS[kind](df[c])
    ]
    if wrong:
        raise error(f"{schema.name}: wrong dtype: {', '.join(wrong)}{fix}")
    return df
