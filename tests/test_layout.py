"""The package's layers import downwards only (files < engine < models < measurement < analysis <
chapters < pipeline).

Every ``import`` and ``from ... import`` in every module (module level or inside a function) is
read with ``ast``; a module may import its own layer or a lower one, never a higher one.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import coupling_utils

PKG = Path(coupling_utils.__file__).resolve().parent
# lowest first; the top-level modules (files, provenance, schemas, __init__) are the base every layer may use
LAYERS = ["files", "engine", "models", "measurement", "analysis", "chapters", "pipeline"]
BASE = {"files", "provenance", "schemas"}  # top-level modules below every layer


def _layer(dotted: str) -> str | None:
    """The layer of an absolute ``coupling_utils...`` module name (None: the package root)."""
    parts = dotted.split(".")
    if parts[0] != "coupling_utils" or len(parts) == 1:
        return None
    return "files" if parts[1] in BASE else (parts[1] if parts[1] in LAYERS else None)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Absolute names of the coupling_utils modules a source file imports, with line numbers."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("coupling_utils")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("coupling_utils"):
                # "from coupling_utils.x import y" may name a submodule y
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_lives_in_a_layer():
    loose = [p.name for p in PKG.glob("*.py") if p.stem not in {"__init__", *BASE}]
    assert not loose, f"modules outside the layer folders: {loose}; put each in {LAYERS[1:]}"
    folders = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS[1:])


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path):
    rel = path.relative_to(PKG)
    own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    if own == "__init__":
        return  # the package root re-exports the public API from every layer, lazily
    own = "files" if own in BASE else own
    rank = LAYERS.index(own)
    bad = []
    for line, name in _imports(path):
        layer = _layer(name)
        if layer is not None and LAYERS.index(layer) > rank:
            bad.append(f"line {line}: {name} ({layer})")
    assert not bad, f"{rel} ({own}) imports a higher layer: {bad}"


def test_the_layer_check_sees_a_violation(tmp_path, monkeypatch):
    """The check itself: an engine module importing analysis is caught, in a function body too."""
    fake = PKG / "engine" / "metric.py"
    src = fake.read_text() + "\n\ndef _oops():\n    from coupling_utils.analysis import plots  # noqa\n"
    probe = tmp_path / "coupling_utils" / "engine" / "metric.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(src)
    monkeypatch.setattr(f"{__name__}.PKG", tmp_path / "coupling_utils")
    names = [name for _, name in _imports(probe)]
    assert "coupling_utils.analysis.plots" in names
    assert _layer("coupling_utils.analysis.plots") == "analysis"


def test_public_names_are_the_documented_objects():
    """Every top-level name resolves, and a subpackage never shadows a function of the same name."""
    for info in pkgutil.walk_packages(coupling_utils.__path__, "coupling_utils."):
        importlib.import_module(info.name)  # every submodule imported first: the worst case
    for name in coupling_utils.__all__:
        obj = getattr(coupling_utils, name)
        assert not isinstance(obj, type(coupling_utils)) or name == "__version__", name
    from coupling_utils import measure

    assert callable(measure) and measure.__module__.startswith("coupling_utils.measurement")


# the names every chapter module defines (its protocol) and entry points: shared on purpose
CHAPTER_NAMES = {
    "Params",
    "Results",
    "jobs",
    "run",
    "claims",
    "assumptions",
    "glue_values",
    "prompts",
    "main",
}


def test_no_two_public_names_in_different_modules():
    """One name per thing: no public function or class is defined in two modules (a chapter
    module's protocol names aside), so a name found in a notebook or a traceback has one home."""
    homes: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(str(path.relative_to(PKG)))
    shared = {n: h for n, h in homes.items() if len(h) > 1 and n not in CHAPTER_NAMES}
    assert not shared, f"public names defined in several modules (rename one of each): {shared}"
