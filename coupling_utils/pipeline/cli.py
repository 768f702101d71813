"""``coupling-book``: run the notebooks, build the book, list what exists, manage the model zoo.

coupling-book list
coupling-book run [NOTEBOOK ...] --profile smoke|default|laptop|paper [-p key=value ...] [--jobs N]
coupling-book build [--executed DIR] [--out DIR] [--work DIR] [--no-strict] [--allow-unexecuted]
              [--edition student] [--printable]
coupling-book kit [--out FILE] [--edition student]
coupling-book zoo list | zoo prepare NAME ... [--jobs N]
coupling-book sweep NOTEBOOK --profile P [-p key=value ...] --executor local|slurm [--partition ...]
              [--gpus-per-job N] [--time T] [--max-parallel N] [--dry-run] | sweep [NOTEBOOK] --status
coupling-book measure MODEL [MODEL ...] [--revision R ...] [--prompts FILE] [--k K ...] [--executor ...]
              --out DIR
coupling-book k-sensitivity [--out FILE] [--n-prompts N] [--n-images N]

Every command ends in its result or in one paragraph that names the input, the problem and the fix:
exit status 2 for bad input, 1 for a failed run (a full disk or quota among them: the folder, what
was kept and the fix), 130 after Ctrl-C. ``--debug`` (anywhere on the line) or ``COUPLING_DEBUG=1``
shows Python's traceback instead.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import traceback
from pathlib import Path

from coupling_utils.chapters.checks import ParameterError
from coupling_utils.pipeline.cli_paths import check_target, path_option

__all__ = ["main"]


def _cmd_list(args) -> int:
    from coupling_utils.pipeline.execution import notebook_paths, profiles, repo_root
    from coupling_utils.pipeline.params import notebook_parameters

    root = repo_root()
    print(f"profiles: {', '.join(profiles(root))}")
    for nb in notebook_paths(root):
        have = [
            p for p in profiles(root) if (root / "notebooks" / "profiles" / p / f"{nb.stem}.yaml").exists()
        ]
        print(f"\n{nb.stem}  (profiles: {', '.join(have) or 'none'})")
        try:
            params = notebook_parameters(nb)
        except ParameterError as exc:
            print(f"  ! {exc}")
            continue
        for p in params.values():
            print(f"  {p.name} = {p.default!r}  # {p.comment}")
    return 0


def _cmd_run(args) -> int:
    from coupling_utils.pipeline.execution import parse_overrides, run_notebooks

    try:
        overrides = parse_overrides(args.param)
        out = check_target(args.output_dir, "--output-dir", "folder") if args.output_dir else None
        results = run_notebooks(args.notebooks, args.profile, overrides, out, jobs=args.jobs)
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in results if r.status != "ok"]
    print(f"{len(results) - len(failed)} ok, {len(failed)} failed")
    if failed and all(r.bad_input for r in failed):
        print(
            "error: the failures above are bad input (a parameter out of range for its model, or a "
            "model that is not there): fix the -p overrides or the --profile and rerun",
            file=sys.stderr,
        )
        return 2
    return 1 if failed else 0


def _cmd_build(args) -> int:
    from coupling_utils.pipeline.book import BookError, BuildOptions, build_book
    from coupling_utils.pipeline.execution import repo_root
    from coupling_utils.pipeline.pages import BookInputError

    executed = args.executed.absolute() if args.executed else None
    if executed and not executed.is_dir():
        raise ParameterError(
            f"--executed {executed} is {'a file' if executed.exists() else 'not there'}: give the folder "
            "of executed notebooks, the --output-dir of `coupling-book run`"
        )
    out = check_target(args.out.absolute(), "--out", "folder") if args.out else None
    work = check_target(args.work.absolute(), "--work", "folder") if args.work else None
    if work is None:  # the default staging folder, <repo>/_build: say so if it cannot be written
        check_target(repo_root() / "_build", "--work (default)", "folder")
    options = BuildOptions(
        work=work,
        strict=args.strict,
        allow_unexecuted=args.allow_unexecuted,
        edition=args.edition,
        printable=args.printable,
    )
    try:
        book = build_book(root=repo_root(), executed=executed, out=out, options=options)
    except BookError as exc:
        unrun = args.executed and "have not been executed" in str(exc)
        note = (
            f"\n(to run them into --executed, give those commands --output-dir {executed})" if unrun else ""
        )
        print(f"error: {exc}{note}", file=sys.stderr)
        return 2 if isinstance(exc, BookInputError) else 1
    print(f"book written to {book / 'index.html'}")
    return 0


def _cmd_kit(args) -> int:
    from coupling_utils.pipeline.book import BookError
    from coupling_utils.pipeline.execution import repo_root
    from coupling_utils.pipeline.kit import KIT_NAME, build_kit
    from coupling_utils.pipeline.pages import BookInputError

    root = repo_root()
    out = check_target(args.out, "--out", "file", f"{KIT_NAME}.zip") if args.out else None
    try:
        path = build_kit(root, out or root / "_build" / f"{KIT_NAME}.zip", args.edition)
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, BookInputError) else 1
    print(f"lab kit ({args.edition} edition) written to {path}")
    return 0


def _edition_option(p) -> None:
    from coupling_utils.pipeline.kit import EDITIONS

    p.add_argument(
        "--edition",
        choices=EDITIONS,
        default="teacher",
        help="teacher (default): each exercise's solution in a drop-down; student: no solutions "
        "in the pages, the downloadable notebooks or the lab kit",
    )


# The commands whose options import torch (they list the engine's choices), with their one-line
# help: their parsers are built only for their own command line, so that every other command and
# `--help` start at once. tests/test_cli_errors.py keeps these lines equal to the parsers' own.
HEAVY = {
    "k-sensitivity": "measure the K/d sensitivity curve (data/k_sensitivity.csv) and print the chosen K/d",
    "sweep": "run a notebook's measurements as jobs (SLURM job array or this machine), resumable",
    "measure": "measure any models (hub ids, local directories, .gguf files) into tidy tables",
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; given the command line, the heavy commands (:data:`HEAVY`)
    it does not name are only listed."""
    from coupling_utils.pipeline.execution import add_override_option

    parser = argparse.ArgumentParser(prog="coupling-book", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--debug", action="store_true", help="show Python's traceback on an error (also: COUPLING_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="show notebooks, profiles and parameters")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("run", help="execute notebooks through papermill into _build/notebooks/")
    p.add_argument("notebooks", nargs="*", help="notebook names or prefixes (default: all), e.g. f00 f01")
    p.add_argument("--profile", default="default", help="parameter profile: smoke, default, laptop or paper")
    add_override_option(p)
    p.add_argument(
        "--output-dir", type=path_option, help="where executed notebooks go (default: _build/notebooks)"
    )
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="build embedded models first and run notebooks N at a time (default 1; "
        "`make book` uses 2). Keep 1 for GPU runs that each need the whole device",
    )
    p.set_defaults(func=_cmd_run)

    _add_book_commands(sub)
    from coupling_utils.pipeline import cli_zoo

    cli_zoo.add_zoo_commands(sub)
    _add_heavy_commands(sub, argv)
    return parser


