"""Pinned reference values the tests compare against, and the one command that updates each.

    .venv/bin/python tests/pinned.py zoo     # checksums of the smoke models' weights
    .venv/bin/python tests/pinned.py smoke   # values the smoke notebooks report
    .venv/bin/python tests/pinned.py smoke --only f05   # re-pin one chapter, keep the others

``zoo`` builds every embedded model the smoke notebooks use in a fresh temporary cache and pins
their checksums for this machine's CPU (capability and vendor) in ``tests/pinned/zoo_checksums.json``
(checked by ``tests/test_zoo_builds.py``; a CPU with no pins is skipped, saying so).
``smoke`` runs the smoke notebooks in a fresh temporary cache (or reads already executed ones
with ``--executed DIR``) and writes ``tests/pinned/smoke_values.yaml`` (checked by
``tests/test_notebooks.py``), keeping the tolerances already there. Run one only when a change of
the numbers is intended (training code, a notebook, torch), and say why in the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PINNED = HERE / "pinned"
ZOO_CHECKSUMS = PINNED / "zoo_checksums.json"
SMOKE_VALUES = PINNED / "smoke_values.yaml"
UPDATE_ZOO = ".venv/bin/python tests/pinned.py zoo"
UPDATE_SMOKE = ".venv/bin/python tests/pinned.py smoke"

# Tolerances for the smoke values, unless the file says otherwise for a value. The smoke runs are
# seeded and their models pinned by checksum, so reruns on one machine agree to the last digit;
# the slack is for other BLAS/thread layouts. Removing the metric's |.| moves the coupling values
# by 0.1 to 1, far outside it.
DEFAULT_TOLERANCE = {"rel": 1e-3, "abs": 1e-4}


def environment() -> dict:
    """What the pinned numbers depend on besides the code: library versions and the CPU."""
    import torch
    import transformers

    from coupling_utils.provenance import cpu_vendor

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_vendor": cpu_vendor(),
        "machine": platform.machine(),
    }


def cpu_key(env: dict | None = None) -> str:
    """Which set of pinned checksums a machine reads: its CPU capability and vendor."""
    env = env or environment()
    return f"{env['cpu_capability']} {env['cpu_vendor']}"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


@contextlib.contextmanager
def fresh_cache() -> Iterator[Path]:
    """A temporary ``COUPLING_CACHE`` for the duration (restored afterwards)."""
    before = os.environ.get("COUPLING_CACHE")
    with tempfile.TemporaryDirectory(prefix="coupling-pinned-") as tmp:
        os.environ["COUPLING_CACHE"] = tmp
        try:
            yield Path(tmp)
        finally:
            if before is None:
                os.environ.pop("COUPLING_CACHE", None)
            else:
                os.environ["COUPLING_CACHE"] = before


def smoke_zoo_names() -> list[str]:
    sys.path.insert(0, str(HERE))
    from support.smoke_runs import smoke_zoo_names as names

    return names()


# ----------------------------------------------------------------------------- zoo checksums
def zoo_checksums() -> dict:
    """Build the smoke models in a fresh cache and return the pinned-checksum document."""
    from coupling_utils.models import zoo

    names = smoke_zoo_names()
    with fresh_cache():
        status = zoo.prepare_many(names, jobs=2)
        failed = {k: v for k, v in status.items() if v != "ready"}
        if failed:
            raise SystemExit(f"could not build: {failed}")
        entries = {name: zoo.weights_checksums(name) for name in names}
    return {
        "made": {"commit": _git_commit(), "date": time.strftime("%Y-%m-%d"), **environment()},
        "entries": entries,
    }


ZOO_ABOUT = (
    "SHA-256 of the tensors (zoo.tensors_sha256) of every weight file of the embedded models the smoke "
    "notebooks use, built from scratch, one set per CPU capability and vendor (torch picks other "
    "kernels on AVX2 and AVX512, the BLAS others on Intel and AMD, and training then rounds "
    "differently: the weights differ in the last bits). Checked by tests/test_zoo_builds.py. Update "
    f"on purpose (and say why in the commit): {UPDATE_ZOO}"
)


def _zoo_document() -> dict:
    doc = json.loads(ZOO_CHECKSUMS.read_text()) if ZOO_CHECKSUMS.exists() else {}
    return {"about": ZOO_ABOUT, "by_cpu": dict(doc.get("by_cpu", {}))}


def load_zoo_checksums() -> dict | None:
    """The pinned checksums made on a CPU of this machine's capability and vendor (None: none)."""
    return _zoo_document()["by_cpu"].get(cpu_key())


