"""``coupling-book`` on bad input and interruptions: a clear error naming the input, the problem and
the fix (exit 2), a failed run's cause shown (exit 1, or 2 when the cause is bad input), Ctrl-C at
any moment (exit 130), and no work started before the input is checked. No kernel starts here:
the notebook runs are stand-ins (``execution._papermill``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coupling_utils.pipeline import cli, execution
from coupling_utils.pipeline.cli import main

ROOT = Path(__file__).resolve().parents[1]
NOT_THERE = (
    "model 'nosuchorg/nosuchmodel' is not a local path and is not in the Hugging Face cache; offline "
    "mode is on (HF_HUB_OFFLINE=1). To get it: run `hf download nosuchorg/nosuchmodel`"
)


class CellError(Exception):
    """What papermill raises for a failing cell: the kernel's ename, evalue and traceback text."""

    def __init__(self, ename: str, evalue: str, traceback: list[str] | None = None):
        super().__init__(evalue)
        self.ename, self.evalue, self.traceback = ename, evalue, traceback or []


def _failing(exc: Exception, calls: list | None = None):
    def papermill(source, running, values, kernel, root):
        if calls is not None:
            calls.append(source)
        running.write_text("{}")
        raise exc

    return papermill


@pytest.mark.parametrize(
    "cause, status",
    [
        (f"ModelNotFoundError: {NOT_THERE}", 2),
        ("ParameterError: parameter 'layer' must be <= 0, got 1000", 2),
        ("RuntimeError: CUDA out of memory", 1),
    ],
)
def test_a_failed_notebook_shows_its_cause(cause, status, tmp_path, monkeypatch, capsys):
    evalue = f"f00_coupling_metric needs the job of its plan:\nmissing model=some/model: {cause}"
    monkeypatch.setattr(execution, "_papermill", _failing(CellError("NotMeasured", evalue)))
    assert main(["run", "f00", "--profile", "smoke", "--output-dir", str(tmp_path)]) == status
    out, err = capsys.readouterr()
    assert cause in out, out
    assert ("bad input" in err) == (status == 2), err
    record = json.loads((tmp_path / "runs.json").read_text())["f00_coupling_metric"]
    assert cause in record["error"] and record["status"] == "failed"
    assert (tmp_path / "f00_coupling_metric.failed.ipynb").exists()


def test_a_long_error_is_cut_and_a_chained_one_names_its_root_cause():
    many = "\n".join(f"missing model=m{i}: ModelNotFoundError: not there" for i in range(40))
    text = execution._cell_error(CellError("NotMeasured", f"needs its plan:\n{many}"), "o/x.failed.ipynb")
    lines = text.splitlines()
    assert len(lines) == execution.ERROR_LINES and "m0: ModelNotFoundError" in lines[1]
    assert lines[-1] == "... and 30 more lines (ModelNotFoundError ×30), in o/x.failed.ipynb"
    assert execution.bad_input_error(text)
    other = many + "\nmissing model=m40: RuntimeError: CUDA out of memory"
    text = execution._cell_error(CellError("NotMeasured", f"needs its plan:\n{other}"))
    assert text.endswith("(ModelNotFoundError ×30, RuntimeError ×1)") and not execution.bad_input_error(text)
    chained = CellError(
        "RuntimeError",
        "loading failed",
        [
            "\x1b[0;31mOSError\x1b[0m: disk quota exceeded",
            "\nThe above exception was the direct cause of the following exception:\n",
            "RuntimeError: loading failed",
        ],
    )
    assert (
        execution._cell_error(chained)
        == "RuntimeError: loading failed\n(caused by OSError: disk quota exceeded)"
    )
    try:
        try:
            raise KeyError("x")
        except KeyError as exc:
            raise ValueError("outer") from exc
    except ValueError as exc:
        assert execution._cell_error(exc) == "ValueError: outer\n(caused by KeyError: 'x')"


