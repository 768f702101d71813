"""Executing the book's notebooks with papermill, under a parameter profile.

Notebooks are jupytext MyST files ``notebooks/fNN_<slug>.md``; profiles are parameter files
``notebooks/profiles/<profile>/fNN_<slug>.yaml``. A run converts a notebook to ``.ipynb``,
checks the profile and overrides against its ``parameters`` cell, executes it with papermill and
writes ``<output_dir>/fNN_<slug>.ipynb`` atomically (a failed run writes ``.failed.ipynb`` instead,
so the book never shows a half-run notebook).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coupling_utils.chapters import NAMES as CHAPTERS
from coupling_utils.chapters import check_parameters
from coupling_utils.chapters.checks import ParameterError
from coupling_utils.files import (
    NO_ROOM,
    DiskFull,
    atomic_write_text,
    cache_dir,
    cache_root,
    naming_the_folder,
    no_room,
    no_room_code,
    read_json,
    yaml_problem,
)
from coupling_utils.pipeline.params import check_overrides, notebook_parameters
from coupling_utils.provenance import code_fingerprint

__all__ = [
    "RootError",
    "repo_root",
    "notebook_paths",
    "find_notebooks",
    "profiles",
    "profile_values",
    "RunResult",
    "run_notebook",
    "run_notebooks",
    "embedded_models",
]

NOTEBOOK_PATTERN = re.compile(r"f\d\d_[a-z0-9_]+\.md")

# The kernel's environment: no progress bars or widget warnings in the book's outputs. OpenMP's
# wait policy is left at its default: OMP_WAIT_POLICY=PASSIVE, set here before, made the chapters'
# measurements 1.1 to 1.5 times slower (bench/bench_wait_policy.py, data/benchmarks/wait_policy.csv).
KERNEL_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore:IProgress not found",
}


@contextlib.contextmanager
def _kernel_env(extra: Mapping[str, str] | None = None) -> Iterator[None]:
    """Set the kernel's environment (values the user already set win), restore it afterwards."""
    wanted = {**KERNEL_ENV, **(extra or {})}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update({key: os.environ.get(key, value) for key, value in wanted.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class RootError(ValueError):
    """``COUPLING_BOOK_ROOT`` (or the install) names no clone of the book: a configuration error."""


def repo_root() -> Path:
    """The project checkout this package was installed from (editable install), or
    ``$COUPLING_BOOK_ROOT`` when it is set (an empty value counts as unset)."""
    installed = Path(__file__).resolve().parents[2]
    given = os.environ.get("COUPLING_BOOK_ROOT", "")
    root = Path(given) if given else installed
    if (root / "notebooks").is_dir():
        return root
    if given:
        fallback = (
            f"or unset it to use {installed}"
            if (installed / "notebooks").is_dir()
            else "or unset it and install the package from a clone with `pip install -e .`"
        )
        raise RootError(
            f"COUPLING_BOOK_ROOT={given!r} has no notebooks/ folder: set COUPLING_BOOK_ROOT to a clone "
            f"of the coupling book (the folder holding notebooks/ and _toc.yml), {fallback}"
        )
    raise RootError(
        f"no notebooks/ folder under {root}, where this package is installed from: install it from a "
        "clone with `pip install -e .`, or set COUPLING_BOOK_ROOT to the clone"
    )


def notebook_paths(root: Path | None = None) -> list[Path]:
    """All finding notebooks, in order."""
    root = root or repo_root()
    return sorted(p for p in (root / "notebooks").glob("f*.md") if NOTEBOOK_PATTERN.fullmatch(p.name))


def find_notebooks(names: Iterable[str] = (), root: Path | None = None) -> list[Path]:
    """Notebooks matching each name by stem or prefix (``f00`` or ``f00_coupling_metric``)."""
    paths = notebook_paths(root)
    names = list(names)
    if not names:
        return paths
    found = []
    for name in names:
        stem = Path(name).stem
        hits = [p for p in paths if p.stem == stem or p.stem.startswith(stem + "_") or p.stem == stem]
        if not hits:
            raise ParameterError(f"no notebook named {name!r}; available: {', '.join(p.stem for p in paths)}")
        found.extend(h for h in hits if h not in found)
    return found


def profiles(root: Path | None = None) -> list[str]:
    root = root or repo_root()
    return sorted(p.name for p in (root / "notebooks" / "profiles").iterdir() if p.is_dir())


def profile_values(notebook: Path, profile: str) -> dict[str, Any]:
    """The parameter values a profile sets for a notebook (empty if the profile has no file)."""
    root = notebook.parent
    available = profiles(root.parent)
    if profile not in available:
        raise ParameterError(f"unknown profile {profile!r}; available: {', '.join(available)}")
    path = root / "profiles" / profile / f"{notebook.stem}.yaml"
    if not path.exists():
        raise ParameterError(f"profile {profile!r} has no parameter file for {notebook.stem} ({path})")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8-sig")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        where, what = yaml_problem(exc)
        raise ParameterError(
            f"{path}: the parameter file of profile {profile!r} cannot be read{where} ({what}); "
            "write it as UTF-8 YAML, one `name: value` per line"
        ) from None
    if not isinstance(values, dict):
        raise ParameterError(f"{path}: a parameter file must be a mapping of name: value")
    return values


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as YAML (``k=5`` -> 5, ``models=[a, b]`` -> list)."""
    if "=" not in text:
        raise ParameterError(f"bad parameter override {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ParameterError(f"bad value for parameter {key!r}: {exc}") from None
    return key.strip(), value


def parse_overrides(texts) -> dict[str, Any]:
    """``-p`` overrides (see :func:`parse_override`) as a mapping; a name given twice is refused."""
    out: dict[str, Any] = {}
    for text in texts:
        key, value = parse_override(text)
        if key in out:
            raise ParameterError(
                f"parameter {key!r} is given twice (-p {key}={out[key]!r} and -p {text}); "
                "give each parameter once"
            )
        out[key] = value
    return out


def add_override_option(parser) -> None:
    """Add ``-p/--param KEY=VALUE`` (parsed by :func:`parse_override`) to an argparse parser:
    one definition for ``coupling-book run`` and ``coupling-book sweep``."""
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one parameter (value read as YAML; a scalar given to a list parameter "
        "becomes a one-element list); repeatable",
    )


@dataclass
class RunResult:
    notebook: str
    status: str  # "ok" | "failed"
    seconds: float
    output: str
    error: str = ""
    parameters: dict = field(default_factory=dict)
    finished: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    code: str = field(
        default_factory=lambda: code_fingerprint()["fingerprint"]
    )  # the code behind its numbers

    @property
    def ran(self) -> bool:
        """Whether the notebook was executed (False: its parameters were refused first)."""
        return bool(self.output)

    @property
    def bad_input(self) -> bool:
        """Whether it failed on bad input: refused parameters, or a run stopped only by a parameter
        out of range for its model or a model that is not there (:func:`bad_input_error`)."""
        return self.status != "ok" and (not self.ran or bad_input_error(self.error))

    def line(self) -> str:
        tail = f"  {self.error}" if self.error else ""
        return f"{self.notebook:<28} {self.status:<7} {self.seconds:7.1f}s{tail}".replace("\n", "\n    ")


# Errors that mean the input was wrong (exit 2); a notebook's NotMeasured lists its failed jobs as
# "missing <job>: <Error>: <message>" lines (measurement.loop.Collected.report).
BAD_INPUT_ERRORS = frozenset({"ParameterError", "ModelNotFoundError", "MissingDependencyError"})
ERROR_LINES = 12  # of a failed cell's error shown and recorded; the notebook has the rest
_MISSING = re.compile(r"missing .*?: ([A-Za-z_]\w*): ")


def bad_input_error(error: str) -> bool:
    """Whether a failed run's error (:func:`_cell_error`) is bad input and nothing else."""
    name, _, rest = error.partition(":")
    if name in BAD_INPUT_ERRORS:
        return True
    lines = rest.splitlines()[1:]
    causes = [m[1] if m else "" for m in (_MISSING.match(x) for x in lines if x.startswith("missing "))]
    causes += [n for x in lines if x.startswith("... and ") for n in re.findall(r"(\w+) ×\d+", x)]
    return name == "NotMeasured" and bool(causes) and all(c in BAD_INPUT_ERRORS for c in causes)


def _root_cause(exc: BaseException) -> str:
    """``Name: message`` of the exception at the root of an explicit chain (``raise ... from``);
    "" when there is none. A kernel's error carries its chain only in its traceback's text."""
    if getattr(exc, "traceback", None) and hasattr(exc, "ename"):
        parts = [re.sub(r"\x1b\[[0-9;]*m", "", str(t)).strip() for t in exc.traceback]
        marks = [i for i, t in enumerate(parts) if t.startswith(("The above exception", "During handling"))]
        if marks and marks[0] > 0 and "direct cause" in parts[marks[0]]:
            return parts[marks[0] - 1].splitlines()[-1] if parts[marks[0] - 1] else ""
        return ""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    return "" if root is exc else f"{type(root).__name__}: {root}"


def _cell_error(exc: BaseException, where: Path | str = "") -> str:
    """The failing cell's exception ``Name: message``, with the root cause of a chain on the next
    line; past :data:`ERROR_LINES` lines, a pointer to ``where`` (the failed notebook) instead."""
    ename = getattr(exc, "ename", type(exc).__name__)
    evalue = getattr(exc, "evalue", str(exc))
    lines = (f"{ename}: {evalue}".strip() if evalue else ename).splitlines()
    cause = _root_cause(exc)
    if cause and cause not in "\n".join(lines):
        lines.insert(1, f"(caused by {cause})")
    if len(lines) > ERROR_LINES:  # the rest as a count of the failed jobs' errors
        rest = Counter(m[1] for m in map(_MISSING.match, lines[ERROR_LINES - 1 :]) if m)
        names = f" ({', '.join(f'{n} ×{c}' for n, c in rest.items())})" if rest else ""
        more = f"... and {len(lines) - ERROR_LINES + 1} more lines{names}" + (
            f", in {where}" if where else ""
        )
        lines = lines[: ERROR_LINES - 1] + [more]
    return "\n".join(lines)


def _refused(notebook: Path, start: float, exc: ParameterError) -> RunResult:
    """The result of a notebook whose parameters were refused (nothing ran, no output)."""
    return RunResult(notebook.stem, "failed", time.perf_counter() - start, "", f"ParameterError: {exc}")


def _checked_values(notebook: Path, profile: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The profile's values and the overrides, checked by name, type and (for a chapter) value;
    raises :class:`ParameterError`."""
    declared = notebook_parameters(notebook)
    values = check_overrides(
        declared, {**profile_values(notebook, profile), **(overrides or {})}, where=notebook.stem
    )
    if notebook.stem in CHAPTERS:  # the chapter's own value checks, before a kernel starts
        check_parameters(notebook.stem, {**{n: p.default for n, p in declared.items()}, **values})
    return values


def run_notebook(
    notebook: Path,
    profile: str,
    overrides: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    *,
    kernel: str = "python3",
) -> RunResult:
    """Execute one notebook under a profile (plus overrides) into ``output_dir``."""
    import jupytext

    root = notebook.parent.parent
    output_dir = Path(output_dir or root / "_build" / "notebooks")
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / f"{notebook.stem}.ipynb"
    failed = output_dir / f"{notebook.stem}.failed.ipynb"
    start = time.perf_counter()
    try:
        values = _checked_values(notebook, profile, overrides)
    except ParameterError as exc:
        return _refused(notebook, start, exc)
    source = output_dir / f".{notebook.stem}.source.ipynb"
    running = output_dir / f".{notebook.stem}.running.ipynb"
    error = ""
    try:
        with naming_the_folder(output_dir):
            jupytext.write(jupytext.read(notebook), source)
        with _kernel_env():
            _papermill(source, running, values, kernel, root)
        os.replace(running, out)
        failed.unlink(missing_ok=True)
    except Exception as exc:  # papermill.PapermillExecutionError and kernel failures
        _stop_without_room(exc, running, failed, output_dir)
        error = _cell_error(exc, failed if running.exists() else "")
        if running.exists():
            os.replace(running, failed)
    except BaseException:  # Ctrl-C: no half-run notebook left behind, hidden or not
        running.unlink(missing_ok=True)
        raise
    finally:
        source.unlink(missing_ok=True)
    status = "failed" if error else "ok"
    return RunResult(
        notebook.stem, status, time.perf_counter() - start, str(out if not error else failed), error, values
    )


def _stop_without_room(exc: Exception, running: Path, failed: Path, output_dir: Path) -> None:
    """Raise :class:`~coupling_utils.files.DiskFull` when a run stopped on a full disk or quota (in
    the kernel, or writing the executed notebook): the other notebooks would stop on it too. The
    notebook as far as it ran is kept as ``failed`` only when it was written whole."""
    found = no_room(exc)
    if found is None:
        return
    if running.exists():
        try:
            json.loads(running.read_bytes())
            os.replace(running, failed)
        except ValueError:  # cut short by the full disk: nothing half-written is kept
            running.unlink()
    if isinstance(found, DiskFull):
        raise found from exc
    if isinstance(found, OSError) and found.errno in NO_ROOM:  # here: papermill saving the notebook
        raise DiskFull(output_dir, found.errno) from exc
    # in the kernel: where its message says, else either place a notebook writes
    raise DiskFull.said(str(found)) or DiskFull(output_dir, no_room_code(found), cache_root()) from exc


def _papermill(source: Path, running: Path, values: dict[str, Any], kernel: str, root: Path) -> None:
    import papermill

    with _kernel_sockets(kernel) as manager:
        papermill.execute_notebook(
            str(source),
            str(running),
            parameters=values,
            kernel_name=kernel,
            cwd=str(root),
            progress_bar=False,
            log_output=False,
            report_mode=False,
            **manager,
        )


@contextlib.contextmanager
def _kernel_sockets(kernel: str) -> Iterator[dict[str, Any]]:
    """A kernel manager whose kernel listens on Unix sockets in a private folder, removed afterwards.

    Jupyter's default TCP transport picks free ports, releases them and lets the kernel bind them;
    a notebook started beside it can take one in between, and the kernel dies at start ("Address
    already in use", then "Kernel died before replying to kernel_info": seen in CI with two
    notebooks at once). Sockets named inside a folder of our own cannot collide. Windows has no
    Unix sockets there, and a folder path too long for one (about 100 bytes) keeps TCP too.

    The kernel is shut down on the way out: nbclient leaves alone a kernel whose manager it was
    given, so it would otherwise live on, holding the notebook's memory, until this process ended.
    """
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="kernel-")
    address = os.path.join(folder, "k")
    try:
        if os.name == "nt" or len(os.fsencode(address)) > 96:
            yield {}
        else:
            from jupyter_client.manager import KernelManager

            manager = KernelManager(kernel_name=kernel, transport="ipc", ip=address)
            try:
                yield {"km": manager}
            finally:
                if manager.has_kernel:  # asks it to stop, kills it after a few seconds, reaps it
                    with contextlib.suppress(Exception):  # the run's own outcome is what to report
                        manager.shutdown_kernel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def embedded_models(values: Mapping[str, Any]) -> list[str]:
    """The embedded models (``"embedded:<name>"`` strings, also inside lists) among parameter values."""
    found: list[str] = []

    def visit(v):
        if isinstance(v, str) and v.startswith("embedded:"):
            found.append(v.split("/", 1)[0])
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    for v in values.values():
        visit(v)
    return list(dict.fromkeys(found))


def _planned_values(notebook: Path, profile: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults, then the profile, then overrides: what a run of the notebook will use."""
    declared = notebook_parameters(notebook)
    values = check_overrides(
        declared, {**profile_values(notebook, profile), **(overrides or {})}, where=notebook.stem
    )
    return {**{name: p.default for name, p in declared.items()}, **values}


def _check_all(notebooks: list[Path], profile: str, overrides, echo) -> dict[Path, dict[str, Any]]:
    """Every notebook's values (defaults filled in), checked before any runs; each refusal is
    echoed as its result line, and then none runs (:class:`ParameterError`)."""
    if notebooks and profile not in (available := profiles(notebooks[0].parent.parent)):
        raise ParameterError(f"unknown profile {profile!r}; available: {', '.join(available)}")
    planned, refused = {}, []
    for nb in notebooks:
        start = time.perf_counter()
        try:
            _checked_values(nb, profile, overrides)
            planned[nb] = _planned_values(nb, profile, overrides)
        except ParameterError as exc:
            refused.append(_refused(nb, start, exc))
            echo(refused[-1].line())
    if refused:  # the reasons again, here: the lines above went to stdout, which may be elsewhere
        which = f"{len(refused)} of {len(notebooks)} notebooks" if len(notebooks) > 1 else "the notebook"
        said = [r.error.removeprefix("ParameterError: ") for r in refused]
        reasons = "".join(
            f"\n  {e}" if e.startswith(r.notebook) else f"\n  {r.notebook}: {e}"
            for r, e in zip(refused, said)
        )
        raise ParameterError(
            f"nothing was run: {which} refused the parameters:{reasons}\nfix the -p overrides or the "
            "--profile and rerun"
        )
    return planned


def run_notebooks(
    names: Iterable[str],
    profile: str,
    overrides: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    *,
    jobs: int = 1,
    echo=print,
) -> list[RunResult]:
    """Run several notebooks; a failure is reported and the others still run. Every notebook's
    parameters are checked first: if any is refused, none runs (:class:`ParameterError`).

    With ``jobs > 1`` the embedded models the notebooks name are built first, ``jobs`` at a time
    (:func:`coupling_utils.models.zoo.prepare_many`), then up to ``jobs`` notebooks run at once (longest
    first, by their last recorded time), each kernel with ``cpu_count // jobs`` threads.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ParameterError(f"jobs must be a positive integer, got {jobs!r}")
    notebooks = find_notebooks(names)
    output_dir = Path(output_dir or repo_root() / "_build" / "notebooks")
    manifest = output_dir / "runs.json"
    previous = read_json(manifest, "record of notebook runs") or {}  # a corrupt one is set aside
    planned = _check_all(notebooks, profile, overrides, echo)
    cache_dir()  # a cache that cannot be made (a file in its place) is refused before any kernel
    output_dir.mkdir(parents=True, exist_ok=True)  # after the checks: a refused run creates nothing
    if jobs > 1:  # one at a time, each notebook builds what it needs on first use
        models = [m for values in planned.values() for m in embedded_models(values)]
        if models:
            from coupling_utils.models import zoo

            zoo.prepare_many(list(dict.fromkeys(models)), jobs=jobs, echo=echo)
    order = sorted(notebooks, key=lambda nb: -float(previous.get(nb.stem, {}).get("seconds", 0) or 0))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    extra = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if jobs > 1 else {}

    lock = threading.Lock()

    def one(nb: Path) -> RunResult:
        result = run_notebook(nb, profile, overrides, output_dir)
        echo(result.line())
        if not result.ran:  # refused (a profile file changed since the check): no record
            return result
        with lock:  # each notebook is recorded when it ends, with its own finish time
            runs = read_json(manifest, "record of notebook runs") or {}
            runs[result.notebook] = {**asdict(result), "profile": profile}
            atomic_write_text(manifest, json.dumps(runs, indent=2, default=str))
        return result

    with _kernel_env(extra):
        if jobs == 1:
            done = {nb: one(nb) for nb in notebooks}
        else:
            with ThreadPoolExecutor(max_workers=min(jobs, len(order))) as pool:
                done = dict(zip(order, pool.map(one, order)))
    return [done[nb] for nb in notebooks]