def pin_zoo_checksums() -> dict:
    """Build the smoke models and pin their checksums for this CPU (others kept)."""
    doc = _zoo_document()
    pins = zoo_checksums()
    doc["by_cpu"][cpu_key(pins["made"])] = pins
    ZOO_CHECKSUMS.write_text(json.dumps(doc, indent=1) + "\n")
    return pins


# ----------------------------------------------------------------------------- smoke values
def _glued(nb: dict, stem: str) -> dict[str, object]:
    """Values a notebook glued (myst_nb ``glue``), by name: numbers as float/int, the rest as text.

    The glued status table (``<notebook>_status``) is left out: its rows are compared as rows.
    """
    out = {}
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            record = (output.get("metadata") or {}).get("scrapbook") or {}
            name = record.get("name")
            if not name or name == f"{stem}_status":
                continue
            prefix = record.get("mime_prefix", "")
            data = {
                k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in output.get("data", {}).items()
            }
            if "text/markdown" in data:
                text = data["text/markdown"]
                out[name] = ("".join(text) if isinstance(text, list) else text).strip()
                continue
            text = data.get("text/plain", "")
            out[name] = _number("".join(text) if isinstance(text, list) else text)
    return out


def _number(text: str):
    """A glued plain-text value: a number when it reads as one, else the text."""
    t = text.strip()
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    if t.startswith(("np.float64(", "np.int64(", "np.float32(")) and t.endswith(")"):
        return _number(t[t.index("(") + 1 : -1])
    return t


def notebook_values(path: Path) -> dict:
    """``{"status": {claim: {"ours", "agree"}}, "glue": {name: value}}`` of one executed notebook."""
    from coupling_utils.pipeline.status import read_notebook_status

    nb = json.loads(Path(path).read_text())
    rows = read_notebook_status(path)
    status = {r["claim"]: {"ours": r["ours"], "agree": r["agree"]} for r in rows.to_dict("records")}
    return {"status": status, "glue": _glued(nb, Path(path).stem)}


def run_smoke(output_dir: Path, only: list[str] | None = None) -> None:
    """Run the notebooks (``only`` these names or prefixes; default all) at the smoke profile
    into ``output_dir`` in a fresh cache."""
    from coupling_utils.pipeline.execution import run_notebooks

    with fresh_cache():
        results = run_notebooks(list(only or []), "smoke", output_dir=output_dir, jobs=2)
    failed = [r for r in results if r.status != "ok"]
    if failed:
        raise SystemExit("smoke runs failed: " + "; ".join(f"{r.notebook}: {r.error}" for r in failed))


def _close(expected, got, tol: dict) -> bool:
    if isinstance(expected, bool) or not isinstance(expected, (int, float)):
        return expected == got
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    if math.isnan(expected) or math.isnan(got):
        return math.isnan(expected) and math.isnan(got)
    if math.isinf(expected) or math.isinf(got):
        return expected == got
    return abs(got - expected) <= tol["abs"] + tol["rel"] * abs(expected)


def compare(expected: dict, got: dict, default_tol: dict) -> list[str]:
    """Differences between pinned and measured values of one notebook, one line each."""
    problems = []
    for claim, want in expected.get("status", {}).items():
        have = got["status"].get(claim)
        if have is None:
            problems.append(f"status row {claim!r} is missing (rows now: {sorted(got['status'])})")
            continue
        tol = {**default_tol, **want.get("tolerance", {})}
        if have["agree"] != want["agree"]:
            problems.append(f"status row {claim!r}: agree={have['agree']!r}, pinned {want['agree']!r}")
        if not _close(want["ours"], have["ours"], tol):
            problems.append(f"status row {claim!r}: ours={have['ours']!r}, pinned {want['ours']!r} ({tol})")
    for claim in got["status"]:
        if claim not in expected.get("status", {}):
            problems.append(f"status row {claim!r} is new (not pinned)")
    for name, want in expected.get("glue", {}).items():
        value = want["value"] if isinstance(want, dict) else want
        tol = {**default_tol, **(want.get("tolerance", {}) if isinstance(want, dict) else {})}
        if name not in got["glue"]:
            problems.append(f"glued value {name!r} is missing")
        elif not _close(value, got["glue"][name], tol):
            problems.append(f"glued value {name!r} = {got['glue'][name]!r}, pinned {value!r} ({tol})")
    for name in got["glue"]:
        if name not in expected.get("glue", {}):
            problems.append(f"glued value {name!r} is new (not pinned)")
    return problems


