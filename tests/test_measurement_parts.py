"""measure() in parts: size limits of the measurement package, its Settings, and provenance helpers."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import coupling_utils
from coupling_utils import provenance
from coupling_utils.measurement import Settings
from coupling_utils.measurement.inputs import model_info
from coupling_utils.measurement.settings import upgrade

PKG = Path(coupling_utils.__file__).resolve().parent
MEASUREMENT = sorted((PKG / "measurement").glob("*.py"))
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


@pytest.mark.parametrize("path", MEASUREMENT, ids=lambda p: p.name)
def test_measurement_modules_are_small_and_import_no_private_names(path):
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_FILE_LINES, f"{path.name} has more than {MAX_FILE_LINES} lines"
    tree = ast.parse(source)
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"
    private = [
        f"line {node.lineno}: {node.module}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coupling_utils")
        for a in node.names
        if a.name.startswith("_")
    ]
    assert not private, f"{path.name} imports private names of other modules: {private}"


def test_the_limits_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"def f():\n{body}\n")
    node = tree.body[0]
    assert node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES


# --------------------------------------------------------------------------- Settings
def test_settings_normalise_validate_and_round_trip_through_json():
    s = Settings(k=[30, 10, 10], tokens=[2, -1], context=True, layers=[0, -1], tiles=10, method="randomized")
    assert s.k == (10, 30) and s.tokens == (2, -1) and s.context == "last" and s.layers == (0, -1)
    assert Settings.from_json(s.to_json()) == s
    assert "chunk_size" not in s.to_dict(runtime=False) and s.to_dict()["chunk_size"] == 64
    with pytest.raises(dataclasses_frozen()):
        s.k = (3,)
    with pytest.raises(ValueError, match="only resolved settings are stored"):
        s.stored()
    with pytest.raises(ValueError, match="unknown settings"):
        Settings.from_dict({"k": [3], "kk": 1})


def dataclasses_frozen():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "fast"}, "method must be one of"),
        ({"k": []}, "k must name at least one K"),
        ({"k": 0}, "k must be at least 1"),
        ({"normalize": "max"}, "normalize must be one of"),
        ({"n_singular": 0}, "n_singular must be a positive integer"),
        ({"solver": "power"}, "solver must be one of"),
        ({"depth_window": 0}, "depth_window must be a positive integer"),
        ({"method": "matrix_free", "block": 0}, "block must be a positive integer"),
        ({"method": "matrix_free", "k": 8, "block": 2, "steps": 3}, "cannot give k=8 triplets"),
        ({"method": "matrix_free", "solver": "subspace", "n_iter": -1}, "n_iter must be a non-negative"),
        ({"layers": []}, "layers selects no block"),
        ({"tokens": "first"}, "tokens must be 'last', 'all'"),
        ({"context": "all"}, "context names one output token"),
        ({"k": 3, "tiles": 5}, "tiles=5 exceeds max"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"chunk_size": -1}, "chunk_size must be a positive integer"),
    ],
)
def test_settings_refuse_bad_values_without_a_model(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Settings(**kwargs)


def test_settings_resolve_against_a_model_and_store_what_the_model_makes_of_them():
    from coupling_utils.engine.architectures import tiny_model

    info = model_info(tiny_model("llama"))  # d = 32, 2 blocks
    s = Settings(k=(3, 8), layers=[-1, 0], tiles=3, method="matrix_free").resolve(info)
    assert s.resolved and s.layers == (0, 1) and s.tile_layers == (0, 1) and s.n_singular == 8
    assert (s.block, s.steps, s.oversample, s.n_iter) == (1, 32, None, None)  # 45 steps capped at d
    stored = s.stored()
    assert stored["format"] == 1 and "max_tokens" not in stored and "chunk_size" not in stored
    assert Settings.from_dict(json.loads(json.dumps(stored))) == s
    assert s.differences(stored) == []
    assert s.differences({**stored, "k": [3]}) == ["k"]
    with pytest.raises(ValueError, match="layer 5 does not exist: the model has 2 blocks"):
        Settings(k=3, layers=[5]).resolve(info)
    with pytest.raises(ValueError, match="tile_layers: layer 7 does not exist"):
        Settings(k=3, tiles=2, tile_layers=[7]).resolve(info)
    with pytest.raises(ValueError, match="exceeds the matrix size d=32"):
        Settings(k=33).resolve(info)
    with pytest.raises(ValueError, match="n_singular=40 exceeds the width d=32"):
        Settings(k=3, n_singular=40).resolve(info)


def test_older_stored_settings_are_upgraded():
    old = {"method": "randomized", "k": [3], "format": 1}
    assert upgrade(old)["solver"] == "subspace" and upgrade(old)["depth_window"] is None
    assert upgrade({"method": "exact", "k": [3]})["solver"] is None


# --------------------------------------------------------------------------- provenance helpers
def test_slug_stable_hash_and_versions():
    assert provenance.slug("embedded:lm-family/run 3") == "embedded_lm-family_run_3"
    assert provenance.slug("..") == "x" and provenance.slug("/a/../.hidden") == "a_.._.hidden"
    assert len(provenance.slug("x" * 200)) == 80
    h = provenance.stable_hash
    assert h({"b": 1, "a": [1, 2]}) == h({"a": [1, 2], "b": 1}) != h({"a": [2, 1], "b": 1})
    assert h(1) != h(1.0) != h("1") and h(torch.tensor([1, 2])) != h(torch.tensor([1, 3]))
    assert h(torch.zeros(2, dtype=torch.bfloat16)) != h(torch.zeros(2))
    import numpy as np

    assert h(np.int64(3)) == h(3)
    with pytest.raises(TypeError, match="cannot hash a object"):
        h(object())
    assert {"coupling_utils", "torch", "transformers", "python"} <= set(provenance.versions())


def test_code_fingerprint_covers_the_number_code_and_ignores_docstrings(tmp_path, monkeypatch):
    fp = provenance.code_fingerprint()
    assert len(fp["fingerprint"]) == 16 and fp["covers"] == list(provenance.NUMBER_SOURCES)
    assert fp["torch"] == torch.__version__
    assert provenance.code_fingerprint(["analysis/trajectories.py"])["fingerprint"] != fp["fingerprint"]
    code = 'def f(x):\n    """Doc."""\n    return x + 1  # a comment\n'
    same = "def f(x):\n    return x + 1\n"
    changed = "def f(x):\n    return x - 1\n"
    assert provenance._code_only(code) == provenance._code_only(same) != provenance._code_only(changed)
    # a change to the engine's code changes the fingerprint
    fake = tmp_path / "pkg"
    for rel in provenance.NUMBER_SOURCES:
        src = provenance.PACKAGE / rel
        dst = fake / rel
        if src.is_dir():
            dst.mkdir(parents=True)
            for f in src.glob("*.py"):
                (dst / f.name).write_text(f.read_text())
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(src.read_text())
    monkeypatch.setattr(provenance, "PACKAGE", fake)
    provenance._sources_hash.cache_clear()
    assert provenance.code_fingerprint()["fingerprint"] == fp["fingerprint"]
    metric = fake / "engine" / "metric.py"
    metric.write_text(metric.read_text().replace("num / den", "num / (den + 0)"))
    provenance._sources_hash.cache_clear()
    assert provenance.code_fingerprint()["fingerprint"] != fp["fingerprint"]
    provenance._sources_hash.cache_clear()
