"""measure(): tidy tables, values against direct computation, resuming, atomic writes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.engine.jacobians import context_jacobians, token_jacobians
from coupling_utils.engine.metric import coupling_matrix, coupling_tile
from coupling_utils.measurement import TABLES, Measurement, coupling_summary, measure
from coupling_utils.measurement.tables import COLUMNS as _COLUMNS

T = 5
KS = (3, 8)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")  # d = 32, 2 blocks, grouped-query attention


@pytest.fixture(scope="module")
def prompts(model):
    g = torch.Generator().manual_seed(7)
    return {
        "a": torch.randint(0, model.config.vocab_size, (1, T), generator=g),
        "b": torch.randint(0, model.config.vocab_size, (1, T - 1), generator=g),
    }


@pytest.fixture(scope="module")
def full(model, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return measure(model, prompts, tokens="all", k=KS, context="last", tiles=3, out=out)


@pytest.fixture(scope="module")
def jacobians(model, prompts):
    return {
        pid: torch.stack([token_jacobians(model, ids, l) for l in range(2)]) for pid, ids in prompts.items()
    }


def test_tables_have_the_documented_schema(full):
    for name in TABLES:
        df = getattr(full, name)
        assert list(df.columns) == _COLUMNS[name], name
        assert len(df) > 0, name
    n_a, n_b = T, T - 1
    assert len(full.depthwise) == len(KS) * 4 * (n_a + n_b)  # 2 layers -> 4 pairs per token and K
    assert len(full.tokenwise) == len(KS) * 2 * (n_a**2 + n_b**2)
    assert len(full.singular_values) == max(KS) * 2 * (n_a + n_b)
    assert len(full.tiles) == 9 * 4 * (n_a + n_b)
    assert set(full.prompts["prompt"]) == {"a", "b"}
    assert full.prompts.set_index("prompt").loc["a", "n_tokens"] == n_a
    np.testing.assert_allclose(full.depthwise["coupling"], 1 - full.depthwise["m"] ** 2)
    assert full.depthwise["layer_i"].dtype == np.int64 and full.depthwise["m"].dtype == np.float64


def test_depthwise_and_tokenwise_match_coupling_matrix(full, jacobians):
    for pid, J in jacobians.items():  # noqa: B007 (pid is read by the query strings); J [L, T, d, d]
        for t in range(J.shape[1]):
            for k in KS:
                M = coupling_matrix(J[:, t], k)
                got = full.depthwise.query("prompt == @pid and token == @t and K == @k")
                got = got.pivot(index="layer_i", columns="layer_j", values="m").to_numpy()
                np.testing.assert_allclose(got, M.numpy(), atol=2e-5)
        for layer in range(2):
            M = coupling_matrix(J[layer], 8)
            got = full.tokenwise.query("prompt == @pid and layer == @layer and K == 8")
            got = got.pivot(index="token_i", columns="token_j", values="m").to_numpy()
            np.testing.assert_allclose(got, M.numpy(), atol=2e-5)


def test_singular_values_and_tiles_match_direct_computation(full, jacobians):
    J = jacobians["a"]
    S = torch.linalg.svdvals(J[1, 2])[:8].double().numpy()
    got = full.singular_values.query("prompt == 'a' and token == 2 and layer == 1").sort_values("rank")
    np.testing.assert_allclose(got["value"], S, rtol=1e-5)
    tile = coupling_tile(J[0, 4], J[1, 4], 3).numpy()  # |U_{1}ᵀ J_0 V_{1}|
    got = full.tiles.query("prompt == 'a' and token == 4 and layer_i == 0 and layer_j == 1")
    got = got.pivot(index="row", columns="col", values="value").to_numpy()
    np.testing.assert_allclose(got, tile, atol=2e-5 * S[0])


def test_context_coupling_matches_context_jacobians(model, prompts, full):
    Jc = torch.stack([context_jacobians(model, prompts["a"], l, T - 1) for l in range(2)])  # [L, T, d, d]
    ctx = full.context.query("prompt == 'a' and K == 3")
    assert set(ctx["output_token"]) == {T - 1}
    M = coupling_matrix(Jc[1], 3)  # across input tokens, layer 1 (causal: all t1 <= t2 are nonzero)
    got = ctx.query("layer_i == 1 and layer_j == 1").pivot(index="token_i", columns="token_j", values="m")
    np.testing.assert_allclose(got.to_numpy(), M.numpy(), atol=2e-5)
    M = coupling_matrix(Jc[:, 2], 3)  # across layers, input token 2
    got = ctx.query("token_i == 2 and token_j == 2 and layer_i != layer_j")
    assert sorted(zip(got["layer_i"], got["layer_j"])) == [(0, 1), (1, 0)]
    for _, row in got.iterrows():
        assert abs(row["m"] - M[row["layer_i"], row["layer_j"]].item()) < 2e-5


def test_files_and_provenance(full):
    out = full.out
    for name in TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{name}.parquet"), getattr(full, name))
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["settings"]["k"] == list(KS) and prov["settings"]["method"] == "exact"
    assert {"coupling_utils", "torch", "transformers"} <= set(prov["versions"])
    assert prov["model"]["n_layers"] == 2 and prov["finished_utc"]
    assert [p["prompt"] for p in prov["prompts"]] == ["a", "b"]
    assert not (out / "_work").exists() or not any((out / "_work").iterdir())  # work removed
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no temporaries
    again = Measurement.load(out)
    pd.testing.assert_frame_equal(again.depthwise, full.depthwise)


def test_interrupted_run_resumes_and_only_computes_the_rest(model, prompts, full, tmp_path):
    class Stop(Exception):
        pass

    seen = []

    def stop_at_second_prompt(info):
        seen.append((info["prompt"], info["layer"], info["computed"]))
        if info["prompt"] == "b" and info["layer"] == 0:
            raise Stop

    with pytest.raises(Stop):
        measure(
            model,
            prompts,
            tokens="all",
            k=KS,
            context="last",
            tiles=3,
            out=tmp_path,
            callback=stop_at_second_prompt,
        )
    assert seen == [("a", 0, True), ("a", 1, True), ("b", 0, True)]
    marker = json.loads((tmp_path / "prompts" / "batch-1" / "done.json").read_text())
    assert list(marker["prompts"]) == ["a"]  # the finished prompt held, written when the run stopped
    layer_dir = tmp_path / "_work" / "b" / "layer_0000"
    assert (layer_dir / "done.json").exists() and (layer_dir / "J.npy").exists()
    assert not (tmp_path / "provenance.json").exists()
    assert not list(tmp_path.rglob("*.tmp"))

    seen.clear()
    res = measure(
        model,
        prompts,
        tokens="all",
        k=KS,
        context="last",
        tiles=3,
        out=tmp_path,
        callback=lambda info: seen.append((info["prompt"], info["layer"], info["computed"])),
    )
    assert seen == [("b", 0, False), ("b", 1, True)]  # prompt a loaded whole; b's layer 0 loaded
    for name in ("depthwise", "tokenwise", "context", "singular_values", "tiles", "prompts"):
        pd.testing.assert_frame_equal(getattr(res, name), getattr(full, name), check_exact=False, atol=1e-6)

    # a third call finds everything stored and computes nothing
    seen.clear()
    measure(
        model,
        prompts,
        tokens="all",
        k=KS,
        context="last",
        tiles=3,
        out=tmp_path,
        callback=lambda info: seen.append(info["computed"]),
    )
    assert seen == []


def test_other_settings_in_the_same_out_are_refused(model, prompts, tmp_path):
    measure(model, {"a": prompts["a"]}, layers=[1], tokens="last", k=3, out=tmp_path)
    with pytest.raises(ValueError, match="other settings.*k"):
        measure(model, {"a": prompts["a"]}, layers=[1], tokens="last", k=4, out=tmp_path)
    res = measure(model, {"a": prompts["a"]}, layers=[1], tokens="last", k=4, out=tmp_path, resume=False)
    assert set(res.singular_values["rank"]) == {1, 2, 3, 4}
    with pytest.raises(ValueError, match="other inputs"):
        measure(model, {"a": prompts["b"]}, layers=[1], tokens="last", k=4, out=tmp_path)


def test_matrix_free_with_full_rank_probe_equals_exact(model, prompts, full):
    seen = []
    res = measure(
        model,
        {"a": prompts["a"]},
        tokens=[1, -1],
        k=KS,
        method="matrix_free",
        solver="subspace",
        oversample=32,
        n_iter=0,
        callback=lambda i: seen.append((i["stage"], i["layer"])),
    )
    # l = d: the range finder sees everything, so the result is exact up to rounding
    ref = full.depthwise.query("prompt == 'a' and token in [1, 4]").reset_index(drop=True)
    np.testing.assert_allclose(res.depthwise["m"], ref["m"], atol=1e-4)
    ref = full.tokenwise.query("prompt == 'a' and token_i in [1, 4] and token_j in [1, 4]")
    np.testing.assert_allclose(res.tokenwise["m"], ref["m"], atol=1e-4)
    assert seen == [("layer", 0), ("layer", 1), ("cross", 0), ("cross", 1)]
    # per layer: 2·l for the spectra, n·kmax token-wise products, (L − 1)·kmax cross products
    assert res.out is None and set(res.timings["block_passes"]) == {2 * 32 + 2 * 8 + 1 * 8}
    assert res.provenance["total_block_passes"] == 2 * (2 * 32 + 2 * 8 + 1 * 8)


def test_matrix_free_vju_orientation_matches_coupling_matrix(model, prompts, jacobians):
    res = measure(
        model,
        {"a": prompts["a"]},
        tokens=[0, -1],
        k=3,
        method="matrix_free",
        solver="subspace",
        oversample=29,
        n_iter=0,
        orientation="vju",
    )
    J = jacobians["a"]
    M = coupling_matrix(J[:, 4], 3, orientation="vju")
    got = res.depthwise.query("token == 4").pivot(index="layer_i", columns="layer_j", values="m")
    np.testing.assert_allclose(got.to_numpy(), M.numpy(), atol=1e-4)
    M = coupling_matrix(J[1][[0, 4]], 3, orientation="vju")
    got = res.tokenwise.query("layer == 1").pivot(index="token_i", columns="token_j", values="m")
    np.testing.assert_allclose(got.to_numpy(), M.numpy(), atol=1e-4)


def test_matrix_free_tiles_use_the_true_jacobian(model, prompts, full):
    """With a truncated sketch the error comes only from the top-K vectors, not from J itself."""
    res = measure(
        model, {"a": prompts["a"]}, k=3, solver="subspace", method="matrix_free", oversample=10, n_iter=3
    )
    ref = full.depthwise.query("prompt == 'a' and token == 4 and K == 3").reset_index(drop=True)
    assert np.abs(res.depthwise["coupling"] - ref["coupling"]).max() < 0.02
    assert set(res.timings["block_passes"]) == {(2 * 3 + 2) * 13 + 3}


def test_randomized_method_is_close_to_exact_and_last_token_is_default(model, prompts, full):
    res = measure(
        model, {"a": prompts["a"]}, k=3, solver="subspace", method="randomized", n_iter=4, oversample=29
    )
    assert set(res.depthwise["token"]) == {T - 1} and res.tokenwise.empty
    ref = full.depthwise.query("prompt == 'a' and token == 4 and K == 3").reset_index(drop=True)
    np.testing.assert_allclose(res.depthwise["m"], ref["m"], atol=1e-4)


@pytest.fixture(scope="module")
def deep_model():
    """A tiny Llama with 4 blocks (d = 32), weights at a realistic scale, for depth windows."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():
            for name, w in m.named_parameters():
                if w.ndim >= 2 and "embed" not in name:
                    w.normal_(0.0, w.shape[-1] ** -0.5)
    return m.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def deep_ids():
    return torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def deep_exact(deep_model, deep_ids):
    return measure(deep_model, {"a": deep_ids}, tokens=[2, -1], k=(3, 6), tiles=2, context="last")


