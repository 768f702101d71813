"""``coupling-book``: run the notebooks, build the book, list what exists, manage the model zoo.

coupling-book list
coupling-book run [NOTEBOOK ...] --profile smoke|default|paper [-p key=value ...] [--jobs N]
coupling-book build [--executed DIR] [--out DIR] [--no-strict] [--allow-unexecuted] [--edition student]
              [--printable]
coupling-book kit [--out FILE] [--edition student]
coupling-book zoo list | zoo prepare NAME ... [--jobs N]
coupling-book sweep NOTEBOOK --profile P [-p key=value ...] --executor local|slurm [--partition ...]
              [--gpus-per-job N] [--time T] [--max-parallel N] [--dry-run] | sweep [NOTEBOOK] --status
coupling-book measure MODEL [MODEL ...] [--revision R ...] [--prompts FILE] [--k K ...] [--executor ...]
              --out DIR
"""

from __future__ import annotations

import argparse
import sys
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
    from coupling_utils.pipeline.execution import parse_override, run_notebooks

    try:
        overrides = dict(parse_override(o) for o in args.param)
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
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="show notebooks, profiles and parameters")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("run", help="execute notebooks through papermill into _build/notebooks/")
    p.add_argument("notebooks", nargs="*", help="notebook names or prefixes (default: all), e.g. f00 f01")
    p.add_argument("--profile", default="default", help="parameter profile: smoke, default or paper")
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
        help="also write the whole book on one page, OUT/print/index.html, to print or save as PDF",
    )
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "kit", help="write the lab kit zip: the chapter notebooks, a wheel, the data, a README"
    )
    p.add_argument("--out", help="the zip to write (default: _build/coupling-lab-kit.zip)")
    _edition_option(p)
    p.set_defaults(func=_cmd_kit)

    from coupling_utils.pipeline.cli_sweep import add_sweep_commands
    from coupling_utils.pipeline.cli_zoo import add_zoo_commands

    add_zoo_commands(sub)
    add_sweep_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
