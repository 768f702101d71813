"""The book's configuration, table of contents, staging, offline checks and chart display."""

from __future__ import annotations

import base64
import io
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from coupling_utils.pipeline import book, book_plan, pages
from coupling_utils.pipeline.book import BookError, BuildOptions, plan_book, stage_book, toc_entries
from coupling_utils.pipeline.offline_assets import remote_assets

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = [
    "f00_coupling_metric",
    "f01_depth_and_tokens",
    "f02_generalization",
    "f03_training_emergence",
    "f04_vision_transformers",
    "f05_token_trajectories",
]
BIB_KEYS = {
    "aubry2025coupling",
    "gai2021mathematical",
    "halko2011finding",
    "biderman2023pythia",
    "dosovitskiy2021image",
    "openllmleaderboard",
    "allal2025smollm2",
    "wang2020minilm",
    "lecun1998mnist",
}
BOOK_PAGES = [
    "intro",
    "notation-and-method",
    "running",
    "teaching",
    "status",
    "performance",
    "glossary",
    "bibliography",
]


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


# --- configuration -------------------------------------------------------------------------


def test_toc_order_is_the_books_reading_order():
    expected = (
        ["book/intro", "book/notation-and-method"]
        + [f"notebooks/{f}" for f in FINDINGS]
        + [
            f"book/{p}"
            for p in (
                "status",
                "architectures",
                "performance",
                "running",
                "teaching",
                "glossary",
                "bibliography",
            )
        ]
    )
    assert toc_entries(ROOT) == expected


def test_book_owned_pages_exist():
    for page in BOOK_PAGES:
        assert (ROOT / "book" / f"{page}.md").is_file(), page


def test_config_renders_without_executing_and_without_remote_code():
    cfg = config()
    assert cfg["execute"]["execute_notebooks"] == "off"
    sphinx = cfg["sphinx"]["config"]
    assert sphinx["nb_execution_mode"] == "off"
    extensions = sphinx["extensions"]
    assert "sphinx_thebe" not in extensions
    assert not any(cfg["html"]["comments"].values())
    assert {"myst_nb", "sphinx_book_theme", "sphinxcontrib.bibtex"} <= set(extensions)
    assert set(cfg["parse"]["myst_enable_extensions"]) >= {"dollarmath", "amsmath", "colon_fence"}
    launch = cfg["launch_buttons"]
    assert not launch["thebe"] and not launch["binderhub_url"] and not launch["colab_url"]
    # MathJax comes from the book itself, outside _static (which Jupyter Book injects
    # into every page), and the path Sphinx writes is the file build_book stages.
    assert sphinx["mathjax_path"] == f"mathjax/{book.MATHJAX_ENTRY}"
    assert sphinx["html_extra_path"] == [book.EXTRA_STAGE] and book.EXTRA_STAGE in cfg["exclude_patterns"]
    assert {"sphinx_exercise", "coupling_utils.pipeline.book_extension"} <= set(extensions)
    # shipped without a public repository: no buttons, no Colab (a fork sets repository.url)
    assert cfg["repository"]["url"] == "" and book.repository_links(cfg) == {}
    assert sphinx["html_theme_options"]["navbar_persistent"] == [], "one search box: no header search"
    assert not (ROOT / "_static").exists()
    for bib in cfg["bibtex_bibfiles"]:
        assert (ROOT / bib).is_file(), bib


def _bib_keys() -> set[str]:
    return set(re.findall(r"@\w+\{([^,\s]+),", (ROOT / "book" / "references.bib").read_text()))


def test_bibliography_has_the_required_keys_once():
    text = (ROOT / "book" / "references.bib").read_text()
    keys = re.findall(r"@\w+\{([^,\s]+),", text)
    assert len(keys) == len(set(keys)), "duplicate bibtex keys"
    assert set(keys) >= BIB_KEYS


def test_every_citation_in_the_sources_is_in_the_bibliography():
    sources = list((ROOT / "book").glob("*.md")) + list((ROOT / "notebooks").glob("f*.md"))
    cited = set()
    for path in sources:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", path.read_text()):
            cited |= {k.strip() for k in group.split(",")}
    missing = cited - _bib_keys()
    assert not missing, f"cited but not in book/references.bib: {sorted(missing)}"


def test_mathjax_files_are_available_offline():
    es5 = book.mathjax_source()
    assert (es5 / book.MATHJAX_ENTRY).stat().st_size > 100_000
    for part in book.MATHJAX_PARTS:
        assert (es5 / part).is_dir(), part


# --- planning and staging --------------------------------------------------------------------


