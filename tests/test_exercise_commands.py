"""Every command and code snippet that the notebooks' exercises and solutions offer works, as written.

Read from the ``{exercise}`` and ``{solution}`` blocks of ``notebooks/f*.md``: their inline code and
code blocks, and the inline code of the values they glue (as the smoke run glues them, from
``tests/pinned/smoke_values.yaml``). Nothing runs a chapter:

- ``coupling-book ...`` parses with the real CLI parser. A ``run`` is then checked at every profile
  (as a reader of that profile runs it, ``--profile`` added), or at the one it names: its overrides
  pass the checks ``coupling-book run`` makes before a kernel starts (names, types, the chapter's
  checks and rules), the chapter plans its jobs, each embedded checkpoint it loads exists, and each
  job's model-fit check passes on the model's shape, read from its configuration (not its weights:
  ``data/model_configs.csv`` for hub ids, the zoo's recipe or packaged files for embedded models;
  checked against the loaded smoke models by :func:`test_shapes_are_the_loaded_models`).
- ``-p key=value ...`` on its own adds to the block's previous ``coupling-book run`` (``... -p k=1``
  and ``-p k=32``) or, without one, to ``coupling-book run <this chapter>``; a bare ``key=value`` is
  a parameter of the chapter (checked so) or a keyword of a function the block names.
- ``python script.py``: the script exists.
- Python (inline or in a code block): it parses; every name it reads is bound by the notebook's code
  cells or by the snippet; each package name it refers to exists; each call of a package function
  binds to its signature (``measure``'s settings build a real ``Settings``); and a snippet that
  needs nothing but imports runs, unless it trains, builds or measures (:data:`COSTLY`).

Planning may read the session's smoke models (``smoke_zoo``) but builds nothing else: a plan that
would build an embedded model fails (an embedded run's checkpoints and width come from its recipe,
so every chapter plans at every profile without training).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import jupytext
import pinned
import pytest

from coupling_utils.chapters.checks import ParameterError
from coupling_utils.pipeline.execution import (
    _checked_values,
    find_notebooks,
    notebook_paths,
    parse_overrides,
    profiles,
)
from coupling_utils.pipeline.teaching import _blocks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebook_paths(ROOT)
PROFILES = profiles(ROOT)
ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # a MyST role ({glue:text}`x`, {numref}`...`): not code
GLUED = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")
INLINE = re.compile(r"`([^`]+)`")
BLOCK = re.compile(r"^```+(?:python|ipython3?)\n(.*?)^```+$", re.M | re.S)
FILE = re.compile(r"^[\w./-]+\.(?:csv|json|yaml|md|ipynb|zip|py)$")


@dataclasses.dataclass(frozen=True)
class Offer:
    """One piece of code an exercise or solution offers: where, of which kind, and its text."""

    where: str  # "<notebook>:<label> (<exercise|solution>)"
    notebook: str  # the notebook's stem
    kind: str  # "command", "script", "keyword" or "python"
    text: str
    names: tuple[str, ...] = ()  # for a keyword: the functions its block refers to
    before: tuple[str, ...] = ()  # for python: the block's earlier snippets (a sequence of cells)


def _spans(body: str, glue: dict) -> list[str]:
    """The code of a block, in reading order: code blocks, inline code (roles taken out), then the
    inline code of the values it glues."""
    blocks = BLOCK.findall(body)
    text = BLOCK.sub("", body)
    spans = [b.strip() for b in blocks] + [s.strip() for s in INLINE.findall(ROLE.sub("", text))]
    for name in GLUED.findall(body):
        value = glue.get(name)
        if isinstance(value, str):
            spans += [s.strip() for s in INLINE.findall(value)]
    return spans


def _kind(span: str) -> str | None:
    """What a span of code is (None: a word, a file name or a formula, nothing to run)."""
    if span.startswith(("coupling-book ", "-p ")):
        return "command"
    if span.startswith("python ") and span.split()[1].endswith(".py"):
        return "script"
    if FILE.match(span):
        return None
    if re.fullmatch(r"[A-Za-z_]\w*=\S+", span):
        return "keyword"
    try:
        tree = ast.parse(span)
    except SyntaxError:
        return None
    runs = (ast.Call, ast.Attribute, ast.Assign, ast.Import, ast.ImportFrom)
    return "python" if any(isinstance(n, runs) for n in ast.walk(tree)) else None


def _merged(span: str, previous: list[str] | None, notebook: str) -> list[str]:
    """A command's arguments (after ``coupling-book``): a ``-p`` span alone adds its overrides to
    the block's previous ``run`` (replacing those it names again), else to a run of ``notebook``."""
    words = shlex.split(span)
    if words[0] == "coupling-book":
        return words[1:]
    base = previous if previous and previous[0] == "run" else ["run", notebook.split("_")[0]]
    given = parse_overrides(words[i + 1] for i, w in enumerate(words) if w in ("-p", "--param"))
    kept, i = [], 0
    while i < len(base):
        if base[i] in ("-p", "--param") and base[i + 1].split("=", 1)[0].strip() in given:
            i += 2
            continue
        kept.append(base[i])
        i += 1
    return kept + words


