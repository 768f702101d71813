"""What ``coupling-book`` says is what happened, no more: a measure rerun that reads stored results
says so, Ctrl-C during a build says the previous book is kept (not that something is stored),
``build`` names one path, the real ``index.html`` (not Jupyter Book's staging copy), and
``sweep --status``'s help lists every state it shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.pipeline import book
from coupling_utils.pipeline.cli import STORED, build_parser, main
from coupling_utils.pipeline.sweep import STATES


def test_a_measure_rerun_says_what_it_read_from_the_store(tmp_path, capsys):
    local = tmp_path / "two-blocks"
    tiny_model("gpt2", seed=3).save_pretrained(local)
    prompts = tmp_path / "ids.json"
    prompts.write_text(json.dumps({"a": [1, 5, 9, 3, 7]}))
    out = tmp_path / "out"
    argv = ["measure", str(local), "--prompts", str(prompts), "--k", "2", "--out", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"1 of 1 measured into {out}\n")
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert said.startswith(
        f"0 of 1 measured now and 1 read from the store (measured by an earlier run), tables in {out}\n"
    ), said


def test_ctrl_c_says_what_is_true_for_each_command(monkeypatch, capsys):
    """A build or a kit replaces the previous one as a whole: Ctrl-C keeps the previous one, and
    says so; a run keeps each notebook and measurement it finished, and says that."""
    from coupling_utils.pipeline import execution, kit

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for module, name in [(book, "build_book"), (kit, "build_kit"), (execution, "run_notebooks")]:
        monkeypatch.setattr(module, name, interrupted)
    for argv, said in [
        (["build"], "The book was not replaced: the previous one, if any, is kept as it was"),
        (["kit"], "The kit was not replaced: the previous one, if any, is kept as it was"),
        (["run", "f00", "--profile", "smoke"], STORED),
    ]:
        assert main(argv) == 130
        err = capsys.readouterr().err
        assert f"interrupted: stopped on Ctrl-C. {said}" in err, err
        assert argv == ["run", "f00", "--profile", "smoke"] or STORED not in err, err


def test_jupyter_book_names_no_staging_copy_as_the_book(tmp_path):
    """The real Jupyter Book on a one-page book: its closing banner and Sphinx's "The HTML pages
    are in ..." (both naming ``jb/_build/html``) are not printed; a failure's box still is."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "_config.yml").write_text('title: t\nexecute:\n  execute_notebooks: "off"\n')
    (src / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (src / "index.md").write_text("# Hello\n\ntext\n")
    for builder in ("html", "singlehtml"):
        jb = tmp_path / f"jb-{builder}"
        cmd = [sys.executable, "-c", book._JB_MAIN, "build", str(src), "--path-output", str(jb)]
        done = subprocess.run([*cmd, "--builder", builder], capture_output=True, text=True, cwd=tmp_path)
        said = done.stdout + done.stderr
        assert done.returncode == 0 and (jb / "_build" / builder / "index.html").is_file(), said
        assert "build succeeded" in said
        for banner in ("Finished generating HTML", "index.html", "pages are in", "page is in"):
            assert banner not in said, said
    (src / "_toc.yml").write_text("format: jb-book\nroot: nosuchpage\n")
    done = subprocess.run([*cmd, "--builder", "html"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "nosuchpage" in done.stdout + done.stderr


def test_build_names_the_books_index_html(tmp_path, monkeypatch, capsys):
    def build_book(**kwargs):
        return kwargs["out"]  # the folder, as build_book returns it

    monkeypatch.setattr(book, "build_book", build_book)
    (tmp_path / "runs").mkdir()
    assert main(["build", "--executed", str(tmp_path / "runs"), "--out", str(tmp_path / "html")]) == 0
    assert capsys.readouterr().out == f"book written to {Path(tmp_path / 'html' / 'index.html')}\n"


def test_sweep_status_help_lists_every_state_it_shows():
    parser = build_parser(["sweep"])
    sweep = next(a for a in parser._actions if a.dest == "command").choices["sweep"]
    status = next(a for a in sweep._actions if a.dest == "status")
    assert all(state in status.help for state in STATES) and "interrupted" in status.help