def _scratch_root(tmp_path: Path, notebooks: list[str]) -> Path:
    """A copy of the book sources with the given finding notebooks written (as stand-ins)."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "book", root / "book")
    if (ROOT / "data").is_dir():  # prose pages include tables from data/
        shutil.copytree(ROOT / "data", root / "data")
    (root / "notebooks").mkdir()
    for name in notebooks:
        (root / "notebooks" / f"{name}.md").write_text("# stand-in\n")
    return root


def _executed_notebook(path: Path, title: str = "Scratch finding", status_rows=()) -> None:
    from coupling_utils.pipeline.status import METADATA_KEY

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {title}\n\nSome math: $m_K(J_1, J_2)$.")]
    if status_rows:  # what coupling_utils.pipeline.status.report() leaves in an executed notebook
        cell = nbformat.v4.new_code_cell("report(...)")
        cell.outputs = [
            nbformat.v4.new_output(
                "display_data",
                data={"text/plain": "status"},
                metadata={METADATA_KEY: {"notebook": path.stem, "rows": list(status_rows)}},
            )
        ]
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


def test_plan_classifies_unwritten_unexecuted_and_ready(tmp_path):
    root = _scratch_root(tmp_path, ["f00_coupling_metric", "f01_depth_and_tokens"])
    executed = tmp_path / "executed"
    _executed_notebook(executed / "f00_coupling_metric.ipynb")
    plan = plan_book(root, executed)
    status = {e.docname: e.status for e in plan.entries}
    assert status["notebooks/f00_coupling_metric"] == "ok"
    assert status["notebooks/f01_depth_and_tokens"] == "not-executed"
    assert status["notebooks/f02_generalization"] == "no-source"
    assert status["book/intro"] == "ok"
    assert [e.docname for e in plan.unexecuted] == ["notebooks/f01_depth_and_tokens"]


def test_unexecuted_notebook_fails_naming_it_and_the_command(tmp_path):
    root = _scratch_root(tmp_path, ["f00_coupling_metric", "f01_depth_and_tokens"])
    executed = tmp_path / "executed"
    _executed_notebook(executed / "f00_coupling_metric.ipynb")
    with pytest.raises(BookError, match=r"f01_depth_and_tokens.*coupling-book run f01"):
        stage_book(root, executed, tmp_path / "src")


def test_staging_keeps_what_exists_and_prunes_the_toc(tmp_path):
    root = _scratch_root(tmp_path, ["f00_coupling_metric", "f01_depth_and_tokens"])
    (root / "book" / "architectures.md").unlink(missing_ok=True)
    executed = tmp_path / "executed"
    row = {"claim": "m(J, J) = 0", "paper": 0.0, "ours": 1e-7, "agree": "yes", "note": "toy"}
    _executed_notebook(executed / "f00_coupling_metric.ipynb", status_rows=[row])
    src = tmp_path / "src"
    src.mkdir()
    (src / "stale.txt").write_text("from an earlier build")
    plan = stage_book(root, executed, src, BuildOptions(allow_unexecuted=True))
    staged = yaml.safe_load((src / "_toc.yml").read_text())
    staged_files = book_plan._toc_files(staged)
    assert staged_files == [e.docname for e in plan.included]
    assert "notebooks/f00_coupling_metric" in staged_files
    assert "notebooks/f01_depth_and_tokens" not in staged_files
    assert "book/architectures" not in staged_files
    assert (src / "notebooks" / "f00_coupling_metric.ipynb").is_file()
    assert not (src / "notebooks" / "f01_depth_and_tokens.ipynb").exists()
    assert not (src / "stale.txt").exists(), "the staged tree is rebuilt from scratch"
    assert (src / book.EXTRA_STAGE / "_static" / "mathjax" / book.MATHJAX_ENTRY).is_file()
    assert (src / "data").is_dir() == (root / "data").is_dir()
    status = (src / "book" / "status.md").read_text()
    assert status.startswith((root / "book" / "status.md").read_text())
    assert "f00_coupling_metric" in status and "m(J, J) = 0" in status
    running = (src / "book" / "running.md").read_text()  # the default profile's time, from the costs
    assert "% profile-times" not in running.splitlines()
    assert "Measured time per notebook at the `default` profile: from " in running
    assert "% book-times" not in running.splitlines()  # the whole book's time, from bench_book's table
    assert "The first `make book` on a clean clone took " in running
    for part in staged["parts"]:
        assert part["chapters"], f"empty part kept: {part['caption']}"


def test_staging_never_deletes_the_repository(tmp_path):
    root = _scratch_root(tmp_path, [])
    for target in (root, tmp_path):
        with pytest.raises(BookError, match="refusing"):
            stage_book(root, tmp_path / "executed", target, BuildOptions(allow_unexecuted=True))
    assert (root / "_toc.yml").is_file()


def test_relative_paths_are_read_from_the_current_folder(tmp_path, monkeypatch):
    """Like any Python function (and the CLI), not from the repository root."""
    root = _scratch_root(tmp_path, ["f00_coupling_metric"])
    _executed_notebook(tmp_path / "runs" / "f00_coupling_metric.ipynb")
    monkeypatch.chdir(tmp_path)
    (f00,) = [e for e in plan_book(root, "runs").entries if e.docname == "notebooks/f00_coupling_metric"]
    assert f00.status == "ok" and f00.content == tmp_path / "runs" / "f00_coupling_metric.ipynb"
    stage_book(root, "runs", "staged", BuildOptions(allow_unexecuted=True))
    assert (tmp_path / "staged" / "notebooks" / "f00_coupling_metric.ipynb").is_file()
    assert not (root / "staged").exists() and not (root / "runs").exists()
    assert BuildOptions(work="scratch").work == tmp_path / "scratch"
    stage_book(root, None, None, BuildOptions(allow_unexecuted=True))  # defaults: under the root
    assert (root / "_build" / "src" / "_toc.yml").is_file()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"edition": "pupil"}, "unknown edition 'pupil': choose teacher or student"),
        ({"strict": "no"}, "BuildOptions strict='no' is not a bool: give True or False"),
        ({"printable": 1}, "BuildOptions printable=1 is not a bool"),
        ({"work": ""}, "BuildOptions work='' is not a path: give a folder, or leave BuildOptions work out"),
        ({"work": 3}, "BuildOptions work=3 is not a path"),
    ],
)
def test_build_options_refuse_bad_values_naming_them(fields, message):
    with pytest.raises(BookError, match=re.escape(message)):
        BuildOptions(**fields)


def test_build_never_replaces_the_repository_or_the_runs(tmp_path):
    root = _scratch_root(tmp_path, ["f00_coupling_metric"])
    executed = tmp_path / "runs" / "default"
    _executed_notebook(executed / "f00_coupling_metric.ipynb")
    options = BuildOptions(work=tmp_path / "work")
    for out, what in (
        (root, "the repository"),
        (tmp_path, "the repository"),
        (executed.parent, "the executed"),
    ):
        with pytest.raises(BookError, match=f"refusing to write the book to {re.escape(str(out))}: .*{what}"):
            book.build_book(root, executed, out, options)
    with pytest.raises(BookError, match="executed='' is not a path"):
        book.build_book(root, "", tmp_path / "html", options)
    assert not (tmp_path / "work").exists(), "refused before staging"
    assert (executed / "f00_coupling_metric.ipynb").is_file() and (root / "_toc.yml").is_file()


def test_toc_entry_outside_book_and_notebooks_is_refused(tmp_path):
    root = _scratch_root(tmp_path, [])
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    toc["parts"][0]["chapters"].append({"file": "elsewhere/page"})
    (root / "_toc.yml").write_text(yaml.safe_dump(toc))
    with pytest.raises(BookError, match="elsewhere/page"):
        plan_book(root)


def test_repository_url_decides_the_links():
    assert book.repository_links({"repository": {"url": ""}}) == {}
    gh = book.repository_links({"repository": {"url": "https://github.com/org/repo.git/", "branch": "dev"}})
    assert gh == {
        "url": "https://github.com/org/repo",
        "branch": "dev",
        "path": "",
        "host": "github",
        "owner_repo": "org/repo",
        "pages_branch": "gh-pages",
    }
    gl = book.repository_links(
        {"repository": {"url": "https://gitlab.com/g/sub/repo", "path_to_book": "docs/"}, "coupling_book": {}}
    )
    assert gl["host"] == "gitlab" and gl["path"] == "docs"
    assert (
        book._repo_file_url(gl, "notebooks/f00.md")
        == "https://gitlab.com/g/sub/repo/-/blob/main/docs/notebooks/f00.md"
    )
    other = book.repository_links({"repository": {"url": "https://git.example.org/repo"}})
    assert other["host"] == "" and other["owner_repo"] == ""
    with pytest.raises(BookError, match="repository.url"):
        book.repository_links({"repository": {"url": "git@github.com:org/repo.git"}})
    staged = book._staged_config(
        {"repository": {"url": ""}, "coupling_book": {"pages_branch": "x"}, "html": {}}, {}
    )
    assert "coupling_book" not in staged and not staged["html"]  # no repository: nothing turned on
    on = book._staged_config(config(), gh)
    theme = on["sphinx"]["config"]["html_theme_options"]
    assert (
        theme["repository_url"] == gh["url"]
        and theme["use_edit_page_button"]
        and theme["use_repository_button"]
    )
    assert on["html"]["use_repository_button"] and "coupling_book" not in on


def test_staging_publishes_notebooks_tables_and_the_download_box(tmp_path):
    from coupling_utils.analysis.display import table_bundle

    root = _scratch_root(tmp_path, ["f00_coupling_metric"])
    cfg = yaml.safe_load((root / "_config.yml").read_text())
    cfg["repository"]["url"] = "https://github.com/org/repo"
    (root / "_config.yml").write_text(yaml.safe_dump(cfg))
    (root / "CITATION.cff").write_text((ROOT / "CITATION.cff").read_text())
    executed = tmp_path / "executed"
    _executed_notebook(executed / "f00_coupling_metric.ipynb")
    nb = nbformat.read(executed / "f00_coupling_metric.ipynb", as_version=4)
    install = nbformat.v4.new_code_cell('REPOSITORY = ""  # set by the build')
    install.metadata["tags"] = ["remove-cell", book.INSTALL_TAG]
    cell = nbformat.v4.new_code_cell("show_table(...)")
    import pandas as pd

    for name in ("per_prompt", "fits"):
        data, meta = table_bundle(pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), name)
        cell.outputs.append(nbformat.v4.new_output("display_data", data=data, metadata=meta))
    nb.cells[1:1] = [install, cell]
    nbformat.write(nb, executed / "f00_coupling_metric.ipynb")
    src = tmp_path / "src"
    book.stage_book(root, executed, src, BuildOptions(allow_unexecuted=True))
    extra = src / book.EXTRA_STAGE / "notebooks"
    assert (extra / "f00_coupling_metric" / "per_prompt.csv").read_text() == "a,b\n1,x\n2,y\n"
    assert (extra / "f00_coupling_metric" / "fits.csv").is_file()
    published = nbformat.read(extra / "f00_coupling_metric.ipynb", as_version=4)
    assert "REPOSITORY = 'https://github.com/org/repo.git'" in published.cells[1].source
    assert "chapter-links" not in published.cells[0].source  # the download is the run, untouched
    page = nbformat.read(src / "notebooks" / "f00_coupling_metric.ipynb", as_version=4)
    title = page.cells[0].source
    assert title.startswith("# Scratch finding\n\n```{chapter-links}")
    assert ":notebook: f00_coupling_metric.ipynb" in title
    assert ":tables: f00_coupling_metric/per_prompt.csv f00_coupling_metric/fits.csv" in title
    assert (
        ":colab: https://colab.research.google.com/github/org/repo/blob/gh-pages/notebooks/f00_coupling_metric.ipynb"
        in title
    )
    assert ":source: https://github.com/org/repo/blob/main/notebooks/f00_coupling_metric.md" in title
    cite = (src / "book" / "bibliography.md").read_text()
    assert "## Cite this companion" in cite and "url     = {https://github.com/org/repo}" in cite
    # two tables of one name in one notebook: an error naming it
    cell.outputs.append(cell.outputs[0])
    nbformat.write(nb, executed / "f00_coupling_metric.ipynb")
    with pytest.raises(BookError, match="two tables named 'per_prompt'"):
        book.stage_book(root, executed, src, BuildOptions(allow_unexecuted=True))


def test_citation_comes_from_citation_cff(tmp_path):
    text = pages.citation_section(ROOT / "CITATION.cff")
    meta = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert meta["title"] in text and f"version {meta['version']}" in text
    assert "{cite:t}`aubry2025coupling`" in text  # the preferred citation: the paper
    bad = tmp_path / "CITATION.cff"
    bad.write_text("cff-version: 1.2.0\n")
    with pytest.raises(BookError, match="no title"):
        pages.citation_section(bad)


def test_publishing_workflow_runs_what_the_repository_has():
    """The GitHub Actions workflow: valid YAML, on pushes to main, make targets that exist, the
    model cache where the notebooks look, and the Pages branch the Colab links point at."""
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert on["push"]["branches"] == ["main"]
    assert wf["permissions"]["contents"] == "write"
    steps = wf["jobs"]["book"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    targets = set(re.findall(r"^\s*([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    used = set(re.findall(r"\bmake (?:-s )?([\w-]+)", runs))
    assert used >= {"venv", "zoo-key", "book"} and used <= targets, used - targets
    assert "PROFILE=default" in runs
    caches = [s["with"] for s in steps if s.get("uses", "").startswith("actions/cache")]
    assert any(
        c["path"] == "${{ env.COUPLING_CACHE }}" and "steps.zoo.outputs.key" in c["key"] for c in caches
    )
    assert wf["env"]["COUPLING_CACHE"].endswith(".cache/coupling")
    pages = config()["coupling_book"]["pages_branch"]
    assert f"git init -q -b {pages}" in runs and runs.rstrip().endswith(pages)
    assert "touch .nojekyll" in runs  # otherwise Pages drops _static/ and _images/
    assert {"serve", "zoo-key"} <= targets


# --- remote assets ---------------------------------------------------------------------------


def test_remote_assets_finds_loads_from_other_hosts_but_not_links(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "ok.html").write_text(
        '<html><head><script src="_static/a.js"></script>'
        '<link rel="stylesheet" href="_static/a.css"></head>'
        '<body><a href="https://example.org/paper">a link is fine</a>'
        '<script type="application/json">{"$schema": "https://vega.github.io/schema/vega-lite/v6.json"}</script>'
        '<img src="data:image/png;base64,AAAA"></body></html>'
    )
    (tmp_path / "sub" / "bad.html").write_text(
        '<html><head><script src="https://cdn.example.com/x.js"></script>'
        '<link rel="stylesheet" href="//fonts.example.com/css">'
        '<script>const URL = "https://unpkg.example.com/lib.js";</script>'
        '<style>@import "https://css.example.com/a.css";</style></head>'
        '<body><img src="http://img.example.com/p.png"></body></html>'
    )
    (tmp_path / "theme.css").write_text("body{background:url('https://img.example.com/bg.png')}")
    found = remote_assets(tmp_path)
    urls = {u for _, u in found}
    assert urls == {
        "https://cdn.example.com/x.js",
        "//fonts.example.com/css",
        "https://unpkg.example.com/lib.js",
        "https://css.example.com/a.css",
        "http://img.example.com/p.png",
        "https://img.example.com/bg.png",
    }
    assert {page for page, _ in found} == {"sub/bad.html", "theme.css"}


def _figure_html(spec: dict, caption: str, alt: str) -> str:
    """A chart figure as the book's Sphinx extension writes it (spec script, image, caption)."""
    import html as html_lib

    from coupling_utils.analysis.display import _json_for_script

    return (
        '<figure class="coupling-chart align-default" id="fig-x"><div class="coupling-chart-view"></div>'
        '<script type="application/json" class="coupling-chart-spec" data-renderer="svg">'
        f'{_json_for_script(spec)}</script><img alt="{html_lib.escape(alt)}" class="coupling-chart-static" '
        'src="../_images/x.svg" />'
        '<figcaption><p><span class="caption-number">Fig. 3 </span><span class="caption-text">'
        f'{caption}</span><a class="headerlink" href="#fig-x" title="Link">#</a></p></figcaption></figure>'
    )


