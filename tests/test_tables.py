"""measurement/tables.py: a table made once from its pieces is the table a frame per piece,
joined and typed, gave: the same values, dtypes and layout."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from coupling_utils.measurement.tables import COLUMNS, DTYPES, TABLES, _dtype, concat, frame


def typed(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """How a table was typed before ``concat`` did it for every table (kept here as the oracle):
    its columns in order, each converted to its dtype and copied into a block of its own."""
    columns = {}
    for c in COLUMNS[name]:
        want = DTYPES.get(c, "float64")
        columns[c] = (df[c] if want == "object" else df[c].astype(_dtype(want))).array.copy()
    return pd.DataFrame(columns, copy=False)


def _old(name: str, pieces: list) -> pd.DataFrame:
    """The table as it was made before pieces: a frame per piece, joined, then typed."""
    frames = [p if isinstance(p, pd.DataFrame) else pd.DataFrame(p, columns=COLUMNS[name]) for p in pieces]
    if not frames:
        empty = {c: pd.Series(dtype=DTYPES.get(c, "float64")) for c in COLUMNS[name]}
        return typed(name, pd.DataFrame(empty))
    return typed(name, pd.concat(frames))


def _read_back(df: pd.DataFrame) -> pd.DataFrame:
    buffer = io.BytesIO()
    df.to_parquet(buffer, index=False)
    return pd.read_parquet(io.BytesIO(buffer.getvalue()))


def _pieces(name: str) -> list:
    rng = np.random.default_rng(3)
    if name == "prompts":
        return [
            {"prompt": ["a"], "text": ["one"], "n_tokens": [2], "input_ids": [[5, 7]]},
            {"prompt": ["bb"], "text": ["two"], "n_tokens": [3], "input_ids": [np.array([1, 2, 3])]},
        ]
    pieces = []
    for i, n in enumerate((4, 0, 9)):  # a piece without rows among them
        piece = {c: rng.integers(0, 50, n) for c in COLUMNS[name]}
        piece |= {c: rng.standard_normal(n) for c in ("m", "coupling", "value", "seconds") if c in piece}
        piece["prompt"] = f"p{i}"  # a scalar on every row
        if "K" in piece:
            piece["K"] = 3 + i
        pieces.append(piece)
    pieces.append(_read_back(_old(name, pieces[:1])))  # a layer's table read back from its file
    return pieces


@pytest.mark.parametrize("name", TABLES)
def test_a_table_from_its_pieces_is_the_table_frames_joined_and_typed_gave(name):
    pieces = _pieces(name)
    got, want = concat(name, pieces), _old(name, pieces)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    # each column in a block of its own, as typed() lays a table out: pandas adds a multi-column
    # aggregate in another order, so other bits, when columns share a block (tables.columnwise)
    assert got._mgr.nblocks == len(COLUMNS[name])
    pd.testing.assert_frame_equal(frame(name), _old(name, []), check_exact=True)


@pytest.mark.parametrize("name", TABLES)
def test_the_tables_of_several_prompts_read_back_join_as_typing_their_joined_frame_did(name):
    """A run's tables join its prompts' tables (some read back from their files) with ``concat``,
    as ``typed(pd.concat(...))`` did; a prompt's table read back is typed the same way."""
    pieces = _pieces(name)
    prompts = [_read_back(concat(name, pieces[:2])), concat(name, pieces[2:]), _read_back(frame(name))]
    got, want = concat(name, prompts), typed(name, pd.concat(prompts))
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got._mgr.nblocks == len(COLUMNS[name])
    read = _read_back(concat(name, pieces))
    pd.testing.assert_frame_equal(concat(name, [read]), typed(name, read), check_exact=True)


def test_a_table_read_back_without_one_of_its_columns_is_refused_by_name():
    read = _read_back(frame("timings")).drop(columns=["seconds"])
    with pytest.raises(ValueError, match="the timings table read back has no column seconds"):
        concat("timings", [read])


def test_a_piece_of_unequal_columns_or_only_scalars_is_refused():
    with pytest.raises(ValueError, match="columns of 2 and 3 rows"):
        concat("timings", [{"prompt": "a", "layer": [0, 1], "seconds": [0.1, 0.2, 0.3], "block_passes": 1}])
    with pytest.raises(ValueError, match="no column of values, only scalars"):
        concat("timings", [{"prompt": "a", "layer": 0, "seconds": 0.1, "block_passes": 1}])
