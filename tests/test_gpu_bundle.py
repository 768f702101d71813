"""bench/gpu_bundle.py: what it packs for a GPU machine without network, the parts, and run.sh."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_bundle as gb  # noqa: E402


def test_what_is_packed_follows_the_gpu_machines_list():
    ours = {"torch": "2.13.0", "nvidia-cublas": "13.0", "triton": "3.5", "ruff": "0.6",
            "coupling-utils": "0.1.0", "pandas": "2.3.0", "numpy": "2.3.1", "gguf": "0.17",
            "scipy": "1.16", "altair": "5.5"}  # fmt: skip
    have = {"numpy": "2.3.1", "scipy": "1.15", "pandas": None, "altair": None}
    need = gb.to_pack(ours, have)
    # missing there (gguf), another version there (scipy), named bare but carried (pandas: CARRY)
    assert need == {"gguf": "0.17", "pandas": "2.3.0", "scipy": "1.16"}
    assert gb.to_pack(ours, have, carry=()) == {"gguf": "0.17", "scipy": "1.16"}


def test_the_have_list_reads_pip_freeze_and_bare_names(tmp_path):
    have = tmp_path / "have.txt"
    have.write_text(
        "# pip list --format=freeze\nNumPy==2.3.1\nmarkdown_it_py==3.0\nfoo @ file:///x\n"
        "absl-py, accelerate, aiofiles,\nzipp.\n",
        encoding="utf-8",
    )
    assert gb.read_have(have) == {"numpy": "2.3.1", "markdown-it-py": "3.0", "foo": None, "absl-py": None,
                                  "accelerate": None, "aiofiles": None, "zipp": None}  # fmt: skip


@pytest.mark.parametrize(
    "content, says",
    [(None, "no such file"), (b"numpy==1\n\xff\xfe\n", "UTF-8"), (b"numpy==1\nnot a name!\n", "line 2")],
)
def test_a_bad_have_list_is_named_with_the_fix(tmp_path, capsys, content, says):
    have = tmp_path / "have.txt"
    if content is not None:
        have.write_bytes(content)
    assert gb.main(["--out", str(tmp_path / "b"), "--have", str(have), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_bundle: --have {have}") and says in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_bad_options_exit_2(tmp_path, capsys):
    for bad in (["--python", "312"], ["--part-mib", "0"]):
        with pytest.raises(SystemExit) as exc:
            gb.main(["--out", str(tmp_path / "b"), *bad])
        assert exc.value.code == 2
    assert "major.minor" in capsys.readouterr().err


def test_a_dry_run_names_the_packages_and_writes_nothing(tmp_path, capsys):
    assert gb.main(["--out", str(tmp_path / "b"), "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "packages to pack for Python 3.12" in said and "transformers==" in said
    assert "torch==" not in said and "ruff==" not in said and "coupling-utils" not in said
    assert not (tmp_path / "b").exists()


def _wheels(folder: Path) -> list[Path]:
    folder.mkdir()
    paths = []
    for i, size in enumerate((3000, 5000, 700)):
        path = folder / f"pkg{i}-1.0-py3-none-any.whl"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def test_the_parts_join_to_the_tar_their_digest_names(tmp_path):
    wheels = _wheels(tmp_path / "w")
    (tmp_path / "b").mkdir()
    digest, parts = gb.pack(wheels, tmp_path / "b", part_bytes=4096)
    assert [p.relative_to(tmp_path / "b").as_posix() for p in parts][:2] == ["p0/part0", "p1/part1"]
    assert all(p.stat().st_size <= 4096 for p in parts) and len(parts) >= 3
    joined = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == digest
    (tmp_path / "t.tar").write_bytes(joined)
    with tarfile.open(tmp_path / "t.tar") as t:
        assert sorted(t.getnames()) == sorted(w.name for w in wheels)


def _fake_bin(folder: Path, log: Path) -> None:
    """python3, nvidia-smi and timeout stand-ins that record what run.sh asks of them."""
    folder.mkdir()
    for name in ("python3", "nvidia-smi", "timeout"):
        tool = folder / name
        tool.write_text(f'#!/bin/bash\necho "{name} $*" >> {log}\n', encoding="utf-8")
        tool.chmod(0o755)


def test_run_sh_joins_checks_installs_and_runs_both_steps(tmp_path):
    wheels = _wheels(tmp_path / "w")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    digest, parts = gb.pack(wheels, bundle, part_bytes=4096)
    opts = gb.Options(out=bundle, engine_budget=100, notebooks_budget=200, jobs=3)
    (bundle / "run.sh").write_text(gb.run_script(digest, len(parts), opts), encoding="utf-8")
    stage, log, out = tmp_path / "stage", tmp_path / "log", tmp_path / "out"
    stage.mkdir()
    (parts[0]).rename(stage / "part0")  # copied by an earlier staging call, no longer in the bundle
    repo = tmp_path / "repo"
    (repo / "data" / "benchmarks").mkdir(parents=True)
    (repo / "data" / "benchmarks" / "gpu_check.csv").write_text("step\n", encoding="utf-8")
    _fake_bin(tmp_path / "bin", log)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STAGE": str(stage)}
    done = subprocess.run(["bash", str(bundle / "run.sh"), str(out)], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("python3 -m pip install -q --no-index --no-deps")
    assert calls[1] == "nvidia-smi -L" and calls[2].startswith("python3 -c import torch")
    assert calls[3] == "timeout -s INT -k 20 150 python3 bench/gpu_check.py --step engine --budget 100"
    assert (
        calls[4]
        == "timeout -s INT -k 20 210 python3 bench/gpu_check.py --step notebooks --jobs 3 --budget 200"
    )
    assert sorted(p.name for p in (stage / "w").iterdir()) == sorted(w.name for w in wheels)
    assert {p.name for p in out.iterdir()} == {
        "engine.log",
        "notebooks.log",
        "gpu_check.csv",
        "gpu_check_engine.csv",
    }


def test_run_sh_stops_on_a_damaged_part(tmp_path):
    wheels = _wheels(tmp_path / "w")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    digest, parts = gb.pack(wheels, bundle, part_bytes=4096)
    (bundle / "run.sh").write_text(
        gb.run_script(digest, len(parts), gb.Options(out=bundle)), encoding="utf-8"
    )
    parts[1].write_bytes(parts[1].read_bytes()[:-1] + b"?")
    _fake_bin(tmp_path / "bin", tmp_path / "log")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STAGE": str(tmp_path / "stage")}
    done = subprocess.run(["bash", str(bundle / "run.sh"), str(tmp_path / "out")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 3 and "missing or damaged" in done.stderr
    assert not (tmp_path / "log").exists()  # nothing installed, nothing run


def test_a_failed_download_says_pips_reason_and_keeps_the_old_bundle(tmp_path, monkeypatch, capsys):
    old = tmp_path / "b"
    old.mkdir()
    (old / "run.sh").write_text("old", encoding="utf-8")

    def fail(command, **kwargs):
        return subprocess.CompletedProcess(
            command, 1, "", "ERROR: No matching distribution found for gguf==0.17"
        )

    monkeypatch.setattr(gb.subprocess, "run", fail)
    monkeypatch.setattr(gb, "installed", lambda: {"gguf": "0.17"})
    assert gb.main(["--out", str(old)]) == 1
    err = capsys.readouterr().err
    assert (
        "pip download failed for Python 3.12 (exit 1): ERROR: No matching distribution found for gguf==0.17"
        in err
    )
    assert (old / "run.sh").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["b"]


def test_a_bundle_replaces_the_old_one_as_a_set_and_follows_the_umask(tmp_path, monkeypatch):
    old = tmp_path / "b"
    (old / "p9").mkdir(parents=True)

    def download(packages, python, dest):
        return _wheels(dest)

    monkeypatch.setattr(gb, "fetch", download)
    monkeypatch.setattr(gb, "installed", lambda: {"gguf": "0.17"})
    mask = os.umask(0o027)
    try:
        gb.bundle(gb.Options(out=old, part_mib=4096 / 2**20))
    finally:
        os.umask(mask)
    names = sorted(p.name for p in old.iterdir())  # the old bundle's p9 is gone with it
    assert names == [*(f"p{i}" for i in range(len(names) - 2)), "run.sh", "wheels.txt"]
    assert old.stat().st_mode & 0o777 == 0o750
    assert os.access(old / "run.sh", os.X_OK)
    assert "pkg0-1.0-py3-none-any.whl\t3000" in (old / "wheels.txt").read_text()


def test_ctrl_c_while_fetching_keeps_the_old_bundle_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    old = tmp_path / "b"
    old.mkdir()
    (old / "run.sh").write_text("old", encoding="utf-8")

    def interrupted(packages, python, dest):
        dest.mkdir()
        (dest / "half.whl").write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(gb, "fetch", interrupted)
    monkeypatch.setattr(gb, "installed", lambda: {"gguf": "0.17"})
    assert gb.main(["--out", str(old)]) == 130
    assert "interrupted; the previous bundle, if any, is unchanged" in capsys.readouterr().err
    assert (old / "run.sh").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["b"]


def test_an_unwritable_out_is_named_with_the_fix(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder", encoding="utf-8")
    monkeypatch.setattr(gb, "installed", lambda: {"gguf": "0.17"})
    assert gb.main(["--out", str(tmp_path / "file" / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_bundle: --out {tmp_path / 'file' / 'b'}: cannot write there (")
    assert "choose a writable folder" in err and "Traceback" not in err


def test_a_full_disk_is_a_failed_run_that_keeps_the_old_bundle(tmp_path, monkeypatch, capsys):
    old = tmp_path / "b"
    old.mkdir()
    (old / "run.sh").write_text("old", encoding="utf-8")

    def full(wheels, folder, part_bytes):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gb, "fetch", lambda packages, python, dest: _wheels(dest))
    monkeypatch.setattr(gb, "pack", full)
    monkeypatch.setattr(gb, "installed", lambda: {"gguf": "0.17"})
    assert gb.main(["--out", str(old)]) == 1
    err = capsys.readouterr().err
    # the project's words for a full disk (files.DiskFull): the cause, the folder, how to see the room
    assert f"--out {old}: the disk is full (No space left on device) while writing in {tmp_path}" in err
    assert "df -h" in err and "the previous bundle, if any, is unchanged" in err and "Traceback" not in err
    assert (old / "run.sh").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["b"]