def offers(path: Path, glue: dict) -> list[tuple[Offer, list[str]]]:
    """Every piece of code ``path``'s exercises and solutions offer, with a command's arguments."""
    out = []
    for kind, arg, options, body in _blocks(path.read_text(encoding="utf-8")):
        label = options.get("label") or arg
        where = f"{path.stem}:{label} ({kind})"
        previous: list[str] | None = None
        spans = _spans(body, glue)
        refs = tuple(s for s in spans if _kind(s) == "python")
        for span in spans:
            what = _kind(span)
            if what is None:
                continue
            argv: list[str] = []
            if what == "command":
                argv = previous = _merged(span, previous, path.stem)
            before = refs[: refs.index(span)] if what == "python" else ()
            out.append((Offer(where, path.stem, what, span, refs if what == "keyword" else (), before), argv))
    return out


def _glue(stem: str) -> dict:
    return pinned.load_smoke_values()["notebooks"].get(stem, {}).get("glue", {})


OFFERS = [pair for nb in NOTEBOOKS for pair in offers(nb, _glue(nb.stem))]


def _id(pair) -> str:
    offer, _ = pair
    return f"{offer.where}: {offer.text[:60]}"


# Offers that cannot work where this test runs, each with the reason (strict: once one works, its
# xfail fails and the entry must go).
REPORTED = {
    ("f03_training_emergence:f03-ex-lr (exercise)", "-p 'models=[\"runs/lr1e-3\"]'"): "runs/lr1e-3 exists "
    "only after the exercise's training call (minutes); at the smoke and default profiles (revisions=[]) "
    "the plan lists its checkpoints from that folder",
}

COSTLY = frozenset({"train_lm", "train_vit", "measure", "prepare", "prepare_many"})
"""Package functions whose call trains, builds or measures (minutes): a snippet calling one is
checked (its names and its calls' signatures) but not run."""


def _cases(kind: str) -> list:
    """The offers of ``kind`` as test cases, the :data:`REPORTED` ones marked as known failures."""
    out = []
    for pair in OFFERS:
        offer, _ = pair
        if offer.kind != kind:
            continue
        reason = REPORTED.get((offer.where, offer.text))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(pair, marks=marks, id=_id(pair)))
    return out


def test_exercises_offer_commands_and_code():
    """The extraction finds what the chapters offer (a guard against a parser that finds nothing)."""
    kinds = {offer.kind for offer, _ in OFFERS}
    assert {"command", "python", "keyword", "script"} <= kinds, kinds
    assert sum(offer.kind == "command" for offer, _ in OFFERS) >= 20
    assert {offer.notebook for offer, _ in OFFERS} == {nb.stem for nb in NOTEBOOKS}
    stale = set(REPORTED) - {(offer.where, offer.text) for offer, _ in OFFERS}
    assert not stale, f"REPORTED names offers the notebooks no longer make: {sorted(stale)}"


@pytest.mark.parametrize("name", ["embedded:pythia-smoke", "embedded:lm-family-smoke/w16-l3-s8-seed0",
                                  "embedded:vit-mnist-smoke"])  # fmt: skip
def test_shapes_are_the_loaded_models(name, smoke_zoo):
    """What the model-fit checks read of a shape (:func:`model_shape`) is what they read of the
    loaded model: depth, width and, for a ViT, the patch grid."""
    from coupling_utils import load_model
    from coupling_utils.models.images import patch_grid

    lm, shape = load_model(name), model_shape(name)
    assert (shape.n_layers, shape.d_model) == (lm.n_layers, lm.d_model)
    if "vit" in name:
        assert patch_grid(shape) == patch_grid(lm)


