"""Wheels and a run script for the GPU check on a CUDA machine that has no network.

A GPU machine often reaches no package index (a cluster's compute node, a lent machine) but has
a ``python3`` with a CUDA build of torch. On a machine that reaches PyPI, this writes to ``--out``:

- ``p0/part0``, ``p1/part1``, …: one tar of the wheels of every package this checkout's ``.venv``
  holds that the GPU machine lacks or holds in another version (``--have``), built for its Python
  (``--python``), split into parts of at most ``--part-mib`` MiB, each part in its own folder (a
  tool that copies folders can carry one part at a time);
- ``run.sh``: run there from the repository root, it joins the parts (those it finds in the
  bundle and those already copied to its staging folder), checks the tar's SHA-256, installs the
  wheels beside the machine's own torch (``pip install --no-index --target``, nothing fetched),
  checks the imports, then runs ``bench/gpu_check.py``'s engine step and its notebooks step, each
  under a time limit, and copies the CSV and the logs to ``$OUT`` (or its first argument);
- ``wheels.txt``: what was packed (name, version, bytes) and the tar's SHA-256.

    python bench/gpu_bundle.py --out .dev --have have.txt             # fetch, pack, write run.sh
    python bench/gpu_bundle.py --out .dev --have have.txt --dry-run   # only say what it would pack

``--have`` names what the GPU machine already has, as ``python3 -m pip list --format=freeze``
prints it there (``name==version``: packed when ``.venv``'s version differs) or as bare names,
one per line or separated by commas (a bare name is trusted, unless ``--carry`` names it: by
default the packages whose versions earlier GPU runs had to match, :data:`CARRY`). Never packed:
the machine's torch and the CUDA stack it was built with (:data:`THEIRS`), this project (run from
the checkout), and what only the tests and the book's build use (:data:`DEV_ONLY`).

The bundle is written as a set: into a new folder beside ``--out``, which then replaces it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from coupling_utils.files import DiskFull, atomic_dir

# the GPU machine's own: its torch is the CUDA build, and these came with it
THEIRS = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|coupling-utils)$")
# used by the tests, the lint and the book's HTML build only, never by a measurement or a notebook run
DEV_ONLY = frozenset(
    ["playwright", "ruff", "greenlet", "jupyter-book", "truststore", "babel", "django-static-mathjax",
     "pytest", "pytest-xdist", "execnet", "mutmut", "pip", "setuptools", "wheel"]
)  # fmt: skip
# bare names in --have that are packed all the same: their versions decide how models load and
# tables are read, and the GPU image's versions differed from the ones this project is tested with
CARRY = (
    "transformers", "huggingface-hub", "tokenizers", "safetensors", "accelerate", "pandas",
    "markdown-it-py", "mdurl", "threadpoolctl",
)  # fmt: skip
# manylinux tags a current x86-64 GPU machine accepts (glibc 2.17 to 2.35)
PLATFORMS = ("manylinux2014_x86_64", *(f"manylinux_2_{v}_x86_64" for v in (17, 24, 27, 28, 31, 34, 35)))


class BundleError(Exception):
    """A bad input (exit 2) or a failed step (``exit_code`` 1), said in one line."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Options:
    """What to pack and for which machine."""

    out: Path
    have: Path | None = None
    carry: tuple[str, ...] = CARRY
    python: str = "3.12"
    part_mib: float = 58.0
    engine_budget: int = 220
    notebooks_budget: int = 260
    jobs: int = 6


