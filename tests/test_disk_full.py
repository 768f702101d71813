"""A full disk or quota (ENOSPC, EDQUOT) at any write: exit 1 with one paragraph naming the folder,
what was kept and the fix; nothing half-written left behind; no traceback, no "likely a bug", no
traceback log. The writes fail here by an injected ``OSError(errno.ENOSPC, ...)``; the real probes
on a small tmpfs are in the report of this work."""

from __future__ import annotations

import errno
import json
import os
import pickle
import types
from pathlib import Path

import pytest

from coupling_utils import files
from coupling_utils.files import DiskFull
from coupling_utils.pipeline import book, execution, jupyter_book_child
from coupling_utils.pipeline.cli import main

FULL = os.strerror(errno.ENOSPC)  # "No space left on device"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith("."))


def _full(*_a, **_k):
    raise OSError(errno.ENOSPC, FULL)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_write_that_finds_no_room_names_the_folder_and_keeps_the_old_file(tmp_path, monkeypatch, code):
    """In the middle of a write (was: a bare OSError, naming nothing): the old file kept, no temporary
    file left, the folder and the fix named; a quota is called one."""
    target = tmp_path / "t" / "table.txt"
    files.atomic_write_text(target, "old")
    with pytest.raises(DiskFull) as raised, files.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(code, os.strerror(code))
    said = str(raised.value)
    assert raised.value.errno == code and raised.value.folder == target.parent
    assert f"while writing in {target.parent};" in said and f"df -h {target.parent}" in said
    assert ("quota" in said) == (code == errno.EDQUOT) and "COUPLING_CACHE" not in said
    assert said.endswith(
        "or give the output option (--out, --output-dir or --work) a folder on a disk with room"
    )
    assert target.read_text() == "old" and _leftovers(tmp_path) == []
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))  # in the cache: move the cache
    assert str(raised.value).endswith("or point $COUPLING_CACHE at a folder on a disk with room")
    both = str(DiskFull(tmp_path / "runs", code, tmp_path.parent))
    assert both.endswith(
        ", or the output option (--out, --output-dir or --work), at a folder on a disk with room"
    )


def test_a_rename_that_finds_no_room_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "replace", _full)
    with pytest.raises(DiskFull, match="the disk is full"):
        files.atomic_write_text(tmp_path / "t.txt", "x")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_built_in_a_temporary_folder_names_the_place_it_goes(tmp_path):
    """A write inside :func:`files.atomic_dir` fills the disk: the error names the folder that stays
    (the temporary one is removed), not the temporary one."""
    with pytest.raises(DiskFull) as raised, files.atomic_dir(tmp_path / "model") as tmp:
        files.atomic_write_text(tmp / "config.json", "{}")
        with files.atomic_path(tmp / "weights.bin") as part:  # noqa: SIM117 (one inside the other)
            part.write_bytes(b"w")
            raise OSError(errno.ENOSPC, FULL)
    assert raised.value.folder == tmp_path and list(tmp_path.iterdir()) == []