# --------------------------------------------------------------------------- models' shapes
@functools.cache
def model_shape(name: str) -> SimpleNamespace | None:
    """What the chapters' model-fit checks read of a loaded model (``name``, ``n_layers``,
    ``d_model``, a ViT's ``model.config``), from its configuration; None where this test cannot
    know it (a local run directory, a hub id without a row in data/model_configs.csv)."""
    config = _config(name)
    if config is None:
        return None
    n_layers = getattr(config, "num_hidden_layers", None) or config.n_layers
    d_model = getattr(config, "hidden_size", None) or config.d_model
    return SimpleNamespace(
        name=name, n_layers=int(n_layers), d_model=int(d_model), model=SimpleNamespace(config=config)
    )


def _config(name: str):
    """A transformers config (or a recipe with n_layers and d_model) of model ``name``."""
    from coupling_utils.analysis.data import read_table
    from coupling_utils.models.vit_training import VitSpec, vit_config
    from coupling_utils.models.zoo.registry import PREFIX, _split
    from coupling_utils.pipeline.model_sizes import build_config

    if not name.startswith(PREFIX):
        rows = read_table("model_configs.csv").set_index("model_id")
        return build_config(rows.loc[name].to_dict()) if name in rows.index else None
    entry, member = _split(name)
    if entry.spec is not None:
        spec = entry.specs()[member] if member else entry.specs()
        return vit_config(spec) if isinstance(spec, VitSpec) else spec
    if not entry.source.gguf:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(entry.source.location())
    return _gguf_config(entry.source.location())


def _gguf_config(path: Path) -> SimpleNamespace:
    """Depth and width from a GGUF file's metadata (``<architecture>.block_count`` and
    ``.embedding_length``)."""
    import gguf

    fields = gguf.GGUFReader(path).fields

    def value(key: str):
        field = fields[key]
        part = field.parts[field.data[0]]
        return bytes(part).decode() if key == "general.architecture" else int(part[0])

    arch = value("general.architecture")
    return SimpleNamespace(n_layers=value(f"{arch}.block_count"), d_model=value(f"{arch}.embedding_length"))


def check_fits(jobs) -> list[str]:
    """Each job's model-fit check on its model's shape, and each embedded checkpoint it loads:
    what fails, in the check's words."""
    from coupling_utils.analysis.vision_transformers import run_revisions

    failed = []
    for job in jobs:
        model = str(job.model)
        if job.revision and model.startswith("embedded:") and job.revision not in run_revisions(model):
            failed.append(f"{model} has no checkpoint {job.revision!r}; it has: {run_revisions(model)}")
        shape = model_shape(model) if job.check is not None else None
        if shape is None:
            continue
        try:
            job.check(shape)
        except (ParameterError, ValueError) as exc:
            failed.append(str(exc))
    return list(dict.fromkeys(failed))


# --------------------------------------------------------------------------- commands
class WouldBuild(Exception):
    """Planning asked for an embedded model that is not built (a plan must train nothing)."""


@pytest.fixture(scope="module")
def no_builds(smoke_zoo):
    """Planning reads the session's smoke models; any other embedded model it asks for raises
    :class:`WouldBuild` instead of being built, and the command fails."""
    from coupling_utils.models import zoo
    from coupling_utils.models.zoo import build

    real = build.prepare

    def prepare(name, *args, **kwargs):
        if not build.is_ready(str(name).removeprefix(zoo.PREFIX)):
            raise WouldBuild(name)
        return real(name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "prepare", prepare)
        mp.setattr(zoo, "prepare", prepare)
        yield


@functools.cache
def _plan(stem: str, profile: str, params: tuple[str, ...]):
    """The jobs of ``stem`` at ``profile`` with the ``-p`` overrides ``params`` (planned once)."""
    from coupling_utils.pipeline.sweep import notebook_jobs

    return notebook_jobs(stem, profile, parse_overrides(params))