def normalized(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """The distributions of the interpreter that runs this (``.venv``'s): name -> version."""
    return {normalized(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def read_have(path: Path) -> dict[str, str | None]:
    """The GPU machine's packages from ``path``: name -> version (None where only named)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BundleError(
            f"--have {path}: no such file; write the GPU machine's `pip list --format=freeze` there"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"--have {path}: cannot be read as UTF-8 text ({exc}); save it as UTF-8") from exc
    have: dict[str, str | None] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for item in line.split("#", 1)[0].split(","):
            item = item.strip().rstrip(".")
            if not item:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*\S+)?", item)
            if m is None:
                raise BundleError(
                    f"--have {path}, line {number}: {item!r} is not a package name or name==version; "
                    "write one per line, as `pip list --format=freeze` prints them"
                )
            have[normalized(m.group(1))] = m.group(2)
    return have


def to_pack(ours: dict[str, str], have: dict[str, str | None], carry=CARRY) -> dict[str, str]:
    """The packages of ``ours`` the GPU machine needs: missing there, there in another version, or
    named bare and in ``carry``; never :data:`THEIRS` or :data:`DEV_ONLY`."""
    carry = {normalized(c) for c in carry}
    need = {}
    for name, version in sorted(ours.items()):
        if THEIRS.match(name) or name in DEV_ONLY:
            continue
        if name not in have or (have[name] is None and name in carry) or have[name] not in (None, version):
            need[name] = version
    return need


def fetch(packages: dict[str, str], python: str, dest: Path) -> list[Path]:
    """Download the wheels of ``packages`` (exact versions, no dependencies) for ``python`` on
    x86-64 Linux into ``dest``; pip's own message where it cannot."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp", *platforms, "--dest", str(dest),
               *(f"{n}=={v}" for n, v in packages.items())]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise BundleError(
            f"pip download failed for Python {python} (exit {done.returncode}): {' '.join(why[-3:])}", 1
        )
    return sorted(dest.glob("*.whl"))


def pack(wheels: list[Path], folder: Path, part_bytes: int) -> tuple[str, list[Path]]:
    """One tar of ``wheels`` split into ``folder/pN/partN`` of at most ``part_bytes``; its SHA-256."""
    tar = folder / "wheels.tar"
    with tarfile.open(tar, "w") as t:
        for wheel in wheels:
            t.add(wheel, arcname=wheel.name)
    digest, parts = hashlib.sha256(), []
    with open(tar, "rb") as f:
        while chunk := f.read(part_bytes):
            digest.update(chunk)
            part = folder / f"p{len(parts)}" / f"part{len(parts)}"
            part.parent.mkdir()
            part.write_bytes(chunk)
            parts.append(part)
    tar.unlink()
    return digest.hexdigest(), parts


def run_script(digest: str, n_parts: int, opts: Options) -> str:
    """``run.sh``: join, check, install, import, then the GPU check's two steps with time limits."""
    parts = " ".join(f"part{i}" for i in range(n_parts))
    engine = f"--step engine --budget {opts.engine_budget}"
    notebooks = f"--step notebooks --jobs {opts.jobs} --budget {opts.notebooks_budget}"
    imports = "torch, transformers, papermill, myst_nb, jupytext, ipykernel, altair, gguf, pandas, pyarrow"
    return f"""#!/bin/bash
# written by bench/gpu_bundle.py: run from the repository root on the GPU machine; results go to
# $OUT (or the first argument). Parts may be in this bundle's pN/ folders or already copied to
# $STAGE (default /tmp/stage).
set -u
bundle=$(cd "$(dirname "$0")" && pwd); out=${{1:-${{OUT:?give the results folder as \\$1 or \\$OUT}}}}
stage=${{STAGE:-/tmp/stage}}; mkdir -p "$stage" "$out"
for p in "$bundle"/p*/part*; do [ -e "$p" ] && cp "$p" "$stage/"; done
( cd "$stage" && cat {parts} > wheels.tar && echo "{digest}  wheels.tar" | sha256sum -c --quiet ) \\
  || {{ echo "run.sh: the wheels' parts are missing or damaged in $stage" >&2; exit 3; }}
mkdir -p "$stage/w" && tar xf "$stage/wheels.tar" -C "$stage/w" || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
  --target /tmp/site "$stage"/w/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \\
  TOKENIZERS_PARALLELISM=false
nvidia-smi -L
python3 -c "import {imports}; print(torch.__version__, transformers.__version__, \\
torch.cuda.get_device_name(0))" || exit 5
timeout -s INT -k 20 {opts.engine_budget + 50} python3 bench/gpu_check.py {engine} 2>&1 \\
  | tee "$out/engine.log"
engine=${{PIPESTATUS[0]}}
cp data/benchmarks/gpu_check.csv "$out/gpu_check_engine.csv"
timeout -s INT -k 20 {opts.notebooks_budget + 10} python3 bench/gpu_check.py {notebooks} 2>&1 \\
  | tee "$out/notebooks.log"
notebooks=${{PIPESTATUS[0]}}
cp data/benchmarks/gpu_check.csv "$out/gpu_check.csv"
echo "run.sh: engine step exit $engine, notebooks step exit $notebooks"
[ "$engine" = 0 ] && [ "$notebooks" = 0 ]
"""


def bundle(opts: Options, dry_run: bool = False) -> dict[str, str]:
    """Fetch and pack what the GPU machine needs into ``opts.out`` (replaced as a whole); the
    packages packed. A dry run only says what it would pack."""
    have = read_have(opts.have) if opts.have is not None else {}
    need = to_pack(installed(), have, opts.carry)
    print(f"{len(need)} packages to pack for Python {opts.python}: "
          + ", ".join(f"{n}=={v}" for n, v in need.items()))  # fmt: skip
    if not need:
        print("nothing to pack: the GPU machine has every package; run bench/gpu_check.py there as it is")
    if dry_run or not need:
        return need
    try:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(opts.out) as new:  # replaced as a whole, the umask followed
            digest, parts = _write(new, need, opts)
    except (PermissionError, NotADirectoryError, FileExistsError) as exc:
        raise BundleError(f"--out {opts.out}: cannot write there ({exc}); choose a writable folder") from exc
    except DiskFull as exc:  # the project's words for it: the folder, how to see the room, the fix
        raise BundleError(f"--out {opts.out}: {exc}; the previous bundle, if any, is unchanged", 1) from exc
    except OSError as exc:
        raise BundleError(
            f"--out {opts.out}: writing the bundle failed ({exc}); the previous bundle, if any, is unchanged",
            1,
        ) from exc
    run = f"bash {shlex.quote(str(opts.out))}/run.sh RESULTS"
    print(f"wrote {opts.out}: {len(parts)} parts of at most {opts.part_mib:g} MiB and run.sh "
          f"(sha256 {digest[:12]}…); on the GPU machine, from the repository root: {run}")  # fmt: skip
    return need


def _write(new: Path, need: dict[str, str], opts: Options) -> tuple[str, list[Path]]:
    """The bundle's files in the folder ``new``: the parts, ``wheels.txt`` and ``run.sh``."""
    wheels = fetch(need, opts.python, new / "wheels")
    listed = "".join(f"{w.name}\t{w.stat().st_size}\n" for w in wheels)
    digest, parts = pack(wheels, new, int(opts.part_mib * 2**20))
    shutil.rmtree(new / "wheels")
    (new / "wheels.txt").write_text(f"# wheel\tbytes; wheels.tar sha256 {digest}\n{listed}", encoding="utf-8")
    script = new / "run.sh"
    script.write_text(run_script(digest, len(parts), opts), encoding="utf-8")
    script.chmod(script.stat().st_mode | 0o111)
    return digest, parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the bundle's folder (replaced)")
    ap.add_argument("--have", type=Path, help="the GPU machine's packages (pip list --format=freeze there)")
    ap.add_argument(
        "--carry", nargs="*", default=list(CARRY), help="bare names in --have packed all the same"
    )
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python, major.minor (default 3.12)")
    ap.add_argument("--part-mib", type=float, default=58.0, help="largest part, MiB (default 58)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be packed; fetch nothing")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        ap.error(f"--python {args.python!r}: give the GPU machine's Python as major.minor, e.g. 3.12")
    if not args.part_mib > 0:
        ap.error(f"--part-mib {args.part_mib:g}: give a size above 0 MiB")
    opts = Options(
        out=args.out, have=args.have, carry=tuple(args.carry), python=args.python, part_mib=args.part_mib
    )
    try:
        bundle(opts, dry_run=args.dry_run)
    except BundleError as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gpu_bundle: interrupted; the previous bundle, if any, is unchanged", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