def test_every_notebook_is_checked_before_any_runs(tmp_path, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(execution, "_papermill", _failing(AssertionError("ran"), calls))
    argv = ["run", "f00", "f05", "--profile", "smoke", "-p", "layer=0", "--output-dir", str(tmp_path)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert calls == [] and not (tmp_path / "runs.json").exists()
    assert "f05_token_trajectories" in out and "unknown parameter 'layer'" in out
    assert "nothing was run" in err and "1 of 2 notebooks" in err
    # the reason is on stderr too (the result lines go to stdout, which may be redirected)
    assert "\n  f05_token_trajectories: unknown parameter 'layer'" in err and "(above)" not in err, err


def test_ctrl_c_while_the_parser_is_built_exits_130(monkeypatch, capsys):
    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["list"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err


def test_the_light_commands_import_no_torch_and_list_the_heavy_ones_as_they_are():
    code = (
        "import sys; from coupling_utils.pipeline.cli import build_parser; build_parser(['list']); "
        "print(sorted({'torch', 'transformers', 'pandas'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr

    def helps(parser):
        sub = next(a for a in parser._actions if a.dest == "command")
        return {a.dest: a.help for a in sub._choices_actions}

    full = helps(cli.build_parser())
    assert helps(cli.build_parser(["list"])) == full
    assert {name: full[name] for name in cli.HEAVY} == cli.HEAVY


@pytest.fixture
def no_work(monkeypatch):
    """Any start of real work (a kit, a book, a notebook, a measurement) fails the test."""
    from coupling_utils.pipeline import book, k_sensitivity, kit

    def work(*args, **kwargs):
        raise AssertionError("work started")

    for module, name in (
        (kit, "build_kit"),
        (book, "build_book"),
        (execution, "_papermill"),
        (k_sensitivity, "measure_sensitivity"),
    ):
        monkeypatch.setattr(module, name, work)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["run", "f00", "--output-dir", ""], "--output-dir"),
        (["build", "--out", ""], "--out"),
        (["build", "--executed", ""], "--executed"),
        (["build", "--work", ""], "--work"),
        (["kit", "--out", ""], "--out"),
        (["k-sensitivity", "--out", ""], "--out"),
    ],
)
def test_an_empty_path_is_refused_naming_the_option(argv, option, no_work, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COUPLING_BOOK_ROOT", str(tmp_path))  # nothing to fall back on
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {option}: the path is empty" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["kit", "--out", "{dir}"], "--out {dir} is a folder: give the file to write, e.g. {dir}/"),
        (["k-sensitivity", "--out", "{dir}"], "--out {dir} is a folder: give the file to write"),
        (["run", "f00", "--profile", "smoke", "--output-dir", "{file}"], "--output-dir {file} is a file"),
        (["run", "f00", "--profile", "smoke", "--output-dir", "{file}/x"], "{file} is a file, so nothing"),
        (["build", "--executed", "{dir}", "--out", "{file}"], "--out {file} is a file, not a folder"),
        (["build", "--executed", "{dir}/none"], "--executed {dir}/none is not there: give the folder"),
        (["build", "--executed", "{file}"], "--executed {file} is a file: give the folder"),
        (["build", "--executed", "{dir}", "--work", "{file}"], "--work {file} is a file, not a folder"),
        (["build", "--executed", "{dir}", "--work", "{file}/w"], "{file} is a file, so nothing"),
    ],
)
def test_an_output_path_of_the_wrong_kind_is_refused_before_any_work(
    argv, message, no_work, tmp_path, capsys
):
    (tmp_path / "file").write_text("")
    paths = {"dir": str(tmp_path), "file": str(tmp_path / "file")}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(**paths) in err, err


def test_a_book_root_without_notebooks_is_a_configuration_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COUPLING_BOOK_ROOT", str(tmp_path))
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert f"COUPLING_BOOK_ROOT='{tmp_path}' has no notebooks/ folder" in err and "unset it" in err
    assert "bug" not in err


def test_build_reads_relative_paths_from_the_current_folder(tmp_path, monkeypatch, capsys):
    from coupling_utils.pipeline import book

    seen = {}

    def build_book(**kwargs):
        seen.update(kwargs)
        return kwargs["out"] / "index.html"

    monkeypatch.setattr(book, "build_book", build_book)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["build", "--executed", "runs", "--out", "html", "--no-strict", "--edition", "student"]) == 0
    assert seen["executed"] == tmp_path / "runs" and seen["out"] == tmp_path / "html"
    assert seen["root"] == execution.repo_root()
    assert seen["options"] == book.BuildOptions(strict=False, edition="student")

    def unexecuted(**kwargs):
        raise book.BookError("these notebooks are in _toc.yml but have not been executed:\n  - f00")

    monkeypatch.setattr(book, "build_book", unexecuted)
    assert main(["build", "--executed", "runs"]) == 1
    assert f"--output-dir {tmp_path / 'runs'}" in capsys.readouterr().err


