"""A measurement's finished prompts (``measurement.finished``): held as they finish, written
together as one batch, read back split by prompt; the one-prompt folders of earlier runs read as
batches of one; a damaged batch set aside and said."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from coupling_utils.measurement import store as store_module
from coupling_utils.measurement.finished import FinishedPrompts
from coupling_utils.measurement.store import Store
from coupling_utils.measurement.tables import TABLES, frame


def tables(pid: str = "p", m: float = 0.5) -> dict[str, pd.DataFrame]:
    out = {name: frame(name) for name in TABLES}
    row = {"prompt": [pid], "token": [-1], "K": [3], "layer_i": [0], "layer_j": [1], "m": [m]}
    out["depthwise"] = frame("depthwise", {**row, "coupling": [1 - m * m]})
    out["timings"] = frame("timings", {"prompt": [pid] * 2, "layer": [0, 1], "seconds": [0.1, 0.2],
                                       "block_passes": [3, 4]})  # fmt: skip
    return out


def same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(TABLES)
    for name in TABLES:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def with_work(store: Store, pid: str) -> None:
    store.layer_dir(pid, 0).mkdir(parents=True)
    (store.layer_dir(pid, 0) / "J.npy").write_bytes(b"x")


def test_each_prompt_at_once_is_a_batch_of_one_read_back_and_its_inputs_checked(tmp_path):
    store = Store(tmp_path)
    done = FinishedPrompts(store)  # checkpoint 0: written at once
    assert done.tables("p", "d1") is None
    with_work(store, "p")
    done.add("p", "d1", tables(), keep_work=False)
    assert not store.work("p").exists()  # its work dropped once its tables are stored
    folder = tmp_path / "prompts" / "batch-1"
    empty = sorted(set(TABLES) - {"depthwise", "timings"})  # tables without rows: named, no file
    assert json.loads((folder / "done.json").read_text()) == {"prompts": {"p": "d1"}, "empty_tables": empty}
    assert sorted(p.name for p in folder.glob("*.parquet")) == ["depthwise.parquet", "timings.parquet"]
    same(FinishedPrompts(store).tables("p", "d1"), tables())  # a new run reads it back
    message = r"prompt 'p' was measured with other inputs; use another out directory, other prompt ids"
    with pytest.raises(ValueError, match=message):
        FinishedPrompts(store).tables("p", "d2")


def test_prompts_held_until_due_are_written_as_one_batch_and_read_back_split(tmp_path):
    store = Store(tmp_path)
    done = FinishedPrompts(store, checkpoint_seconds=600)
    for i, pid in enumerate(["a", "b", "c"]):
        with_work(store, pid)
        done.add(pid, f"d{pid}", tables(pid, m=0.1 * (i + 1)), keep_work=pid == "b")
    assert not (tmp_path / "prompts").exists() and store.work("a").exists()  # held: nothing written
    same(done.tables("b", "db"), tables("b", 0.2))  # a held prompt is finished too
    done.write()
    assert [p.name for p in (tmp_path / "prompts").iterdir()] == ["batch-1"]
    assert not store.work("a").exists() and store.work("b").exists()  # b's work kept, as asked
    again = FinishedPrompts(store)
    for i, pid in enumerate(["a", "b", "c"]):
        same(again.tables(pid, f"d{pid}"), tables(pid, m=0.1 * (i + 1)))
    done.add("e", "de", tables("e"), keep_work=False)
    done.write()
    assert json.loads((tmp_path / "prompts" / "batch-2" / "done.json").read_text())["prompts"] == {"e": "de"}
    done.write()  # nothing held: nothing written
    assert len(list((tmp_path / "prompts").iterdir())) == 2


def test_held_prompts_past_the_held_bytes_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "HELD_BYTES", 1)
    done = FinishedPrompts(Store(tmp_path), checkpoint_seconds=600)
    done.add("p", "d1", tables(), keep_work=False)
    assert (tmp_path / "prompts" / "batch-1" / "done.json").exists()


def test_a_one_prompt_folder_of_an_earlier_run_is_read_as_a_batch_of_one(tmp_path):
    folder = tmp_path / "prompts" / "p"
    folder.mkdir(parents=True)
    tables()["depthwise"].to_parquet(folder / "depthwise.parquet", index=False)
    tables()["timings"].to_parquet(folder / "timings.parquet", index=False)
    empty = sorted(set(TABLES) - {"depthwise", "timings"})
    (folder / "done.json").write_text(json.dumps({"prompt": "p", "digest": "d1", "empty_tables": empty}))
    done = FinishedPrompts(Store(tmp_path))
    same(done.tables("p", "d1"), tables())
    done.add("q", "d2", tables("q"), keep_work=False)
    assert (tmp_path / "prompts" / "batch-1" / "done.json").exists()  # batches beside it


def test_a_batch_without_its_marker_is_not_finished_and_is_written_over(tmp_path):
    """The marker is written after the tables: tables alone (a writer killed between) do not count,
    and the next batch takes their place."""
    store = Store(tmp_path)
    FinishedPrompts(store).add("p", "d1", tables(), keep_work=False)
    (tmp_path / "prompts" / "batch-1" / "done.json").unlink()
    done = FinishedPrompts(store)
    assert done.tables("p", "d1") is None
    done.add("p", "d1", tables(), keep_work=False)  # the resumed run finishes it again
    assert [p.name for p in (tmp_path / "prompts").iterdir()] == ["batch-1"]
    same(FinishedPrompts(store).tables("p", "d1"), tables())


def test_a_marker_that_names_its_empty_tables_otherwise_than_as_a_list_names_none(tmp_path, capsys):
    """A damaged marker (valid JSON, the names as one string) never lets a table pass as empty: each
    is read from its file, and a missing one sends the batch's prompts to be measured again."""
    store = Store(tmp_path)
    FinishedPrompts(store).add("p", "d1", tables(), keep_work=False)
    marker = tmp_path / "prompts" / "batch-1" / "done.json"
    empty = json.loads(marker.read_text())["empty_tables"]
    marker.write_text(json.dumps({"prompts": {"p": "d1"}, "empty_tables": " ".join(empty)}))
    assert FinishedPrompts(store).tables("p", "d1") is None
    assert "cannot be read" in capsys.readouterr().err


def test_a_batch_damaged_since_is_set_aside_and_said(tmp_path, capsys):
    store = Store(tmp_path)
    done = FinishedPrompts(store, checkpoint_seconds=600)
    done.add("a", "da", tables("a"), keep_work=False)
    done.add("b", "db", tables("b"), keep_work=False)
    done.write()
    folder = tmp_path / "prompts" / "batch-1"
    table = folder / "depthwise.parquet"
    table.write_bytes(table.read_bytes()[:20])
    capsys.readouterr()
    again = FinishedPrompts(store)
    assert again.tables("a", "da") is None and again.tables("b", "db") is None  # both measured again
    err = capsys.readouterr().err
    said = f"a table of the prompts stored in {folder} cannot be read ("
    assert err.startswith(f"warning: {said}") and "moved it to done.json.corrupt-" in err, err
    assert not (folder / "done.json").exists() and len(list(folder.glob("done.json.corrupt-*"))) == 1