def _add_book_commands(sub) -> None:
    """``build`` and ``kit``."""
    p = sub.add_parser("build", help="render the book from executed notebooks (execution off)")
    p.add_argument(
        "--executed", type=path_option, help="folder of executed notebooks (default: _build/notebooks)"
    )
    p.add_argument("--out", type=path_option, help="HTML output folder (default: _build/html)")
    p.add_argument(
        "--work",
        type=path_option,
        help="staging folder (WORK/src, WORK/jb; default: _build): give each of two builds at once its own",
    )
    p.add_argument(
        "--allow-unexecuted",
        action="store_true",
        help="leave out notebooks that have no executed copy instead of failing",
    )
    p.add_argument(
        "--no-strict", dest="strict", action="store_false", help="do not turn Sphinx warnings into errors"
    )
    _edition_option(p)
    p.add_argument(
        "--printable",
        action="store_true",
        help="also write the whole book on one page, OUT/print/index.html, and, when Chromium is "
        "installed (make browser), its PDF, OUT/print/coupling-book.pdf",
    )
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "kit", help="write the lab kit zip: the chapter notebooks, a wheel, the data, a README"
    )
    p.add_argument("--out", type=path_option, help="the zip to write (default: _build/coupling-lab-kit.zip)")
    _edition_option(p)
    p.set_defaults(func=_cmd_kit)


