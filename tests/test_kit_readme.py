"""The lab kit's README and notebooks as a class meets them: times that say where they come from,
commands that run twice, reruns without the repository, Colab, and the values the prose quotes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from IPython.display import Markdown
from test_kit import _readme_blocks

from coupling_utils.pipeline import kit
from coupling_utils.pipeline.execution import notebook_paths

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "f00_coupling_metric"
WHEEL = "coupling_utils-1-py3-none-any.whl"


def _costs(folder: Path) -> kit.KitFacts:
    rows = [
        ("f00", "cold", 95.0, "ok", "default", "2 CPU (Xeon), no GPU", "2026-01-02 10:00", "bench"),
        ("f00", "models", 30.0, "ok", "default", "2 CPU (Xeon), no GPU", "2026-01-02 10:00", "bench"),
        ("f00", "warm", 600.0, "failed", "default", "2 CPU (Xeon), no GPU", "2026-01-02 10:00", "bench"),
    ]
    columns = ["chapter", "state", "seconds", "status", "profile", "machine", "date_utc", "command"]
    pd.DataFrame(rows, columns=columns).to_csv(folder / "chapter_costs.csv", index=False)
    predicted = {"notebook": [NOTEBOOK], "profile": ["laptop"], "4-core CPU time": ["about 2.0 min"]}
    predicted.update({"1-core CPU time": ["about 7.5 min"], "download (GB)": [1.24]})
    pd.DataFrame(predicted).to_csv(folder / "profile_costs.csv", index=False)
    return kit.KitFacts(folder, ("f00-ex-big",), {NOTEBOOK: ("smollm2-135m",)})


def test_the_readme_says_how_long_a_chapter_takes_and_where_the_times_come_from(tmp_path):
    readme = kit.kit_readme([NOTEBOOK], WHEEL, "teacher", _costs(tmp_path))
    times = readme[readme.index("## How long a chapter takes") :]
    assert "| f00 | about 2 min | under a minute | not measured | `smollm2-135m` |" in times
    assert "measured on a 2-core CPU (Xeon, no GPU) on 2026-01-02" in " ".join(times.split())
    assert "`smoke` profile is not timed" in times
    assert "coupling-book zoo prepare smollm2-135m" in times
    laptop = " ".join(times.split())
    assert (
        "predicted from the engine's measured throughput, not measured: f00 about 2.0 min on 4 cores"
        in laptop
    )
    assert "`f00-ex-big`" in readme[readme.index("## Exercises") :]
    unknown = kit.kit_readme([NOTEBOOK], WHEEL, "teacher")  # no benchmarks: nothing is claimed
    assert "| f00 | not measured | not measured | not measured | none |" in unknown
    assert "minutes, on a laptop" not in unknown and "measured on" not in unknown


def test_the_readmes_run_commands_can_be_run_twice(tmp_path):
    """A class reruns a cell or a line: the folder the runs go to may exist already."""
    readme = kit.kit_readme([NOTEBOOK], WHEEL, "teacher")
    _unix, _windows, runs, *_ = _readme_blocks(readme)
    made = [line for line in runs if line.startswith("mkdir")]
    assert made
    for _ in range(2):
        done = subprocess.run(["bash", "-c", "set -e\n" + "\n".join(made)], cwd=tmp_path, capture_output=True)
        assert done.returncode == 0, done.stderr


def test_the_readme_reruns_an_exercise_without_the_repository(tmp_path):
    """Exercises say ``coupling-book run``, which needs a clone; the README gives the kit's
    papermill line (the profile's file first, then the parameter) and says why."""
    readme = kit.kit_readme([NOTEBOOK], WHEEL, "teacher")
    section = readme[readme.index("## Exercises") :]
    (rerun,) = _readme_blocks(section)[0]
    assert rerun.startswith(f"python -m papermill {NOTEBOOK}.ipynb runs/")
    assert rerun.index(f"-f profiles/default/{NOTEBOOK}.yaml") < rerun.index("-p k 30")
    env = {k: v for k, v in os.environ.items() if k != "COUPLING_DATA"}
    env.update(COUPLING_BOOK_ROOT=str(tmp_path), COUPLING_CACHE=str(tmp_path / "cache"))
    cli = [sys.executable, "-m", "coupling_utils.pipeline.cli", "run", "f00", "-p", "k=30"]
    failed = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert failed.returncode == 2 and "notebooks/" in failed.stderr, failed.stderr
    assert "finds no `notebooks/` folder" in " ".join(section.split())


def test_the_readme_says_what_differs_on_colab():
    readme = kit.kit_readme([NOTEBOOK], WHEEL, "student")
    colab = readme[readme.index("## Colab") :]
    (steps,) = _readme_blocks(colab)
    assert steps == [f"!unzip -qo {kit.KIT_NAME}.zip", f"%cd {kit.KIT_NAME}"]
    words = " ".join(colab.split())
    assert "skip the venv and the torch line" in words and "Restart session" in words
    assert "`jupyter lab`" in readme and "pip install jupyterlab" in " ".join(readme.split())


def test_each_kit_notebook_lists_the_values_its_prose_quotes():
    """In Jupyter the glue roles of the prose are not filled in: the kit adds, right after each
    chapter's ``glue_all(...)`` cell, one that shows the same values by name."""
    for source in notebook_paths(ROOT):
        nb = kit.kit_notebook(source)
        at = [i for i, c in enumerate(nb.cells) if kit.GLUED_TAG in c.metadata.get("tags", [])]
        assert len(at) == 1, source.name
        glued = nb.cells[at[0] - 1].source
        call = kit._GLUE_CALL.search(glued).group("values")
        assert f"({call})" in nb.cells[at[0]].source, source.name
    shown = []
    values = {"f00_a": 0.25, "f00_b": Markdown("`coupling-book run f00 -p k=1`")}
    names = {"f00": SimpleNamespace(glue_values=lambda p, r: values), "params": 0, "results": 0}
    names["display"] = shown.append
    exec(kit.GLUED_CELL.format(values="f00.glue_values(params, results)"), names)
    (table,) = shown
    assert table["value"].to_dict() == {"f00_a": 0.25, "f00_b": "`coupling-book run f00 -p k=1`"}


def test_the_facts_name_each_chapters_embedded_models():
    facts = kit.kit_facts(ROOT, notebook_paths(ROOT))
    assert facts.models["f00_coupling_metric"] == ("smollm2-135m",)
    assert "lm-training-family" in facts.models["f02_generalization"]
    assert facts.benchmarks == ROOT / "data" / "benchmarks"


def test_the_course_plans_build_every_model_their_chapters_use():
    """The teaching page's ``zoo prepare`` line (the first two plans) and what it adds for the
    module name every embedded model of the plans' chapters at ``default``."""
    import re

    from coupling_utils.pipeline.teaching import PLANS

    text = " ".join((ROOT / "book" / "teaching.md").read_text().split())
    first, added = re.search(
        r"`coupling-book zoo prepare ([\w -]+)` for the first two; add `([\w -]+)`", text
    ).groups()
    models = kit.kit_facts(ROOT, notebook_paths(ROOT)).models
    by_chapter = {stem[:3]: set(names) for stem, names in models.items()}
    for at, (name, chapters) in enumerate(PLANS):
        prepared = set(first.split()) | (set(added.split()) if at >= 2 else set())
        needed = set().union(*(by_chapter[c] for c in chapters))
        assert needed <= prepared, f"{name}: {sorted(needed - prepared)} not prepared"