def check_run(argv: list[str]) -> list[str]:
    """``coupling-book ARGV`` parsed by the CLI's parser and, for a ``run``, checked and planned
    at every profile (or the one it names) with its jobs' fits: the problems found."""
    from coupling_utils.pipeline.cli import build_parser

    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit:
        return [f"the CLI refuses `coupling-book {shlex.join(argv)}` (its message is above)"]
    if args.command != "run":
        return []
    problems = []
    try:
        notebooks = find_notebooks(args.notebooks, ROOT)
        overrides = parse_overrides(args.param)
    except ParameterError as exc:
        return [str(exc)]
    given = "--profile" in argv or any(a.startswith("--profile=") for a in argv)
    for nb in notebooks:
        for profile in [args.profile] if given else PROFILES:
            try:
                _checked_values(nb, profile, overrides)
                jobs = _plan(nb.stem, profile, tuple(args.param))
            except WouldBuild as exc:
                problems.append(
                    f"{nb.stem} at profile {profile}: planning would build {exc} (a plan trains nothing)"
                )
                continue
            except (ParameterError, ValueError) as exc:
                problems.append(f"{nb.stem} at profile {profile}: {exc}")
                continue
            problems += [f"{nb.stem} at profile {profile}: {p}" for p in check_fits(jobs)]
    return problems


@pytest.mark.parametrize("pair", _cases("command"))
def test_command_works(pair, no_builds):
    offer, argv = pair
    problems = check_run(argv)
    assert not problems, (
        f"{offer.where} offers `{offer.text}` (as `coupling-book {shlex.join(argv)}`), which fails:\n  "
        + "\n  ".join(problems)
        + "\nfix the command in the notebook's text (or glue one computed for the run's model)"
    )


@pytest.mark.parametrize("pair", _cases("script"))
def test_script_exists(pair):
    offer, _ = pair
    script = offer.text.split()[1]
    assert (ROOT / script).is_file(), (
        f"{offer.where} offers `{offer.text}`, but {script} is not in the repository"
    )


# --------------------------------------------------------------------------- python
def _bound(tree: ast.AST) -> dict[str, ast.stmt | None]:
    """The names ``tree`` binds at its top level (not inside functions or classes): each import
    with its statement, every other name with None."""
    out: dict[str, ast.stmt | None] = {}

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                out[name] = (
                    ast.Import([alias])
                    if isinstance(node, ast.Import)
                    else ast.ImportFrom(node.module, [alias], node.level)
                )
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = None
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.setdefault(node.id, None)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


@functools.cache
def notebook_bindings(stem: str) -> dict[str, ast.stmt | None]:
    """The names the code cells of notebook ``stem`` bind (see :func:`_bound`)."""
    cells = jupytext.read(ROOT / "notebooks" / f"{stem}.md").cells
    source = "\n".join(
        line
        for c in cells
        if c.cell_type == "code"
        for line in c.source.splitlines()
        if not line.startswith(("%", "!"))
    )
    return _bound(ast.parse(source))


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _imported(statements) -> dict:
    """The namespace that running the import ``statements`` makes."""
    namespace: dict = {}
    module = ast.fix_missing_locations(ast.Module(list(statements), []))
    exec(compile(module, "<imports>", "exec"), namespace)  # noqa: S102 - the notebook's own imports
    return namespace


def _resolve(parts: list[str], imports: dict[str, ast.stmt]):
    """The object ``parts`` names when its root is an import (or the package itself), else
    None; raises AttributeError for a name that does not exist."""
    root, *attrs = parts
    if root in imports:
        obj = _imported([imports[root]])[root]
    else:
        return None
    for attr in attrs:
        if not hasattr(obj, attr) and inspect.ismodule(obj):
            with_sub = f"{obj.__name__}.{attr}"
            if importlib.util.find_spec(with_sub) is not None:
                importlib.import_module(with_sub)
        obj = getattr(obj, attr)  # AttributeError: the name does not exist
    return obj


def _binds(func, call: ast.Call) -> str | None:
    """Why ``call``'s arguments do not fit ``func``'s signature (None: they fit). ``measure``'s
    settings given as keywords must build a :class:`~coupling_utils.measurement.Settings`."""
    from coupling_utils.measurement import Settings, measure

    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        inspect.signature(func).bind(*call.args, **{k.arg: k.value for k in call.keywords})
    except TypeError as exc:
        return f"{func.__qualname__}{inspect.signature(func)}: {exc}"
    if func is measure:
        literal = {}
        for k in call.keywords:
            try:
                literal[k.arg] = ast.literal_eval(k.value)
            except ValueError:
                literal[k.arg] = None
        unknown = (
            set(literal)
            - {f.name for f in dataclasses.fields(Settings)}
            - set(inspect.signature(func).parameters)
        )
        if unknown:
            return f"measure() has no setting {sorted(unknown)}"
    return None


