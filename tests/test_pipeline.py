"""The book pipeline's contracts: parameters cells, profiles, the CLI, and the environment files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coupling_utils.chapters import chapter, check_parameters
from coupling_utils.chapters.checks import (
    ParameterError,
    check_choice,
    check_int,
    check_list,
    check_model,
    check_top_k,
)
from coupling_utils.pipeline.execution import (
    find_notebooks,
    notebook_paths,
    parse_override,
    profile_values,
    profiles,
    run_notebook,
    run_notebooks,
)
from coupling_utils.pipeline.params import check_overrides, notebook_parameters
from coupling_utils.provenance import code_fingerprint

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebook_paths(ROOT)


def test_there_are_notebooks_and_three_profiles():
    assert any(nb.stem.startswith("f00_") for nb in NOTEBOOKS)
    assert {"smoke", "default", "paper"} <= set(profiles(ROOT))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_one_literal_parameters_cell(nb):
    params = notebook_parameters(nb)
    assert params, f"{nb.name} declares no parameters"


@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_profile_file_validates_against_its_notebook(nb, profile):
    declared = notebook_parameters(nb)
    values = check_overrides(declared, profile_values(nb, profile), where=f"{profile}/{nb.stem}")
    check_parameters(nb.stem, {**{n: p.default for n, p in declared.items()}, **values})


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_parameter_is_a_checked_field_of_its_chapter(nb):
    """The notebook's parameters cell and its chapter's ``Params`` agree, name for name, in order,
    default for default (papermill reads the cell; every other caller reads the chapter)."""
    declared = notebook_parameters(nb)
    Params = chapter(nb.stem).Params
    assert list(declared) == Params.names(), f"{nb.stem}: the cell's parameters differ from {Params}"
    defaults = Params.defaults()
    differ = {n: (p.default, defaults[n]) for n, p in declared.items() if p.default != defaults[n]}
    assert not differ, f"{nb.stem}: defaults differ between the cell and the chapter: {differ}"
    check_parameters(nb.stem, {n: p.default for n, p in declared.items()})  # the defaults pass


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_run_without_papermill_is_the_default_profile_s(nb):
    """Jupyter's Run All, Colab and the lab kit run the parameters cell as written, with no profile
    injected: its values must be the `default` profile's, the book's run, which the pages, the
    solutions and the chapter's time describe. f01's cell measured 2 prompts and f05's 2 after the
    default profile had gone to 6 (each verdict then had no interval)."""
    declared = notebook_parameters(nb)
    profile = profile_values(nb, "default")
    differ = {n: (declared[n].default, v) for n, v in profile.items() if declared[n].default != v}
    assert not differ, f"{nb.stem}: the cell (left) is not the default profile (right): {differ}"


def test_bad_values_fail_before_a_kernel_starts(tmp_path):
    nb = next(p for p in NOTEBOOKS if p.stem.startswith("f01"))
    result = run_notebook(nb, "smoke", {"dtype": "float64", "tile_k": 4}, tmp_path)
    assert result.status == "failed" and "parameter 'dtype' must be one of" in result.error
    result = run_notebook(nb, "smoke", {"k": [2], "tile_k": 3}, tmp_path)
    assert "parameter 'tile_k' must be <= max(k) = 2" in result.error
    assert not list(tmp_path.iterdir())  # nothing was executed or written


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_page_skeleton(nb):
    text = nb.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    expected = [
        "The claim",
        "The paper's figure",
        "Parameters",
        "Setup",
        "Results",
        "What matched and what did not",
        "Exercises",
        "References",
    ]
    assert [h for h in headings if h in expected] == expected, headings


def _write_nb(tmp_path, cell):
    nb = tmp_path / "f99_x.md"
    nb.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n"
        f"```{{code-cell}} ipython3\n:tags: [parameters]\n\n{cell}\n```\n"
    )
    return nb


def test_parameters_cell_rules(tmp_path):
    params = notebook_parameters(_write_nb(tmp_path, "k = 10  # top-K\nmodels = ['a', 'b']  # models"))
    assert params["k"].default == 10 and params["models"].type_name == "list"
    with pytest.raises(ParameterError, match="comment"):
        notebook_parameters(_write_nb(tmp_path, "k = 10"))
    with pytest.raises(ParameterError, match="literal"):
        notebook_parameters(_write_nb(tmp_path, "k = 5 * n  # derived"))


def test_overrides_are_checked_by_name_and_type(tmp_path):
    params = notebook_parameters(_write_nb(tmp_path, "k = 10  # top-K\nscale = 1.0  # a float"))
    check_overrides(params, {"k": 5, "scale": 2})
    with pytest.raises(ParameterError, match="unknown parameter 'kk'"):
        check_overrides(params, {"kk": 5})
    with pytest.raises(ParameterError, match="parameter 'k' must be of type int"):
        check_overrides(params, {"k": "ten"})
    assert parse_override("k=5") == ("k", 5)
    assert parse_override("models=[a, b]") == ("models", ["a", "b"])
    with pytest.raises(ParameterError, match="key=value"):
        parse_override("k5")


def test_a_single_value_for_a_list_parameter_is_a_one_element_list(tmp_path):
    params = notebook_parameters(
        _write_nb(tmp_path, "k = [10, 30]  # K values\nlayers = []  # blocks\nname = 'x'  # a text")
    )
    assert check_overrides(params, {"k": 30, "layers": 3, "name": "y"}) == {
        "k": [30],
        "layers": [3],
        "name": "y",
    }
    assert check_overrides(params, {"k": [5, 6]}) == {"k": [5, 6]}
    with pytest.raises(ParameterError, match="parameter 'k' must be of type list"):
        check_overrides(params, {"k": "thirty"})  # not an element of the default's type


def test_value_checks_name_the_parameter():
    assert check_int("k", 3, min=1) == 3
    with pytest.raises(ParameterError, match="parameter 'k' must be >= 1, got -1"):
        check_int("k", -1, min=1)
    with pytest.raises(ParameterError, match="'k'.*d=64"):
        check_top_k("k", 65, d=64)
    with pytest.raises(ParameterError, match="'mode'.*one of"):
        check_choice("mode", "x", ["a", "b"])
    with pytest.raises(ParameterError, match=r"'ks\[1\]'"):
        check_list("ks", [1, 0], lambda n, v: check_int(n, v, min=1))
    with pytest.raises(ParameterError, match="'model'"):
        check_model("model", "../no/such/dir")
    assert check_model("model", "EleutherAI/pythia-160m") == "EleutherAI/pythia-160m"


def test_find_notebooks_by_prefix():
    assert find_notebooks(["f00"], ROOT)[0].stem.startswith("f00_")
    with pytest.raises(ParameterError, match="no notebook named"):
        find_notebooks(["f99"], ROOT)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "coupling_utils.pipeline.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_cli_list():
    r = _cli("list")
    assert r.returncode == 0, r.stderr
    assert "f00_" in r.stdout and "smoke" in r.stdout


def test_cli_bad_parameter_fails_naming_it(tmp_path):
    r = _cli("run", "f00", "--profile", "smoke", "-p", "k=-1", "--output-dir", str(tmp_path))
    assert r.returncode != 0
    assert "f00_" in r.stdout and "failed" in r.stdout
    assert "parameter 'k'" in r.stdout
    assert not (tmp_path / "f00_coupling_metric.ipynb").exists()
    r = _cli("run", "f00", "--profile", "smoke", "-p", "nope=1", "--output-dir", str(tmp_path))
    assert r.returncode != 0 and "unknown parameter 'nope'" in r.stdout
    # in parallel too: an unknown name is reported before any model is built or kernel started
    r = _cli(
        "run",
        "f00",
        "f01",
        "--profile",
        "smoke",
        "-p",
        "nope=1",
        "--jobs",
        "2",
        "--output-dir",
        str(tmp_path),
    )
    assert (
        r.returncode != 0 and "building" not in r.stdout and r.stdout.count("unknown parameter 'nope'") == 2
    )
    r = _cli("run", "f00", "--jobs", "0", "--output-dir", str(tmp_path))
    assert r.returncode == 2 and "jobs must be a positive integer" in r.stderr


def _names(requirements):
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_and_pyproject_name_the_same_packages():
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared |= _names(extra)
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _names(pip) == declared


def _tiny_notebook(path: Path, body: str) -> None:
    path.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n"
        f"# {path.stem}\n\n```{{code-cell}} ipython3\n:tags: [parameters]\n\nk = [1, 2]  # K values\n```\n\n"
        f"```{{code-cell}} ipython3\n{body}\n```\n"
    )


def test_run_records_each_notebook_when_it_ends(tmp_path, monkeypatch):
    """runs.json gets a notebook's record (with its own finish time) as soon as it ends: the
    second notebook, run after the first, finds the first already recorded, and sees the
    scalar override as a one-element list."""
    (tmp_path / "notebooks" / "profiles" / "p").mkdir(parents=True)
    out = tmp_path / "out"
    _tiny_notebook(tmp_path / "notebooks" / "f00_first.md", "assert k == [7], k")
    _tiny_notebook(
        tmp_path / "notebooks" / "f01_second.md",
        f"import json\nruns = json.load(open({str(out / 'runs.json')!r}))\n"
        "assert runs['f00_first']['status'] == 'ok' and 'f01_second' not in runs, runs",
    )
    for name in ("f00_first", "f01_second"):
        (tmp_path / "notebooks" / "profiles" / "p" / f"{name}.yaml").write_text("k: [1]\n")
    monkeypatch.setenv("COUPLING_BOOK_ROOT", str(tmp_path))
    results = run_notebooks([], "p", {"k": 7}, output_dir=out, jobs=1, echo=lambda _: None)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    runs = json.loads((out / "runs.json").read_text())
    assert runs["f00_first"]["finished"] <= runs["f01_second"]["finished"]
    assert runs["f00_first"]["parameters"] == {"k": [7]} and runs["f01_second"]["profile"] == "p"
    assert runs["f00_first"]["code"] == code_fingerprint()["fingerprint"]


def test_papermill_reads_every_parameter_of_every_notebook():
    """papermill parses the parameters cell itself to match what it injects (an '=' in a comment
    hides that line from it, and it then warns of an unknown parameter): it must find every one."""
    from papermill.translators import PythonTranslator

    from coupling_utils.pipeline.execution import notebook_paths
    from coupling_utils.pipeline.params import _read_cells, notebook_parameters

    for nb in notebook_paths():
        (cell,) = [c for c in _read_cells(nb) if "parameters" in c.metadata.get("tags", [])]
        assert [p.name for p in PythonTranslator.inspect(cell)] == list(notebook_parameters(nb)), nb.stem


PROBE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

```{code-cell} ipython3
:tags: [parameters]
tag = 0  # which run this is
```

```{code-cell} ipython3
import json, os
from ipykernel.connect import get_connection_info
info = json.loads(get_connection_info())
print(json.dumps({"tag": tag, "pid": os.getpid(), "transport": info["transport"], "ip": info["ip"]}))
```
"""