def test_proofreading_fails_the_build_on_reprs_and_false_captions(tmp_path, capsys):
    """The built pages: a repr in prose, an output or alt text, and a caption whose "(left)" the
    figure (stacked for the book's column) contradicts are found, by page and text; code is not."""
    import altair as alt
    import pandas as pd

    from coupling_utils.analysis.display import chart_spec
    from coupling_utils.pipeline.proofread import proofread

    def panel(title):
        return (
            alt.Chart(pd.DataFrame({"x": [1, 2]}))
            .mark_point()
            .encode(x="x:Q")
            .properties(width=400, height=100, title=title)
        )

    spec = chart_spec(panel("Excess over the twin") | panel("Raw coupling"))[0]  # stacked: 2 x 400 px
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "good.html").write_text(
        "<html><body><p>Coupling is 0.25 and None of the runs fall.</p>"
        '<div class="cell_input docutils container"><pre>x = np.float64(0.3); array([1])</pre></div>'
        + _figure_html(
            spec, "Excess over the twin (top) and raw coupling (bottom).", "Two scatters, stacked."
        )
        + "</body></html>"
    )
    (tmp_path / "notebooks" / "bad.html").write_text(
        "<html><body><p>The peak is np.float64(0.3) at step 8.</p>"
        '<div class="cell_output"><pre>steps array([1, 2])</pre></div>'
        '<img alt="at Timestamp(\'2024\')" src="a.png">'
        + _figure_html(
            spec, "Excess over the twin (left) and raw coupling (right).", "Two scatters side by side."
        )
        + "<script>var a = 'np.int64(2)';</script></body></html>"
    )
    found = proofread(tmp_path)
    assert all(p.startswith("notebooks/bad.html: ") for p in found), found
    text = "\n".join(found)
    assert "repr 'np.float64(' in the text: …The peak is np.float64(0.3) at step 8" in text
    assert "repr 'array([' in the text" in text and "repr 'Timestamp(' in alt text" in text
    assert "np.int64" not in text  # scripts are not text
    assert "figure caption 'Excess over the twin (left) and raw coupling (right).'" in text
    assert "said to be (left) but is at (top)" in text and "said to be (right) but is at (bottom)" in text
    assert "figure alt text 'Two scatters side by side.'" in text
    with pytest.raises(BookError, match=r"notebooks/bad.html: repr 'np.float64\('"):
        book._check_proofread(tmp_path, strict=True)
    book._check_proofread(tmp_path, strict=False)
    assert "[book] warning: the built book shows readers" in capsys.readouterr().err
    (tmp_path / "notebooks" / "bad.html").unlink()
    book._check_proofread(tmp_path, strict=True)  # nothing left to find