def _scratch_book(tmp_path: Path, monkeypatch) -> list[Path]:
    """A book root of the prose pages only (COUPLING_BOOK_ROOT) whose Jupyter Book run is a
    stand-in; the staging folders it was given, in order."""
    from coupling_utils.pipeline import book

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    for name in ("_config.yml", "_toc.yml"):
        (root / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "book", root / "book")
    shutil.copytree(ROOT / "data", root / "data")
    monkeypatch.setenv("COUPLING_BOOK_ROOT", str(root))
    staged = []

    def jupyter_book(root, src, jb, strict, builder="html", shown=None):
        staged.append(src)
        assert (src / "_toc.yml").is_file() and jb.parent == src.parent
        (jb / "_build" / builder).mkdir(parents=True)
        (jb / "_build" / builder / "index.html").write_text("<html></html>")
        return jb / "_build" / builder

    monkeypatch.setattr(book, "_jupyter_book", jupyter_book)
    return staged


def test_build_stages_in_its_work_folder_so_two_builds_share_nothing(tmp_path, monkeypatch, capsys):
    """`build --work DIR`: staging goes to DIR/src (and DIR/jb), not the repository's _build, so
    two builds at once with their own --work do not overwrite each other's sources."""
    staged = _scratch_book(tmp_path, monkeypatch)
    (tmp_path / "runs").mkdir()
    for n in (1, 2):
        argv = ["build", "--executed", str(tmp_path / "runs"), "--allow-unexecuted"]
        assert main([*argv, "--out", str(tmp_path / f"html{n}"), "--work", str(tmp_path / f"w{n}")]) == 0
    assert staged == [tmp_path / "w1" / "src", tmp_path / "w2" / "src"]
    assert all((w / "_toc.yml").is_file() for w in staged), "each build keeps its own staged sources"
    assert not (tmp_path / "repo" / "_build").exists(), "the repository's _build/src is untouched"
    assert (tmp_path / "html2" / "index.html").is_file()


