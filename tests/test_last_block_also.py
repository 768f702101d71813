"""``last_block_also``: the last block measured under a second map in the same run. Every other
block's map is the same under both, so one run with one more block gives the tables of two runs:
checked against the two runs themselves, on every table, for formed and matrix-free Jacobians."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers

from coupling_utils.engine.architectures import tiny_model
from coupling_utils.measurement import measure
from coupling_utils.measurement.settings import Settings
from coupling_utils.measurement.tables import TABLES, Measurement

KEYS = {
    "depthwise": ["prompt", "token", "K", "layer_i", "layer_j"],
    "tokenwise": ["prompt", "layer", "K", "token_i", "token_j"],
    "context": ["prompt", "output_token", "K", "layer_i", "token_i", "layer_j", "token_j"],
    "singular_values": ["prompt", "token", "layer", "rank"],
    "tiles": ["prompt", "token", "K", "layer_i", "layer_j", "row", "col"],
    "prompts": ["prompt"],
    "timings": ["prompt", "layer"],
}


def _gpt2(n_layer=3):
    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=n_layer, n_head=2, n_positions=16)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _same(got: Measurement, want: Measurement, atol: float) -> None:
    for name in TABLES:
        a, b = (m.tables[name].sort_values(KEYS[name]).reset_index(drop=True) for m in (got, want))
        if name == "timings":  # seconds differ; so do matrix-free passes (one more partner block)
            drop = ["seconds"] + (
                ["block_passes"] if got.provenance["settings"]["method"] == "matrix_free" else []
            )
            a, b = a.drop(columns=drop), b.drop(columns=drop)
        assert len(a) == len(b), name
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-5, atol=atol, obj=name)


@pytest.mark.parametrize(
    "fields",
    [
        dict(
            tokens="all", context="last", tiles=2, tile_layers=[1, 2]
        ),  # all-token sweeps, the last in the tiles
        dict(tokens="last", tiles=2),  # a causal model's last token: the one-token path
        dict(tokens="all", method="matrix_free", solver="subspace", seed=3),
    ],
    ids=["all-tokens", "one-token", "matrix-free"],
)
def test_one_run_gives_the_tables_of_two(tmp_path, fields):
    model = _gpt2()
    ids = {"a": torch.randint(0, 64, (1, 6)), "b": torch.randint(0, 64, (1, 5))}
    both = measure(
        model,
        ids,
        k=(2, 4),
        last_block="final_norm",
        last_block_also="block",
        out=tmp_path / "both",
        **fields,
    )
    for last_block in ("final_norm", "block"):
        alone = measure(model, ids, k=(2, 4), last_block=last_block, out=tmp_path / last_block, **fields)
        got = both.under(last_block)
        atol = 1e-4 if fields.get("method") == "matrix_free" else 1e-6
        _same(got, alone, atol)
        assert got.last_block == last_block and got.provenance["last_block"] == alone.provenance["last_block"]
        assert sorted(set(got.depthwise.layer_i)) == [0, 1, 2]
    assert both.under("block").provenance["measured_beside"] == "final_norm"
    # the last block's two maps differ (the final norm is folded into one of them)
    sv = {
        lb: both.under(lb).singular_values.query("layer == 2").value.to_numpy()
        for lb in ("final_norm", "block")
    }
    assert not (abs(sv["final_norm"] - sv["block"]) < 1e-6).all()
    # stored: read back as a set, each map in its place; a rerun reads them without measuring
    loaded = Measurement.load(tmp_path / "both")
    for last_block in ("final_norm", "block"):
        _same(loaded.under(last_block), both.under(last_block), 0.0)
    calls = []
    kw = dict(k=(2, 4), last_block="final_norm", last_block_also="block", callback=calls.append, **fields)
    again = measure(model, ids, out=tmp_path / "both", **kw)
    assert calls == [] and again.under("block").out == tmp_path / "both" / "last_block-block"


def test_a_run_that_does_not_reach_the_last_block_holds_the_same_tables_under_both(tmp_path):
    model = _gpt2()
    ids = {"a": torch.randint(0, 64, (1, 5))}
    m = measure(
        model, ids, k=2, layers=[0, 1], tokens="all", last_block="final_norm", last_block_also="block"
    )
    _same(m.under("block"), m, 0.0)
    assert m.provenance["settings"].get("also_layer") is None
    with pytest.raises(
        ValueError, match=r"holds the last block under \['final_norm', 'block'\], not 'excluded'"
    ):
        m.under("excluded")
    plain = measure(model, ids, k=2, layers=[0, 1])
    with pytest.raises(ValueError, match="measure it with last_block='final_norm', or last_block_also="):
        plain.under("final_norm")
    assert plain.under("block") is plain


def test_the_setting_is_checked_keys_only_when_set_and_is_cleared_with_the_rest(tmp_path):
    for bad in (dict(last_block_also="block"), dict(last_block_also="excluded", last_block="final_norm"),
                dict(last_block_also="block", last_block="excluded")):  # fmt: skip
        with pytest.raises(
            ValueError, match="last_block_also measures the last block once more under the other"
        ):
            Settings(**bad)
    with pytest.raises(ValueError, match="cannot be combined with depth_window=1.*leave depth_window None"):
        Settings(last_block="final_norm", last_block_also="block", depth_window=1)
    plain, both = (
        Settings(last_block="final_norm"),
        Settings(last_block="final_norm", last_block_also="block"),
    )
    assert "last_block_also" not in plain.to_dict(runtime=False)
    assert both.to_dict(runtime=False)["last_block_also"] == "block"
    model = tiny_model("llama")  # 2 blocks: the second map's label is 2
    ids = {"a": torch.randint(0, 64, (1, 4))}
    m = measure(model, ids, k=2, last_block="final_norm", last_block_also="block", out=tmp_path / "m")
    assert m.provenance["settings"]["also_layer"] == 2 and (tmp_path / "m" / "last_block-block").is_dir()
    measure(
        model, ids, k=2, last_block="final_norm", last_block_also="block", out=tmp_path / "m", resume=False
    )
    from coupling_utils.measurement.store import Store

    Store(tmp_path / "m").clear()
    assert not (tmp_path / "m" / "last_block-block").exists()


def test_the_cost_model_counts_the_last_block_twice_where_a_run_measures_it_twice():
    from coupling_utils.chapters import f01_depth_and_tokens as f01
    from coupling_utils.pipeline.costs import Work, works

    def work(layers, last_blocks):
        return Work("m", None, "float32", 1, 8, layers, 1, last_blocks=last_blocks)

    assert work(None, None).blocks(30) == 30 and work(None, ()).blocks(30) == 31
    assert (
        work(1, (15,)).blocks(30) == 1 and work(1, (29,)).blocks(30) == 2 and work(1, (-1,)).blocks(30) == 2
    )
    drawn = [w for w in works(f01.jobs(f01.Params())) if w.model == f01.Params().model]
    assert {w.what: w.last_blocks for w in drawn} == {"depth": (), "tokens": (15,)}