def _pairs(df):
    return sorted(set(zip(df["layer_i"], df["layer_j"])))


def test_depth_window_keeps_only_near_pairs_for_every_method(deep_model, deep_ids, deep_exact):
    near = [(i, j) for i in range(4) for j in range(4) if abs(i - j) <= 1]
    win = measure(
        deep_model, {"a": deep_ids}, tokens=[2, -1], k=(3, 6), tiles=2, context="last", depth_window=1
    )
    assert _pairs(win.depthwise) == near and _pairs(win.tiles) == near
    ctx = win.context.query("layer_i != layer_j")
    assert len(ctx) > 0 and (ctx["layer_i"] - ctx["layer_j"]).abs().max() == 1
    # the window drops rows, it does not change values
    key = ["prompt", "token", "K", "layer_i", "layer_j"]
    both = win.depthwise.merge(deep_exact.depthwise, on=key, suffixes=("", "_full"))
    assert len(both) == len(win.depthwise) == 2 * 2 * len(near)
    np.testing.assert_allclose(both["m"], both["m_full"], atol=1e-6)
    pd.testing.assert_frame_equal(win.tokenwise, deep_exact.tokenwise)
    assert win.provenance["settings"]["depth_window"] == 1


def test_matrix_free_depth_window_matches_exact_and_counts_passes(deep_model, deep_ids, deep_exact):
    key = ["prompt", "token", "K", "layer_i", "layer_j"]
    # block·steps = d = 32: the Krylov space is everything, so the values are exact
    mf = measure(
        deep_model,
        {"a": deep_ids},
        tokens="last",
        k=(3, 6),
        method="matrix_free",
        block=4,
        steps=8,
        depth_window=1,
    )
    assert _pairs(mf.depthwise) == [(i, j) for i in range(4) for j in range(4) if abs(i - j) <= 1]
    both = mf.depthwise.merge(deep_exact.depthwise, on=key, suffixes=("", "_exact"))
    assert len(both) == len(mf.depthwise)
    np.testing.assert_allclose(both["coupling"], both["coupling_exact"], atol=1e-4)
    # per layer: (2·steps − 1)·block for the spectra + (partners)·max(k) tiles; no token-wise tiles
    assert list(mf.timings["block_passes"]) == [
        15 * 4 + 1 * 6,
        15 * 4 + 2 * 6,
        15 * 4 + 2 * 6,
        15 * 4 + 1 * 6,
    ]
    settings = mf.provenance["settings"]
    assert (settings["solver"], settings["block"], settings["steps"]) == ("lanczos", 4, 8)
    assert settings["oversample"] is None and settings["n_iter"] is None
    # default Lanczos settings: block ceil(6/10) = 1, 45 steps capped at d = 32 (the whole space)
    mf = measure(deep_model, {"a": deep_ids}, tokens="last", k=(3, 6), method="matrix_free", depth_window=1)
    both = mf.depthwise.merge(deep_exact.depthwise, on=key, suffixes=("", "_exact"))
    assert (both["coupling"] - both["coupling_exact"]).abs().max() < 1e-3
    assert list(mf.timings["block_passes"]) == [63 + 6, 63 + 12, 63 + 12, 63 + 6]
    assert (mf.provenance["settings"]["block"], mf.provenance["settings"]["steps"]) == (1, 32)
    adjacent = both[(both["K"] == 6) & ((both["layer_i"] - both["layer_j"]).abs() == 1)]
    assert mf.summary("adjacent", k=6) == pytest.approx(adjacent["coupling_exact"].mean(), abs=1e-3)
    with pytest.raises(ValueError, match="how='offdiag' averages all ordered pairs.*depth_window"):
        mf.summary("offdiag")


