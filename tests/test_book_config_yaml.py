"""``_config.yml`` and ``_toc.yml`` have one reader (:func:`~coupling_utils.pipeline.pages.book_yaml`;
``book_config`` for the settings), for the book build and the lab kit: a file that cannot be read
is bad input (exit 2) naming the file, the problem and the fix, before anything is staged; never
a traceback."""

from __future__ import annotations

import pytest
from test_cli_errors import _scratch_book

from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.pages import BookInputError, book_config

BAD = [
    (b"title: t\nhtml:\n  baseurl: [unclosed\n", "at line 4, column 1 (ParserError: expected ',' or ']'"),
    (b"title: caf\xe9\n", "(UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9"),
    (b"- title\n- html\n", "holds a YAML list, not a mapping of settings"),
]


@pytest.mark.parametrize("content, problem", BAD, ids=["not-yaml", "not-utf8", "a-list"])
def test_a_bad_config_ends_the_build_as_bad_input_naming_it(content, problem, tmp_path, monkeypatch, capsys):
    config = tmp_path / "repo" / "_config.yml"
    err = _build_with(tmp_path, monkeypatch, capsys, config, content)
    assert err.startswith(f"error: {config} "), err
    assert problem in err and "then run the command again" in err, err
    assert "Traceback" not in err and "bug" not in err


def _build_with(tmp_path, monkeypatch, capsys, bad, content: bytes) -> str:
    """``coupling-book build`` of the scratch book with ``bad`` (one of its files) holding
    ``content``: exit 2 with nothing staged; returns what it printed on stderr."""
    staged = _scratch_book(tmp_path, monkeypatch)
    bad.write_bytes(content)
    (tmp_path / "runs").mkdir()
    work = tmp_path / "work"
    argv = ["build", "--executed", str(tmp_path / "runs"), "--allow-unexecuted", "--work", str(work)]
    assert main([*argv, "--out", str(tmp_path / "html")]) == 2
    assert staged == [] and not (work / "src").exists(), "refused before anything is staged"
    return capsys.readouterr().err


def test_a_bad_toc_ends_the_build_as_bad_input_naming_it(tmp_path, monkeypatch, capsys):
    toc = tmp_path / "repo" / "_toc.yml"
    err = _build_with(
        tmp_path, monkeypatch, capsys, toc, b"format: jb-book\nroot: index\nchapters:\n- file: [a\n"
    )
    assert err.startswith(f"error: {toc} cannot be read at line 5"), err
    assert "the table of contents must be UTF-8 YAML" in err and "Traceback" not in err


def test_the_kit_command_says_bad_input_with_exit_2(tmp_path, monkeypatch, capsys):
    """``coupling-book kit`` on a book whose settings cannot be read: exit 2 (bad input), not 1."""
    from coupling_utils.pipeline import execution

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "f00_coupling_metric.md").write_text("# stand-in\n")
    (tmp_path / "_config.yml").write_bytes(BAD[0][0])
    monkeypatch.setattr(execution, "repo_root", lambda: tmp_path)
    assert main(["kit", "--out", str(tmp_path / "kit.zip")]) == 2
    err = capsys.readouterr().err
    assert "_config.yml cannot be read at line 4" in err and "Traceback" not in err
    assert not (tmp_path / "kit.zip").exists()


def test_the_kit_reads_the_config_through_the_same_reader(tmp_path):
    from coupling_utils.pipeline.kit import build_kit

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "f00_coupling_metric.md").write_text("# stand-in\n")
    (tmp_path / "_config.yml").write_bytes(BAD[0][0])
    with pytest.raises(BookInputError, match=f"{tmp_path / '_config.yml'} cannot be read at line 4"):
        build_kit(tmp_path, tmp_path / "kit.zip")
    assert not (tmp_path / "kit.zip").exists()


def test_a_missing_or_empty_config_is_no_settings(tmp_path):
    assert book_config(tmp_path) == {}
    (tmp_path / "_config.yml").write_text("# nothing set\n")
    assert book_config(tmp_path) == {}
    (tmp_path / "_config.yml").write_text("\ufefftitle: t\n", encoding="utf-8")
    assert book_config(tmp_path) == {"title": "t"}
