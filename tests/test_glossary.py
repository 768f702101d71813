"""The glossary defines at least 20 terms, and every chapter links each at its first use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
glossary_links = load_script("scripts/glossary_links.py")


def test_the_glossary_defines_at_least_twenty_terms():
    terms = glossary_links.glossary_terms()
    assert len(terms) >= 20, terms
    assert len({t.lower() for t in terms}) == len(terms)


@pytest.mark.parametrize("notebook", glossary_links.NOTEBOOKS, ids=lambda p: p.stem)
def test_each_term_is_linked_at_its_first_use(notebook):
    problems = glossary_links.unlinked(notebook, glossary_links.glossary_terms())
    assert not problems, "link these with `python scripts/glossary_links.py --fix`:\n" + "\n".join(problems)


def test_every_term_link_names_a_defined_term():
    terms = {t.lower() for t in glossary_links.glossary_terms()}
    pages = [*glossary_links.NOTEBOOKS, *sorted((ROOT / "book").glob("*.md"))]
    for page in pages:
        for role in re.findall(r"\{term\}`([^`]*)`", page.read_text(encoding="utf-8")):
            target = role.rsplit("<", 1)[1].rstrip(">") if role.endswith(">") else role
            assert target.strip().lower() in terms, f"{page.name}: {{term}}`{role}` names no glossary term"


def test_the_check_skips_code_math_and_roles_and_links_the_first_prose_use(tmp_path):
    page = tmp_path / "f09_x.md"
    page.write_text(
        "# Coupling in a title\n\n```{code-cell} ipython3\ncoupling = 1\n```\n\n"
        "Math $coupling$ and `coupling` and {glue:text}`coupling_x` are not prose.\n"
        "Here Coupling is used, and coupling again; trajectories of a twin.\n",
        encoding="utf-8",
    )
    terms = ["coupling", "twin"]
    assert [p.split(": ", 1)[1].split(" is")[0] for p in glossary_links.unlinked(page, terms)] == [
        "first use of 'coupling'",
        "first use of 'twin'",
    ]
    assert glossary_links.link(page, terms) == 2
    text = page.read_text(encoding="utf-8")
    assert "Here {term}`Coupling` is used, and coupling again; trajectories of a {term}`twin`." in text
    assert "coupling = 1" in text and "# Coupling in a title" in text
    assert glossary_links.unlinked(page, terms) == []


def test_the_plateau_entry_says_what_the_book_does_with_curves_that_are_not_flat():
    """It said the book "checks that its small models were trained to it before comparing them";
    f02 finds most curves not flat and compares the models anyway, saying so."""
    text = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    entry = text.split("\nplateau\n", 1)[1].split("\n\n", 1)[0]
    entry = " ".join(entry.split())
    assert "checks that its small models were trained to it" not in entry
    assert "whether each of its small models' curves is flat at its end" in entry
    assert "compares the models either way" in entry