def test_randomized_method_uses_the_lanczos_solver(deep_model, deep_ids, deep_exact):
    res = measure(deep_model, {"a": deep_ids}, tokens=[2, -1], k=3, method="randomized", block=8, steps=4)
    ref = deep_exact.depthwise.query("K == 3").reset_index(drop=True)
    np.testing.assert_allclose(res.depthwise["m"], ref["m"], atol=1e-4)
    assert res.provenance["settings"]["solver"] == "lanczos"


@pytest.mark.parametrize("checkpoint", [0, 600])
def test_the_assembly_maps_each_stored_file_once_and_reads_back_no_table_this_run_stored(
    model, prompts, full, tmp_path, monkeypatch, checkpoint
):
    """A prompt's tables are assembled from the layer tables this run stored, kept in memory, and
    from its stored arrays, each file mapped once (not once per token and layer): the same tables
    as ever, to the bit (a layer resumed from its files gives them too: test_measurement_crash).
    Layers held in memory (a checkpoint interval longer than the run) get no file at all, and
    their arrays are read from memory: the same tables again."""
    from coupling_utils.measurement import Options
    from coupling_utils.measurement import store as stored

    maps, reads, saved = [], [], []
    load, read, save = stored.load_npy, pd.read_parquet, stored.save_npy
    monkeypatch.setattr(stored, "load_npy", lambda path, mmap=True: maps.append(path) or load(path, mmap))
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **kw: reads.append(path) or read(path, *a, **kw))
    monkeypatch.setattr(stored, "save_npy", lambda path, arr: saved.append(path) or save(path, arr))
    options = Options(checkpoint_seconds=checkpoint)
    res = measure(model, prompts, tokens="all", k=KS, context="last", tiles=3, out=tmp_path, options=options)
    if checkpoint:
        assert maps == [] and saved == [] and not list((tmp_path / "_work").rglob("*.*"))
    else:
        assert maps and len(maps) == len(set(maps)), sorted(maps)
        assert saved and all("/_work/" in str(path) for path in saved)
    assert reads == []
    for name in TABLES:
        got, want = getattr(res, name), getattr(full, name)
        if name == "timings":
            got, want = got.drop(columns="seconds"), want.drop(columns="seconds")
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)


