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


# --------------------------------------------------------------------------- sizes (CONTRIBUTING.md)
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 600, 60, 8
# what is still over a limit, by check: only analysis/plots.py and analysis/display.py may be here
# (being split, issue 20); an entry that no longer exists or no longer breaks its limit fails the test
NOT_YET: dict[str, set[str]] = {"module lines": set(), "function lines": set(), "parameters": set()}
NOT_YET_FILES = ("analysis/plots.py", "analysis/display.py")


def _functions(source: str):
    """``(qualified name, node, public)`` of every function of a module, methods and nested ones
    included (``Class.method``, ``outer.<locals>.inner``); public: a top-level function or a
    method whose name does not start with ``_``."""
    out = []

    def walk(body, prefix: str, in_function: bool):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + node.name, node, not in_function and not node.name.startswith("_")))
                walk(node.body, f"{prefix}{node.name}.<locals>.", True)
            elif isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.", in_function)

    walk(ast.parse(source).body, "", False)
    return out


def _n_lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _n_parameters(node: ast.FunctionDef) -> int:
    """Named parameters, keyword-only ones included, ``self``/``cls`` not (nor ``*args`` and
    ``**kwargs``: a signature another library fixes, or a documented catch-all, e.g. measure()'s
    Settings fields)."""
    a = node.args
    return len([x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")])


def _over_limits() -> dict[str, dict[str, int]]:
    """Every module and function over a limit, by check: ``{check: {"path[:function]": size}}``."""
    over: dict[str, dict[str, int]] = {"module lines": {}, "function lines": {}, "parameters": {}}
    for path in _modules():
        rel, source = str(path.relative_to(PKG)), path.read_text()
        if len(source.splitlines()) > MAX_MODULE_LINES:
            over["module lines"][rel] = len(source.splitlines())
        for name, node, public in _functions(source):
            if _n_lines(node) > MAX_FUNCTION_LINES:
                over["function lines"][f"{rel}:{name}"] = _n_lines(node)
            if public and _n_parameters(node) > MAX_PARAMETERS:
                over["parameters"][f"{rel}:{name}"] = _n_parameters(node)
    return over


def _check_limit(check: str, limit: str):
    over = _over_limits()[check]
    new = {k: v for k, v in over.items() if k not in NOT_YET[check]}
    assert not new, f"over the limit of {limit} (split or group them, CONTRIBUTING.md): {new}"
    stale = sorted(NOT_YET[check] - set(over))
    assert not stale, f"NOT_YET[{check!r}] lists what is gone or now within {limit}: remove {stale}"
    elsewhere = sorted(k for k in NOT_YET[check] if not k.startswith(NOT_YET_FILES))
    assert not elsewhere, f"NOT_YET[{check!r}] may only hold {NOT_YET_FILES}, not {elsewhere}"


def test_no_module_over_600_lines():
    _check_limit("module lines", f"{MAX_MODULE_LINES} lines a module")


def test_no_function_over_60_lines():
    _check_limit("function lines", f"{MAX_FUNCTION_LINES} lines a function")


def test_no_public_function_over_8_parameters():
    _check_limit("parameters", f"{MAX_PARAMETERS} parameters a public function")


def test_the_size_checks_see_a_violation():
    """The checks themselves: a long method, a long nested function and a public function with
    nine named parameters are caught; ``self``, ``*args``, ``**kwargs`` and private names are not counted."""
    body = "".join(f"        x{i} = {i}\n" for i in range(60))  # 60 lines, two levels in
    source = (
        f"class C:\n    def long(self):\n{body}\n"
        f"def outer():\n    def inner():\n{body}\n"
        "def wide(a, b, c, d, e, f, g, h, *args, i=0, **kwargs):\n    pass\n\n"
        "def fits(self, a, b, c, d, e, f, g, h, *args, **kwargs):\n    pass\n\n"
        "def _private(a, b, c, d, e, f, g, h, i):\n    pass\n"
    )
    found = {name: (_n_lines(node), _n_parameters(node), public) for name, node, public in _functions(source)}
    assert found["C.long"][0] == 61 and found["outer"][0] == 62 and found["outer.<locals>.inner"][0] == 61
    assert found["wide"] == (2, 9, True) and found["fits"] == (2, 8, True)
    assert found["_private"][1:] == (9, False) and not found["outer.<locals>.inner"][2]


# --------------------------------------------------------------------------- no circles (CONTRIBUTING.md)
# modules that import each other today (module level or in a function), each with its reason; an
# entry that is no longer a circle fails the test, so the list only shrinks
CIRCLES_NOT_YET: dict[frozenset[str], str] = {
    frozenset({"models/loading.py", "models/preprocessors.py"}): (
        "fingerprinted code: moving the shared errors out would make every stored measurement stale"
    ),
    frozenset({"analysis/linearization.py", "analysis/trajectories.py"}): (
        "both are sources of stored f03/f05 trajectory measurements: moving code would make them stale"
    ),
}


def _module_of(dotted: str, files: dict[str, str]) -> str | None:
    """The module file (relative to the package) a dotted import name lands in (None: a package face)."""
    parts = dotted.split(".")[1:]
    while parts:
        rel = "/".join(parts) + ".py"
        if rel in files:
            return rel
        parts = parts[:-1]
    return None


def _circles(paths: list[Path]) -> list[frozenset[str]]:
    """Groups of modules that import each other in a loop (Tarjan's strongly connected components);
    package faces (``__init__.py``, which re-export) are left out, as their imports are lazy."""
    files = {str(p.relative_to(PKG)): p for p in paths if p.name != "__init__.py"}
    edges = {
        rel: {m for _, name in _imports(p) if (m := _module_of(name, files)) and m != rel}
        for rel, p in files.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other():
    """A newcomer reads the house from the ground up: no module imports one that imports it back
    (directly or round a longer loop), even inside a function."""
    found = set(_circles(_modules()))
    new = [sorted(c) for c in found if c not in CIRCLES_NOT_YET]
    gone = [sorted(c) for c in CIRCLES_NOT_YET if c not in found]
    assert not new, f"modules that import each other: {new}; move what both need into a lower module"
    assert not gone, f"no longer a circle, remove it from CIRCLES_NOT_YET: {gone}"


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    pkg = tmp_path / "coupling_utils"
    (pkg / "analysis").mkdir(parents=True)
    (pkg / "analysis" / "a.py").write_text("from coupling_utils.analysis.b import g\n")
    (pkg / "analysis" / "b.py").write_text("def g():\n    from coupling_utils.analysis import a\n")
    (pkg / "analysis" / "c.py").write_text("from coupling_utils.analysis.a import f\n")
    monkeypatch.setattr(f"{__name__}.PKG", pkg)
    paths = sorted(pkg.rglob("*.py"))
    assert _circles(paths) == [frozenset({"analysis/a.py", "analysis/b.py"})]
