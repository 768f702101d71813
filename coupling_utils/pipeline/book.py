"""Build the book: stage sources and executed notebooks, render them with Jupyter Book 1.

The book never executes code. ``coupling-book run`` executes each finding notebook
(``notebooks/fNN_<slug>.md``, jupytext MyST) with papermill into
``_build/notebooks/fNN_<slug>.ipynb``; :func:`build_book` then renders those outputs, so the
book shows exactly what the run produced. The resulting HTML is self-contained: MathJax and
the chart runtime are served from the book itself and :func:`remote_assets` checks that no page
loads anything from another host; :func:`~coupling_utils.pipeline.proofread.proofread` that no page
shows a Python/numpy repr and no caption places a panel where its figure does not show it.

Staging also makes each chapter downloadable and linked: the executed notebook is published
next to its page (``notebooks/<name>.ipynb``) and the tables its ``display.show_table`` calls
stored go to ``notebooks/<name>/<table>.csv``, both listed in a ``chapter-links`` box under
the chapter title. ``repository.url`` in ``_config.yml`` (empty: none of this) turns on the
theme's repository and "edit this page" buttons, a link to each chapter's source and, on
github.com, an "Open in Colab" link to the notebook as published on the Pages branch
(``coupling_book.pages_branch``). The bibliography page gets "Cite this companion" from ``CITATION.cff``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from coupling_utils.files import NO_ROOM, DiskFull, atomic_dir, naming_the_folder
from coupling_utils.pipeline.book_plan import (
    EXECUTED_DIR,
    NOTEBOOK_DIR,
    PROSE_DIR,
    BookPlan,
    TocEntry,
    check_executed,
    path_or_default,
    plan_book,
    report_plan,
    staged_toc,
    toc_entries,
)
from coupling_utils.pipeline.jupyter_book_child import JB_MAIN as _JB_MAIN
from coupling_utils.pipeline.jupyter_book_child import SHOWN_OUT
from coupling_utils.pipeline.kit import INSTALL_TAG, KIT_DOWNLOAD, build_kit, check_edition, publish_notebook
from coupling_utils.pipeline.offline_assets import remote_assets
from coupling_utils.pipeline.pages import (
    PRINT_DIR,
    PRINT_MARKER,
    BookError,
    BookInputError,
    architectures_section,
    book_config,
    citation_section,
    stage_performance_findings,
    status_rows,
    status_section,
)
from coupling_utils.pipeline.printing import finish_printable, printable_link
from coupling_utils.pipeline.proofread import proofread
from coupling_utils.pipeline.teaching import replace_marker

__all__ = [
    "BookError",
    "INSTALL_TAG",
    "BookPlan",
    "TocEntry",
    "toc_entries",
    "plan_book",
    "BuildOptions",
    "stage_book",
    "mathjax_source",
    "remote_assets",
    "status_section",
    "citation_section",
    "repository_links",
    "notebook_tables",
    "printable_link",
    "build_book",
]

STATUS_PAGE = "status"  # its tables are generated from the notebooks' outputs
INTRO_PAGE = "intro"  # gets the reproduction summary (bottom line and chart) at its marker
TEACHING_PAGE = "teaching"  # gets the list of the chapters' exercises at its marker
ARCHITECTURES_PAGE = "architectures"  # its table is generated from the adapter table
BIBLIOGRAPHY_PAGE = "bibliography"  # gets "Cite this companion" from CITATION.cff
RUNNING_PAGE = "running"  # gets the default profile's measured time per notebook at its marker
DATA_DIR = "data"  # staged too: prose may include its tables
EXTRA_STAGE = "_extra"  # an html_extra_path (see _config.yml): copied as is to the HTML root
BOOK_KEY = "coupling_book"  # our own section of _config.yml, removed from the staged copy
MATHJAX_ENTRY = "tex-svg.js"  # SVG output: no web fonts to load
# What tex-svg.js may load lazily (TeX extensions, menu, accessibility); the other
# combined builds are left out.
MATHJAX_PARTS = ("a11y", "adaptors", "input", "output", "sre", "ui")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How :func:`build_book` builds, checked here once (a bad value is a BookError naming it).

    ``strict``: every Sphinx warning, remote asset and proofreading finding is an error (else a
    warning). ``allow_unexecuted``: leave out written notebooks that have no executed copy instead
    of failing. ``edition``: "teacher" (solutions in drop-downs) or "student" (no solutions
    anywhere). ``printable``: also the whole book on one page, ``out/print/index.html`` (and its
    PDF). ``work``: the staging folder (``work/src``, ``work/jb``), kept absolute (a relative one
    is read from the current folder); None: ``<root>/_build``.
    """

    strict: bool = True
    allow_unexecuted: bool = False
    edition: str = "teacher"
    printable: bool = False
    work: Path | None = None

    def __post_init__(self) -> None:
        for name in ("strict", "allow_unexecuted", "printable"):
            if not isinstance(getattr(self, name), bool):
                raise BookInputError(
                    f"BuildOptions {name}={getattr(self, name)!r} is not a bool: give True or False"
                )
        check_edition(self.edition)
        object.__setattr__(self, "work", path_or_default(self.work, None, "BuildOptions work"))