def test_held_layers_are_written_once_they_reach_the_byte_cap(model, prompts, tmp_path, monkeypatch):
    """However long the checkpoint interval, layers are not held past ``HELD_BYTES`` (a GPU can
    finish many large layers in seconds): here every layer is over a one-byte cap, so each is
    written when done, and the tables are the same."""
    from coupling_utils.measurement import Options
    from coupling_utils.measurement import store as stored

    saved, save = [], stored.save_npy
    monkeypatch.setattr(stored, "HELD_BYTES", 1)
    spy = lambda path, arr: saved.append(path.parent.name) or save(path, arr)  # noqa: E731
    monkeypatch.setattr(stored, "save_npy", spy)
    res = measure(model, prompts, tokens="all", k=KS, out=tmp_path, options=Options(checkpoint_seconds=600))
    layers = sorted(res.depthwise.layer_i.unique())
    assert sorted(set(saved)) == [f"layer_{layer:04d}" for layer in layers]
    pd.testing.assert_frame_equal(res.depthwise, measure(model, prompts, tokens="all", k=KS).depthwise)


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "10"])
def test_a_checkpoint_interval_is_seconds_zero_or_more(bad):
    from coupling_utils.measurement import Options

    with pytest.raises(ValueError, match="checkpoint_seconds must be a number of seconds, 0 or more"):
        Options(checkpoint_seconds=bad)


