"""The lab kit's notebooks show no MyST role that Jupyter leaves as written (``{numref}``,
``{cite}``, besides ``{doc}``, ``{ref}`` and ``{term}``): each is a link to the published book
or plain words. The reruns the prose types in the repository's form (``coupling-book run f01 -p
how=adjacent``) are the kit's papermill lines, by the rule of the glued rerun hints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from test_kit_reruns_and_links import _papermill

from coupling_utils.chapters import reruns
from coupling_utils.chapters.reruns import kit_command
from coupling_utils.pipeline import kit
from coupling_utils.pipeline.execution import _checked_values, notebook_paths
from coupling_utils.pipeline.kit_links import book_links, kit_reruns
from coupling_utils.pipeline.pages import book_config

ROOT = Path(__file__).resolve().parents[1]
ROLE = re.compile(r"\{(?!glue:)[a-z:]+\}`")  # the glue roles stay: the kit lists their values
CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _markdown(base: str, tmp_path: Path) -> dict[str, str]:
    """The markdown of each kit notebook (by its fNN), built with the address ``base``."""
    config = {**book_config(ROOT), "html": {"baseurl": base}}
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    links = book_links(ROOT, book_config(tmp_path))
    return {
        s.stem[:3]: "\n".join(
            c.source for c in kit.kit_notebook(s, "teacher", links).cells if c.cell_type == "markdown"
        )
        for s in notebook_paths(ROOT)
    }


@pytest.mark.parametrize("base", ["", "https://example.org/coupling"])
def test_figures_and_citations_are_links_or_words(tmp_path, base):
    text = _markdown(base, tmp_path)
    sources = "".join(s.read_text() for s in notebook_paths(ROOT))
    assert all(f"{{{role}}}`" in sources for role in ("numref", "cite", "cite:t"))
    for name, words in text.items():
        assert not ROLE.search(words), (name, ROLE.findall(words))
    if base:
        f00 = f"{base}/notebooks/f00_coupling_metric.html"
        assert f"([Fig. `fig-f00-spectrum`]({f00}#fig-f00-spectrum))" in text["f00"]
        notation = (
            f"[Fig. `fig-notation-jacobian`]({base}/book/notation-and-method.html#fig-notation-jacobian)"
        )
        assert notation in text["f00"]
        assert (
            f"[Fig. `fig-f04-training`]({base}/notebooks/f04_vision_transformers.html#fig-f04-training)"
            in text["f04"]
        )
        assert f"The paper [(Aubry et al., 2025)]({base}/book/bibliography.html) " in text["f00"]
        assert f"of [Gai and Zhang (2021)]({base}/book/bibliography.html)" in text["f05"]
        for page, label in re.findall(
            rf"\]\({re.escape(base)}/([\w/-]+)\.html#(fig-[\w-]+)\)", "".join(text.values())
        ):
            assert (ROOT / f"{page}.md").is_file() and label.split("-")[1] in page, (page, label)
    else:
        assert "(in blue in Fig. `fig-f00-spectrum`)" in text["f00"]
        # the prose names the page ("on the notation page"): said once
        assert "(Fig. `fig-notation-jacobian` on the notation page" in text["f00"]
        assert "against Fig. `fig-f01-tiles-twin`;" in text["f01"]  # on its own page: no page named
        assert "The paper (Aubry et al., 2025) compares" in text["f00"]  # {cite}: as {cite:p}
        assert "SmolLM2-135M-Instruct (Ben Allal et al., 2025)" in text["f01"]
        assert "of Gai and Zhang (2021): replace" in text["f05"]  # {cite:t}: textual
        assert "- Aubry et al. (2025): the paper;" in text["f00"]
        links = book_links(ROOT, book_config(ROOT))
        said = links.rewrite("{cite:p}`gai2021mathematical,aubry2025coupling`", "f05_token_trajectories")
        assert said == "(Gai and Zhang, 2021; Aubry et al., 2025)"
        assert "](" not in " ".join(re.findall(r"Fig\. `[^`]+`.{0,3}|\(\d{4}\)", "".join(text.values())))


def test_no_citation_repeats_the_authors_the_prose_names():
    """``{cite}`` and ``{cite:p}`` are parenthetical in the book (sphinxcontrib-bibtex's author-year
    style) and in the kit: prose that names the authors cites with ``{cite:t}``, or it reads
    "Aubry et al. (Aubry et al., 2025)"."""
    cites = book_links(ROOT, book_config(ROOT)).cites
    pages = [*notebook_paths(ROOT), *sorted((ROOT / "book").glob("*.md"))]
    role = re.compile(r"\{cite(?::p|:ps)?\}`(?P<keys>[^`]+)`")
    repeated = []
    for path in pages:
        text = path.read_text(encoding="utf-8")
        for m in role.finditer(text):
            before = text[max(0, m.start() - 40) : m.start()]
            for key in m.group("keys").split(","):
                surname = cites[key.strip()][0].split()[0]
                if re.search(rf"\b{re.escape(surname)}\b", before):
                    repeated.append(f"{path.name}: ...{before}{m.group(0)}")
    assert not repeated, "cite with {cite:t} where the prose names the authors:\n" + "\n".join(repeated)


def test_typed_reruns_are_papermill_lines_the_chapter_accepts(tmp_path):
    """No typed ``coupling-book run`` is left in a kit notebook; each papermill line names a
    notebook and a profile file of the kit and passes ``coupling-book run``'s checks."""
    text = _markdown("", tmp_path)
    lines = []
    for name, words in text.items():
        assert "coupling-book run" not in words, name
        lines += [code for code in CODE.findall(words) if code.startswith("python -m papermill")]
    assert len(lines) >= 8
    for line in lines:
        notebook, profile, values = _papermill(line)
        stem = notebook.removesuffix(".ipynb")
        assert profile.endswith(f"/{stem}.yaml") and (ROOT / "notebooks" / profile).is_file(), line
        if values != {"name": "value"}:  # f03's "-p name=value": the form, not a rerun
            _checked_values(ROOT / "notebooks" / f"{stem}.md", profile.split("/")[1], values)
    assert kit_command("f01", {}, "paper") in text["f01"]
    assert reruns._command("f01", {}, False, "paper") == "coupling-book run f01 --profile paper"  # the book's
    assert kit_command("f01", {"how": "adjacent"}) in text["f01"]
    f05 = {"model": "embedded:pythia-tiny"}
    for revision in ("step0", "step64", ""):  # "then `-p revision=step64`": the same rerun, changed
        assert f"`{kit_command('f05', {**f05, 'revision': revision})}`" in text["f05"], revision
    assert shlex.split(kit_command("f05", {**f05, "revision": ""}))[-2:] == ["revision", ""]


def test_only_chapter_reruns_are_rewritten():
    same = [
        "`coupling-book zoo prepare pythia-tiny`",
        "`coupling-book run f00 --output-dir runs`",  # no papermill form: left, the README says which to use
        "`coupling-book run f99 -p k=1`",
        "`-p k=3`",  # no rerun before it in its paragraph
        "```\ncoupling-book run f00 -p k=1\n```",
    ]
    assert [kit_reruns(text) for text in same] == same
    first = f"`{kit_command('f00', {'k': 1})}`"
    assert kit_reruns("`coupling-book run f00 -p k=1`\n\n`-p k=3`") == f"{first}\n\n`-p k=3`"
    assert kit_reruns("`coupling-book run f00 -p k=1`, then `-p k=3`") == (
        f"{first}, then `{kit_command('f00', {'k': 3})}`"
    )