def mathjax_source() -> Path:
    """The MathJax 3 ``es5`` directory shipped by the PyPI package django-static-mathjax."""
    spec = importlib.util.find_spec("mathjax")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        es5 = Path(location) / "static" / "mathjax" / "es5"
        if (es5 / MATHJAX_ENTRY).is_file():
            return es5
    raise BookError(
        "MathJax files not found: the book serves MathJax itself so that it works offline; "
        "install them with `pip install 'django-static-mathjax>=3.2.2,<4'` "
        "(or `pip install -e '.[book]'`)"
    )


def stage_book(
    root: str | Path = ".",
    executed: str | Path | None = None,
    src: str | Path | None = None,
    options: BuildOptions = BuildOptions(),
) -> BookPlan:
    """Lay out the Jupyter Book source tree ``src`` from the repository and executed notebooks.

    ``executed`` and ``src`` are read as given (relative to the current folder); None:
    ``<root>/_build/notebooks`` and ``<root>/_build/src``. Pages not written yet are left out. A
    written notebook without an executed copy is an error naming the command that produces it,
    unless ``options.allow_unexecuted`` (then it is left out too). The reproduction-status page
    gets its tables from the executed notebooks' status outputs (:func:`status_section`), and the
    intro page its bottom line and summary chart from the same rows
    (:func:`coupling_utils.pipeline.summary.stage_summary`); the teaching page lists the chapters'
    exercises (:func:`coupling_utils.pipeline.teaching.stage_exercises`); the lab kit
    (:func:`~coupling_utils.pipeline.kit.build_kit`) is served at
    :data:`~coupling_utils.pipeline.kit.KIT_DOWNLOAD`. The ``student`` edition hides the solutions
    (``hide_solutions``) and leaves them out of the notebooks and the kit. Rebuilt from scratch.
    """
    root = Path(root).resolve()
    executed = path_or_default(executed, root / EXECUTED_DIR, "executed")
    plan = plan_book(root, executed)
    if not options.allow_unexecuted:
        check_executed(plan)
    _check_readable(plan)
    config = book_config(root)
    links = repository_links(config)
    src = path_or_default(src, root / "_build" / "src", "src").resolve()
    _refuse_to_replace(src, {root: "the repository"}, "stage the book into", "_build/src")
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    (src / "_config.yml").write_text(
        yaml.safe_dump(_staged_config(config, links, options.edition), sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    # prose (with whatever sits beside it: references.bib, figures)
    shutil.copytree(
        root / PROSE_DIR,
        src / PROSE_DIR,
        ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"),
    )
    # data the prose includes by relative path (e.g. ../data/benchmarks/*.csv tables)
    if (root / DATA_DIR).is_dir():
        shutil.copytree(root / DATA_DIR, src / DATA_DIR, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    (src / NOTEBOOK_DIR).mkdir()
    extra = src / EXTRA_STAGE
    kit = _stage_chapters(root, src, plan, links, options.edition)
    _stage_generated_pages(root, src, plan, executed, links, options, kit)
    (src / "_toc.yml").write_text(yaml.safe_dump(staged_toc(root, plan), sort_keys=False), encoding="utf-8")
    _stage_mathjax(extra / "_static" / "mathjax")
    return plan


def _check_readable(plan: BookPlan) -> None:
    """Refuse (bad input, before anything is staged) an executed notebook that cannot be read:
    truncated (a copy or a run stopped while writing it), not JSON or not UTF-8."""
    import nbformat

    for entry in plan.included:
        if entry.kind != "notebook":
            continue
        try:
            nbformat.read(entry.content, as_version=4)
        except (ValueError, OSError, nbformat.ValidationError) as exc:  # NotJSONError, UnicodeDecodeError
            cause = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise BookInputError(
                f"the executed notebook {entry.content} cannot be read ({type(exc).__name__}: {cause}); "
                f"it is probably truncated or not a notebook. Run it again (`{entry.run_command} "
                f"--output-dir {entry.content.parent}`), or move it away and build with --allow-unexecuted"
            ) from exc


def _stage_chapters(root: Path, src: Path, plan: BookPlan, links: dict, edition: str) -> bool:
    """The lab kit (unless ``root`` has no package to build: a scratch tree) and the chapter
    notebooks; whether there is a kit."""
    extra = src / EXTRA_STAGE
    kit = (root / "pyproject.toml").is_file()
    if kit:
        build_kit(root, extra / KIT_DOWNLOAD, edition)
    for entry in plan.included:
        if entry.kind == "notebook":
            _stage_notebook(entry, src, extra, links, edition, kit)
    return kit


def _stage_mathjax(target: Path) -> None:
    """MathJax's ES5 build, served by the book itself (it is read offline)."""
    target.mkdir(parents=True)
    es5 = mathjax_source()
    shutil.copy2(es5 / MATHJAX_ENTRY, target / MATHJAX_ENTRY)
    for part in MATHJAX_PARTS:
        shutil.copytree(es5 / part, target / part)


def _stage_generated_pages(
    root: Path, src: Path, plan: BookPlan, executed: Path, links: dict, options: BuildOptions, kit: bool
) -> None:
    """The parts of pages made at build time: the status tables, the intro's summary and printable
    link, the teaching page's exercises, costs and kit link (for ``options.edition``, when there
    is a ``kit``), the running page's time per notebook, diagrams, the matrix-free findings,
    architectures, citation."""
    page = {name: src / PROSE_DIR / f"{name}.md" for name in (
        STATUS_PAGE, INTRO_PAGE, TEACHING_PAGE, ARCHITECTURES_PAGE, BIBLIOGRAPHY_PAGE)}  # fmt: skip
    included = {Path(e.docname).name for e in plan.included if e.kind == "notebook"}
    if page[STATUS_PAGE].is_file():
        with page[STATUS_PAGE].open("a", encoding="utf-8") as f:
            f.write("\n" + status_section(executed, included))
    if page[INTRO_PAGE].is_file():
        from coupling_utils.pipeline.summary import stage_summary

        costs = root / DATA_DIR / "benchmarks" / "profile_costs.csv"
        stage_summary(page[INTRO_PAGE], status_rows(executed, included), executed, costs)
        replace_marker(page[INTRO_PAGE], PRINT_MARKER, printable_link(options.printable))
    if page[TEACHING_PAGE].is_file():
        from coupling_utils.pipeline.teaching import stage_costs, stage_exercises, stage_kit_link, stage_plans

        chapters = [e.source for e in plan.included if e.kind == "notebook"]
        stage_exercises(page[TEACHING_PAGE], chapters, options.edition)
        stage_kit_link(page[TEACHING_PAGE], f"../{KIT_DOWNLOAD}", options.edition if kit else "")
        stage_costs(page[TEACHING_PAGE], root / "data" / "benchmarks" / "chapter_costs.csv")
        stage_plans(page[TEACHING_PAGE], root / "data" / "benchmarks" / "chapter_costs.csv")
    if (src / PROSE_DIR / f"{RUNNING_PAGE}.md").is_file():
        from coupling_utils.pipeline.book_times import stage_book_times
        from coupling_utils.pipeline.teaching import stage_profile_times

        running = src / PROSE_DIR / f"{RUNNING_PAGE}.md"
        stage_profile_times(running, root / DATA_DIR / "benchmarks" / "chapter_costs.csv")
        stage_book_times(running, root / DATA_DIR / "benchmarks" / "book_builds.csv")
    from coupling_utils.pipeline.diagrams import stage_diagrams

    for name in ("notation-and-method", "performance"):  # the pages with figures and findings made now
        if (src / PROSE_DIR / f"{name}.md").is_file():
            stage_diagrams(src / PROSE_DIR / f"{name}.md")
            stage_performance_findings(src / PROSE_DIR / f"{name}.md", root / DATA_DIR / "benchmarks")
    if page[ARCHITECTURES_PAGE].is_file():
        with page[ARCHITECTURES_PAGE].open("a", encoding="utf-8") as f:
            f.write("\n" + architectures_section())
    if page[BIBLIOGRAPHY_PAGE].is_file() and (root / "CITATION.cff").is_file():
        with page[BIBLIOGRAPHY_PAGE].open("a", encoding="utf-8") as f:
            f.write("\n" + citation_section(root / "CITATION.cff", links.get("url", "")))


_HOSTS = {"github.com": "github", "gitlab.com": "gitlab"}


def repository_links(config: dict) -> dict:
    """What ``repository.url`` in ``_config.yml`` turns on: {} when it is empty.

    Otherwise ``url``, ``branch``, ``path`` (the book's folder in the repository, "" for its
    root), ``host`` ("github", "gitlab" or "" for another host), ``pages_branch`` (where the
    workflow publishes the HTML) and ``owner_repo`` ("owner/name" on github.com or gitlab.com).
    A URL that is not http(s) is an error naming the setting.
    """
    repo = config.get("repository") or {}
    url = str(repo.get("url") or "").strip().rstrip("/")
    if not url:
        return {}
    m = re.match(r"^https?://([^/]+)/(.+?)(?:\.git)?$", url)
    if m is None:
        raise BookError(
            f"_config.yml repository.url must be the repository's web address, such as "
            f"https://github.com/OWNER/REPO, got {url!r}"
        )
    host = _HOSTS.get(m.group(1).lower(), "")
    url = f"https://{m.group(1)}/{m.group(2)}"
    own = config.get(BOOK_KEY) or {}
    return {
        "url": url,
        "branch": str(repo.get("branch") or "main"),
        "path": str(repo.get("path_to_book") or "").strip("/"),
        "host": host,
        "owner_repo": m.group(2) if host else "",
        "pages_branch": str(own.get("pages_branch") or "gh-pages"),
    }


def _staged_config(config: dict, links: dict, edition: str = "teacher") -> dict:
    """The _config.yml Jupyter Book sees: our own section dropped, buttons on with a repository,
    solutions hidden by sphinx-exercise in the student edition."""
    config = json.loads(json.dumps(config))  # a deep copy
    config.pop(BOOK_KEY, None)
    if edition == "student":
        config.setdefault("sphinx", {}).setdefault("config", {})["hide_solutions"] = True
    if links:
        html_cfg = config.setdefault("html", {})
        html_cfg["use_repository_button"] = True
        html_cfg["use_edit_page_button"] = True
        theme = config.setdefault("sphinx", {}).setdefault("config", {}).setdefault("html_theme_options", {})
        theme.update(
            repository_url=links["url"],
            repository_branch=links["branch"],
            path_to_docs=links["path"],
            use_repository_button=True,
            use_edit_page_button=True,
        )
    return config


def _repo_file_url(links: dict, path: str) -> str:
    """The web page of a file in the repository (GitHub and GitLab spell it differently)."""
    sep = "/-/blob/" if links["host"] == "gitlab" else "/blob/"
    full = f"{links['path']}/{path}" if links["path"] else path
    return f"{links['url']}{sep}{links['branch']}/{full}"


def notebook_tables(nb) -> dict[str, str]:
    """{name: CSV text} of the tables a notebook's ``display.show_table`` calls stored."""
    from coupling_utils.analysis.display import METADATA_KEY

    tables: dict[str, str] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            table = ((output.get("metadata") or {}).get(METADATA_KEY) or {}).get("table")
            if not isinstance(table, dict):
                continue
            name = str(table.get("name"))
            if name in tables:
                raise BookError(
                    f"two tables named {name!r} in one notebook: give each show_table(...) call its own name"
                )
            tables[name] = str(table.get("csv", ""))
    return tables


def _stage_notebook(entry: TocEntry, src: Path, extra: Path, links: dict, edition: str, kit: bool) -> None:
    """Stage one executed notebook: the page (with its chapter-links box, linking the lab kit
    when there is one), its published copy (for download and Colab; the install cell
    knows the repository; no solutions in the student edition) and its tables as CSV."""
    import nbformat

    from coupling_utils.pipeline.teaching import stage_chapter_time

    name = Path(entry.docname).name
    nb = nbformat.read(entry.content, as_version=4)
    stage_chapter_time(nb, entry.source.parent.parent / DATA_DIR / "benchmarks" / "chapter_costs.csv")
    publish_notebook(nb, extra / NOTEBOOK_DIR / f"{name}.ipynb", links.get("url", ""), edition)
    tables = notebook_tables(nb)
    for table, csv in tables.items():
        path = extra / NOTEBOOK_DIR / name / f"{table}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(csv, encoding="utf-8")
    options = [f":notebook: {name}.ipynb"] + ([f":kit: ../{KIT_DOWNLOAD}"] if kit else [])
    if tables:
        options.append(":tables: " + " ".join(f"{name}/{t}.csv" for t in tables))
    if links.get("host") == "github":
        options.append(
            f":colab: https://colab.research.google.com/github/{links['owner_repo']}/blob/"
            f"{links['pages_branch']}/{NOTEBOOK_DIR}/{name}.ipynb"
        )
    if links.get("host"):
        options.append(f":source: {_repo_file_url(links, f'{NOTEBOOK_DIR}/{name}.md')}")
    box = "\n```{chapter-links}\n" + "\n".join(options) + "\n```\n"
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = cell.source.split("\n")
            title = next((k for k, line in enumerate(lines) if line.startswith("# ")), None)
            if title is not None:
                lines.insert(title + 1, box)
                cell.source = "\n".join(lines)
                break
    else:
        raise BookError(f"{entry.content}: no markdown cell with a '# title' line to put the downloads under")
    nbformat.write(nb, src / f"{entry.docname}.ipynb")


def _jupyter_book(
    root: Path, src: Path, jb: Path, strict: bool, builder: str = "html", shown: Path | None = None
) -> Path:
    """Run ``jupyter-book build`` on ``src`` into ``jb`` (its pages will be copied to ``shown``);
    the built HTML folder, or BookError (:class:`~coupling_utils.files.DiskFull` for no room)."""
    if jb.exists():
        shutil.rmtree(jb)
    cmd = [
        sys.executable,
        "-c",
        _JB_MAIN,
        "build",
        str(src),
        "--path-output",
        str(jb),
        "--builder",
        builder,
        "--all",
    ]
    if strict:
        cmd += ["-W", "-n", "--keep-going"]
    result = subprocess.run(cmd, cwd=root, env={**os.environ, SHOWN_OUT: str(shown or "")})
    if result.returncode in NO_ROOM:
        raise DiskFull(jb.parent, result.returncode)
    built = jb / "_build" / builder
    if result.returncode != 0 or not (built / "index.html").is_file():
        raise BookError(
            f"jupyter-book build failed (exit {result.returncode}); the messages above name "
            f"the page and the problem. Staged sources are in {src}"
            + ("; strict mode turns every Sphinx warning into an error" if strict else "")
        )
    return built


def _check_proofread(built: Path, strict: bool) -> None:
    """Fail (warn unless ``strict``) on reprs in the pages and captions that contradict their figures."""
    problems = proofread(built)
    if not problems:
        return
    listing = "\n".join(f"  - {p}" for p in problems[:30])
    more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
    message = (
        "the built book shows readers Python/numpy reprs or positional words that contradict their "
        f"figures (fix the notebook's text, then rerun it):\n{listing}{more}"
    )
    if strict:
        raise BookError(message)
    print(f"[book] warning: {message}", file=sys.stderr)


def _refuse_to_replace(target: Path, keep: dict[Path, str], action: str, example: str) -> None:
    """Refuse a folder about to be replaced when it is, or holds, one of ``keep`` ({path: what})."""
    for path, what in keep.items():
        if target.resolve() == path.resolve() or target.resolve() in path.resolve().parents:
            raise BookInputError(
                f"refusing to {action} {target}: it would delete {what} ({path}); "
                f"choose a build folder such as {example}"
            )


def build_book(
    root: str | Path = ".",
    executed: str | Path | None = None,
    out: str | Path | None = None,
    options: BuildOptions = BuildOptions(),
) -> Path:
    """Render the book to static HTML at ``out`` and return ``out`` (``out/index.html`` exists).

    ``executed`` and ``out`` are read as given (relative to the current folder, like any path
    given to Python); None: ``<root>/_build/notebooks`` and ``<root>/_build/html``. Stages
    ``work/src`` (see :func:`stage_book`; ``work`` is ``options.work``, by default
    ``<root>/_build``), runs ``jupyter-book build`` into ``work/jb`` with execution off and, when
    ``options.strict``, every Sphinx warning an error (``-W -n --keep-going``) and no remote asset
    allowed; then replaces ``out`` atomically (never the repository or the executed notebooks).
    A disk (or quota) that fills up is a :class:`~coupling_utils.files.DiskFull` naming the folder,
    raised after the staging folders are removed (``out`` is as it was).
    """
    root = Path(root).resolve()
    executed = path_or_default(executed, root / EXECUTED_DIR, "executed")
    out = path_or_default(out, root / "_build" / "html", "out")
    keep = {root: "the repository", executed: "the executed notebooks"}
    _refuse_to_replace(out, keep, "write the book to", "_build/html")
    work = options.work or root / "_build"
    src, jb = work / "src", work / "jb"
    for folder in (src, jb, work / "jb-print"):  # each is deleted and rebuilt: none may hold these
        _refuse_to_replace(
            folder,
            {**keep, out: "the book's output folder"},
            "stage the book into",
            "_build/src (give another --work)",
        )
    try:  # staging and Jupyter Book's pages: given back when the disk is full
        with naming_the_folder(work):
            plan = stage_book(root, executed, src, options)
            report_plan(plan)
            built = _jupyter_book(root, src, jb, options.strict, shown=out)
            one_page = (
                _jupyter_book(root, src, work / "jb-print", options.strict, "singlehtml", out / PRINT_DIR)
                if options.printable
                else None
            )
        _check_built(built, one_page, options.strict)
        with atomic_dir(out) as tmp:
            shutil.copytree(built, tmp, dirs_exist_ok=True)
            if one_page:
                finish_printable(shutil.copytree(one_page, tmp / PRINT_DIR))  # its PDF with Chromium
    except DiskFull as exc:
        for folder in (src, jb, work / "jb-print"):
            shutil.rmtree(folder, ignore_errors=True)
        if exc.folder.is_dir():
            raise
        raise DiskFull(work, exc.errno) from exc  # it named a staging folder, now removed
    return out


def _check_built(built: Path, one_page: Path | None, strict: bool) -> None:
    """Fail (warn unless ``strict``) on pages that load remote assets or fail proofreading."""
    remote = remote_assets(built) + (remote_assets(one_page) if one_page else [])
    if remote:
        listing = "\n".join(f"  - {page}: {url}" for page, url in remote[:20])
        message = f"the built book loads resources from other hosts, so it would not work offline:\n{listing}"
        if strict:
            raise BookError(message)
        print(f"[book] warning: {message}", file=sys.stderr)
    _check_proofread(built, strict)