# --- charts ----------------------------------------------------------------------------------


def _chart():
    import altair as alt
    import pandas as pd

    data = pd.DataFrame({"layer": [0, 1, 2, 3], "coupling": [0.1, 0.5, 0.7, 0.8]})
    return alt.Chart(data).mark_line(point=True).encode(x="layer:Q", y="coupling:Q")


def test_to_svg_draws_the_chart_without_a_browser():
    from coupling_utils.analysis.display import to_svg

    svg = to_svg(_chart())
    assert svg.lstrip().startswith("<svg") and "</svg>" in svg
    assert "coupling" in svg  # the axis title is drawn as text
    assert to_svg(_chart().to_dict()) == svg


def _displayed(monkeypatch) -> list:
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append((obj, kw)))
    return shown


def test_show_displays_a_live_chart_with_a_static_picture(monkeypatch):
    import json

    from coupling_utils.analysis import display

    shown = _displayed(monkeypatch)
    assert display.show(_chart(), caption="Coupling rises.", name="fig-x", alt="A rising line.") is None
    ((bundle, kw),) = shown
    assert kw["raw"] is True
    assert kw["metadata"][display.METADATA_KEY]["chart"] == {
        "name": "fig-x",
        "caption": "Coupling rises.",
        "alt": "A rising line.",
    }
    assert set(bundle) == {"text/html", "image/svg+xml", "text/plain"}  # HTML, and a picture fallback
    assert bundle["text/plain"] == "A rising line."
    parts = display.chart_parts(bundle["text/html"])
    assert parts.mime == "image/svg+xml" and parts.content == bundle["image/svg+xml"]
    assert parts.alt == "A rising line." and parts.width and parts.width < display.FIT_WIDTH
    spec = json.loads(re.search(r'class="coupling-chart-spec"[^>]*>(.*?)</script>', parts.live).group(1))
    assert spec["description"] == "A rising line." and spec["mark"]["type"] == "line"
    assert spec["config"]["mark"]["tooltip"] == {"content": "encoding"}  # marks without one still tell
    # no alt given: a description from the chart, never a file name
    display.show(_chart().properties(title="Coupling by layer"))
    alt_text = shown[-1][1]["metadata"][display.METADATA_KEY]["chart"]["alt"]
    assert alt_text.startswith("Chart: Coupling by layer") and "coupling against layer" in alt_text