def test_a_short_write_that_says_no_errno_counts_as_full_only_without_room(tmp_path, monkeypatch):
    """numpy's "N requested and M written" (no errno) when the disk has no room left: a DiskFull
    (was: "OSError: 1635797 requested and 1001440 written", seen on a full tmpfs); with room, the
    error is left as it is."""
    frsize = os.statvfs(tmp_path).f_frsize
    for room, full in [(0, True), (1 << 30, False)]:
        free = types.SimpleNamespace(f_bavail=room // frsize, f_frsize=frsize)
        monkeypatch.setattr(files.os, "statvfs", lambda p, free=free: free)
        short = OSError("1635797 requested and 1001440 written")
        with pytest.raises(OSError) as raised, files.atomic_dir(tmp_path / "corpus") as tmp:
            (tmp / "train_ids.npy").write_bytes(b"x")
            raise short
        assert isinstance(raised.value, DiskFull) == full and (raised.value is short) != full
        assert list(tmp_path.iterdir()) == []


def test_a_cache_folder_that_cannot_be_made_on_a_full_disk_names_where(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "mkdir", _full)
    with pytest.raises(DiskFull) as raised:
        files.cache_dir("zoo")
    assert raised.value.folder == tmp_path and raised.value.errno == errno.ENOSPC

    def over_quota(*_a, **_k):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(Path, "mkdir", over_quota)
    with pytest.raises(DiskFull) as raised:
        files.cache_dir("zoo")
    assert raised.value.errno == errno.EDQUOT  # the quota is named as such


def test_no_room_is_found_in_a_chain_and_in_a_library_s_text(tmp_path):
    """The error in a chain (a BuildFailed raised from it) or in a Rust library's text (safetensors);
    a notebook's DiskFull message gives back its folders and errno."""
    try:
        try:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        except OSError as exc:
            raise RuntimeError("could not be built") from exc
    except RuntimeError as exc:
        assert files.no_room(exc) is exc.__cause__ and files.no_room_code(exc.__cause__) == errno.EDQUOT
    rust = RuntimeError(f'Error while serializing: IoError(Os {{ code: 28, message: "{FULL}" }})')
    assert files.no_room(rust) is rust and files.no_room(RuntimeError("other")) is None
    said = DiskFull.said(
        f"NotMeasured: ... (DiskFull: {DiskFull(tmp_path / 'a', errno.EDQUOT, tmp_path / 'b')})"
    )
    assert said.folders == [tmp_path / "a", tmp_path / "b"] and said.errno == errno.EDQUOT
    assert DiskFull.said("ValueError: while writing in x; the files being written") is None
    again = pickle.loads(pickle.dumps(said))  # it crosses processes (a sweep's local jobs)
    assert str(again) == str(said) and again.folders == said.folders


def _one_paragraph(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: the disk is full (No space left on device)"), err
    assert "Traceback" not in err and "bug" not in err and "Check that this path" not in err, err
    return err


def test_kit_on_a_full_disk_is_one_paragraph_without_a_log(tmp_path, monkeypatch, capsys):
    """A write that says neither where nor what (a bare ENOSPC, e.g. from a library): the output
    folder (--out) and the cache are named; no traceback log is written into the full disk (was: "an
    unexpected error ... This is likely a bug", an empty log left in <cache>/logs)."""
    from coupling_utils.pipeline import kit

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kit, "build_kit", _full)
    assert main(["kit", "--out", str(tmp_path / "k" / "kit.zip")]) == 1
    err = _one_paragraph(capsys.readouterr().err)
    assert f"while writing in {tmp_path / 'k'} or {tmp_path / 'cache'};" in err
    assert "The kit was not replaced: the previous one, if any, is kept as it was" in err
    assert not (tmp_path / "cache" / "logs").exists() or not list((tmp_path / "cache" / "logs").iterdir())
    with pytest.raises(OSError):  # --debug: Python's traceback
        main(["--debug", "kit", "--out", str(tmp_path / "k" / "kit.zip")])


def test_the_traceback_log_on_a_full_disk_is_not_left_half_written(tmp_path, monkeypatch, capsys):
    """An unexpected error whose log cannot be written (the cache's disk is full): no empty or cut
    log is left, and the message says --debug once (was: an empty log file, "rerun with --debug to
    see the traceback (or rerun with --debug ...)")."""
    from coupling_utils.pipeline import kit

    def bug(*_a, **_k):
        raise ValueError("a bug")

    write_text = Path.write_text

    def half(self, text, *a, **k):
        write_text(self, text[:5], *a, **k)
        raise OSError(errno.ENOSPC, FULL)

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kit, "build_kit", bug)
    monkeypatch.setattr(Path, "write_text", half)
    assert main(["kit", "--out", str(tmp_path / "kit.zip")]) == 1
    err = capsys.readouterr().err
    assert "This is likely a bug" in err and err.count("--debug") == 1, err
    assert list((tmp_path / "cache" / "logs").iterdir()) == []
    monkeypatch.setattr(Path, "write_text", write_text)
    assert main(["kit", "--out", str(tmp_path / "kit.zip")]) == 1
    (log,) = (tmp_path / "cache" / "logs").iterdir()
    assert f"the traceback is in {log}" in capsys.readouterr().err and "ValueError: a bug" in log.read_text()


