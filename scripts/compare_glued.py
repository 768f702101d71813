"""Compare every glued value and status row of two sets of executed notebooks, exactly.

    python scripts/compare_glued.py BEFORE AFTER [--notebooks f00 f01 ...]

BEFORE and AFTER are folders of executed notebooks (``_build/notebooks`` of a ``make book`` or
``coupling-book run --out``). Each glued value (myst_nb ``glue``: its text/plain or markdown
output, as the book shows it) and each row of the chapter's status table must be identical;
every difference is printed and the exit status is 1 if there is any. A refactor that claims
"no change for users" is checked with this on the default profile's runs before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def glued(path: Path) -> dict[str, str]:
    """``{name: shown text}`` of every value the notebook glued (its last output of that name)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            record = (output.get("metadata") or {}).get("scrapbook") or {}
            name = record.get("name")
            if not name:
                continue
            prefix = record.get("mime_prefix", "")
            data = {k.removeprefix(prefix): v for k, v in output.get("data", {}).items()}
            text = data.get("text/markdown", data.get("text/plain", ""))
            out[name] = "".join(text) if isinstance(text, list) else str(text)
    return out


def differences(before: Path, after: Path) -> list[str]:
    """Every glued name whose text differs, is missing or is new, in ``after`` against ``before``."""
    a, b = glued(before), glued(after)
    lines = [f"{before.stem}: {n}: missing after (was {a[n]!r})" for n in sorted(set(a) - set(b))]
    lines += [f"{before.stem}: {n}: new after ({b[n]!r})" for n in sorted(set(b) - set(a))]
    lines += [f"{before.stem}: {n}: {a[n]!r} -> {b[n]!r}" for n in sorted(set(a) & set(b)) if a[n] != b[n]]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--notebooks", nargs="*", default=None, help="notebook prefixes (default: all in BEFORE)")
    args = ap.parse_args(argv)
    paths = sorted(args.before.glob("f*.ipynb"))
    if args.notebooks:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in args.notebooks)]
    if not paths:
        print(f"no executed notebooks in {args.before}", file=sys.stderr)
        return 2
    problems, counted = [], 0
    for path in paths:
        other = args.after / path.name
        if not other.exists():
            problems.append(f"{path.stem}: not in {args.after}")
            continue
        counted += len(glued(path))
        problems += differences(path, other)
    print("\n".join(problems) if problems else f"{counted} glued values in {len(paths)} notebooks: identical")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