@pytest.mark.skipif(sys.platform == "win32", reason="Windows kernels keep TCP")
def test_notebooks_run_side_by_side_on_private_unix_sockets_left_behind_by_none(tmp_path):
    """TCP ports are picked, released and only then bound by the kernel, so a notebook started beside
    it could take one ("Address already in use": a kernel dead at start, seen in CI). Each kernel
    listens on Unix sockets in its own folder instead, and the folder goes when the run ends."""
    from concurrent.futures import ThreadPoolExecutor

    (tmp_path / "notebooks" / "profiles" / "smoke").mkdir(parents=True)
    nb = tmp_path / "notebooks" / "probe.md"
    nb.write_text(PROBE)
    (tmp_path / "notebooks" / "profiles" / "smoke" / "probe.yaml").write_text("{}\n")

    def one(tag):
        result = run_notebook(nb, "smoke", {"tag": tag}, tmp_path / f"out{tag}")
        assert result.status == "ok", result.error
        text = json.loads(Path(result.output).read_text())["cells"][-1]["outputs"][0]["text"]
        return json.loads("".join(text))

    with ThreadPoolExecutor(max_workers=4) as pool:
        seen = list(pool.map(one, range(4)))
    assert [s["tag"] for s in seen] == [0, 1, 2, 3]  # each run spoke to its own kernel
    assert len({s["pid"] for s in seen}) == 4
    assert {s["transport"] for s in seen} == {"ipc"}
    folders = {Path(s["ip"]).parent for s in seen}
    assert len(folders) == 4 and not any(f.exists() for f in folders)
    for s in seen:  # each kernel stopped and reaped with its run, not left holding memory until exit
        with pytest.raises(ProcessLookupError):
            os.kill(s["pid"], 0)


