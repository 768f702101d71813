"""``coupling-book``: run the notebooks, build the book, list what exists, manage the model zoo.

coupling-book list
coupling-book run [NOTEBOOK ...] --profile smoke|default|laptop|paper [-p key=value ...] [--jobs N]
coupling-book build [--executed DIR] [--out DIR] [--no-strict] [--allow-unexecuted] [--edition student]
              [--printable]
coupling-book kit [--out FILE] [--edition student]
coupling-book zoo list | zoo prepare NAME ... [--jobs N]
coupling-book sweep NOTEBOOK --profile P [-p key=value ...] --executor local|slurm [--partition ...]
              [--gpus-per-job N] [--time T] [--max-parallel N] [--dry-run] | sweep [NOTEBOOK] --status
coupling-book measure MODEL [MODEL ...] [--revision R ...] [--prompts FILE] [--k K ...] [--executor ...]
              --out DIR
coupling-book k-sensitivity [--out FILE] [--n-prompts N] [--n-images N]

Every command ends in its result or in one paragraph that names the input, the problem and the fix:
exit status 2 for bad input, 1 for a failed run, 130 after Ctrl-C. ``--debug`` (anywhere on the
line) or ``COUPLING_DEBUG=1`` shows Python's traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from coupling_utils.chapters.checks import ParameterError

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
        results = run_notebooks(
            args.notebooks,
            args.profile,
            overrides,
            Path(args.output_dir) if args.output_dir else None,
            jobs=args.jobs,
        )
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in results if r.status != "ok"]
    print(f"{len(results) - len(failed)} ok, {len(failed)} failed")
    if failed and not any(r.ran for r in failed):
        return 2  # only refused parameters: bad input
    return 1 if failed else 0


def _cmd_build(args) -> int:
    from coupling_utils.pipeline.book import BookError, build_book
    from coupling_utils.pipeline.execution import repo_root

    root = repo_root()
    executed = Path(args.executed) if args.executed else root / "_build" / "notebooks"
    out = Path(args.out) if args.out else root / "_build" / "html"
    try:
        index = build_book(
            root=root,
            executed=executed,
            out=out,
            strict=args.strict,
            allow_unexecuted=args.allow_unexecuted,
            edition=args.edition,
            printable=args.printable,
        )
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"book written to {index}")
    return 0


def _cmd_kit(args) -> int:
    from coupling_utils.pipeline.book import BookError
    from coupling_utils.pipeline.execution import repo_root
    from coupling_utils.pipeline.kit import KIT_NAME, build_kit

    root = repo_root()
    out = Path(args.out) if args.out else root / "_build" / f"{KIT_NAME}.zip"
    try:
        path = build_kit(root, out, args.edition)
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
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


def build_parser() -> argparse.ArgumentParser:
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
    p.add_argument("--output-dir", help="where executed notebooks go (default: _build/notebooks)")
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="build embedded models first and run notebooks N at a time (default 1; "
        "`make book` uses 2). Keep 1 for GPU runs that each need the whole device",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("build", help="render the book from executed notebooks (execution off)")
    p.add_argument("--executed", help="folder of executed notebooks (default: _build/notebooks)")
    p.add_argument("--out", help="HTML output folder (default: _build/html)")
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
    p.add_argument("--out", help="the zip to write (default: _build/coupling-lab-kit.zip)")
    _edition_option(p)
    p.set_defaults(func=_cmd_kit)

    from coupling_utils.pipeline import cli_sweep, cli_zoo, k_sensitivity

    cli_zoo.add_zoo_commands(sub)
    k_sensitivity.add_k_sensitivity_command(sub)
    cli_sweep.add_sweep_commands(sub)
    return parser


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
    from coupling_utils.models.loading import MissingDependencyError, ModelNotFoundError
    from coupling_utils.models.zoo import ZooError
    from coupling_utils.pipeline.measure_models import MeasureError
    from coupling_utils.pipeline.pages import BookError
    from coupling_utils.pipeline.status import StatusError
    from coupling_utils.pipeline.sweep import SweepError
    from coupling_utils.schemas import TableError

    bad = (ParameterError, MeasureError, SweepError, ZooError, ModelNotFoundError, MissingDependencyError)
    return bad + (StatusError, TableError), (BookError,)


def _log_traceback(exc: BaseException) -> Path | None:
    """Write the traceback of an unexpected error to ``<cache>/logs/``; None if that fails."""
    try:
        from coupling_utils.files import cache_dir

        path = cache_dir("logs") / f"coupling-book-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
        path.write_text(
            f"coupling-book {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(exc))
        )
        return path
    except Exception:
        return None


def _explain(exc: Exception) -> tuple[int, str]:
    """The exit status and the one paragraph a user sees for an error that reached the top."""
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
    where = f"the traceback is in {log}" if log else "rerun with --debug to see the traceback"
    return 1, (
        f"error: coupling-book stopped on an unexpected error ({type(exc).__name__}: {exc}). "
        f"This is likely a bug: {where} (or rerun with --debug, or COUPLING_DEBUG=1); please report it."
    )


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors become messages and exit statuses (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("COUPLING_DEBUG", "") not in ("", "0")
    parser = build_parser()
    _options_once(parser)
    try:
        args = parser.parse_args([a for a in argv if a != "--debug"])  # --help can meet a closed pipe
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is seen below and not at exit
        return status
    except KeyboardInterrupt:
        if debug:
            raise
        print(
            "\ninterrupted: stopped on Ctrl-C. What was finished is stored; rerun the same command "
            "to continue.",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:  # the reader went away (`coupling-book list | head`): stop quietly
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if debug:
            raise
        status, text = _explain(exc)
        print(text, file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