def _run(tmp_path, monkeypatch, papermill) -> Path:
    """`run f00 --profile smoke` into tmp_path/runs, whose previous notebook is "previous", with
    ``papermill`` standing in for the kernel."""
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(execution, "_papermill", papermill)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "f00_coupling_metric.ipynb").write_text("previous")
    return runs


def test_a_notebook_that_cannot_be_written_stops_the_run_and_keeps_the_previous_one(
    tmp_path, monkeypatch, capsys
):
    """papermill saving the executed notebook on a full disk (seen on a tmpfs: an OSError from its
    write, the notebook cut short): exit 1 naming --output-dir; the cut notebook removed, the
    previous one intact (was: "0 ok, 1 failed" and a truncated .failed.ipynb)."""

    def papermill(source, running, values, kernel, root):
        running.write_text('{"cells": [')
        raise OSError(errno.ENOSPC, FULL)

    runs = _run(tmp_path, monkeypatch, papermill)
    assert main(["run", "f00", "--profile", "smoke", "--output-dir", str(runs)]) == 1
    err = _one_paragraph(capsys.readouterr().err)
    assert f"while writing in {runs};" in err and "What was finished is stored" in err
    assert sorted(p.name for p in runs.iterdir()) == ["f00_coupling_metric.ipynb"]
    assert (runs / "f00_coupling_metric.ipynb").read_text() == "previous"


def test_a_kernel_that_fills_the_disk_names_the_folder_it_said(tmp_path, monkeypatch, capsys):
    """The notebook's own DiskFull (building a model into the cache): the paragraph names the folder
    the kernel named; the failed notebook, written whole, is kept for its traceback."""
    where = tmp_path / "cache" / "zoo" / "pythia-smoke"

    class CellError(Exception):
        ename, evalue = "DiskFull", str(DiskFull(where))

    def papermill(source, running, values, kernel, root):
        running.write_text(json.dumps({"cells": []}))
        raise CellError(f"DiskFull: {CellError.evalue}")

    runs = _run(tmp_path, monkeypatch, papermill)
    assert main(["run", "f00", "--profile", "smoke", "--output-dir", str(runs)]) == 1
    err = _one_paragraph(capsys.readouterr().err)
    assert f"while writing in {where};" in err
    assert json.loads((runs / "f00_coupling_metric.failed.ipynb").read_text()) == {"cells": []}
    assert not [p for p in runs.iterdir() if p.name.startswith(".")]


def test_a_source_that_cannot_be_staged_leaves_nothing(tmp_path, monkeypatch, capsys):
    """The notebook's own copy (.source.ipynb) cannot be written: removed, the folder named (was:
    an empty .f00_coupling_metric.source.ipynb left behind, "likely a bug")."""
    import jupytext

    def cut(nb, path, *a, **k):
        Path(path).write_text("{")
        raise OSError(errno.ENOSPC, FULL)

    runs = _run(tmp_path, monkeypatch, None)
    monkeypatch.setattr(jupytext, "write", cut)
    assert main(["run", "f00", "--profile", "smoke", "--output-dir", str(runs)]) == 1
    assert f"while writing in {runs};" in _one_paragraph(capsys.readouterr().err)
    assert sorted(p.name for p in runs.iterdir()) == ["f00_coupling_metric.ipynb"]