def test_tables_without_rows_get_no_file_and_a_resumed_run_reads_them_as_empty(model, prompts, tmp_path):
    """The last token alone: no token-wise, context or tile rows. Such a table gets no file for a
    layer or a prompt, its marker names it, and a run resumed from a stored layer and a stored
    prompt gives the tables of an uninterrupted run, to the bit."""

    class Stop(Exception):
        pass

    def stop_at_b_layer_1(info):
        if info["prompt"] == "b" and info["layer"] == 1:
            raise Stop

    kw = dict(tokens="last", k=KS)
    whole = measure(model, prompts, **kw, out=tmp_path / "whole")
    assert whole.tokenwise.empty and whole.tiles.empty and whole.context.empty
    out = tmp_path / "resumed"
    with pytest.raises(Stop):
        measure(model, prompts, **kw, out=out, callback=stop_at_b_layer_1)
    layer = out / "_work" / "b" / "layer_0000"
    assert json.loads((layer / "done.json").read_text())["empty_tables"] == ["tokenwise"]
    assert sorted(p.name for p in layer.glob("*.parquet")) == ["singular_values.parquet"]
    finished = out / "prompts" / "batch-1"
    marker = json.loads((finished / "done.json").read_text())
    assert list(marker["prompts"]) == ["a"]
    assert marker["empty_tables"] == ["context", "tiles", "tokenwise"]
    assert not (finished / "tiles.parquet").exists() and (finished / "depthwise.parquet").exists()
    resumed = measure(model, prompts, **kw, out=out)
    for name in TABLES:
        got, want = resumed.tables[name], whole.tables[name]
        if name == "timings":
            got, want = got.drop(columns="seconds"), want.drop(columns="seconds")
        if name == "prompts":  # token ids read back from Parquet are arrays, fresh ones lists
            got, want = (df.assign(input_ids=[list(map(int, x)) for x in df.input_ids]) for df in (got, want))
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)
    assert all((out / f"{name}.parquet").exists() for name in TABLES)  # the finished tables all have files


