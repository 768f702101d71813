"""The lab kit's notebooks as a student without the repository meets them: the exercises' rerun
hints are papermill lines that run in the kit's folder, and the links to the book's other pages
lead to the published book or name the page in plain text."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml
from papermill.cli import _resolve_type

from coupling_utils.chapters import f00_coupling_metric as f00
from coupling_utils.chapters import f05_token_trajectories as f05
from coupling_utils.chapters.f01_depth_and_tokens import findings as f01
from coupling_utils.chapters.reruns import KIT_ENV, in_kit
from coupling_utils.pipeline import kit
from coupling_utils.pipeline.execution import _checked_values, notebook_paths
from coupling_utils.pipeline.kit_links import book_links
from coupling_utils.pipeline.pages import book_config

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"`([^`]+)`")
ROLE = re.compile(r"\{(doc|ref|term)\}`")


def _hints() -> list[str]:
    """Every glued rerun hint, for a deep model and for one too shallow for the exercise."""
    sweep = pd.DataFrame({"noise": [0.0, 0.5, 1.0, 2.0, 3.0]})
    return [
        f00.k_reruns(576),
        f00.noise_reruns(sweep, 2.5),
        f00.layer_reruns(30, 10),
        f00.layer_reruns(2, 0),
        f01.token_layer_reruns(30, 15),
        f01.token_layer_reruns(1, 0),
        f01.tile_window_reruns(30, 8, "excluded"),
        f01.tile_window_reruns(2, 2, "excluded"),
        f05.lss_window_reruns(30),
        f05.lss_window_reruns(3),
    ]


def _papermill(line: str) -> tuple[str, str, dict]:
    """A papermill line's input notebook, profile file and parameters, read as papermill reads
    them (``-p`` through its own type guess, ``-y`` as YAML)."""
    words = shlex.split(line)
    assert words[:3] == ["python", "-m", "papermill"], line
    notebook, output, *options = words[3:]
    assert output.startswith("runs/") and output.endswith(".ipynb"), line
    values, profile = {}, ""
    while options:
        flag, *options = options
        if flag == "-f":
            profile, *options = options
        elif flag == "-p":
            (name, value), options = options[:2], options[2:]
            values[name] = _resolve_type(value)
        else:
            assert flag == "-y", line
            text, *options = options
            values.update(yaml.safe_load(text))
    return notebook, profile, values


def test_the_repository_says_coupling_book_run(monkeypatch):
    monkeypatch.delenv(KIT_ENV, raising=False)
    assert f00.k_reruns(576) == "`coupling-book run f00 -p k=1` and `-p k=50`"
    assert f05.lss_window_reruns(3).endswith("(e.g. `--profile default`)")
    assert all("papermill" not in hint for hint in _hints())


def test_in_the_kit_every_rerun_hint_is_a_papermill_line_the_chapter_accepts(monkeypatch):
    """Each code of each hint is a whole papermill line for the kit's folder: its notebook and
    profile file exist there, and its parameters pass the checks of ``coupling-book run``."""
    monkeypatch.setenv(KIT_ENV, "1")
    outputs = set()
    for hint in _hints():
        codes = [code for code in CODE.findall(hint) if code != "default"]  # "the `default` profile"
        assert codes and "coupling-book" not in hint and "--profile" not in hint, hint
        for line in codes:
            notebook, profile, values = _papermill(line)
            stem = notebook.removesuffix(".ipynb")
            assert profile == f"profiles/default/{stem}.yaml" and (ROOT / "notebooks" / profile).is_file()
            _checked_values(ROOT / "notebooks" / f"{stem}.md", "default", values)
            outputs.add(shlex.split(line)[4])
    assert {"runs/f00_coupling_metric-k1.ipynb", "runs/f00_coupling_metric-k50.ipynb"} <= outputs
    _, _, values = _papermill(CODE.findall(f01.tile_window_reruns(30, 8, "excluded"))[0])
    assert values == {"tile_layers": list(range(8))}  # a list goes in as YAML, not as a string


def test_the_kit_notebooks_switch_to_papermill_before_a_value_is_glued(monkeypatch):
    monkeypatch.setenv(KIT_ENV, "0")  # restored when the test ends
    assert not in_kit()
    for source in notebook_paths(ROOT):
        nb = kit.kit_notebook(source)
        tagged = [i for i, c in enumerate(nb.cells) if kit.SETUP_TAG in c.metadata.get("tags", [])]
        glued = next(i for i, c in enumerate(nb.cells) if kit._GLUE_CALL.search(c.source))
        assert tagged == [1] and glued > 1, source.name
        assert nb.cells[0].source == kit.INSTALL_CELL
    exec(nb.cells[1].source, {})
    assert in_kit() and "papermill" in f00.k_reruns(576)


def _stderr(tmp_path: Path, cells: list[str]) -> str:
    """What a Jupyter kernel writes to stderr running ``cells`` (no ipywidgets, as in the kit)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells for o in c.outputs if o.get("name") == "stderr")