def test_show_refuses_unusable_figure_names():
    from coupling_utils.analysis.display import chart_bundle

    with pytest.raises(ValueError, match="no caption"):
        chart_bundle(_chart(), name="fig-x")
    with pytest.raises(ValueError, match="letters, digits"):
        chart_bundle(_chart(), name="fig x", caption="c")
    with pytest.raises(ValueError, match="non-empty"):
        chart_bundle(_chart(), caption=" ")


def test_chart_spec_cannot_close_its_script_element():
    import altair as alt
    import pandas as pd

    from coupling_utils.analysis.display import chart_bundle, chart_parts

    data = pd.DataFrame({"label": ["</script><script>alert(1)</script>"], "x": [1.0]})
    bundle, _ = chart_bundle(alt.Chart(data).mark_point().encode(x="x:Q", tooltip="label:N"))
    live = chart_parts(bundle["text/html"]).live
    assert live.count("</script>") == 1 and "\\u003c/script>" in live


def test_show_switches_to_png_for_a_large_chart(monkeypatch):
    from coupling_utils.analysis import display

    shown = _displayed(monkeypatch)
    svg_bytes = len(display.to_svg(display.chart_spec(_chart())[0]).encode())
    display.show(_chart(), max_svg_bytes=svg_bytes)  # at the limit: still SVG
    display.show(_chart(), max_svg_bytes=svg_bytes - 1)  # over it: PNG at twice the resolution
    (svg, _), (png, kw) = shown
    assert "image/svg+xml" in svg and "image/png" in png and 'data-renderer="svg"' in svg["text/html"]
    assert 'data-renderer="canvas"' in png["text/html"]  # many marks: a canvas live view
    parts = display.chart_parts(png["text/html"])
    raw = base64.b64decode(parts.content)
    assert raw.startswith(b"\x89PNG") and parts.width == int.from_bytes(raw[16:20], "big") // 2
    assert kw["metadata"]["image/png"] == {"width": parts.width} and 0 < parts.width < 2000


