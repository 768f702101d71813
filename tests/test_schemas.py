"""coupling_utils/schemas.py: one check of a table's columns and dtypes against its schema."""

from __future__ import annotations

import pandas as pd
import pytest

from coupling_utils.measurement.tables import COLUMNS, SCHEMAS, frame
from coupling_utils.schemas import Schema, TableError, check_table

DEPTHWISE = Schema(
    "the depthwise table",
    {"prompt": "str", "K": "int", "layer_i": "int", "m": "number", "ok": "bool", "note": "any"},
    fix="pass Measurement.depthwise",
)


def _table(**changes):
    df = pd.DataFrame(
        {
            "prompt": ["a", "b"],
            "K": [1, 2],
            "layer_i": [0, 1],
            "m": [0.5, 1],
            "ok": [True, False],
            "note": [None, 3],
            "extra": [1, 2],
        }
    )
    return df.assign(**changes)


def test_a_right_table_is_returned_unchanged():
    df = _table()
    assert check_table(df, DEPTHWISE) is df
    assert check_table(_table(m=[1, 2], prompt=pd.Series(["a", "b"], dtype="string")), DEPTHWISE) is not None
    for name in COLUMNS:  # every measurement table, empty and typed, matches its own schema
        check_table(frame(name), SCHEMAS[name])


def test_missing_columns_are_named_with_the_table_and_the_fix():
    with pytest.raises(TableError) as info:
        check_table(_table().drop(columns=["K", "m"]), DEPTHWISE)
    assert str(info.value) == (
        "the depthwise table: missing column(s) ['K', 'm']; it has "
        "['prompt', 'layer_i', 'ok', 'note', 'extra']; pass Measurement.depthwise"
    )
    assert isinstance(info.value, ValueError)
    with pytest.raises(TableError, match=r"^df: missing column\(s\) \['x'\]; it has \[\]$"):
        check_table(pd.DataFrame(), Schema("df", {"x": "any"}))
    with pytest.raises(TableError, match="expected a pandas DataFrame, got dict"):
        check_table({"K": [1]}, DEPTHWISE)


def test_wrong_dtypes_are_named():
    bad = _table(K=[1.0, 2.5], m=pd.Series(["0.5", "1"], dtype=object), ok=[1, 0], layer_i=[True, False])
    with pytest.raises(TableError) as info:
        check_table(bad, DEPTHWISE)
    assert str(info.value) == (
        "the depthwise table: wrong dtype: 'K' is float64, not int, 'layer_i' is bool, not int, "
        "'m' is object, not number, 'ok' is int64, not bool; pass Measurement.depthwise"
    )
    with pytest.raises(TableError, match="'prompt' is int64, not str"):
        check_table(_table(prompt=[1, 2]), DEPTHWISE)


def test_need_takes_part_of_a_schema():
    part = DEPTHWISE.need("model", "K", None, m="any")
    assert dict(part.columns) == {"model": "any", "K": "int", "m": "any"}
    assert part.name == DEPTHWISE.name and part.fix == DEPTHWISE.fix
    check_table(_table(model="x", m=["a", "b"]), part)  # m may be anything here
    with pytest.raises(TableError, match=r"missing column\(s\) \['model'\]"):
        check_table(_table(), part)
    assert DEPTHWISE.need("K", fix="").fix == ""


def test_a_schema_refuses_an_unknown_kind_and_a_subclass_error_is_raised():
    with pytest.raises(ValueError, match=r"unknown dtype kind\(s\) \['integer'\]"):
        Schema("t", {"a": "integer"})

    class Mine(TableError):
        pass

    with pytest.raises(Mine):
        check_table(pd.DataFrame(), Schema("t", {"a": "any"}), error=Mine)