def _add_heavy_commands(sub, argv: list[str] | None) -> None:
    """The :data:`HEAVY` commands: built when ``argv`` is None or names them, else only listed."""
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if argv is None or named == "k-sensitivity":
        from coupling_utils.pipeline import k_sensitivity

        k_sensitivity.add_k_sensitivity_command(sub)
    else:
        sub.add_parser("k-sensitivity", help=HEAVY["k-sensitivity"])
    if argv is None or named in ("sweep", "measure"):
        from coupling_utils.pipeline import cli_sweep

        cli_sweep.add_sweep_commands(sub)
    else:
        sub.add_parser("sweep", help=HEAVY["sweep"])
        sub.add_parser("measure", help=HEAVY["measure"])


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value: given twice, it is refused (not silently the last one)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            parser.error(f"{option_string} is given twice; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


def _options_once(parser: argparse.ArgumentParser) -> None:
    """Make every single-valued option of ``parser`` and its subcommands refuse a repeat."""
    for action in parser._actions:
        if type(action) is argparse._StoreAction and action.option_strings:
            action.__class__ = _StoreOnce
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _options_once(sub)


def _known_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(bad input: exit 2, failed run: exit 1): the errors whose message already says the fix."""
    from coupling_utils.files import CacheError
    from coupling_utils.models.loading import MissingDependencyError, ModelNotFoundError
    from coupling_utils.models.zoo import BuildFailed, ZooError
    from coupling_utils.pipeline.execution import RootError
    from coupling_utils.pipeline.measure_models import MeasureError
    from coupling_utils.pipeline.pages import BookError, BookInputError
    from coupling_utils.pipeline.status import StatusError
    from coupling_utils.pipeline.sweep import SweepError
    from coupling_utils.schemas import TableError

    bad = (ParameterError, MeasureError, SweepError, ZooError, ModelNotFoundError, MissingDependencyError)
    bad += (StatusError, TableError, RootError, BookInputError, CacheError)
    return bad, (BookError, BuildFailed)


def _log_traceback(exc: BaseException) -> Path | None:
    """Write the traceback of an unexpected error to ``<cache>/logs/`` (whole or not at all: a full
    disk leaves no empty log behind); None if that fails."""
    try:
        from coupling_utils.files import atomic_write_text, cache_dir

        path = cache_dir("logs") / f"coupling-book-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
        text = f"coupling-book {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(exc))
        # a path that is not UTF-8 (surrogates) is written as its escapes, not left out with the log
        atomic_write_text(path, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        return path
    except Exception:
        return None


def _no_room(exc: BaseException, argv: list[str]) -> str | None:
    """The paragraph for a write that found the disk or the quota full (:class:`~coupling_utils.files.
    DiskFull`, or ENOSPC/EDQUOT anywhere in the error's chain): where, what is kept, the fix; None
    for any other error. Where the error does not say which folder, the command's output folder
    (its option's value) and the cache are named."""
    from coupling_utils.files import DiskFull, cache_root, error_chain, no_room, no_room_code

    found = no_room(exc)
    if found is None:
        return None
    named = [e for e in error_chain(exc) if isinstance(e, DiskFull)]
    full = named[0] if named else DiskFull.said(str(found))
    if full is None:
        file = getattr(found, "filename", None)
        places = [Path(file).parent] if file else [*_output_places(argv), cache_root()]
        full = DiskFull(places[0], no_room_code(found), *places[1:])
    command = next((a for a in argv if not a.startswith("-")), "")
    kept = INTERRUPTED.get(command, STORED).replace("to continue", "to continue once there is room")
    return f"error: {full}. {kept}"


# The options that name where a command writes; named when a full disk's error does not say where.
OUTPUT_OPTIONS = ("--out", "--output-dir", "--work")


def _output_places(argv: list[str]) -> list[Path]:
    """The folders the command line's output options name (a file's folder for a file)."""
    places = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in OUTPUT_OPTIONS:
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            path = Path(value).absolute()
            places.append(path if path.is_dir() or not path.suffix else path.parent)
    return places


def _explain(exc: Exception, argv: list[str] = ()) -> tuple[int, str]:
    """The exit status and the one paragraph a user sees for an error that reached the top."""
    if isinstance(exc, ParameterError):  # the common case, without the imports of the others
        return 2, f"error: {exc}"
    full = _no_room(exc, list(argv))
    if full:  # a failed run, not a bug: no traceback log (there would be no room for it either)
        return 1, full
    bad, failed = _known_errors()
    if isinstance(exc, bad):
        return 2, f"error: {exc}"
    if isinstance(exc, failed):
        return 1, f"error: {exc}"
    if isinstance(exc, OSError) and exc.filename:
        what = exc.strerror or type(exc).__name__
        return (
            1,
            f"error: {what}: {exc.filename}. Check that this path exists, is the kind expected "
            "and can be written.",
        )
    log = _log_traceback(exc)
    where = (
        f"the traceback is in {log} (or rerun with --debug, or COUPLING_DEBUG=1)"
        if log
        else "rerun with --debug (or COUPLING_DEBUG=1) to see the traceback"
    )
    return 1, (
        f"error: coupling-book stopped on an unexpected error ({type(exc).__name__}: {exc}). "
        f"This is likely a bug: {where}; please report it."
    )


# What is true after Ctrl-C, by command: a book or a kit replaces the previous one as a whole
# (atomically), so nothing of the interrupted one is kept; the other commands keep each piece
# they finished (an executed notebook, a measurement, a built model) and a rerun continues.
STORED = "What was finished is stored; rerun the same command to continue."
INTERRUPTED = {
    "build": "The book was not replaced: the previous one, if any, is kept as it was; rerun the same "
    "command to build it.",
    "kit": "The kit was not replaced: the previous one, if any, is kept as it was; rerun the same "
    "command to write it.",
    "list": "Nothing was written.",
}


def _names_as_given() -> None:
    """Print a file name whose bytes are not UTF-8 (Python keeps them as surrogates) as those bytes,
    as the shell gave them, instead of failing on it with a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):  # the process's own streams only (not a test's capture)
        if type(stream) is io.TextIOWrapper and stream.encoding.lower().replace("-", "") == "utf8":
            stream.reconfigure(errors="surrogateescape")


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors become messages and exit statuses (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _names_as_given()
    debug = "--debug" in argv or os.environ.get("COUPLING_DEBUG", "") not in ("", "0")
    try:  # Ctrl-C while the parser's imports load is an interrupt like any other
        argv = [a for a in argv if a != "--debug"]
        parser = build_parser(argv)
        _options_once(parser)
        args = parser.parse_args(argv)  # --help can meet a closed pipe
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is seen below and not at exit
        return status
    except KeyboardInterrupt:
        if debug:
            raise
        named = next((a for a in argv if not a.startswith("-")), "")
        print(f"\ninterrupted: stopped on Ctrl-C. {INTERRUPTED.get(named, STORED)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`coupling-book list | head`): stop quietly
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if debug:
            raise
        status, text = _explain(exc, argv)
        print(text, file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