def test_kit_progress_bars_are_plain_text_without_the_ipywidgets_warning(tmp_path, monkeypatch):
    """tqdm.auto in a kernel without ipywidgets warns "IProgress not found"; after the kit's setup
    cell its bars are plain text and nothing warns (``coupling-book run`` silences it its own way)."""
    pytest.importorskip("nbclient")
    if importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed here: tqdm draws widgets, and never warns")
    for name in ("PYTHONWARNINGS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    probe = "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='probe'):\n    pass"
    assert "IProgress not found" in _stderr(tmp_path, [probe])  # what a student saw before
    (setup,) = [c.source for c in kit.kit_notebook(ROOT / "notebooks" / "f00_coupling_metric.md").cells[1:2]]
    shown = _stderr(tmp_path, [setup, probe])
    assert "IProgress" not in shown and "probe: 100%" in shown and "3/3" in shown


def test_kit_notebooks_have_the_same_cell_ids_in_every_build():
    source = ROOT / "notebooks" / "f00_coupling_metric.md"
    ids = [[c.id for c in kit.kit_notebook(source).cells] for _ in range(2)]
    assert ids[0] == ids[1] and len(set(ids[0])) == len(ids[0])
    other = [c.id for c in kit.kit_notebook(ROOT / "notebooks" / "f01_depth_and_tokens.md").cells]
    assert not set(other) & set(ids[0])


@pytest.mark.parametrize("base", ["", "https://example.org/coupling"])
def test_kit_notebooks_link_the_published_book_or_name_the_page(tmp_path, base):
    """``{doc}``, ``{ref}`` and ``{term}`` lead nowhere in Jupyter: with ``html.baseurl`` they
    become links to the published book, without it the page or section in words."""
    (tmp_path / "_config.yml").write_text(yaml.safe_dump({"html": {"baseurl": base + "/"}}))
    links = book_links(ROOT, book_config(tmp_path))
    assert links.base == base
    text = {
        s.stem: "\n".join(c.source for c in kit.kit_notebook(s, "teacher", links).cells)
        for s in notebook_paths(ROOT)
    }
    assert not any(ROLE.search(t) for t in text.values())
    if base:
        assert f"[Reproduction status]({base}/book/status.html)" in text["f00_coupling_metric"]
        assert (
            f"[The scale question]({base}/notebooks/f02_generalization.html#f02-scale)"
            in text["f02_generalization"]
        )
        assert f"[coupling]({base}/book/glossary.html#term-coupling)" in text["f00_coupling_metric"]
        assert f"[Coupling]({base}/book/glossary.html#term-coupling)" in text["f05_token_trajectories"]
        assert "http" not in kit._links_sentence("") and base in kit._links_sentence(base)
    else:
        assert "*Reproduction status* (a page of the book)" in text["f00_coupling_metric"]
        assert "*The scale question* (in this notebook)" in text["f02_generalization"]
        assert "*exercise f05-ex-prenorm* (in this notebook)" in text["f05_token_trajectories"]
        assert "](" not in links.rewrite("{term}`tiles <tile>`", "f00_coupling_metric")


def test_the_glossary_anchors_are_the_ones_sphinx_gives():
    from coupling_utils.pipeline.kit_links import term_anchor

    assert term_anchor("block Jacobian") == "term-block-Jacobian"
    assert term_anchor("m_K") == "term-m_K"
    assert term_anchor("Spearman's ρ") == "term-Spearman-s"