def _reference(tree: ast.Module) -> list[str] | None:
    """The dotted name a snippet only refers to (``coupling_utils.measure``), else None."""
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
        return _dotted(tree.body[0].value)
    return None


def _check_reference(parts: list[str]) -> list[str]:
    """A dotted name in prose (``numpy.linalg.lstsq``): its module imports and the name exists."""
    if importlib.util.find_spec(parts[0]) is None:
        return [f"{parts[0]!r} is not a module"]
    try:
        _resolve(parts, {parts[0]: ast.Import([ast.alias(parts[0])])})
    except AttributeError as exc:
        return [f"`{'.'.join(parts)}` does not exist ({exc})"]
    return []


def _check_calls(tree: ast.Module, own: dict, imports: dict) -> list[str]:
    """Each package name the snippet reaches through an import exists, and each call of a package
    function binds to its signature."""
    problems = []
    for node in ast.walk(tree):
        parts = _dotted(node.func if isinstance(node, ast.Call) else node)
        if parts is None or (parts[0] in own and parts[0] not in imports):
            continue
        try:
            obj = _resolve(parts, imports)
        except AttributeError as exc:
            problems.append(f"`{'.'.join(parts)}` does not exist ({exc})")
            continue
        package = getattr(obj, "__module__", "") or ""
        if isinstance(node, ast.Call) and callable(obj) and package.startswith("coupling_utils"):
            why = _binds(obj, node)
            if why:
                problems.append(why)
    return problems


def check_python(offer: Offer) -> list[str]:
    """What is wrong with a snippet offered in ``offer.notebook``'s exercises (see the module doc);
    a snippet that reads nothing but imports is run."""
    tree = ast.parse(offer.text)
    notebook = notebook_bindings(offer.notebook)
    parts = _reference(tree)
    if parts is not None and parts[0] not in notebook:  # a name in prose
        return _check_reference(parts)
    own = {**_bound(ast.parse("\n".join(offer.before))), **_bound(tree)}
    imports = {n: s for n, s in {**notebook, **own}.items() if s is not None}
    loaded = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    free = [n for n in dict.fromkeys(loaded) if n not in own and not hasattr(builtins, n)]
    problems = [
        f"{n!r} is defined neither by the notebook's cells nor by the snippet"
        for n in free
        if n not in notebook
    ]
    problems += _check_calls(tree, own, imports)
    calls = {(_dotted(n.func) or [""])[-1] for n in ast.walk(tree) if isinstance(n, ast.Call)}
    if not problems and all(n in imports for n in free) and not calls & COSTLY:  # nothing but imports
        namespace = _imported(imports.values())
        try:
            exec(compile(tree, f"<{offer.where}>", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - reported as the snippet's failure
            problems.append(f"running it raises {type(exc).__name__}: {exc}")
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("pair", _cases("python"))
def test_snippet_works(pair):
    offer, _ = pair
    problems = check_python(offer)
    assert not problems, f"{offer.where} offers\n    {offer.text}\nwhich fails:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("pair", _cases("keyword"))
def test_keyword_is_a_parameter_or_argument(pair, no_builds):
    """A bare ``key=value``: a parameter of the chapter (then checked as ``-p key=value``), or a
    keyword of a function the same block names."""
    from coupling_utils.chapters import chapter

    offer, _ = pair
    key = offer.text.split("=", 1)[0]
    if key in chapter(offer.notebook).Params.names():
        problems = check_run(["run", offer.notebook.split("_")[0], "-p", offer.text])
        assert not problems, f"{offer.where} offers `{offer.text}`, which fails:\n  " + "\n  ".join(problems)
        return
    imports = {**notebook_bindings(offer.notebook)}
    imports = {n: s for n, s in imports.items() if s is not None}
    named = [_resolve(_dotted(ast.parse(r, mode="eval").body) or ["?"], imports) for r in offer.names]
    takes = [f for f in named if callable(f) and key in inspect.signature(f).parameters]
    assert takes, (
        f"{offer.where} offers `{offer.text}`, but {key!r} is neither a parameter of "
        f"{offer.notebook} nor an argument of a function the block names ({', '.join(offer.names) or 'none'})"
    )
