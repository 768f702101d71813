"""Every shell command the README and the book's pages document works, as written.

The commands are read from the fenced ``bash``/``sh``/``shell``/``console`` blocks of README.md and
book/*.md. Each block runs as one bash script (``set -e``), in a scratch folder, with shims in
front of PATH that keep it small but real:

- ``coupling-book run`` first checks the documented overrides at the documented profile (as
  ``run`` checks them before anything runs: f01's ``-p k=30`` was refused at ``default``, where
  ``tile_k`` is 72, while the smoke run passed), then runs the named notebooks for real at the
  ``smoke`` profile (whatever profile the docs name), with the documented overrides, into the
  documented output folder; a run identical to one already made in this session (same notebook,
  the smoke profile, the same overrides) is copied instead of executed again, the session's own
  smoke runs (``smoke_runs``) included, which ran the same notebooks through the same ``run_notebook``;
- ``coupling-book build`` renders a real book from what the block ran (into the scratch folder); a
  build of the same executed notebooks with the same options as one already made in this session
  (``make test`` documents four builds of two distinct sets) is copied from it;
- ``coupling-book zoo prepare NAME`` prepares the smoke-sized twin of NAME (``SMOKE_TWINS``);
- ``coupling-book sweep`` runs at the ``smoke`` profile too, with ``--executor local`` for real, in
  a cache that holds the session's smoke measurements (its tasks are found done, as on a rerun;
  ``tests/test_sweep.py`` runs sweeps' workers); with ``--executor slurm`` it adds ``--dry-run``
  (no cluster here: it plans the jobs and prints the batch script it would submit);
- hub ids (``coupling-book measure``) resolve in the stand-in hub (``standin_hub`` fixture);
- other ``coupling-book`` commands (``list``, ``zoo list``) run as they are;
- ``make TARGET ...`` is checked with ``make -n`` (the target exists, its variables parse): the
  real targets are this suite (``make test``) or minutes of work (``make book``, ``make bench``);
- a command that is none of these must be listed in ``NOT_RUN`` with the reason, so a new kind
  of documented command cannot go untested unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
SMOKE_TWINS = {
    "pythia-tiny": "pythia-smoke",
    "lm-family": "lm-family-smoke",
    "vit-family": "vit-family-smoke",
    "vit-mnist": "vit-mnist-smoke",
    "smollm2-135m": "pythia-smoke",
}
# first words of commands that are documented but not run here, and why
NOT_RUN = {
    "python": "benchmarks take minutes per case; `make bench` runs them (checked with --help)",
    "git": "publishing and cloning need a remote",
    "pip": "installs need the network; `make venv` is what the docs rely on",
}
FIRST_WORDS = {"coupling-book", "make", "for", "done", "do", ".", "source", "cd", "export", *NOT_RUN}


def documented_blocks() -> list[tuple[str, int, str]]:
    """(file, line, script) for every fenced shell block of the documentation."""
    blocks = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)(```+|~~~+)\s*([\w-]*)", lines[i])
            if m and m.group(3) in SHELLS:
                fence, start, body = m.group(2), i + 1, []
                i += 1
                while i < len(lines) and not lines[i].strip().startswith(fence):
                    body.append(re.sub(r"^\$ ", "", lines[i].strip()))
                    i += 1
                blocks.append((path.relative_to(ROOT).as_posix(), start, "\n".join(body)))
            i += 1
    return blocks


def _first_words(script: str) -> set[str]:
    words = set()
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r";|&&|\|\|", line):
            tokens = shlex.split(part.strip(), comments=True) if part.strip() else []
            if tokens:
                words.add(tokens[0].rsplit("/", 1)[-1] if tokens[0].endswith("coupling-book") else tokens[0])
    return words


SHIM = textwrap.dedent(
    """\
    #!{python}
    '''coupling-book, kept at the smoke profile and inside the scratch folder.

    A notebook run identical to one already done in this test (same notebook, profile and
    parameters), or a build of the same executed notebooks with the same options, is copied from
    it instead of made again.
    '''
    import dataclasses, hashlib, json, shutil, sys
    from pathlib import Path

    from coupling_utils.pipeline import book, execution
    from coupling_utils.pipeline.cli import main

    twins = {twins!r}
    memo = Path({memo!r})
    real = execution.run_notebook

    def run_notebook(notebook, profile, overrides=None, output_dir=None, **kw):
        key = hashlib.sha256(json.dumps([notebook.stem, profile, overrides or {{}}], sort_keys=True,
                                        default=str).encode()).hexdigest()[:16]
        done = memo / key
        if (done / "result.json").exists():
            result = execution.RunResult(**json.loads((done / "result.json").read_text()))
            out = Path(output_dir or execution.repo_root() / "_build" / "notebooks")
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(done / "run.ipynb", out / f"{{notebook.stem}}.ipynb")
            result.output = str(out / f"{{notebook.stem}}.ipynb")
            return result
        result = real(notebook, profile, overrides, output_dir, **kw)
        if result.status == "ok":
            done.mkdir(parents=True, exist_ok=True)
            shutil.copy(result.output, done / "run.ipynb")
            (done / "result.json").write_text(json.dumps(result.__dict__, default=str))
        return result

    real_build = book.build_book

    def build_book(root, executed=None, out=None, options=None):
        # a build of the same executed notebooks with the same options (the staging folder aside)
        # is copied from the first one instead of rendered again
        options = options or book.BuildOptions()
        source = Path(executed or Path(root) / "_build" / "notebooks")
        key = hashlib.sha256(repr(dataclasses.replace(options, work=None)).encode())
        for nb in sorted(source.glob("*.ipynb")):
            key.update(nb.name.encode() + b"\\0" + nb.read_bytes())
        done = memo / f"build-{{key.hexdigest()[:16]}}"
        if done.is_dir():
            target = Path(out or Path(root) / "_build" / "html")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(done, target)
            return target
        written = real_build(root, executed, out, options)
        shutil.copytree(written, done)
        return written

    execution.run_notebook = run_notebook
    book.build_book = build_book
    argv = sys.argv[1:]
    if argv[:1] == ["sweep"] and "slurm" in argv and "--dry-run" not in argv:
        argv.append("--dry-run")  # no cluster here
    if argv[:1] == ["run"]:  # the documented parameters must pass at the documented profile
        from coupling_utils.chapters.checks import ParameterError
        from coupling_utils.pipeline.cli import build_parser
        args = build_parser(argv).parse_args(argv)
        try:
            execution._check_all(execution.find_notebooks(args.notebooks), args.profile,
                                 execution.parse_overrides(args.param), lambda line: None)
        except ParameterError as exc:
            sys.exit(f"error: at the documented profile {{args.profile!r}}: {{exc}}")
    if argv[:1] in (["run"], ["sweep"]):
        if "--profile" in argv:
            argv[argv.index("--profile") + 1] = "smoke"
        else:
            argv += ["--profile", "smoke"]
    if argv[:2] == ["zoo", "prepare"]:
        argv = argv[:2] + [twins.get(a.removeprefix("embedded:"), a) if not a.startswith("-") else a
                           for a in argv[2:]]
    sys.exit(main(argv))
    """
)


def memo_key(stem: str, profile: str, overrides) -> str:
    """The shim's key for a notebook run (as :data:`SHIM` computes it)."""
    text = json.dumps([stem, profile, overrides or {}], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def seed_memo(memo: Path, smoke_runs) -> None:
    """Enter the session's successful smoke runs (no overrides) in the shim's memo."""
    for result in smoke_runs.results.values():
        if result.status != "ok":
            continue
        done = memo / memo_key(Path(result.notebook).stem, "smoke", None)
        done.mkdir(parents=True, exist_ok=True)
        shutil.copy(result.output, done / "run.ipynb")
        (done / "result.json").write_text(json.dumps(result.__dict__, default=str))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, standin_hub, smoke_runs):
    """A scratch book root (the repository's sources linked in), a PATH with the shims first, the
    shim's memo seeded with the session's smoke runs, and a cache holding what those runs measured
    (so a documented sweep at the smoke profile finds its tasks done, as a rerun would: the sweeps'
    workers are tested in tests/test_sweep.py)."""
    root = tmp_path_factory.mktemp("docs")
    for name in ("notebooks", "book", "data", "_config.yml", "_toc.yml", "CITATION.cff"):
        if (ROOT / name).exists():
            (root / name).symlink_to(ROOT / name)
    shims = root / ".shims"
    shims.mkdir()
    (shims / "coupling-book").write_text(
        SHIM.format(python=sys.executable, twins=SMOKE_TWINS, memo=str(root / ".memo"))
    )
    make = shutil.which("make")  # the real one, resolved before the shim shadows it
    (shims / "make").write_text(f'#!/bin/sh\nexec {make} -n -C {shlex.quote(str(ROOT))} "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    seed_memo(root / ".memo", smoke_runs)
    cache = root / ".cache"  # the smoke runs' cache: their measurements, and links to the models
    shutil.copytree(smoke_runs.cache, cache, symlinks=True)
    env = {
        **os.environ,
        "PATH": f"{shims}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "COUPLING_BOOK_ROOT": str(root),
        "COUPLING_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": str(standin_hub[0]),
    }
    return root, env


BLOCKS = documented_blocks()


def test_the_docs_document_commands():
    assert len(BLOCKS) >= 5, BLOCKS
    assert any("coupling-book run" in script for _, _, script in BLOCKS)


@pytest.mark.parametrize("where, line, script", BLOCKS, ids=[f"{w}:{n}" for w, n, _ in BLOCKS])
def test_documented_command_works(where, line, script, scratch):
    root, env = scratch
    unknown = _first_words(script) - FIRST_WORDS
    assert not unknown, (
        f"{where}:{line} documents {sorted(unknown)}, which this test does not know how to run; "
        "teach it (a shim) or list the command in NOT_RUN with the reason"
    )
    lines = []
    for text in script.splitlines():
        words = shlex.split(text, comments=True) if text.strip() else []
        if words and words[0] in NOT_RUN:
            if words[0] == "python" and len(words) > 1 and words[1].endswith(".py"):
                lines.append(
                    f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / words[1]))} --help >/dev/null"
                )
            continue  # documented, not run: see NOT_RUN
        if words[:2] in ([".", ".venv/bin/activate"], ["source", ".venv/bin/activate"]):
            continue  # the test already runs inside the project's environment
        lines.append(text.replace(".venv/bin/coupling-book", "coupling-book"))
    body = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    proc = subprocess.run(
        ["bash", "-c", body], cwd=root, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, (
        f"{where}:{line}: the documented commands failed (exit {proc.returncode}):\n{script}\n\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )


def _lent_packages(where: Path) -> Path:
    """A folder of links to this environment's installed packages but the project's own (its
    editable install and metadata), for a fresh venv to borrow the heavy ones (torch, ...) offline."""
    import sysconfig

    where.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if not (
            name.startswith(("coupling_utils", "__editable__", "coupling-utils")) or name.endswith(".pth")
        ):
            (where / entry.name).symlink_to(entry)
    return where


def _setup_lines() -> list[str]:
    """The macOS/Linux lines of the running page's "Without `make`" section, as documented."""
    text = (ROOT / "book" / "running.md").read_text(encoding="utf-8")
    section = text[text.index("## Without `make`") :]
    section = section[: section.index("\n## ", 5)]
    (block,) = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)
    return block.strip().splitlines()


@pytest.mark.slow
def test_the_setup_without_make_runs_on_linux(tmp_path, smoke_zoo):
    """The running page's setup without make, run line by line in a copy of the repository: a
    real venv, real pip installs (offline: the venv borrows this environment's packages through a
    path file, so torch and the book's packages are already satisfied and the project itself is
    installed, editable, from the copy), then ``coupling-book`` from that venv. The run line keeps
    its options but runs f00 at the smoke profile (the smoke models shared read-only): the default
    profile takes minutes."""
    lines = _setup_lines()
    assert lines[0] == "python -m venv .venv" and lines[-1].startswith("coupling-book run ")
    clone = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file() and not name.startswith("tests/"):
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("zoo", "corpus"):
        (cache / name).symlink_to(smoke_zoo / name, target_is_directory=True)
    lent = _lent_packages(tmp_path / "lent")
    purelib = ".venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
    # the test's one addition: the venv borrows the lent packages, setuptools included (the old one
    # that ensurepip puts in a Python 3.11 venv would shadow the newer one torch asks for)
    borrow = (
        ".venv/bin/python -m pip uninstall -q -y setuptools 2>/dev/null || true; "
        f'echo {shlex.quote(str(lent))} > "$({purelib})/lent.pth"'
    )
    script = ["set -euo pipefail"]
    for line in lines:
        if line == "python -m venv .venv":
            script += [f"{shlex.quote(sys.executable)} -m venv .venv", borrow]
        elif line.startswith("coupling-book run "):
            script.append(line.replace("--profile default", "--profile smoke").replace("run ", "run f00 ", 1))
        else:
            script.append(line)
    script.append('python -c "import coupling_utils; print(coupling_utils.__file__)"')
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "COUPLING_BOOK_ROOT")
    }
    env.update(
        PATH=os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix)),
        PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1",
        COUPLING_CACHE=str(cache), XDG_CACHE_HOME=str(tmp_path / "xdg"), HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
    imported = Path(proc.stdout.strip().splitlines()[-1])
    assert imported.is_relative_to(clone), f"the venv imports coupling_utils from {imported}, not the copy"
    assert (clone / ".venv" / "bin" / "coupling-book").is_file()
    assert (clone / "_build" / "notebooks" / "f00_coupling_metric.ipynb").is_file()