def load_smoke_values() -> dict:
    import yaml

    return yaml.safe_load(SMOKE_VALUES.read_text())


def _yaml_scalar(value) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return repr(value)


def _pinned_values(before: dict) -> dict:
    """A notebook's pinned block read back as :func:`notebook_values` gives it (values only)."""
    glue = {k: (v["value"] if isinstance(v, dict) else v) for k, v in before.get("glue", {}).items()}
    status = {c: {"ours": r["ours"], "agree": r["agree"]} for c, r in before.get("status", {}).items()}
    return {"status": status, "glue": glue}


def smoke_document(executed: Path, source: str, only: list[str] | None = None) -> str:
    """The pinned smoke values as commented YAML (tolerances already in the file are kept).

    With ``only`` (notebook names or prefixes), just those notebooks are read from ``executed``;
    the others keep their pinned values."""
    from coupling_utils.pipeline.execution import notebook_paths

    old = load_smoke_values() if SMOKE_VALUES.exists() else {}
    default = old.get("tolerance", DEFAULT_TOLERANCE)
    env = environment()
    lines = [
        "# Values each notebook reports at the smoke profile, checked by tests/test_notebooks.py.",
        "# status: the notebook's reproduction-status rows (claim -> what this run measured, verdict);",
        "# glue: the numbers (and words) its text is built from. A number passes when",
        "# |got - pinned| <= abs + rel * |pinned| (the tolerance below, or a value's own); text must match.",
        f"# Made by `{UPDATE_SMOKE}`, from {source},",
        f"# at commit {_git_commit()} on {time.strftime('%Y-%m-%d')} (torch {env['torch']}, "
        f"transformers {env['transformers']}, {env['machine']} {env['cpu_capability']}),",
        "# on the smoke models pinned in zoo_checksums.json.",
        "# Regenerate only when a change of these numbers is intended, and say why in the commit.",
        f"tolerance: {{rel: {default['rel']}, abs: {default['abs']}}}",
        "notebooks:",
    ]
    for nb in notebook_paths(ROOT):
        path = executed / f"{nb.stem}.ipynb"
        before = old.get("notebooks", {}).get(nb.stem, {})
        if only and not any(nb.stem.startswith(o) for o in only):
            values = _pinned_values(before)
        elif not path.exists():
            raise SystemExit(f"no executed notebook {path}")
        else:
            values = notebook_values(path)
        lines.append(f"  {nb.stem}:")
        lines.append("    status:" + ("" if values["status"] else " {}"))
        for claim, row in values["status"].items():
            tol = before.get("status", {}).get(claim, {}).get("tolerance")
            extra = f", tolerance: {{rel: {tol['rel']}, abs: {tol['abs']}}}" if tol else ""
            lines.append(
                f"      {_yaml_scalar(claim)}: {{ours: {_yaml_scalar(row['ours'])}, "
                f"agree: {_yaml_scalar(row['agree'])}{extra}}}"
            )
        lines.append("    glue:" + ("" if values["glue"] else " {}"))
        for name, value in values["glue"].items():
            was = before.get("glue", {}).get(name)
            tol = was.get("tolerance") if isinstance(was, dict) else None
            if tol:
                lines.append(
                    f"      {name}: {{value: {_yaml_scalar(value)}, "
                    f"tolerance: {{rel: {tol['rel']}, abs: {tol['abs']}}}}}"
                )
            else:
                lines.append(f"      {name}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("zoo", help=f"pin this CPU capability's checksums in {ZOO_CHECKSUMS.relative_to(ROOT)}")
    smoke = sub.add_parser("smoke", help=f"rewrite {SMOKE_VALUES.relative_to(ROOT)}")
    smoke.add_argument("--executed", type=Path, help="read these executed notebooks instead of running them")
    smoke.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="re-pin only these (names or prefixes)")
    args = parser.parse_args(argv)
    PINNED.mkdir(exist_ok=True)
    if args.what == "zoo":
        pins = pin_zoo_checksums()
        n = sum(len(v) for v in pins["entries"].values())
        print(f"wrote {ZOO_CHECKSUMS} ({n} weight files, CPU {cpu_key(pins['made'])})")
        return 0
    if args.executed:
        text = smoke_document(args.executed, f"the executed notebooks in {args.executed}", args.only)
    else:
        with tempfile.TemporaryDirectory(prefix="coupling-smoke-") as out:
            run_smoke(Path(out), args.only)
            text = smoke_document(Path(out), "a fresh smoke run in an empty cache", args.only)
    SMOKE_VALUES.write_text(text)
    print(f"wrote {SMOKE_VALUES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