def test_windowed_matrix_free_run_resumes(deep_model, deep_ids, tmp_path):
    class Stop(Exception):
        pass

    kw = dict(tokens="last", k=3, method="matrix_free", block=4, steps=8, depth_window=1, out=tmp_path)

    def stop_at_cross_2(info):  # raised after layer 2's tiles are stored
        if info["stage"] == "cross" and info["layer"] == 2:
            raise Stop

    with pytest.raises(Stop):
        measure(deep_model, {"a": deep_ids}, callback=stop_at_cross_2, **kw)
    seen = []
    res = measure(
        deep_model,
        {"a": deep_ids},
        callback=lambda i: seen.append((i["stage"], i["layer"], i["computed"])),
        **kw,
    )
    assert seen == [
        ("layer", 0, False),
        ("layer", 1, False),
        ("layer", 2, False),
        ("layer", 3, False),
        ("cross", 0, False),
        ("cross", 1, False),
        ("cross", 2, False),
        ("cross", 3, True),
    ]
    fresh = measure(deep_model, {"a": deep_ids}, **{**kw, "out": None})
    pd.testing.assert_frame_equal(res.depthwise, fresh.depthwise)
    # the stored settings key includes the solver and the window
    with pytest.raises(ValueError, match="other settings.*depth_window"):
        measure(deep_model, {"a": deep_ids}, **{**kw, "depth_window": 2})
    with pytest.raises(ValueError, match="other settings.*steps"):
        measure(deep_model, {"a": deep_ids}, **{**kw, "steps": 4})
    with pytest.raises(ValueError, match="other settings.*solver"):
        measure(deep_model, {"a": deep_ids}, **{**kw, "solver": "subspace"})


def test_settings_stored_before_the_solver_setting_still_resume(model, prompts, tmp_path):
    kw = dict(layers=[0, 1], tokens="last", k=3, out=tmp_path)
    for method, extra in (
        ("exact", {}),
        ("matrix_free", {"solver": "subspace", "oversample": 5, "n_iter": 1}),
    ):
        out = tmp_path / method
        measure(model, {"a": prompts["a"]}, **{**kw, "out": out, "method": method, **extra})
        cfg = json.loads((out / "settings.json").read_text())
        for key in ("solver", "block", "steps", "depth_window"):
            cfg.pop(key)
        (out / "settings.json").write_text(json.dumps(cfg))
        seen = []
        measure(
            model,
            {"a": prompts["a"]},
            **{**kw, "out": out, "method": method, **extra},
            callback=seen.append,
        )
        assert seen == []  # recognised as the same settings: nothing recomputed


def test_solver_and_window_arguments_raise_clear_errors(model, prompts):
    ids = prompts["a"]
    for w in (0, -1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="depth_window must be a positive integer"):
            measure(model, [ids], k=2, depth_window=w)
    with pytest.raises(ValueError, match="solver must be one of"):
        measure(model, [ids], k=2, method="matrix_free", solver="power")
    with pytest.raises(ValueError, match="block must be a positive integer"):
        measure(model, [ids], k=2, method="matrix_free", block=0)
    with pytest.raises(ValueError, match="cannot give k=8 triplets"):
        measure(model, [ids], k=8, method="matrix_free", block=2, steps=3)
    with pytest.raises(ValueError, match="computes block·steps = 12 singular values; n_singular=13"):
        measure(model, [ids], k=8, method="randomized", block=4, steps=3, n_singular=13)
    with pytest.raises(ValueError, match="oversample"):
        measure(model, [ids], k=2, method="matrix_free", solver="subspace", oversample=-1)


def test_coupling_summary_refuses_missing_pairs():
    rows = [
        {
            "prompt": "p",
            "token": 0,
            "K": 10,
            "layer_i": i,
            "layer_j": j,
            "m": 0.5,
            "coupling": 0.75 - 0.1 * abs(i - j),
        }
        for i in range(4)
        for j in range(4)
        if abs(i - j) <= 1
    ]
    df = pd.DataFrame(rows)
    assert coupling_summary(df, "adjacent") == pytest.approx(0.65)
    with pytest.raises(ValueError, match="how='offdiag' averages all ordered pairs of different layers"):
        coupling_summary(df, "offdiag")
    with pytest.raises(ValueError, match="how='adjacent' averages all consecutive layer pairs"):
        coupling_summary(df[~((df["layer_i"] == 1) & (df["layer_j"] == 2))], "adjacent")


@dataclass
class _Loaded:  # the fields of loading.LoadedModel that measure() reads
    model: object
    tokenizer: object
    name: str = "tiny-llama"
    revision: str | None = None
    dtype: str = "float32"
    arch: str = "llama"
    n_layers: int = 2
    d_model: int = 32
    provenance: dict | None = None


