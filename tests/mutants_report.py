"""Summarise a mutmut run (``make mutants``) and check every surviving mutant is explained.

    .venv/bin/python tests/mutants_report.py

Reads mutmut's results under ``mutants/`` for the modules listed in ``[tool.mutmut] only_mutate``
(pyproject.toml) and prints, per module, how many mutants the fast tests killed, how many
survived and how many no test reached, and the score ``killed / (mutants - skipped)`` (a mutant
that made the tests time out counts as killed). Every mutant that was not killed must have a line
in ``tests/mutants.md`` (``- `name`: why it is equivalent or left``); the script lists the ones
that do not, and exits with 1 if there are any. ``mutmut show <name>`` prints a mutant's diff.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPLAINED = ROOT / "tests" / "mutants.md"
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
}
for code in (-24, 24, 152, 255):
    STATUS[code] = "timeout"


def modules() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def results() -> dict[str, dict[str, str]]:
    """``{module path: {mutant name: status}}`` from mutmut's ``.meta`` files."""
    out = {}
    for module in modules():
        meta = ROOT / "mutants" / f"{module}.meta"
        if not meta.exists():
            raise SystemExit(f"no mutmut results for {module} ({meta}); run `make mutants` first")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out[module] = {
            name: STATUS.get(code, "not checked" if code is None else "suspicious")
            for name, code in codes.items()
        }
    return out


def explained() -> dict[str, str]:
    if not EXPLAINED.exists():
        return {}
    return dict(re.findall(r"^- `([^`]+)`: (.+)$", EXPLAINED.read_text(), flags=re.M))


def main() -> int:
    res = results()
    why = explained()
    width = max(len(m) for m in res)

    def row(label, n, killed, survived, no_tests, score):
        other = n - killed - survived - no_tests
        print(
            f"{label:<{width}}  {n:7d}  {killed:6d}  {survived:8d}  {no_tests:8d}  {other:5d}  {score:6.1%}"
        )

    print(f"{'module':<{width}}  mutants  killed  survived  no-tests  other   score")
    totals: Counter = Counter()
    for module, by_name in res.items():
        c = Counter("killed" if s in ("killed", "timeout") else s for s in by_name.values())
        n = len(by_name) - c["skipped"]
        totals.update(c)
        totals["n"] += n
        row(module, n, c["killed"], c["survived"], c["no tests"], c["killed"] / n if n else float("nan"))
    t = totals
    row("all", t["n"], t["killed"], t["survived"], t["no tests"], t["killed"] / t["n"])
    left = sorted(
        name
        for by_name in res.values()
        for name, s in by_name.items()
        if s not in ("killed", "timeout", "skipped")
    )
    unexplained = [name for name in left if name not in why]
    stale = sorted(set(why) - set(left))
    if stale:
        where = EXPLAINED.relative_to(ROOT)
        print(
            f"\n{len(stale)} line(s) in {where} name mutants that are now killed or gone (remove them): "
            + ", ".join(stale[:10])
            + (" ..." if len(stale) > 10 else "")
        )
    if unexplained:
        print(
            f"\n{len(unexplained)} mutant(s) not killed and not explained in {EXPLAINED.relative_to(ROOT)}; "
            "kill each with a test or add a line saying why it is equivalent "
            "(see one with `.venv/bin/mutmut show <name>`):"
        )
        for name in unexplained:
            print(f"  {name}")
        return 1
    print(f"\nevery mutant not killed ({len(left)}) is explained in {EXPLAINED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
