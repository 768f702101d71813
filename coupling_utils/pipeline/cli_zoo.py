"""``coupling-book zoo list`` and ``coupling-book zoo prepare NAME [--force]``.

``list`` shows every embedded model: its state (ready / missing / opt-in / not installed), what it
cost to build (seconds, size on disk) and its final metrics. ``prepare`` builds entries (one with
a progress bar; several with ``--jobs N`` builds at once), or finds them in the cache.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_zoo_commands", "run_zoo"]


def add_zoo_commands(subparsers) -> argparse.ArgumentParser:
    """Add the ``zoo`` command (``zoo list``, ``zoo prepare``) to an argparse subparsers object."""
    p = subparsers.add_parser(
        "zoo", help="the embedded models: list them, prepare one", description=__doc__.splitlines()[0]
    )
    zsub = p.add_subparsers(dest="zoo_command", required=True)
    pl = zsub.add_parser("list", help="show every embedded model, its state, cost and metrics")
    pl.add_argument("--json", action="store_true", help="print the table as JSON records")
    pl.add_argument("--long", action="store_true", help="also show licences and descriptions")
    pp = zsub.add_parser("prepare", help="build embedded models (or training runs) into the cache")
    pp.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        help="e.g. smollm2-135m, pythia-tiny, lm-family (the 'embedded:' prefix is optional)",
    )
    pp.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="builds at once (family members count separately); default 1",
    )
    pp.add_argument("--force", action="store_true", help="rebuild even if it is already in the cache")
    pp.add_argument(
        "--accept-gemma-terms",
        action="store_true",
        help="accept the Gemma Terms of Use (https://ai.google.dev/gemma/terms) for gemma3-270m",
    )
    p.set_defaults(func=run_zoo)
    return p


def _format_table(table, cols) -> str:
    """Left-aligned plain-text table (long text columns stay readable)."""
    cells = [list(cols)] + [
        ["" if v is None or v != v else str(v) for v in r] for r in table[cols].itertuples(index=False)
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _refused(zoo, name: str) -> bool:
    """Whether ``prepare_many`` refused ``name`` before building it (its terms not accepted, a
    package with its weights not installed: bad input, exit 2), rather than failed to build it."""
    try:
        entry, _ = zoo._split(name)
        zoo._check_opt_in(entry, None)
        entry.key()  # raises if a package with weights is not installed
    except zoo.ZooError:
        return True
    return False


def run_zoo(args) -> int:
    """Run ``zoo list`` / ``zoo prepare``; returns the exit status."""
    from coupling_utils.models import zoo

    if args.zoo_command == "list":
        return _list(zoo, args)
    if args.zoo_command == "prepare":
        return _prepare(zoo, args)
    print(f"error: unknown zoo command {args.zoo_command!r}", file=sys.stderr)
    return 2


def _list(zoo, args) -> int:
    """``zoo list``: the table of every entry (or JSON records)."""
    table = zoo.list_entries()
    if getattr(args, "json", False):
        print(table.to_json(orient="records", indent=1))
        return 0
    cols = ["name", "kind", "state", "seconds", "size_mb", "metrics", "expected_cost"]
    if getattr(args, "long", False):
        cols += ["licence", "description", "note"]
    print(_format_table(table, cols))
    print(f"\ncache: {zoo.cache_dir('zoo')}")
    return 0


def _not_built(name: str, cause: str) -> str:
    """The line for a build that failed: which entry, and the cause the library gave."""
    return (
        f"{name} could not be built: {cause.rstrip('.')}. Nothing half-built is left in the cache; "
        f"fix the cause and rerun `coupling-book zoo prepare {name}`."
    )


def _prepare(zoo, args) -> int:
    """``zoo prepare``: 0 when every entry is ready, 2 when one is refused (bad input: unknown,
    terms not accepted, package not installed), 1 when a build failed (a failed run)."""
    accept = bool(getattr(args, "accept_gemma_terms", False)) or None
    jobs = getattr(args, "jobs", 1)
    if jobs < 1:
        print(f"error: --jobs must be at least 1, got {jobs}", file=sys.stderr)
        return 2
    if len(args.names) > 1 or jobs > 1:
        if args.force or accept:
            print("error: --force and --accept-gemma-terms take one NAME (without --jobs)", file=sys.stderr)
            return 2
        return _prepare_many(zoo, args.names, jobs)
    name = args.names[0]
    try:
        path = zoo.prepare(name, force=args.force, progress=True, accept_terms=accept)
    except zoo.ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the build failed: say which and why (exit 1), keeping the cause for --debug
        raise zoo.BuildFailed(_not_built(name, f"{type(exc).__name__}: {exc}")) from exc
    man = zoo.manifest(name) or {}
    print(f"{name}: ready at {path}")
    if man:
        print(
            f"  built in {man.get('seconds')} s, {man.get('size_bytes', 0) / 2**20:.1f} MB on disk; "
            f"{zoo._fmt_metrics(man.get('metrics', {}))}"
        )
    return 0


def _prepare_many(zoo, names: list[str], jobs: int) -> int:
    """Several entries (or ``--jobs``): each one refused or failed is named with its cause."""
    try:
        status = zoo.prepare_many(names, jobs=jobs)
    except zoo.ZooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bad = {n: s for n, s in status.items() if s != "ready"}
    refused = {n: _refused(zoo, n) for n in bad}
    for n, s in bad.items():
        print(f"error: {n}: {s}" if refused[n] else f"error: {_not_built(n, s)}", file=sys.stderr)
    if not bad:
        return 0
    return 2 if all(refused.values()) else 1  # a build failed: a failed run