class _CharTokenizer:
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 64 for c in text]])}

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_string_prompts_are_tokenised_with_the_models_tokenizer(model):
    res = measure(_Loaded(model, _CharTokenizer()), ["hello", "abc"], k=2, layers=[0, -1])
    assert list(res.prompts["prompt"]) == ["0", "1"] and list(res.prompts["text"]) == ["hello", "abc"]
    assert list(res.prompts["n_tokens"]) == [5, 3]
    assert list(res.prompts["input_ids"].iloc[1]) == [ord(c) % 64 for c in "abc"]
    assert res.provenance["model"]["name"] == "tiny-llama"
    with pytest.raises(ValueError, match="need a tokenizer"):
        measure(model, ["hello"], k=2)


def test_bad_arguments_raise_clear_errors(model, prompts):
    ids = prompts["a"]
    with pytest.raises(ValueError, match="exceeds the matrix size"):
        measure(model, [ids], k=33)
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        measure(model, [ids], layers=[5], k=2)
    with pytest.raises(ValueError, match="outside a 5-token prompt"):
        measure(model, [ids], tokens=[9], k=2)
    with pytest.raises(ValueError, match="method must be one of"):
        measure(model, [ids], method="fast", k=2)
    with pytest.raises(ValueError, match="tiles=5 exceeds max"):
        measure(model, [ids], k=2, tiles=5)
    with pytest.raises(ValueError, match="prompts is empty"):
        measure(model, [], k=2)


def test_coupling_summary_offdiag_and_adjacent():
    rows = []
    for prompt, scale in (("p", 1.0), ("q", 0.5)):
        for i in range(3):
            for j in range(3):
                c = 1.0 if i == j else scale * (0.9 if abs(i - j) == 1 else 0.3)
                rows.append(
                    {
                        "prompt": prompt,
                        "token": 0,
                        "K": 10,
                        "layer_i": i,
                        "layer_j": j,
                        "m": np.sqrt(1 - c),
                        "coupling": c,
                    }
                )
                rows.append(
                    {
                        "prompt": prompt,
                        "token": 0,
                        "K": 50,
                        "layer_i": i,
                        "layer_j": j,
                        "m": 0.0,
                        "coupling": 0.0 if i != j else 1.0,
                    }
                )
    df = pd.DataFrame(rows)
    # off-diagonal at K=10: 4 adjacent pairs at 0.9·s and 2 far ones at 0.3·s -> 0.7·s per prompt
    assert coupling_summary(df, "offdiag", k=10) == pytest.approx((0.7 + 0.35) / 2)
    assert coupling_summary(df, "adjacent", k=10) == pytest.approx((0.9 + 0.45) / 2)
    assert coupling_summary(df) == pytest.approx(0.0)  # default K: the largest (50)
    per = coupling_summary(df, "offdiag", k=10, per_prompt=True)
    assert per.to_dict() == pytest.approx({"p": 0.7, "q": 0.35})
    with pytest.raises(ValueError, match="K=30 is not in the table"):
        coupling_summary(df, k=30)
    with pytest.raises(ValueError, match="how must be one of"):
        coupling_summary(df, how="diag")


def test_measurement_summary_uses_the_depthwise_table(full):
    assert full.summary("offdiag", k=3) == pytest.approx(
        full.depthwise.query("K == 3 and layer_i != layer_j").groupby("prompt")["coupling"].mean().mean()
    )


def test_a_second_run_into_the_same_folder_waits_for_the_first(deep_model, deep_ids, tmp_path, capsys):
    import threading

    from coupling_utils.files import file_lock, is_locked

    held, release = threading.Event(), threading.Event()

    def other_run():  # stands in for another process measuring into tmp_path
        with file_lock(tmp_path / ".lock"):
            held.set()
            release.wait(10)

    t = threading.Thread(target=other_run)
    t.start()
    held.wait(10)
    assert is_locked(tmp_path / ".lock")
    threading.Timer(1.0, release.set).start()
    res = measure(deep_model, {"a": deep_ids}, tokens="last", k=3, layers=[0, 1], out=tmp_path)
    t.join()
    assert "another process is working on it" in capsys.readouterr().out  # it waited, saying so
    assert len(res.depthwise) and not is_locked(tmp_path / ".lock")