def test_show_wraps_charts_wider_than_the_column():
    from coupling_utils.analysis import display, rendering

    wide = _chart().properties(width=300) | _chart().properties(width=300) | _chart().properties(width=300)
    spec, svg = display.chart_spec(wide)
    assert "hconcat" not in spec and spec["columns"] == 1
    assert rendering.svg_width(svg) <= display.FIT_WIDTH
    kept, svg = display.chart_spec(wide, fit=False)
    assert "hconcat" in kept and rendering.svg_width(svg) > display.FIT_WIDTH


def test_book_renderer_makes_bare_charts_live_too():
    import altair as alt

    from coupling_utils.analysis.display import METADATA_KEY, RENDERER_NAME, use_book_charts

    previous = alt.renderers.active
    try:
        use_book_charts()
        assert alt.renderers.active == RENDERER_NAME
        bundle, metadata = alt.renderers.get()(_chart().to_dict())
        assert "coupling-chart-spec" in bundle["text/html"] and "<svg" in bundle["image/svg+xml"]
        assert metadata[METADATA_KEY]["chart"]["caption"] is None
    finally:
        alt.renderers.enable(previous)


def test_show_table_wraps_text_and_stores_the_csv(monkeypatch):
    import pandas as pd

    from coupling_utils.analysis import display

    shown = _displayed(monkeypatch)
    df = pd.DataFrame({"prompt": [f"p{k}" for k in range(40)], "text": ["KING RICHARD II:\nRight, you"] * 40})
    display.show_table(df, "prompts", max_rows=5)
    ((bundle, kw),) = shown
    page = bundle["text/html"]
    assert "\\n" not in page and "KING RICHARD II: ↵ Right, you" in page
    assert "First 5 of 40 rows" in page and page.count("<tr>") == 5  # the body rows shown
    table = kw["metadata"][display.METADATA_KEY]["table"]
    assert table["name"] == "prompts" and table["rows"] == 40
    assert pd.read_csv(io.StringIO(table["csv"])).equals(df)  # the whole table, newlines kept
    with pytest.raises(ValueError, match="file name"):
        display.show_table(df, "my table")
    with pytest.raises(TypeError, match="DataFrame"):
        display.show_table([1, 2], "x")