def test_jupyter_book_that_finds_no_room_is_a_full_disk_and_the_staging_goes(tmp_path, monkeypatch):
    """Jupyter Book's child saying no room (its status, see :func:`jupyter_book_child.jupyter_book_main`): a
    DiskFull naming the work folder, the staging removed, the previous book as it was."""
    import subprocess

    monkeypatch.setattr(
        book, "stage_book", lambda root, executed, src, options: (src / "x").mkdir(parents=True)
    )
    monkeypatch.setattr(book, "report_plan", lambda plan: None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, errno.ENOSPC))
    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "index.html").write_text("previous")
    options = book.BuildOptions(work=tmp_path / "w")
    with pytest.raises(DiskFull) as raised:
        book.build_book(tmp_path / "repo", tmp_path / "runs", tmp_path / "html", options)
    assert raised.value.folder == tmp_path / "w" and list((tmp_path / "w").iterdir()) == []
    assert (tmp_path / "html" / "index.html").read_text() == "previous"


def _jb_main(monkeypatch, capsys, main_):
    """:func:`jupyter_book_child.jupyter_book_main` with Jupyter Book's ``main`` replaced: its
    status, stdout and stderr."""
    from jupyter_book.cli import main as jb

    monkeypatch.setattr(jb, "main", main_)
    status = jupyter_book_child.jupyter_book_main()
    out, err = capsys.readouterr()
    return status, out, err


def test_jupyter_book_s_output_line_names_the_final_folder(monkeypatch, capsys):
    """Its "Output Path:" line names where the pages end up ($COUPLING_BOOK_SHOWN_OUT), not the
    staging copy (was: ``work/jb/_build/html``); without that folder the line is left out; where a
    release no longer prints through the module's ``click``, its lines are shown as they are."""
    import click
    from jupyter_book.cli import main as jb

    def main_():  # as jupyter_book.cli.main.build prints it
        jb.click.echo(click.style("Output Path: ", bold=True, fg="blue") + "/w/jb/_build/html")
        jb.click.echo("Source Folder: /w/src")
        raise SystemExit(0)

    monkeypatch.setattr(jb, "click", click)
    monkeypatch.setenv(jupyter_book_child.SHOWN_OUT, "/book/html")
    assert _jb_main(monkeypatch, capsys, main_)[:2] == (0, "Output Path: /book/html\nSource Folder: /w/src\n")
    monkeypatch.setattr(jb, "click", click)
    monkeypatch.setenv(jupyter_book_child.SHOWN_OUT, "")
    assert _jb_main(monkeypatch, capsys, main_)[:2] == (0, "Source Folder: /w/src\n")
    monkeypatch.setattr(jb, "click", types.SimpleNamespace())  # a release without the private hook

    def printing():
        print("Output Path: /w/jb/_build/html")
        return 0

    assert _jb_main(monkeypatch, capsys, printing)[:2] == (0, "Output Path: /w/jb/_build/html\n")


def test_jupyter_book_s_no_room_warnings_and_errors_end_it_with_the_errno(monkeypatch, capsys):
    """Sphinx makes a failed copy a warning ("Failed to copy a file ...: OSError(28, 'No space left
    on device')", seen on a tmpfs; --no-strict would build a book without its styles): the child's
    status is ENOSPC, as for a raised one; other runs keep their own status."""
    import sys

    def warned():
        print(f"WARNING: Failed to copy a file: OSError(28, '{FULL}')", file=sys.stderr)
        return 0

    def raised():
        try:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        except OSError as exc:
            raise RuntimeError("There was an error in building your book") from exc

    assert _jb_main(monkeypatch, capsys, warned)[0] == errno.ENOSPC
    status, _, err = _jb_main(monkeypatch, capsys, raised)
    assert status == errno.EDQUOT and "There was an error" in err
    assert _jb_main(monkeypatch, capsys, lambda: 0)[0] == 0
    assert not isinstance(sys.stderr, jupyter_book_child._NoRoomSeen)