def test_a_work_folder_over_the_runs_or_the_output_is_refused(tmp_path, monkeypatch, capsys):
    """--work whose src or jb would delete the executed notebooks or the book: exit 2, nothing
    staged or deleted."""
    staged = _scratch_book(tmp_path, monkeypatch)
    runs = tmp_path / "w" / "src"
    runs.mkdir(parents=True)
    (runs / "f00_coupling_metric.ipynb").write_text("{}")
    work = ["--work", str(tmp_path / "w")]
    assert main(["build", "--executed", str(runs), "--allow-unexecuted", *work]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: refusing to stage the book into {runs}: it would delete the executed"), err
    assert "--work" in err
    argv = ["build", "--executed", str(tmp_path / "w"), "--out", str(tmp_path / "w" / "jb" / "html")]
    assert main([*argv, "--allow-unexecuted", *work]) == 2
    assert "it would delete the book's output folder" in capsys.readouterr().err
    assert staged == [] and (runs / "f00_coupling_metric.ipynb").is_file()


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"cells": [', "NotJSONError: Notebook does not appear to be JSON"),
        (b"\xff\xfe{}", "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
        (b"", "NotJSONError"),
    ],
    ids=["truncated", "not-utf8", "empty"],
)
def test_an_executed_notebook_that_cannot_be_read_is_bad_input(
    content, problem, tmp_path, monkeypatch, capsys
):
    """A truncated or garbled executed notebook: exit 2 naming the file, the problem and the command
    that writes it again, before anything is staged (was: "an unexpected error ... likely a bug")."""
    staged = _scratch_book(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "f00_coupling_metric.ipynb").write_bytes(content)
    work = tmp_path / "work"
    assert main(["build", "--executed", str(runs), "--allow-unexecuted", "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the executed notebook {runs / 'f00_coupling_metric.ipynb'} cannot be read")
    assert problem in err and "coupling-book run f00" in err and f"--output-dir {runs}" in err, err
    assert "bug" not in err and "Traceback" not in err
    assert staged == [] and not (work / "src").exists()


def test_build_over_the_repository_is_bad_input(monkeypatch, capsys):
    """`build --out .` from the repository root is refused before any work: bad input, exit 2."""
    monkeypatch.chdir(execution.repo_root())
    assert main(["build", "--out", "."]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: refusing to write the book to {execution.repo_root()}"), err


@pytest.mark.parametrize(
    "option, message",
    [(["--n-prompts", "-1"], "--n-prompts -1 is negative"), (["--n-images", "0"], "--n-images 0")],
)
def test_k_sensitivity_checks_its_options_before_measuring(option, message, no_work, capsys):
    assert main(["k-sensitivity", *option]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "where, exc",
    [
        ("_train_one", RuntimeError("out of disk space while writing the weights")),
        ("_lock", PermissionError(13, "Permission denied", "/shared/cache/zoo/pythia-smoke/.lock")),
    ],
    ids=["build", "read-only-cache"],
)
def test_a_failed_zoo_build_names_the_model_and_its_cause(where, exc, tmp_path, monkeypatch, capsys):
    """`zoo prepare NAME` whose build fails: which model and why, exit 1 (a failed run), no traceback
    and no "unexpected error"; several failing names each get their line."""
    from coupling_utils.models.zoo import build
    from coupling_utils.models.zoo import errors as zoo_errors

    def fail(*_a, **_k):
        raise exc

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, where, fail)
    assert main(["zoo", "prepare", "pythia-smoke"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: pythia-smoke could not be built: {type(exc).__name__}: {exc}."), err
    assert "Traceback" not in err and "unexpected" not in err and "rerun" in err
    assert main(["zoo", "prepare", "pythia-smoke", "vit-mnist-smoke"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" could not be built: ")[0] for line in lines] == [
        "error: pythia-smoke",
        "error: vit-mnist-smoke",
    ], lines
    assert all(f"{type(exc).__name__}: {exc}" in line for line in lines)
    with pytest.raises(zoo_errors.BuildFailed) as shown:  # --debug: the traceback, to the library error
        main(["--debug", "zoo", "prepare", "pythia-smoke"])
    assert shown.value.__cause__ is exc


@pytest.mark.parametrize(
    "argv, option",
    [
        (["run", "f00", "--profile", "smoke", "--output-dir", "{ro}/runs"], "--output-dir {ro}/runs"),
        (["build", "--executed", "{tmp}", "--out", "{ro}/html"], "--out {ro}/html"),
        (["build", "--executed", "{tmp}", "--work", "{ro}"], "--work {ro}"),
        (["kit", "--out", "{ro}/kit.zip"], "--out {ro}/kit.zip"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_bad_input(
    argv, option, no_work, tmp_path, monkeypatch, capsys
):
    """An output in a folder the user cannot write (chmod 555; emulated: the tests run as root):
    exit 2 naming the option and the folder, before any work (was: exit 1, "Permission denied:
    <path>. Check that this path exists ..." once the work had started)."""
    import os

    ro = tmp_path / "read-only"
    ro.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != ro and access(path, mode))
    paths = {"ro": str(ro), "tmp": str(tmp_path)}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option.format(**paths)}: {ro} cannot be written (permission denied)"), err


def test_run_refused_or_without_a_cache_creates_nothing(no_work, tmp_path, monkeypatch, capsys):
    """`run` refused (a bad profile), or with COUPLING_CACHE naming a file: exit 2 naming the
    problem, no kernel started and no --output-dir made (was: the folder made first; and with the
    cache a file, each notebook started and failed on "Not a directory", exit 1)."""
    out = tmp_path / "runs"
    assert main(["run", "f00", "--profile", "nosuch", "--output-dir", str(out)]) == 2
    assert "unknown profile 'nosuch'" in capsys.readouterr().err and not out.exists()
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path / "cache" / "sub"))
    assert main(["run", "f00", "--profile", "smoke", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: $COUPLING_CACHE='{tmp_path / 'cache' / 'sub'}': {tmp_path / 'cache'} is a file"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"k: [1,\n", "cannot be read at line 2, column 1 (expected the node content"),
        (b"\xff\xfek: 3\n", "cannot be read ('utf-8' codec can't decode byte 0xff"),
    ],
    ids=["bad-yaml", "not-utf8"],
)
def test_a_parameter_file_that_cannot_be_read_is_bad_input(
    content, problem, no_work, tmp_path, monkeypatch, capsys
):
    """A profile's parameter file that is not YAML or not UTF-8: exit 2 naming the file, where and
    the fix, nothing run or made (was: "an unexpected error ... likely a bug", exit 1)."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    (root / "notebooks" / "profiles" / "mine").mkdir()
    (root / "notebooks" / "profiles" / "mine" / "f00_coupling_metric.yaml").write_bytes(content)
    monkeypatch.setenv("COUPLING_BOOK_ROOT", str(root))
    assert main(["run", "f00", "--profile", "mine", "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    path = root / "notebooks" / "profiles" / "mine" / "f00_coupling_metric.yaml"
    assert f"{path}: the parameter file of profile 'mine' {problem}" in err, err
    assert "write it as UTF-8 YAML" in err and "bug" not in err and not (tmp_path / "runs").exists()