def test_to_svg_rejects_what_is_not_a_chart():
    from coupling_utils.analysis.display import to_svg

    with pytest.raises(TypeError, match="Altair chart"):
        to_svg(42)


# --- a whole build -------------------------------------------------------------------------

SAMPLE_REPOSITORY = "https://github.com/example-org/coupling-book"

SCRATCH_NOTEBOOK = """\
---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# f00 · Scratch finding

A formula, inline $m_K(J_1, J_2) \\le \\sqrt 2$ and displayed:

$$
1 - m_K^2 .
$$

See {doc}`../book/notation-and-method`, {cite}`aubry2025coupling`, the {term}`coupling` of
{term}`block Jacobians <block Jacobian>`, and {numref}`Fig. %s <fig-scratch-curve>`.

```{code-cell} ipython3
:tags: [remove-cell, companion-install]

REPOSITORY = ""  # the book build writes _config.yml's repository.url here
```

```{code-cell} ipython3
import pandas as pd
from coupling_utils.analysis import plots
from coupling_utils.analysis.display import show, show_table

curve = pd.DataFrame({"layer": [0, 1, 2], "coupling": [0.2, 0.6, 0.9]})
show(plots.layer_profile(curve, "coupling", look=plots.Look(title="Scratch curve")), name="fig-scratch-curve",
     caption="Coupling rises with depth ({term}`coupling`, $1 - m_K^2$).",
     alt="Line chart: coupling rises from 0.2 at layer 0 to 0.9 at layer 2.")
show_table(curve, "curve", caption="The curve's values")
```

```{exercise}
:label: ex-scratch

Predict the coupling at layer 3, then check it.
```

```{solution} ex-scratch
:class: dropdown

It keeps rising.
```
"""


def build_scratch_book(
    tmp_path: Path, repository: str = "", edition: str = "teacher", printable: bool = False
) -> Path:
    """Build the real prose plus one executed scratch notebook (a captioned chart, a table,
    formulas, an exercise) to HTML, with ``repository.url`` set to ``repository``, in the given
    edition (and with its printable edition)."""
    import jupytext
    from nbclient import NotebookClient

    root = _scratch_root(tmp_path, [])
    shutil.copy2(ROOT / "CITATION.cff", root / "CITATION.cff")
    if repository:
        cfg = yaml.safe_load((root / "_config.yml").read_text())
        cfg["repository"]["url"] = repository
        (root / "_config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    for page in {p.stem for p in (root / "book").glob("*.md")} - set(BOOK_PAGES):
        (root / "book" / f"{page}.md").unlink()  # other helpers' pages: tested by the full build
    source = root / "notebooks" / "f00_coupling_metric.md"
    source.write_text(SCRATCH_NOTEBOOK)
    nb = jupytext.read(source)
    NotebookClient(
        nb,
        timeout=600,  # generous guards against a hang (nbclient names them when they fire)
        startup_timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(root)}},
    ).execute()
    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(nb, executed / "f00_coupling_metric.ipynb")
    options = BuildOptions(strict=True, work=tmp_path / "work", edition=edition, printable=printable)
    return book.build_book(root, executed, tmp_path / "html", options)