def test_the_real_jupyter_book_names_the_final_folder(tmp_path):
    """The installed Jupyter Book on a one-page book, as :func:`book._jupyter_book` runs it: its
    opening lines name the final folder, never the staging copy ``jb/_build/html``."""
    import subprocess
    import sys

    src = tmp_path / "src"
    src.mkdir()
    (src / "_config.yml").write_text('title: t\nexecute:\n  execute_notebooks: "off"\n')
    (src / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (src / "index.md").write_text("# Hello\n\ntext\n")
    cmd = [
        sys.executable,
        "-c",
        jupyter_book_child.JB_MAIN,
        "build",
        str(src),
        "--path-output",
        str(tmp_path / "jb"),
    ]
    env = {**os.environ, jupyter_book_child.SHOWN_OUT: str(tmp_path / "html")}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and (tmp_path / "jb" / "_build" / "html" / "index.html").is_file(), said
    assert f"Output Path: {tmp_path / 'html'}\n" in said and "_build/html" not in said, said


def test_measure_stops_on_a_full_store_and_names_the_cache_not_a_missing_model(tmp_path, monkeypatch, capsys):
    """A job whose measurement cannot be stored (no room) stops measure: one paragraph naming the
    cache, exit 1, no tables written as if the model were missing."""
    from coupling_utils.engine.architectures import tiny_model
    from coupling_utils.measurement import store

    local = tmp_path / "two-blocks"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"a": [1, 5, 9, 3]}))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store, "atomic_write_text", full)
    out = tmp_path / "out"
    assert main(["measure", str(local), "--prompts", str(prompts), "--k", "4", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the disk is full" in err and str(files.cache_root()) in err, err
    assert "likely a bug" not in err and not list(out.glob("*.csv")), err


def test_the_no_room_code_and_the_message_of_each_kind_of_full(tmp_path, monkeypatch):
    """ENOSPC or EDQUOT from an OSError's errno, else from the text (a library's message); the message
    names the quota only for EDQUOT, and the fix by where the folders lie: the cache, an output, both."""
    assert files.no_room_code(OSError(errno.ENOSPC, "x")) == errno.ENOSPC
    assert files.no_room_code(OSError(errno.EDQUOT, "x")) == errno.EDQUOT
    assert files.no_room_code(OSError(errno.EIO, os.strerror(errno.EDQUOT))) == errno.EDQUOT
    assert files.no_room_code(RuntimeError(f"IoError: {os.strerror(errno.EDQUOT)}")) == errno.EDQUOT
    assert files.no_room_code(RuntimeError(f"IoError: {FULL}")) == errno.ENOSPC
    cache, out = tmp_path / "cache", tmp_path / "out"
    monkeypatch.setenv("COUPLING_CACHE", str(cache))
    quota = str(DiskFull(cache / "zoo", errno.EDQUOT))
    assert quota.startswith(
        f"the disk quota is used up ({os.strerror(errno.EDQUOT)}) while writing in {cache / 'zoo'};"
    )
    assert (
        "shows the room left, `quota -s` your quota), or point $COUPLING_CACHE at a folder on a disk" in quota
    )
    other = str(DiskFull(out, errno.EIO))  # an errno not of a full disk (from a library's text)
    assert other.startswith(f"there is no room ({os.strerror(errno.EIO)}) while writing in {out};")
    full = str(DiskFull(out))
    assert full.startswith(
        f"the disk is full ({FULL}) while writing in {out}; the files being written were removed"
    )
    assert "quota" not in full and "give the output option (--out, --output-dir or --work) a folder" in full
    both = str(DiskFull(cache, errno.ENOSPC, out))
    assert (
        f"while writing in {cache} or {out};" in both
        and f"(`df -h {cache} {out}` shows the room left)" in both
    )
    assert "point $COUPLING_CACHE, or the output option (--out, --output-dir or --work), at a folder" in both