def test_the_light_copies_of_choices_name_what_their_owners_do():
    """chapters.checks and the data schemas keep their own copies of a few choices, so that checking
    a parameter or a data file does not import torch; each copy must name what its owner does."""
    from coupling_utils.analysis.data import SCHEMAS
    from coupling_utils.chapters import checks
    from coupling_utils.engine.blocks import LAST_BLOCKS
    from coupling_utils.measurement.settings import MEASURE_METHODS
    from coupling_utils.measurement.tables import SUMMARY_HOWS
    from coupling_utils.models.loading import DTYPES

    assert (
        tuple(DTYPES) == checks.DTYPES and checks.METHODS == MEASURE_METHODS and checks.HOWS == SUMMARY_HOWS
    )
    (last_block,) = [c for c in SCHEMAS["k_sensitivity.csv"].columns if c.name == "last_block"]
    assert last_block.choices == LAST_BLOCKS


def test_every_profile_takes_the_exact_spectra_as_f00_says():
    """f00's references say every profile of the book uses ``method="exact"`` (randomized SVD is
    offered, not used): true of every notebook's default and every profile file."""
    f00 = " ".join((ROOT / "notebooks" / "f00_coupling_metric.md").read_text().split())
    assert 'every {term}`profile` of this book uses `method="exact"`' in f00
    for nb in NOTEBOOKS:
        declared = notebook_parameters(nb)
        if "method" in declared:
            for profile in profiles(ROOT):
                values = {"method": declared["method"].default, **profile_values(nb, profile)}
                assert values["method"] == "exact", f"{profile}/{nb.stem} uses method {values['method']!r}"


