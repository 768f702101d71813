"""files.py: the cache directory, atomic writes (also under SIGKILL) and the inter-process lock."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
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
        r"\(`pip install -e \.`\), or set \$COUPLING_DATA to a copy of the repository's data/ folder "
        r"\(the lab kit has one beside its notebooks: run a kit notebook from the unzipped kit's folder, "
        r"whose first cell sets it\)\.$"
    )
    with pytest.raises(FileNotFoundError, match=message):
        files.data_dir()


# --------------------------------------------------------------------------- read_json
CLOCK_SLACK_S = 2  # a virtual machine's clock may be stepped back by a second between two readings


def _stamp_time(aside: Path, name: str) -> float:
    """The UTC time in a moved-aside file's name ``<name>.corrupt-<YYYYmmddTHHMMSSZ>``, as a timestamp."""
    assert re.fullmatch(rf"{re.escape(name)}\.corrupt-\d{{8}}T\d{{6}}Z", aside.name), aside.name
    stamp = aside.name.rsplit("-", 1)[1]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()


def test_read_json_reads_a_record_and_gives_none_for_a_missing_one(tmp_path):
    assert files.read_json(tmp_path / "none.json") is None
    files.atomic_write_text(tmp_path / "r.json", json.dumps({"prompt": "Größe ≈ 0.9", "k": [1, 2]}))
    assert files.read_json(tmp_path / "r.json") == {"prompt": "Größe ≈ 0.9", "k": [1, 2]}
    assert files.read_json(str(tmp_path / "r.json"), "marker") == {"prompt": "Größe ≈ 0.9", "k": [1, 2]}


READ_UNDER_LOCALE = """
import json, locale, sys
from coupling_utils.files import read_json
print(locale.getpreferredencoding(False), json.dumps(read_json(sys.argv[1])))
"""


def test_read_json_reads_utf8_records_under_an_ascii_locale(tmp_path):
    """A job started with LANG unset (the C locale, no UTF-8 mode) reads the non-ASCII records it wrote."""
    record = tmp_path / "r.json"
    files.atomic_write_text(record, json.dumps({"text": "Größe ≈ 0.9"}, ensure_ascii=False))
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    run = subprocess.run(
        [sys.executable, "-c", READ_UNDER_LOCALE, str(record)], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    encoding, got = run.stdout.split(" ", 1)
    assert encoding.lower() != "utf-8"  # the fault is really there
    assert json.loads(got) == {"text": "Größe ≈ 0.9"} and run.stderr == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # not taken for corrupt


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"half a rec', "Unterminated string"),
        ('{"text": "Größe"}'.encode("latin-1"), "can't decode byte"),
        (b'[{"job_id": "42"}]', "a JSON list, not an object"),  # valid JSON, not a record
        (b"null", "a JSON NoneType, not an object"),
    ],
    ids=["truncated", "not-utf8", "a-list", "null"],
)
def test_a_corrupt_record_is_moved_aside_and_named_with_the_problem(tmp_path, capsys, content, problem):
    """The warning names the file, the problem and what happens; the bytes are kept for a post-mortem."""
    bad = tmp_path / "state.json"
    bad.write_bytes(content)
    before = int(time.time())
    assert files.read_json(bad) is None
    after = time.time()
    assert not bad.exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name != "state.json"]
    assert aside.read_bytes() == content
    assert before - CLOCK_SLACK_S <= _stamp_time(aside, "state.json") <= after + CLOCK_SLACK_S
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.fullmatch(
        rf"warning: the record {re.escape(str(bad))} is corrupt \(.*{problem}.*\); moved it to "
        rf"{re.escape(aside.name)} and will recompute what it held\.\n",
        captured.err,
    ), captured.err
    assert files.read_json(bad) is None and capsys.readouterr().err == ""  # said once, not at every run


def test_a_corrupt_record_is_stamped_with_utc_time_whatever_the_time_zone(tmp_path, monkeypatch):
    bad = tmp_path / "runs.json"
    bad.write_text("{")
    with monkeypatch.context() as m:
        m.setenv("TZ", "NPT-05:45")  # Nepal: 5 h 45 min ahead of UTC, no tz database needed
        time.tzset()
        try:
            before = int(time.time())
            files.read_json(bad)
            after = time.time()
        finally:
            m.undo()
            time.tzset()
    (aside,) = list(tmp_path.iterdir())
    assert before - CLOCK_SLACK_S <= _stamp_time(aside, "runs.json") <= after + CLOCK_SLACK_S


