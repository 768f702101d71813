"""Bad input to ``coupling-book``: a one-paragraph message and exit 2, or the right result; never
a traceback unless ``--debug`` asks. Repeated options add up or are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from coupling_utils.pipeline import cli_sweep
from coupling_utils.pipeline.cli import main
from coupling_utils.pipeline.measure_models import read_prompts


def _measure(model_dir, ids_file, out, *more):
    return main(["measure", str(model_dir), "--prompts", str(ids_file), "--k", "2", "--out", str(out), *more])


def _one_paragraph(err: str, *words: str) -> None:
    assert "Traceback" not in err and err.strip().count("\n") <= 1, err
    for w in words:
        assert w in err, err


def test_prompt_files_non_utf8_and_byte_order_mark(tmp_path, model_dir, capsys):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café au lait\n".encode("latin-1"))
    assert main(["measure", str(model_dir), "--prompts", str(latin), "--out", str(tmp_path / "o")]) == 2
    _one_paragraph(capsys.readouterr().err, str(latin), "not UTF-8", "byte 0xe9", "iconv")
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffid,text\nq1,hello there\n".encode())
    assert read_prompts(bom) == {"q1": "hello there"}  # the header is found, no BOM in the text
    (tmp_path / "bom.txt").write_bytes("\ufefffirst\nsecond\n".encode())
    assert read_prompts(tmp_path / "bom.txt") == {"p0": "first", "p1": "second"}
    assert main(["measure", str(model_dir), "--prompts", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    _one_paragraph(capsys.readouterr().err, "is a folder")


def test_bad_out_folders_and_counts(tmp_path, model_dir, ids_file, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out, words in [(a_file, ["is a file"]), (a_file / "sub", ["cannot create", "Not a directory"])]:
        assert _measure(model_dir, ids_file, out) == 2
        _one_paragraph(capsys.readouterr().err, str(out), *words)
    assert main(["measure", str(model_dir), "--n-prompts", "-1", "--out", str(tmp_path / "o")]) == 2
    _one_paragraph(capsys.readouterr().err, "--n-prompts must be 0 or more", "-1")


def test_slurm_without_slurm(tmp_path, model_dir, ids_file, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    assert _measure(model_dir, ids_file, tmp_path / "o", "--executor", "slurm") == 2
    _one_paragraph(capsys.readouterr().err, "sbatch", "--executor local")


def test_repeated_options_add_up_or_are_refused(tmp_path, model_dir, ids_file, capsys):
    out = tmp_path / "o"
    assert _measure(model_dir, ids_file, out, "--k", "4", "--k", "3") == 0
    assert sorted(pd.read_csv(out / "summary.csv").K) == [2, 3, 4]
    with pytest.raises(SystemExit) as exit_:
        _measure(model_dir, ids_file, out, "--out", str(tmp_path / "other"))
    assert exit_.value.code == 2 and "--out is given twice" in capsys.readouterr().err
    runs = tmp_path / "runs"
    rc = main(["run", "f00", "--profile", "smoke", "-p", "k=4", "-p", "k=3", "--output-dir", str(runs)])
    assert rc == 2
    _one_paragraph(capsys.readouterr().err, "parameter 'k' is given twice", "k=3")
    assert not (runs / "runs.json").exists()
    assert cli_sweep.DEFAULT_K == (10, 30, 50)  # what --k means when it is not given


def test_prompts_too_long_are_cut_and_ids_out_of_range_refused(tmp_path, model_dir, capsys):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"long": list(range(1, 64)) * 3, "bad": [1, 2, 64, 99]}))
    out = tmp_path / "o"
    # refused before any work (bad input, exit 2), naming the file, the prompt, the ids and the range
    assert main(["measure", str(model_dir), "--prompts", str(prompts), "--k", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"prompts file {prompts}: prompt 'bad' has token ids 64, 99, outside the vocabulary" in err
    assert "(64 ids, 0..63)" in err and not (out / "summary.csv").exists()
    prompts.write_text(json.dumps({"long": list(range(1, 64)) * 3}))
    assert main(["measure", str(model_dir), "--prompts", str(prompts), "--k", "2", "--out", str(out)]) == 0
    assert "'long' has 189 tokens, more than this model's context of 64" in capsys.readouterr().err
    assert pd.read_csv(out / "prompts.csv").n_tokens.tolist() == [64]


def test_unexpected_errors_name_the_log_and_debug_shows_the_traceback(
    tmp_path, model_dir, ids_file, capsys, monkeypatch
):
    from coupling_utils.pipeline import measure_models

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(measure_models, "measure_many", broken)
    assert _measure(model_dir, ids_file, tmp_path / "o") == 1
    err = capsys.readouterr().err
    _one_paragraph(err, "RuntimeError: something nobody planned for", "--debug", "COUPLING_DEBUG=1")
    log = err.split("the traceback is in ")[1].split(" (")[0]
    assert "Traceback" in Path(log).read_text()
    with pytest.raises(RuntimeError):
        _measure(model_dir, ids_file, tmp_path / "o", "--debug")
    monkeypatch.setenv("COUPLING_DEBUG", "1")
    with pytest.raises(RuntimeError):
        _measure(model_dir, ids_file, tmp_path / "o")
    monkeypatch.delenv("COUPLING_DEBUG")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure_models, "measure_many", interrupted)
    assert _measure(model_dir, ids_file, tmp_path / "o") == 130
    _one_paragraph(capsys.readouterr().err, "interrupted", "rerun the same command")


def test_a_closed_pipe_is_quiet(cli):
    """``coupling-book list | head -1``: the reader goes away; no BrokenPipeError traceback."""
    proc = cli("list", background=True)
    proc.stdout.close()  # as `head` does once it has its lines, here before any is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) in (0, 141) and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.fixture
def nothing_loaded(monkeypatch):
    """Loading any model fails the test: what is refused is refused from the files alone."""
    from coupling_utils.models import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail(f"loaded {a}"))


def _t5(folder: Path) -> None:
    from transformers import T5Config

    (folder / "config.json").write_text(T5Config(d_model=32, num_layers=1).to_json_string())


def _checkpoints(folder: Path) -> None:
    import shutil

    for step in ("step0", "step8"):
        shutil.copytree(folder, folder / "revisions" / step, ignore=shutil.ignore_patterns("revisions"))


@pytest.mark.parametrize(
    "change, target, more, said",
    [
        (_t5, "", [], "config.json names model_type 't5' (an encoder-decoder; the engine follows one "
         "stack of blocks, decoder or encoder), an architecture the engine has no row for; the engine "
         "measures these transformers: GPT-2, GPT-Neo"),
        (lambda d: (d / "config.json").write_text('{"model_type": "mamba"}'), "", [],
         "names model_type 'mamba', an architecture the engine has no row for"),
        (lambda d: (d / "config.json").write_text('{"vocab_size": 64}'), "", [],
         "config.json names no model_type"),
        (lambda d: (d.parent / "x.gguf").write_bytes(b"<html>not found</html>"), "../x.gguf", [],
         "x.gguf is a file but not a GGUF model (it does not start with the GGUF magic bytes)"),
        (lambda d: (d.parent / "notes.txt").write_text("hi"), "../notes.txt", [],
         "notes.txt is a file but not a GGUF model (not a .gguf file); give a .gguf file, or a "
         "save_pretrained"),
        (lambda d: None, "", ["--revision", "step8"], "has no revision 'step8': a local folder keeps "
         "checkpoint R in revisions/R/, and {model}/revisions/step8 does not exist; it has no revisions/, "
         "only its final model: leave --revision out"),
        (_checkpoints, "", ["--revision", "step0", "--revision", "step7"], "has no revision 'step7': "
         "a local folder keeps checkpoint R in revisions/R/, and {model}/revisions/step7 does not exist; "
         "it has step0, step8 (and main, the folder itself); name one of them, or leave --revision out"),
    ],
)  # fmt: skip
def test_a_local_model_that_cannot_be_measured_is_refused_from_its_files(
    change, target, more, said, tmp_path, model_dir, ids_file, nothing_loaded, capsys
):
    """Before: each was loaded and failed the run (exit 1, the loader's words: 'Add a row ... (and a
    tiny test)', 'probably truncated or damaged' for a file that is no GGUF at all, a ValueError
    for a revision of a file)."""
    change(model_dir)
    model = (model_dir / target).resolve() if target else model_dir
    out = tmp_path / "o"
    assert (
        main(["measure", str(model), "--prompts", str(ids_file), "--k", "2", "--out", str(out), *more]) == 2
    )
    sep = "; "
    _one_paragraph(capsys.readouterr().err, f"error: MODEL {model}", said.format(model=model, sep=sep))
    assert not out.exists()


def test_a_revision_of_one_file_is_refused(tmp_path, ids_file, nothing_loaded, capsys):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    assert (
        main(
            [
                "measure",
                str(gguf),
                "--prompts",
                str(ids_file),
                "--revision",
                "step1",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    _one_paragraph(
        capsys.readouterr().err, f"MODEL {gguf} is one file, which has no revisions (--revision step1)"
    )