def test_the_method_page_says_which_verdicts_are_not_at_the_book_s_k_over_d():
    """The method page names the default book's verdicts at another K/d than the book's: f01's
    other model (MiniLM-L6, at SmolLM2's K) and f02's scale question (the paper's K); true of the
    default profiles, and their K are the ones the page names."""
    from coupling_utils.analysis.k_policy import BOOK_K_OVER_D
    from coupling_utils.engine.metric import k_for_width

    page = " ".join((ROOT / "book" / "notation-and-method.md").read_text().split())
    f01 = {nb.stem: nb for nb in NOTEBOOKS}["f01_depth_and_tokens"]
    f02 = {nb.stem: nb for nb in NOTEBOOKS}["f02_generalization"]
    v01, v02 = profile_values(f01, "default"), profile_values(f02, "default")
    assert v01["model"] == "embedded:smollm2-135m" and k_for_width(576, BOOK_K_OVER_D) == max(v01["k"]) == 72
    assert v01["more_models"] == ["embedded:minilm-l6"] and k_for_width(384, BOOK_K_OVER_D) not in v01["k"]
    assert "other model, MiniLM-L6 (width 384), at SmolLM2's $K$ (so its $K$ = 72 is $K/d$ = 0.19" in page
    assert (
        v02["scale_k"] == [10, 30, 50]
        and "scale question reads the paper's $K \\in \\{10, 30, 50\\}$" in page
    )