@pytest.mark.slow
def test_build_renders_live_charts_figures_downloads_and_links(tmp_path):
    """One strict build with a sample public repository: every feature of a chapter page."""
    html = build_scratch_book(tmp_path, repository=SAMPLE_REPOSITORY)
    assert (html / "index.html").is_file()
    page = (html / "notebooks" / "f00_coupling_metric.html").read_text()
    # the chart: a numbered, captioned figure with the live view, its spec and a static picture
    figure = re.search(
        r'<figure class="[^"]*coupling-chart[^"]*" id="fig-scratch-curve">(.*?)</figure>', page, re.S
    )
    assert figure, "the captioned chart is not a figure labelled fig-scratch-curve"
    assert 'class="coupling-chart-spec"' in figure.group(1)
    assert re.search(
        r'<img alt="Line chart: coupling rises[^"]*" class="[^"]*coupling-chart-static', figure.group(1)
    )
    assert re.search(r'<span class="caption-number">Fig\. \d+ </span>', figure.group(1))
    assert 'href="../book/glossary.html#term-coupling"' in figure.group(1), (
        "the caption is MyST: {term} works"
    )
    image = re.search(r'<img alt="Line chart[^"]*"[^>]*>', figure.group(1)).group(0)
    assert 'loading="lazy"' in image  # not fetched once the live view hides it
    static = re.search(r'src="([^"]+)"', image).group(1)
    assert (html / "notebooks" / static).resolve().is_file(), static
    assert re.search(
        r'<a class="reference internal" href="#fig-scratch-curve"><span class="std std-numref">Fig\. \d+',
        page,
    )
    # the chart runtime: one file per build, loaded by this page only, not from _static's injected set
    assert page.count("_static/coupling/charts.js") == 1
    assert (html / "_static" / "coupling" / "charts.js").stat().st_size > 500_000
    intro = (html / "book" / "intro.html").read_text()
    assert "coupling/charts.js" not in intro and "_static/coupling/book.css" in intro
    # downloads: the executed notebook and the table, next to the page
    assert 'href="f00_coupling_metric.ipynb" download' in page
    assert 'href="f00_coupling_metric/curve.csv" download' in page
    assert (html / "notebooks" / "f00_coupling_metric" / "curve.csv").read_text().splitlines() == [
        "layer,coupling",
        "0,0.2",
        "1,0.6",
        "2,0.9",
    ]
    published = nbformat.read(html / "notebooks" / "f00_coupling_metric.ipynb", as_version=4)
    install = [c for c in published.cells if book.INSTALL_TAG in c.metadata.get("tags", [])]
    assert install and f"REPOSITORY = '{SAMPLE_REPOSITORY}.git'" in install[0].source
    assert "REPOSITORY" not in page, "the install cell is removed from the page"
    # links: repository button, edit link to the Markdown source, chapter source, Colab
    assert f'href="{SAMPLE_REPOSITORY}"' in page
    assert f"{SAMPLE_REPOSITORY}/edit/main/notebooks/f00_coupling_metric.md" in page
    assert f"{SAMPLE_REPOSITORY}/edit/main/book/intro.md" in intro
    assert f'href="{SAMPLE_REPOSITORY}/blob/main/notebooks/f00_coupling_metric.md"' in page
    colab = (
        "https://colab.research.google.com/github/example-org/coupling-book/blob/gh-pages/"
        "notebooks/f00_coupling_metric.ipynb"
    )
    assert f'href="{colab}"' in page
    # exercise and hidden solution (sphinx-exercise)
    assert re.search(r'class="[^"]*exercise[^"]*"', page) and "Predict the coupling" in page
    assert re.search(r'class="[^"]*solution[^"]*dropdown', page) or "toggle" in page
    assert "It keeps rising" in page, "the teacher edition shows the solution (the student one does not)"
    # glossary terms fill the index; the companion's citation comes from CITATION.cff
    genindex = (html / "genindex.html").read_text()
    for term in ("block Jacobian", "m_K", "twin", "expodistance", "profile"):
        assert term in genindex, term
    bibliography = re.sub(r"<[^>]+>", "", (html / "book" / "bibliography.html").read_text())
    assert "Cite this companion" in bibliography and "@software{coupling_companion" in bibliography
    assert "version 0.1.0" in bibliography
    assert "MathJax" not in page or "_static/mathjax/tex-svg.js" in page
    assert (html / "_static" / "mathjax" / "tex-svg.js").is_file()
    assert remote_assets(html) == []
    for name in BOOK_PAGES:
        assert (html / "book" / f"{name}.html").is_file(), name


def test_proofreading_checks_each_verdict_word_against_the_status_table(tmp_path):
    """A verdict glued with verdict_word agrees with its claim's status row, or the build says so;
    a bold verdict typed into the prose is refused; a status table's own cells are not prose."""
    import html

    from coupling_utils.analysis.verdicts import Rule, claim, verdict_word
    from coupling_utils.pipeline.proofread import proofread
    from coupling_utils.pipeline.status import _html, status_table

    rule = Rule(yes="x >= 1", partly="x > 0")
    rows = [claim("the twin's coupling is low", paper="low", rule=rule, values={"x": 0.5})]  # partly
    table = _html(status_table(rows))
    word = verdict_word(rows[0]).data
    assert 'data-claim="the twin&#x27;s coupling is low"' in word and "**partly**" in word

    def span(claim_text, verdict):
        return (
            f'<span class="coupling-verdict" data-claim="{html.escape(claim_text, quote=True)}">'
            f"<strong>{verdict}</strong></span>"
        )

    pages = tmp_path / "notebooks"
    pages.mkdir()
    (pages / "good.html").write_text(
        f"<html><body><p>The twin ({span(rows[0]['claim'], 'partly')}).</p>"
        f"<p><strong>Note</strong>: text.</p>{table}</body></html>"
    )
    (pages / "bad.html").write_text(
        f"<html><body><p>The twin ({span(rows[0]['claim'], 'yes')}), the rise "
        f"({span('the rise', 'no')}), and typed: <strong>partly</strong>.</p>{table}</body></html>"
    )
    found = proofread(tmp_path)
    assert all(p.startswith("notebooks/bad.html: ") for p in found), found
    text = "\n".join(found)
    assert (
        "verdict 'yes' in the prose, 'partly' in the status table, for \"the twin's coupling is low\"" in text
    )
    assert "verdict 'no' for the claim 'the rise', which no status table on the page lists" in text
    assert "a typed bold verdict 'partly'" in text and len(found) == 3
