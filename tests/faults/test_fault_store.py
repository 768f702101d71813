"""Nothing stale, lost or inconsistent: models keyed by content, tables replaced as a set, inputs
round-tripped, corrupt records quarantined, one bad model never stops the others, the umask
respected, a read-only cache readable."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from coupling_utils import files
from coupling_utils.engine.architectures import tiny_model
from coupling_utils.models.identity import model_identity
from coupling_utils.pipeline.cli import main


def _measure(out, *models, prompts):
    return main(["measure", *map(str, models), "--prompts", str(prompts), "--k", "2", "--out", str(out)])


def test_new_weights_under_an_unchanged_config_are_measured_again(model_dir, ids_file, tmp_path):
    out = tmp_path / "o"
    assert _measure(out, model_dir, prompts=ids_file) == 0
    before = pd.read_csv(out / "summary.csv").coupling.tolist()
    identity = model_identity(str(model_dir))
    assert model_identity(str(model_dir)) == identity  # unchanged files: the same key
    config_mtime = (model_dir / "config.json").stat().st_mtime_ns
    tiny_model("gpt2", seed=11).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", model_dir / "model.safetensors")
    assert (model_dir / "config.json").stat().st_mtime_ns == config_mtime
    assert model_identity(str(model_dir)) != identity
    assert _measure(out, model_dir, prompts=ids_file) == 0
    assert pd.read_csv(out / "summary.csv").coupling.tolist() != before


def test_a_moved_cache_or_model_folder_keeps_its_identity(model_dir, tmp_path, monkeypatch):
    """Identity by content, not by place: the same zoo entry under two cache roots (a cache copied
    or mounted elsewhere) and the same files in two folders have one identity each, so stored
    measurements are found again; the zoo entry's identity still carries its recipe's key."""
    identities = []
    for root in ("a", "b"):
        monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / root))
        identities.append(model_identity("embedded:pythia-smoke"))
    assert identities[0] == identities[1]
    assert identities[0].startswith("zoo:pythia-smoke/") and str(tmp_path) not in identities[0]
    moved = Path(shutil.copytree(model_dir, tmp_path / "moved" / "model", copy_function=shutil.copy2))
    assert model_identity(str(moved)) == model_identity(str(model_dir))


def test_a_local_checkpoint_is_known_by_its_own_files(model_dir, tmp_path):
    """A training run that adds checkpoints to its folder (revisions/<R>/) leaves the identity of
    those already there, and of its final model, unchanged: each is keyed by the files it loads."""
    other = tmp_path / "other"
    tiny_model("gpt2", seed=11).save_pretrained(other)
    shutil.copytree(other, model_dir / "revisions" / "step1")
    final, step1 = model_identity(str(model_dir)), model_identity(str(model_dir), "step1")
    assert step1 != final and model_identity(str(model_dir), "main") == final
    assert step1 == model_identity(str(other))  # the same files, wherever they lie
    shutil.copytree(model_dir / "revisions" / "step1", model_dir / "revisions" / "step2")
    tiny_model("gpt2", seed=12).save_pretrained(model_dir / "revisions" / "step2")
    assert (model_identity(str(model_dir)), model_identity(str(model_dir), "step1")) == (final, step1)
    missing = model_identity(str(model_dir), "step3")  # not there: loading fails; its key follows the folder
    shutil.copytree(other, model_dir / "revisions" / "step3")
    assert model_identity(str(model_dir), "step3") not in (missing, final)


def test_hub_models_are_keyed_by_their_cached_commit(standin_hub):
    hub, _ = standin_hub
    step1, step128 = (model_identity("EleutherAI/pythia-6.9b", r) for r in ("step1", "step128"))
    assert step1 != step128 and step1.startswith("EleutherAI/pythia-6.9b@")
    assert (hub / "models--EleutherAI--pythia-6.9b" / "snapshots" / step1.split("@")[1]).is_dir()
    assert model_identity("someorg/not-in-the-cache") == "someorg/not-in-the-cache"


def test_inputs_round_trip_and_tables_are_replaced_as_a_set(model_dir, ids_file, tmp_path):
    out = tmp_path / "o"
    assert _measure(out, model_dir, prompts=ids_file) == 0
    assert _measure(out, model_dir, prompts=ids_file) == 0  # from the store this time
    ids = pd.read_csv(out / "prompts.csv").set_index("prompt").input_ids.map(json.loads)
    assert ids.to_dict() == json.loads(ids_file.read_text())
    # a rerun where every model fails: no table of the earlier run is left beside its provenance
    not_a_model = tmp_path / "not-a-model"  # a folder with no model in it: it fails when loaded
    not_a_model.mkdir()
    assert _measure(out, not_a_model, prompts=ids_file) == 1
    prov = json.loads((out / "provenance.json").read_text())
    assert list(prov["models"]) == [str(not_a_model)]
    assert sorted(p.stem for p in out.glob("*.csv")) == prov["tables"] == ["failures"]
    assert not list(out.glob(".*"))  # no temporary folder left


def test_one_bad_model_does_not_stop_the_others(model_dir, ids_file, tmp_path, capsys):
    out = tmp_path / "o"
    not_a_model = tmp_path / "not-a-model"  # a folder with no model in it: it fails when loaded
    not_a_model.mkdir()
    assert _measure(out, not_a_model, model_dir, prompts=ids_file) == 1
    text = capsys.readouterr().out
    assert "1 of 2 measured" in text and f"missing model={not_a_model}: " in text, text
    failures = pd.read_csv(out / "failures.csv")
    assert failures.model.tolist() == [str(not_a_model)] and str(not_a_model) in failures.message[0]
    assert pd.read_csv(out / "summary.csv").model.tolist() == [str(model_dir)]
    # a name that is known to name nothing (a typo) is refused before anything runs or is written
    assert _measure(tmp_path / "o2", "embedded:no-such-model", model_dir, prompts=ids_file) == 2
    assert "MODEL embedded:no-such-model: unknown embedded model" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_truncated_weights_are_named_as_damaged(model_dir, ids_file, tmp_path, capsys):
    from test_loading import write_tiny_llama_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(tiny_model("llama", seed=4), gguf)
    for path in (gguf, model_dir / "model.safetensors"):
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    assert _measure(tmp_path / "o", gguf, model_dir, prompts=ids_file) == 1
    failures = pd.read_csv(tmp_path / "o" / "failures.csv")
    assert failures.error.tolist() == ["DamagedModelError"] * 2, failures.message.tolist()
    assert failures.message.str.contains("probably truncated or damaged").all()


def test_corrupt_store_files_are_quarantined_and_recomputed(model_dir, ids_file, tmp_path, capsys):
    out = tmp_path / "o"
    assert _measure(out, model_dir, prompts=ids_file) == 0
    good = pd.read_csv(out / "depthwise.csv")
    store = out / "store"
    measurement = store.rglob("provenance.json").__next__().parent
    for name in ("provenance.json", "settings.json", "done.json"):
        victim = sorted(measurement.rglob(name))[0]
        victim.write_text('{"half a rec')
        if name != "provenance.json":
            (measurement / "provenance.json").unlink()  # as if the run had stopped before the end
        capsys.readouterr()
        assert _measure(out, model_dir, prompts=ids_file) == 0, name
        err = capsys.readouterr().err
        assert f"{victim} is corrupt" in err and "moved it to" in err, err
        assert len(list(victim.parent.glob(f"{name}.corrupt-*"))) == 1
        for old in victim.parent.glob(f"{name}.corrupt-*"):
            old.unlink()
        pd.testing.assert_frame_equal(pd.read_csv(out / "depthwise.csv"), good, check_exact=False)


def test_corrupt_runs_record_and_a_refused_run_keep_the_good_record(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    good = {"f00_coupling_metric": {"status": "ok", "profile": "smoke", "code": "abc"}}
    (runs / "runs.json").write_text(json.dumps(good))
    args = ["run", "f00", "--profile", "smoke", "-p", "nope=1", "--output-dir", str(runs)]
    assert main(args) == 2  # bad input, and nothing ran
    assert json.loads((runs / "runs.json").read_text()) == good
    (runs / "runs.json").write_text("{")
    assert main(args) == 2
    assert "runs.json is corrupt" in capsys.readouterr().err
    assert len(list(runs.glob("runs.json.corrupt-*"))) == 1


@pytest.mark.parametrize("mask", [0o002, 0o077])
def test_files_and_folders_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        files.atomic_write_text(tmp_path / "f.txt", "x")
        with files.atomic_dir(tmp_path / "d") as tmp:
            (tmp / "inside").write_text("y")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~mask


def _fake_entry(monkeypatch, tmp_path):
    """A built zoo entry (manifest and a weights file) in a folder of its own."""
    from coupling_utils.models.zoo import build

    root = tmp_path / "zoo" / "pythia-smoke" / "key"
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"w" * 1000)
    (root / "manifest.json").write_text(json.dumps({"size_bytes": 1002, "metrics": {}}))
    monkeypatch.setattr(build, "entry_dir", lambda entry, member=None: root / member if member else root)
    return build, root


def test_truncated_zoo_weights_are_not_ready(monkeypatch, tmp_path):
    from coupling_utils.models import zoo

    build, root = _fake_entry(monkeypatch, tmp_path)
    state = {r["name"]: r["state"] for r in zoo.list_entries().to_dict("records")}
    assert state["embedded:pythia-smoke"] == "ready"
    with open(root / "model.safetensors", "r+b") as f:
        f.truncate(600)
    state = {r["name"]: r["state"] for r in zoo.list_entries().to_dict("records")}
    assert state["embedded:pythia-smoke"].startswith("damaged (602 of 1002 bytes")
    with pytest.raises(zoo.ZooError, match="zoo prepare pythia-smoke --force"):
        zoo.resolve("pythia-smoke", progress=False)


def test_a_built_zoo_entry_is_read_without_its_lock(monkeypatch, tmp_path):
    """A read-only cache cannot create lock files; a built entry needs none to be read."""
    build, root = _fake_entry(monkeypatch, tmp_path)

    def no_lock(name):
        raise PermissionError(13, "Permission denied", str(tmp_path / "zoo" / name / ".lock"))

    monkeypatch.setattr(build, "_lock", no_lock)
    assert build.resolve("pythia-smoke", progress=False) == root
    assert not files.is_locked(root / "manifest.json")


def _readable_by_all(path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def test_a_read_only_cache_and_store_serve_what_they_hold(cli, tiny_dir, ids_file):
    """As another user (root: `nobody`), with the cache and the stored measurement not writable."""
    import pwd
    import tempfile
    from pathlib import Path

    import coupling_utils

    root = Path(coupling_utils.__file__).parents[1]
    if os.geteuid() == 0 and not all(_readable_by_all(p) for p in (root, Path(sys.executable).resolve())):
        pytest.skip("run as root, and `nobody` cannot read this checkout or its Python")
    base = Path(tempfile.mkdtemp(prefix="coupling-ro-"))
    try:
        base.chmod(0o755)
        model, cache, out = base / "model", base / "cache", base / "out"
        shutil.copytree(tiny_dir, model)
        shutil.copy(ids_file, base / "ids.json")
        args = ["measure", model, "--prompts", base / "ids.json", "--k", "2", "--out", out]
        env = {"COUPLING_CACHE": str(cache)}
        assert cli(*args, env=env).returncode == 0
        stored = {p: p.stat().st_mtime_ns for p in out.rglob("*") if "store" in p.parts}
        as_user = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(out, nobody.pw_uid, nobody.pw_gid)  # tables may be written, the store may not
            for p in [*out.iterdir()]:
                if p.is_file():
                    os.chown(p, nobody.pw_uid, nobody.pw_gid)
            as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid}
        else:
            for p in [cache, *cache.rglob("*"), out / "store", *(out / "store").rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
        r = cli(*args, env={**env, "HOME": str(base)}, **as_user)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if "store" in p.parts} == stored
    finally:
        for p in [base, *base.rglob("*")]:
            with contextlib.suppress(OSError):
                p.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_a_store_that_fills_up_keeps_whole_entries_and_a_rerun_equals_a_clean_run(
    model_dir, ids_file, tmp_path, monkeypatch, capsys
):
    """The disk fills up midway through a measurement (the 5th rename finds no room): the model's
    run stops naming the store's folder (was: a bare "OSError: [Errno 28] ..."), no temporary file is
    left in the store, and once there is room the rerun finishes from what was stored, with the
    tables of a run that never failed."""
    import errno

    clean = tmp_path / "clean"
    assert _measure(clean, model_dir, prompts=ids_file) == 0
    replace, calls = os.replace, []

    def full_once(src, dst):
        calls.append(dst)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return replace(src, dst)

    out = tmp_path / "o"
    monkeypatch.setattr(os, "replace", full_once)
    capsys.readouterr()
    assert _measure(out, model_dir, prompts=ids_file) == 1
    said = capsys.readouterr()
    full = "error: the disk is full (No space left on device) while writing in"
    assert f"{full} {out / 'store'}" in said.err and not list(out.glob("*.csv")), said.err
    assert list((out / "store").rglob("*.tmp")) == [] and len(calls) >= 5
    monkeypatch.setattr(os, "replace", replace)
    assert _measure(out, model_dir, prompts=ids_file) == 0
    for table in ("summary", "depthwise", "singular_values", "prompts"):
        assert (out / f"{table}.csv").read_text() == (clean / f"{table}.csv").read_text(), table


@pytest.mark.parametrize("damage", ["cut short", "a column short"])
def test_a_stored_table_damaged_later_is_measured_again(damage, model_dir, ids_file, tmp_path, capsys):
    """A finished measurement whose table was cut short afterwards (a truncated copy of a cache),
    or lost a column (rewritten by other code), is set aside, said, and measured again: the rerun
    gives the tables of an undamaged one. Both the run's table and each prompt's are damaged."""
    out = tmp_path / "o"
    assert _measure(out, model_dir, prompts=ids_file) == 0
    clean = (out / "summary.csv").read_text()
    tables = sorted((out / "store").rglob("depthwise.parquet"))
    assert len(tables) == 2  # the run's and its finished prompts' (written as one batch)
    for table in tables:
        if damage == "cut short":
            table.write_bytes(table.read_bytes()[:20])
        else:
            pd.read_parquet(table).drop(columns=["m"]).to_parquet(table)
    capsys.readouterr()
    assert _measure(out, model_dir, prompts=ids_file) == 0
    err = capsys.readouterr().err
    assert "cannot be read" in err and "will recompute what it held" in err, err
    assert damage == "cut short" or "the depthwise table read back has no column m" in err, err
    assert (out / "summary.csv").read_text() == clean
    assert list((out / "store").rglob("provenance.json.corrupt-*"))
    assert damage == "cut short" or list((out / "store").rglob("done.json.corrupt-*"))  # prompts too
