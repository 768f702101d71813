"""measure()'s folder (measurement/store.py): what a run may reuse, what it must clear, and in
which order it writes. No model runs here: the facts are files on disk."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import Settings
from coupling_utils.measurement.inputs import model_info
from coupling_utils.measurement.store import Store, load_npy, save_npy, write_json
from coupling_utils.measurement.tables import TABLES, concat, frame

CODE = {"fingerprint": "code-today", "torch": "x"}
OLD_CODE = {"fingerprint": "code-before"}


@pytest.fixture(scope="module")
def info():
    return model_info(tiny_model("llama"))  # d = 32, 2 blocks


@pytest.fixture
def settings(info):
    return Settings(k=3).resolve(info)


def tables() -> dict[str, pd.DataFrame]:
    out = {name: frame(name) for name in TABLES}
    row = {"prompt": ["a"], "token": [-1], "K": [3], "layer_i": [0], "layer_j": [1], "m": [0.5]}
    out["depthwise"] = frame("depthwise", {**row, "coupling": [0.75]})
    return out


def with_work(store: Store) -> Store:
    """A folder holding one computed layer file (work that a resume keeps)."""
    (store.layer_dir("p", 0)).mkdir(parents=True)
    (store.layer_dir("p", 0) / "J.npy").write_bytes(b"x")
    return store


# --------------------------------------------------------------------------- paths
def test_paths_of_a_prompt_and_a_layer(tmp_path):
    store = Store(str(tmp_path))
    assert store.out == tmp_path
    assert store.work("p") == tmp_path / "_work" / "p"
    assert store.layer_dir("p", 3) == tmp_path / "_work" / "p" / "layer_0003"
    assert store.layer_dir("p", 12345) == tmp_path / "_work" / "p" / "layer_12345"


# --------------------------------------------------------------------------- open
def test_open_a_new_folder_stamps_settings_and_code(tmp_path, settings):
    out = tmp_path / "new" / "m"
    made_by = Store(out).open(settings, CODE, resume=True, reuse_stale=False)
    assert made_by == CODE
    assert json.loads((out / "code.json").read_text()) == CODE
    assert settings.differences(json.loads((out / "settings.json").read_text())) == []


def test_open_removes_only_temporary_files_left_by_a_killed_writer(tmp_path, settings):
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    deep = with_work(store).layer_dir("p", 0)
    (deep / ".J.npy.tmp").write_bytes(b"half")
    (tmp_path / ".depthwise.parquet.tmp").write_bytes(b"half")
    (deep / "notes.tmp").write_bytes(b"kept: not a writer's temporary name")
    Store(tmp_path).open(settings, CODE, resume=True, reuse_stale=False)
    assert not (deep / ".J.npy.tmp").exists() and not (tmp_path / ".depthwise.parquet.tmp").exists()
    assert (deep / "notes.tmp").exists() and (deep / "J.npy").exists()


def test_open_refuses_other_settings_when_resuming_and_replaces_them_when_not(tmp_path, settings, info):
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    with_work(store)
    other = Settings(k=4).resolve(info)
    message = r"other settings \(k, n_singular\); use another out directory, or resume=False to replace it$"
    with pytest.raises(ValueError, match=message):
        store.open(other, CODE, resume=True, reuse_stale=False)
    assert (store.layer_dir("p", 0) / "J.npy").exists()  # a refusal deletes nothing
    store.open(other, CODE, resume=False, reuse_stale=False)
    assert not (tmp_path / "_work").exists()
    assert other.differences(json.loads((tmp_path / "settings.json").read_text())) == []


def test_resume_keeps_work_of_the_same_code_and_reports_that_code(tmp_path, settings):
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    with_work(store)
    assert store.open(settings, dict(CODE), resume=True, reuse_stale=False) == CODE
    assert (store.layer_dir("p", 0) / "J.npy").exists()


def test_resume_false_clears_work_of_the_same_settings(tmp_path, settings):
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    with_work(store)
    assert store.open(settings, CODE, resume=False, reuse_stale=False) == CODE
    assert not (tmp_path / "_work").exists()


def test_work_of_other_code_is_measured_again_unless_reused_as_stale(tmp_path, settings):
    store = Store(tmp_path)
    store.open(settings, OLD_CODE, resume=True, reuse_stale=False)
    with_work(store)
    assert store.open(settings, CODE, resume=True, reuse_stale=True) == OLD_CODE  # kept, stamped old
    assert (store.layer_dir("p", 0) / "J.npy").exists()
    assert json.loads((tmp_path / "code.json").read_text()) == OLD_CODE
    assert store.open(settings, CODE, resume=True, reuse_stale=False) == CODE  # cleared, stamped new
    assert not (tmp_path / "_work").exists()
    assert json.loads((tmp_path / "code.json").read_text()) == CODE


def test_work_stored_before_code_stamps_is_stale_when_reused(tmp_path, settings):
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    with_work(store)
    (tmp_path / "code.json").unlink()
    made_by = store.open(settings, CODE, resume=True, reuse_stale=True)
    assert made_by == {"fingerprint": None, "note": "stored before code fingerprints"}
    assert (store.layer_dir("p", 0) / "J.npy").exists()


@pytest.mark.parametrize("computed", ["_work", "prompts", "provenance.json"])
def test_each_kind_of_computed_file_counts_as_work(tmp_path, computed):
    store = Store(tmp_path)
    (tmp_path / "settings.json").write_text("{}")
    (tmp_path / "code.json").write_text("{}")
    (tmp_path / "depthwise.parquet").write_bytes(b"")
    assert not store.holds_work()
    if computed.endswith(".json"):
        (tmp_path / computed).write_text("{}")
    else:
        (tmp_path / computed).mkdir()
    assert store.holds_work()


def test_clear_removes_every_computed_file_and_keeps_the_rest(tmp_path):
    store = Store(tmp_path)
    computed = ["provenance.json", "code.json", *(f"{name}.parquet" for name in TABLES)]
    for name in computed:
        (tmp_path / name).write_text("x")
    with_work(store)
    (tmp_path / "prompts" / "batch-1").mkdir(parents=True)
    for name in ("settings.json", "notes.txt", "provenance.parquet"):
        (tmp_path / name).write_text("kept")
    store.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "provenance.parquet", "settings.json"]
    store.clear()  # clearing an empty folder is fine


# --------------------------------------------------------------------------- prompts and layers
def test_layer_markers_by_stage(tmp_path):
    store = Store(tmp_path)
    assert store.layer_meta("p", 0) is None
    store.layer_dir("p", 0).mkdir(parents=True)
    write_json(store.layer_dir("p", 0) / "cross.json", {"stage": "cross"})
    assert store.layer_meta("p", 0) is None  # "done" is the default stage
    assert store.layer_meta("p", 0, "cross") == {"stage": "cross"}
    write_json(store.layer_dir("p", 0) / "done.json", {"stage": "done"})
    assert store.layer_meta("p", 0) == {"stage": "done"}
    assert store.layer_meta("p", 1, "cross") is None


def test_a_prompt_keeps_its_work_for_the_same_inputs_and_drops_it_for_others(tmp_path):
    store = Store(tmp_path)
    store.start_prompt("p", "d1", "hello")
    assert json.loads((store.work("p") / "prompt.json").read_text()) == {
        "prompt": "p",
        "digest": "d1",
        "text": "hello",
    }
    with_work(store)
    store.start_prompt("p", "d1", "hello")
    assert (store.layer_dir("p", 0) / "J.npy").exists()
    store.start_prompt("p", "d2", "other")
    assert not store.layer_dir("p", 0).exists()
    assert json.loads((store.work("p") / "prompt.json").read_text())["digest"] == "d2"


# --------------------------------------------------------------------------- the finished measurement
def test_finished_is_today_s_code_only_unless_stale_is_allowed(tmp_path):
    store = Store(tmp_path)
    assert store.finished("code-today") is None
    store.finish(tables(), {"code": {"fingerprint": "code-today"}, "model": "m"})
    m = store.finished("code-today")
    assert m is not None and not m.stale and m.provenance["model"] == "m"
    pd.testing.assert_frame_equal(m.depthwise, concat("depthwise", [tables()["depthwise"]]))
    assert store.finished("code-tomorrow") is None
    stale = store.finished("code-tomorrow", reuse_stale=True)
    assert stale is not None and stale.stale
    assert store.finished("code-today", reuse_stale=True).stale is False


def test_a_finished_table_damaged_since_is_set_aside_and_said(tmp_path, capsys):
    """A finished measurement's table cut short later: its marker is moved aside and the warning
    names the folder and the table's problem; the marker's place is free for a rerun (a finished
    prompt's: tests/test_finished_prompts.py)."""
    store = Store(tmp_path)
    store.finish(tables(), {"code": {"fingerprint": "code-today"}})
    table = tmp_path / "depthwise.parquet"
    table.write_bytes(table.read_bytes()[:20])
    capsys.readouterr()
    assert store.finished("code-today") is None
    err = capsys.readouterr().err
    said = f"a table of the stored measurement {tmp_path} cannot be read ("
    assert err.startswith(f"warning: {said}") and "moved it to provenance.json.corrupt-" in err, err
    assert not (tmp_path / "provenance.json").exists()
    assert len(list(tmp_path.glob("provenance.json.corrupt-*"))) == 1


def test_a_measurement_stored_before_code_stamps_is_stale(tmp_path):
    store = Store(tmp_path)
    store.finish(tables(), {"model": "m"})
    assert store.finished("code-today") is None
    assert store.finished("code-today", reuse_stale=True).stale


# --------------------------------------------------------------------------- arrays and json
def test_arrays_round_trip_from_tensors_and_non_contiguous_views(tmp_path):
    t = torch.arange(12.0, requires_grad=True).reshape(3, 4) * 2
    save_npy(tmp_path / "a.npy", t.T)  # a non-contiguous view of a tensor that needs grad
    back = load_npy(tmp_path / "a.npy")
    assert isinstance(back, np.memmap)
    np.testing.assert_array_equal(back, (np.arange(12.0).reshape(3, 4) * 2).T)
    assert not isinstance(load_npy(tmp_path / "a.npy", mmap=False), np.memmap)
    save_npy(tmp_path / "b.npy", [1, 2])
    np.testing.assert_array_equal(load_npy(tmp_path / "b.npy"), [1, 2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]  # no temporary left


def test_stored_bases_and_arrays_by_token(tmp_path):
    store = Store(tmp_path)
    ldir = store.layer_dir("p", 1)
    ldir.mkdir(parents=True)
    U, S, Vh = torch.randn(2, 5, 3), torch.rand(2, 3), torch.randn(2, 3, 5)
    for prefix, scale in (("", 1.0), ("ctx_", 10.0)):
        for name, arr in zip(("U", "S", "Vh"), (U, S, Vh), strict=True):
            save_npy(ldir / f"{prefix}basis_{name}.npy", arr * scale)
    full = store.basis("p", 1)
    assert all(torch.equal(a, b) for a, b in zip(full, (U, S, Vh), strict=True))
    assert torch.equal(store.arrays("p").basis(1).S, S)  # the arrays' own default: no prefix
    one = store.basis("p", 1, index=1)
    assert all(torch.equal(a, b[1]) for a, b in zip(one, (U, S, Vh), strict=True))
    ctx = store.basis("p", 1, prefix="ctx_", index=0)
    assert torch.equal(ctx.S, S[0] * 10.0)
    save_npy(ldir / "J.npy", U)
    assert torch.equal(store.array("p", 1, "J", 1), U[1])


def test_json_is_sorted_and_writes_paths_as_text(tmp_path):
    write_json(tmp_path / "x.json", {"b": tmp_path, "a": 1})
    text = (tmp_path / "x.json").read_text()
    assert text.index('"a"') < text.index('"b"') and json.loads(text)["b"] == str(tmp_path)


# --------------------------------------------------------------------------- corrupt stamps and markers
@pytest.mark.parametrize(
    "corrupt, code_stamp",
    [("settings.json", True), ("settings.json", False), ("code.json", True)],
    ids=["settings", "settings-without-code-stamp", "code"],
)
def test_a_corrupt_stamp_clears_the_work_it_vouched_for(tmp_path, settings, capsys, corrupt, code_stamp):
    """Work whose settings or code cannot be read is measured again, even where stale work would be
    kept (reuse_stale=True); the stamp is moved aside, named, and written anew."""
    store = Store(tmp_path)
    store.open(settings, CODE, resume=True, reuse_stale=False)
    with_work(store)
    if not code_stamp:  # work stored before code stamps
        (tmp_path / "code.json").unlink()
    (tmp_path / corrupt).write_text('{"half a st')
    capsys.readouterr()
    assert store.open(settings, CODE, resume=True, reuse_stale=True) == CODE
    assert not (tmp_path / "_work").exists()
    assert json.loads((tmp_path / "code.json").read_text()) == CODE
    assert settings.differences(json.loads((tmp_path / "settings.json").read_text())) == []
    assert len(list(tmp_path.glob(f"{corrupt}.corrupt-*"))) == 1
    assert f"warning: the stored measurement file {tmp_path / corrupt} is corrupt" in capsys.readouterr().err


def test_a_corrupt_marker_means_not_done_and_says_which_file(tmp_path, capsys):
    store = Store(tmp_path)
    store.layer_dir("p", 0).mkdir(parents=True)
    marker = store.layer_dir("p", 0) / "done.json"
    marker.write_text("{")
    assert store.layer_meta("p", 0) is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: the stored measurement file {marker} is corrupt ("), err
    assert not marker.exists() and len(list(marker.parent.glob("done.json.corrupt-*"))) == 1


# --------------------------------------------------------------------------- a stored layer, checked
def stored_layer(store: Store) -> tuple[dict, pd.DataFrame]:
    """Layer 0 of prompt p as a run stores it: arrays, a table with rows, one without, marker last."""
    ldir = store.layer_dir("p", 0)
    ldir.mkdir(parents=True)
    arrays = {"J": torch.randn(2, 4, 4), "basis_S": torch.rand(2, 3)}
    for name, arr in arrays.items():
        save_npy(ldir / f"{name}.npy", arr)
    sv = frame(
        "singular_values",
        {"prompt": ["p"] * 2, "token": [3, 4], "layer": [0, 0], "rank": [1, 1], "value": [2.0, 1.5]},
    )
    sv.to_parquet(ldir / "singular_values.parquet")
    meta = {
        "layer": 0,
        "T": 5,
        "tokens": [3, 4],
        "context_tokens": [],
        "seconds": 0.5,
        "block_passes": 4,
        "empty_tables": ["tokenwise"],
        "arrays": {name: list(arr.shape) for name, arr in arrays.items()},
    }
    write_json(ldir / "done.json", meta)
    return meta, sv


def test_a_stored_layer_is_read_back_with_its_tables_typed(tmp_path):
    store = Store(tmp_path)
    meta, sv = stored_layer(store)
    got, read = store.stored_layer("p", 0, ("singular_values", "tokenwise"))
    assert got == meta and list(read) == ["singular_values", "tokenwise"]
    pd.testing.assert_frame_equal(read["singular_values"], concat("singular_values", [sv]), check_exact=True)
    pd.testing.assert_frame_equal(read["tokenwise"], frame("tokenwise"))  # named as without rows
    assert store.stored_layer("p", 0, ()) == (meta, {})
    assert store.stored_layer("p", 1) is None and store.stored_layer("p", 0, stage="cross") is None
    write_json(
        store.layer_dir("p", 0) / "cross.json", {"layer": 0, "seconds": 1, "block_passes": 2, "arrays": {}}
    )
    assert store.stored_layer("p", 0, stage="cross")[0]["block_passes"] == 2


def _edit_marker(**changes):
    def edit(ldir):
        marker = json.loads((ldir / "done.json").read_text())
        for key, value in changes.items():
            if value is None:
                del marker[key]
            else:
                marker[key] = value
        (ldir / "done.json").write_text(json.dumps(marker))

    return edit


def _cut(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {
    "an array cut short": (lambda ldir: _cut(ldir / "J.npy"), "mmap length is greater than file size"),
    "an array missing": (lambda ldir: (ldir / "basis_S.npy").unlink(), "basis_S.npy"),
    "an array of another shape": (
        lambda ldir: np.save(ldir / "J.npy", np.zeros((1, 4, 4))),
        "J.npy holds an array of shape [1, 4, 4], not [2, 4, 4]",
    ),
    "a table cut short": (lambda ldir: _cut(ldir / "singular_values.parquet"), "singular_values"),
    "a table a column short": (
        lambda ldir: (
            pd.read_parquet(ldir / "singular_values.parquet")
            .drop(columns="value")
            .to_parquet(ldir / "singular_values.parquet")
        ),
        "the singular_values table read back has no column value",
    ),
    "a table without rows not named so": (_edit_marker(empty_tables=[]), "tokenwise.parquet"),
    "a marker without its tokens": (_edit_marker(tokens=None), "its marker's tokens is None"),
    "a marker with a token not a number": (_edit_marker(tokens=[3, "4"]), "its marker's tokens is [3, '4']"),
    "a marker with T true": (_edit_marker(T=True), "its marker's T is True"),
    "a marker with seconds as text": (_edit_marker(seconds="0.5"), "its marker's seconds is '0.5'"),
    "a marker naming no arrays": (_edit_marker(arrays=None), "its marker's arrays is None"),
    "a marker naming arrays without shapes": (
        _edit_marker(arrays={"J": 2}),
        "its marker's arrays are {'J': 2}, not shapes",
    ),
    "another layer's marker": (_edit_marker(layer=1), "its marker is layer 1's"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_stored_layer_damaged_since_is_set_aside_and_said(damage, tmp_path, capsys):
    store = Store(tmp_path)
    stored_layer(store)
    ldir = store.layer_dir("p", 0)
    harm, why = DAMAGES[damage]
    harm(ldir)
    capsys.readouterr()
    assert store.stored_layer("p", 0, ("singular_values", "tokenwise")) is None
    err = capsys.readouterr().err
    assert err.startswith(f"warning: layer 0 of prompt 'p' stored in {ldir} cannot be read ("), err
    assert why in err and "moved it to done.json.corrupt-" in err, err
    assert not (ldir / "done.json").exists() and len(list(ldir.glob("done.json.corrupt-*"))) == 1
    assert store.stored_layer("p", 0) is None  # not stored now: computed again


def test_damaged_cross_products_are_set_aside(tmp_path, capsys):
    store = Store(tmp_path)
    stored_layer(store)
    ldir = store.layer_dir("p", 0)
    save_npy(ldir / "cross_tiles.npy", torch.rand(2, 2, 3, 3))
    write_json(
        ldir / "cross.json",
        {"layer": 0, "seconds": 1.0, "block_passes": 6, "arrays": {"cross_tiles": [2, 2, 3, 3]}},
    )
    assert store.stored_layer("p", 0, stage="cross") is not None
    _cut(ldir / "cross_tiles.npy")
    assert store.stored_layer("p", 0, stage="cross") is None
    err = capsys.readouterr().err
    assert (
        "cannot be read (mmap length is greater than file size)" in err
        and "moved it to cross.json.corrupt-" in err
    )
    assert len(list(ldir.glob("cross.json.corrupt-*"))) == 1 and (ldir / "done.json").exists()