def test_the_corrupt_record_warning_is_written_at_once_to_a_buffered_stderr(tmp_path, monkeypatch):
    """Where stderr is block-buffered (a log file, a notebook kernel), the warning is out before the
    recomputation it announces, not after it."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    (tmp_path / "done.json").write_text("{")
    assert files.read_json(tmp_path / "done.json") is None
    assert b"warning: the record " in raw.getvalue() and b"done.json is corrupt" in raw.getvalue()


def test_a_corrupt_record_in_a_read_only_place_is_ignored_and_said_so(tmp_path, monkeypatch, capsys):
    """A folder one may not write (another user's cache): the record stays, and is not used.

    The refusal is injected: the tests may run as root, whom no folder refuses."""
    bad = tmp_path / "done.json"
    bad.write_text("{")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(os, "replace", refuse)
    assert files.read_json(bad, "marker") is None
    monkeypatch.undo()
    assert bad.read_text() == "{" and sorted(p.name for p in tmp_path.iterdir()) == ["done.json"]
    assert re.fullmatch(
        rf"warning: the marker {re.escape(str(bad))} is corrupt \(.+\); could not move it aside "
        r"\(Permission denied\); it is ignored and will recompute what it held\.\n",
        capsys.readouterr().err,
    )


# --------------------------------------------------------------------------- the umask
@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mask", [0o002, 0o027, 0o077])
def test_umask_is_the_process_s_and_is_left_as_it_was(mask):
    with _umask(mask):
        assert files.umask() == mask
        assert _current_umask() == mask


def test_umask_on_linux_is_read_without_being_set(monkeypatch):
    """Reading it from /proc leaves it unchanged throughout, so a thread creating a file meanwhile
    gets the right mode (setting and restoring it leaves a moment with another one)."""
    status = Path("/proc/self/status")
    if not status.exists() or "Umask:" not in status.read_text():
        pytest.skip("no umask in /proc/self/status (not Linux, or Linux before 4.7)")

    def no_set(mask):
        raise AssertionError("umask() set the process's umask")

    with _umask(0o027), monkeypatch.context() as m:
        m.setattr(os, "umask", no_set)
        got = files.umask()
    assert got == 0o027


@pytest.mark.parametrize(
    "fault",
    [
        FileNotFoundError(2, "No such file or directory"),  # no /proc (macOS)
        PermissionError(13, "Permission denied"),  # a sandbox hides it
        UnicodeDecodeError("ascii", b"\xc3", 0, 1, "ordinal not in range(128)"),  # a non-ASCII name, C locale
    ],
    ids=["missing", "refused", "undecodable"],
)
def test_umask_without_a_readable_proc_is_still_the_process_s(monkeypatch, fault):
    read_text = Path.read_text

    def unreadable_proc(self, *args, **kwargs):
        if str(self) == "/proc/self/status":
            raise fault
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", unreadable_proc)
    with _umask(0o027):
        assert files.umask() == 0o027
        assert _current_umask() == 0o027


@pytest.mark.parametrize("mask", [0o002, 0o077])
def test_written_files_and_folders_get_the_modes_open_and_mkdir_give(tmp_path, mask):
    """0664/0775 under a group-shared umask (002), 0600/0700 under a private one (077)."""
    with _umask(mask):
        files.atomic_write_text(tmp_path / "f.txt", "x")
        with files.atomic_dir(tmp_path / "d") as tmp:
            (tmp / "inside").write_text("y")
        (tmp_path / "plain.txt").write_text("x")
        (tmp_path / "plain").mkdir()
    assert (tmp_path / "f.txt").stat().st_mode & 0o7777 == 0o666 & ~mask
    assert (tmp_path / "d").stat().st_mode & 0o7777 == 0o777 & ~mask
    assert (tmp_path / "f.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode
    assert (tmp_path / "d").stat().st_mode == (tmp_path / "plain").stat().st_mode


@pytest.mark.parametrize("mask", [0o002, 0o022])
def test_what_is_written_inside_an_atomic_dir_follows_the_umask(tmp_path, mask):
    """A file a library made 0600 (mkstemp, as save_pretrained's weights) and a folder made 0700
    (mkdtemp) end with the modes the umask gives once the folder is moved into place."""
    import tempfile

    with _umask(mask):
        with files.atomic_dir(tmp_path / "d") as tmp:
            fd, weights = tempfile.mkstemp(dir=tmp)
            os.close(fd)
            sub = Path(tempfile.mkdtemp(dir=tmp))
            (sub / "config.json").write_text("{}")
        done = tmp_path / "d"
        modes = {p.relative_to(done).as_posix(): p.stat().st_mode & 0o7777 for p in done.rglob("*")}
    assert modes == {
        Path(weights).name: 0o666 & ~mask,
        sub.name: 0o777 & ~mask,
        f"{sub.name}/config.json": 0o666 & ~mask,
    }


def test_a_lock_file_one_cannot_open_counts_as_not_locked(tmp_path, monkeypatch):
    """Another user's lock in a shared cache (mode 0600): `zoo list` says the entry is not being
    built rather than failing, or saying so for ever. The refusal is injected (root opens anything)."""
    lock = tmp_path / ".lock"
    lock.write_text("")

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files, "open", refuse, raising=False)
    assert files.is_locked(lock) is False


def test_follow_umask_gives_a_tree_the_modes_open_and_mkdir_would(tmp_path):
    """Files 0666 (0777 if executable) and folders 0777, less the umask; a link and its target alone."""
    with _umask(0o027):
        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        for name, mode in (("weights", 0o600), ("sub/tool", 0o700), ("sub/open", 0o666)):
            (tree / name).write_text(name)
            os.chmod(tree / name, mode)
        os.chmod(tree / "sub", 0o700)
        outside = tmp_path / "outside"
        outside.write_text("not part of the tree")
        os.chmod(outside, 0o600)
        (tree / "link").symlink_to(outside)
        files.follow_umask(tree)
    modes = {p.relative_to(tree).as_posix(): p.lstat().st_mode & 0o7777 for p in [tree, *tree.rglob("*")]}
    del modes["link"]
    assert modes == {".": 0o750, "sub": 0o750, "weights": 0o640, "sub/tool": 0o750, "sub/open": 0o640}
    assert outside.stat().st_mode & 0o7777 == 0o600
    shared = tmp_path / "shared"  # a group's umask leaves every bit but others' write
    shared.mkdir()
    (shared / "weights").write_text("w")
    os.chmod(shared / "weights", 0o600)
    with _umask(0o002):
        files.follow_umask(shared)
    assert (shared / "weights").stat().st_mode & 0o7777 == 0o664 and shared.stat().st_mode & 0o7777 == 0o775


def test_a_cache_with_a_file_in_its_place_names_the_variable_and_the_fix(tmp_path, monkeypatch):
    """COUPLING_CACHE (or a folder under it) that is a file: a CacheError (an OSError, so code that
    copes with an unwritable cache still does) naming the variable, the file and the fix."""
    from coupling_utils.files import CacheError, cache_dir

    (tmp_path / "f").write_text("")
    for given, parts in (
        (tmp_path / "f", ()),
        (tmp_path / "f", ("zoo",)),
        (tmp_path / "f" / "c", ("x", "y")),
    ):
        monkeypatch.setenv("COUPLING_CACHE", str(given))
        with pytest.raises(CacheError) as raised:
            cache_dir(*parts)
        assert str(raised.value) == (
            f"$COUPLING_CACHE='{given}': {tmp_path / 'f'} is a file, not a folder, so nothing can be "
            "cached there; point COUPLING_CACHE at a folder (it is created if missing), or move the file away"
        )
        assert isinstance(raised.value, OSError)
    monkeypatch.delenv("COUPLING_CACHE")
    monkeypatch.setattr("platformdirs.user_cache_dir", lambda name: str(tmp_path / "f"))
    with pytest.raises(CacheError, match=r"^the cache folder .*/f \(set \$COUPLING_CACHE to move it\): "):
        cache_dir("zoo")
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "ok"))
    assert cache_dir("a", "b") == tmp_path / "ok" / "a" / "b" and (tmp_path / "ok" / "a" / "b").is_dir()


@pytest.mark.parametrize("mask", [0o002, 0o077])
def test_an_atomic_dir_can_be_entered_and_written_while_it_is_filled(tmp_path, mask):
    """The temporary folder has mkdir's mode from the start (searchable, writable by its owner),
    not mkdtemp's 0700 or a file's mode: a user who is not root can write into it, and a group that
    shares the cache can enter it. Checked by its mode, since root (the tests' user) passes any."""
    with _umask(mask), files.atomic_dir(tmp_path / "d") as tmp:
        assert tmp.stat().st_mode & 0o7777 == 0o777 & ~mask
        (tmp / "config.json").write_text("{}")


def _broken_link_cache(tmp_path, monkeypatch) -> Path:
    """COUPLING_CACHE set to a symbolic link to a folder that is gone (as on an unmounted disk)."""
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "unmounted" / "cache")
    monkeypatch.setenv("COUPLING_CACHE", str(link))
    return link


def test_a_cache_that_is_a_broken_link_names_the_link(tmp_path, monkeypatch):
    """A broken link in the cache's place: a CacheError (not a bare FileExistsError) naming the
    variable, the link and the fix."""
    link = _broken_link_cache(tmp_path, monkeypatch)
    with pytest.raises(files.CacheError) as raised:
        files.cache_dir()
    assert str(raised.value).startswith(f"$COUPLING_CACHE='{link}': {link} is ")
    assert "point COUPLING_CACHE at a folder" in str(raised.value)


def test_a_cache_subfolder_behind_a_broken_link_names_the_link(tmp_path, monkeypatch):
    link = _broken_link_cache(tmp_path, monkeypatch)
    with pytest.raises(files.CacheError) as raised:
        files.cache_dir("zoo")
    assert str(raised.value).startswith(f"$COUPLING_CACHE='{link}': {link} is a link to ")
    assert "which does not exist" in str(raised.value)


def test_a_cache_that_is_a_link_to_a_file_is_named_a_file(tmp_path, monkeypatch):
    """A link whose target exists but is a file: the file message, not the broken-link one."""
    target = tmp_path / "notes.txt"
    target.write_text("not a folder\n", encoding="utf-8")
    link = tmp_path / "cache"
    link.symlink_to(target)
    monkeypatch.setenv("COUPLING_CACHE", str(link))
    with pytest.raises(files.CacheError) as raised:
        files.cache_dir("zoo")
    assert str(raised.value).startswith(f"$COUPLING_CACHE='{link}': {link} is a file, not a folder")


def test_a_read_only_cache_names_the_folder_and_the_fix(tmp_path, monkeypatch):
    """A subfolder that cannot be created (a read-only cache; staged by mkdir's refusal, since the
    tests run as root, whom no mode stops): a CacheError naming the variable, the folder and both
    fixes, not a bare PermissionError."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if self.name == "f03":
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(files.CacheError) as raised:
        files.cache_dir("f03")
    message = str(raised.value)
    assert message.startswith(f"$COUPLING_CACHE='{tmp_path / 'cache'}': {tmp_path / 'cache' / 'f03'} cannot ")
    assert "Permission denied" in message and "chmod -R u+w" in message and "point COUPLING_CACHE" in message
    assert isinstance(raised.value.__cause__, PermissionError)


def test_yaml_problem_names_the_place_and_the_problem():
    """A YAML error's place (1-based line and column) and problem, for the message that names the
    file; a decoding error has no place and gives its first line."""
    import yaml

    from coupling_utils.files import yaml_problem

    with pytest.raises(yaml.YAMLError) as bad:
        yaml.safe_load("a: 1\nb: [2, 3\nc: 4\n")
    where, what = yaml_problem(bad.value)
    mark = bad.value.problem_mark
    assert where == f" at line {mark.line + 1}, column {mark.column + 1}" and mark.line >= 1
    assert what == bad.value.problem and what
    undecodable = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert yaml_problem(undecodable) == ("", str(undecodable).splitlines()[0])
    placeless = yaml.YAMLError("first line\nsecond line")
    assert yaml_problem(placeless) == ("", "first line")


def test_the_error_chain_follows_causes_and_what_was_being_handled_and_a_missing_folder_has_room():
    try:
        try:
            raise KeyError("first")
        except KeyError:
            raise ValueError("while handling it")  # noqa: B904 (the context, not a cause)
    except ValueError as exc:
        handled = exc
    assert [type(e) for e in files.error_chain(handled)] == [ValueError, KeyError]
    caused = RuntimeError("outer")
    caused.__cause__ = handled
    assert [type(e) for e in files.error_chain(caused)] == [RuntimeError, ValueError, KeyError]
    assert files.error_chain(None) == []
    assert files._room(Path("/no/such/folder/here")) == float("inf")  # unknown: never counted as full
