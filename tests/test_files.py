"""files.py: the cache directory, atomic writes (also under SIGKILL) and the inter-process lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from coupling_utils import files

# Only a guard against hangs, far above what any step needs on a busy machine.
HANG_S = 600


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(files.ENV_VAR, str(tmp_path / "c"))
    assert files.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    sub = files.cache_dir("zoo", "x")
    assert sub == tmp_path / "c" / "zoo" / "x" and sub.is_dir()
    assert files.cache_dir("zoo", "x") == sub  # an existing folder is fine
    monkeypatch.delenv(files.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert files.cache_dir() == tmp_path / "xdg" / "coupling-book"


def test_atomic_path_writes_beside_and_renames_on_success(tmp_path):
    target = tmp_path / "sub" / "table.txt"
    with files.atomic_path(target) as tmp:
        assert tmp != target and tmp.parent == target.parent and tmp.name.startswith(".table.txt.")
        assert not target.exists()
        tmp.write_text("new")
    assert target.read_text() == "new" and _leftovers(target.parent) == []
    files.atomic_write_text(target, "again")
    assert target.read_text() == "again" and _leftovers(target.parent) == []


def test_atomic_path_leaves_the_old_file_on_failure(tmp_path):
    target = tmp_path / "table.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half"), files.atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("half written")
    assert target.read_text() == "old" and _leftovers(tmp_path) == []
    fresh = tmp_path / "fresh.txt"
    with pytest.raises(RuntimeError), files.atomic_path(fresh) as tmp:
        tmp.write_text("x")
        raise RuntimeError
    assert not fresh.exists() and _leftovers(tmp_path) == []


def test_atomic_parquet_and_text(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=[7, 9])
    files.atomic_write_parquet(df, tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(back, df.reset_index(drop=True))  # the index is not stored
    assert _leftovers(tmp_path) == []
    files.atomic_write_text(tmp_path / "t.txt", "coupling ≈ 0.9, ρ")
    assert (tmp_path / "t.txt").read_bytes() == "coupling ≈ 0.9, ρ".encode()


def test_atomic_dir_replaces_whole_directories_only_on_success(tmp_path):
    target = tmp_path / "model"
    with files.atomic_dir(target) as tmp:
        assert tmp != target and tmp.parent == tmp_path and not target.exists()
        (tmp / "w.bin").write_text("v1")
    assert (target / "w.bin").read_text() == "v1" and _leftovers(tmp_path) == []
    with pytest.raises(RuntimeError), files.atomic_dir(target) as tmp:
        (tmp / "w.bin").write_text("v2-half")
        raise RuntimeError
    assert (target / "w.bin").read_text() == "v1" and _leftovers(tmp_path) == []
    with files.atomic_dir(target) as tmp:
        (tmp / "other.bin").write_text("v3")
    assert sorted(p.name for p in target.iterdir()) == ["other.bin"] and _leftovers(tmp_path) == []


KILLED_MID_WRITE = """
import os, signal, sys
from coupling_utils.files import atomic_dir, atomic_path
target, kind = sys.argv[1], sys.argv[2]
if kind == "file":
    with atomic_path(target) as tmp:
        with open(tmp, "w") as fh:
            fh.write("half of the new")
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
else:
    with atomic_dir(target) as tmp:
        (tmp / "w.bin").write_text("half of the new")
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_sigkill_mid_write_leaves_the_old_version(tmp_path, kind):
    """A process killed while writing leaves the previous version intact (a hidden temp at most)."""
    target = tmp_path / "t"
    if kind == "file":
        target.write_text("old")
    else:
        target.mkdir()
        (target / "w.bin").write_text("old")
    run = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(target), kind], capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    assert (target.read_text() if kind == "file" else (target / "w.bin").read_text()) == "old"
    assert all(name.startswith(".t.") and name.endswith(".tmp") for name in _leftovers(tmp_path))


HOLD_LOCK = """
import sys, time
from pathlib import Path
from coupling_utils.files import file_lock
lock, flag, release = sys.argv[1:4]
with file_lock(lock, "held"):
    Path(flag).write_text("locked")
    while not Path(release).exists():
        time.sleep(0.01)
"""


def test_file_lock_is_exclusive_across_processes(tmp_path, capsys):
    lock, flag, release = tmp_path / "e" / ".lock", tmp_path / "locked", tmp_path / "release"
    assert not files.is_locked(lock)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), str(flag), str(release)])
    try:
        while not flag.exists():
            assert holder.poll() is None, "the lock holder died"
            threading.Event().wait(0.01)
        assert files.is_locked(lock)
        got = threading.Event()

        def take():
            with files.file_lock(lock, "embedded:x"):
                got.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        # Once the waiter says it waits, it has tried the lock and been refused: the check
        # below then holds however slow the machine is (a fixed 0.5 s wait proved nothing
        # when the thread had not yet reached the lock). The deadline only guards a hang.
        said, deadline = "", time.monotonic() + HANG_S
        while "another process is working on it; waiting" not in said:
            assert waiter.is_alive() and not got.is_set(), "the lock was taken while another process held it"
            assert time.monotonic() < deadline, (
                f"the waiter did not reach the lock within {HANG_S} s: the machine is very slow or it hangs"
            )
            said += capsys.readouterr().out
            threading.Event().wait(0.01)
        assert not got.is_set(), "the lock was taken while another process held it"
        release.write_text("")
        waiter.join(HANG_S)
        assert got.is_set(), f"the lock was not taken within {HANG_S} s of its release"
        assert holder.wait(HANG_S) == 0
    finally:
        release.write_text("")
        holder.wait(HANG_S)
    assert "embedded:x: another process is working on it; waiting" in said
    assert not files.is_locked(lock)
    assert not files.is_locked(tmp_path / "never-created")


def test_file_lock_is_released_on_error(tmp_path):
    lock = tmp_path / ".lock"
    with files.file_lock(lock):
        assert files.is_locked(lock)  # flock: another descriptor, even in this process, is refused
    with pytest.raises(KeyError), files.file_lock(lock):
        raise KeyError
    assert not files.is_locked(lock) and os.path.exists(lock)


# --------------------------------------------------------------------------- data_dir
def test_data_dir_is_the_repository_s_data_folder_by_default(monkeypatch):
    monkeypatch.delenv(files.DATA_ENV_VAR, raising=False)
    path = files.data_dir()
    assert path.name == "data" and (path / "model_aliases.csv").is_file()
    assert (path.parent / "coupling_utils" / "files.py").is_file()  # beside the package


def test_data_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(files.DATA_ENV_VAR, str(tmp_path))
    assert files.data_dir() == tmp_path
    monkeypatch.setenv(files.DATA_ENV_VAR, str(tmp_path / "missing"))
    message = (
        r"^\$COUPLING_DATA='.*missing' is not a directory\. Point it at a copy of the "
        r"repository's data/ folder, or unset it to use the repository's own\.$"
    )
    with pytest.raises(FileNotFoundError, match=message):
        files.data_dir()


def test_data_dir_says_how_to_fix_a_package_installed_without_its_data(monkeypatch, tmp_path):
    monkeypatch.delenv(files.DATA_ENV_VAR, raising=False)
    monkeypatch.setattr(files, "__file__", str(tmp_path / "site-packages" / "coupling_utils" / "files.py"))
    message = (
        r"^The project's data folder was not found at .*site-packages/data\. coupling_utils reads "
        r"its data from the repository checkout: install it editable from the repository "
        r"\(`pip install -e \.`\), or set \$COUPLING_DATA to a copy of the repository's data/ folder\.$"
    )
    with pytest.raises(FileNotFoundError, match=message):
        files.data_dir()
