"""Trained vs random-init twins: the measurement plumbing on a tiny model, and the condensing helpers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import block_distance as bd
from coupling_utils.analysis import depth_and_tokens as tw
from coupling_utils.analysis import tile_grid
from coupling_utils.analysis.block_range import ParameterError
from coupling_utils.engine.metric import coupling
from coupling_utils.measurement import Options


class _Tok:
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 64 for c in text]])}

    def convert_ids_to_tokens(self, ids):
        return [chr(65 + i % 26) for i in ids]

    def decode(self, ids):
        return "".join(self.convert_ids_to_tokens(ids))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    models = {}
    for random_init, seed in ((False, 7), (True, 0)):
        torch.manual_seed(seed)
        models[random_init] = LlamaForCausalLM(cfg).eval()
    calls = []

    def load(name, *, dtype, random_init, seed):
        calls.append((random_init, seed))
        return SimpleNamespace(
            model=models[random_init],
            tokenizer=_Tok(),
            name=name,
            revision=None,
            dtype=dtype,
            arch="llama",
            n_layers=4,
            d_model=16,
            provenance={},
        )

    out = tmp_path_factory.mktemp("twins")
    prompts = {"p": "abcdef", "q": "xyz!"}
    options = Options(load=load, on_error="raise")
    m = tw.measure_twins(
        "tiny", prompts, k=(2, 4), tile_layers=[1, 2], tile_k=3, token_layer=-1, out=out, options=options
    )
    return SimpleNamespace(
        m=m, models=models, prompts=prompts, load=load, options=options, out=out, calls=calls
    )


def test_twin_tables(pair):
    m = pair.m
    assert pair.calls == [(False, 0), (True, 0)]
    assert (m.n_layers, m.d_model, m.token_layer) == (4, 16, 3)
    for df in (m.depthwise, m.tiles, m.tokenwise, m.context, m.summary):
        assert set(df.weights) == set(tw.WEIGHTS) and list(df.columns[:2]) == ["model", "weights"]
    # 2 weights x 2 prompts x 2 K x 4 x 4 blocks
    assert len(m.depthwise) == 2 * 2 * 2 * 16
    assert len(m.tiles) == 2 * 2 * 2 * 2 * 3 * 3 and set(m.tiles.layer_i) == {1, 2}
    assert set(m.tokenwise.layer) == {3} and m.tokenwise.query("prompt == 'p'").token_i.nunique() == 6
    tok = _Tok()
    assert m.tokens == {
        p: tok.convert_ids_to_tokens(tok(t)["input_ids"][0].tolist()) for p, t in pair.prompts.items()
    }
    assert m.tokens["p"] == list("HIJKLM")
    assert len(m.summary) == 4
    # the summary is the mean of 1 − m² over off-diagonal block pairs, prompts counted equally,
    # computed here from the m column (not from the table's own coupling column)
    off = m.depthwise.query("layer_i != layer_j")
    by_hand = (
        off.assign(c=1 - off.m**2)
        .groupby(["weights", "K", "prompt"])
        .c.mean()
        .groupby(["weights", "K"])
        .mean()
    )
    got = m.summary.set_index(["weights", "K"]).coupling
    pd.testing.assert_series_equal(got.sort_index(), by_hand.sort_index(), check_names=False, rtol=1e-12)


def test_twin_values_match_direct_computation(pair):
    from coupling_utils.engine.jacobians import reference_jacobians  # the oracle, not the fast path

    ids = _Tok()(pair.prompts["p"])["input_ids"]
    model = pair.models[True]
    J0, J2 = (reference_jacobians(model, ids, layer, tokens=[-1])[0] for layer in (0, 2))
    row = pair.m.depthwise.query(
        "weights == 'random init' and prompt == 'p' and K == 4 and layer_i == 0 and layer_j == 2"
    )
    assert row.m.item() == pytest.approx(coupling(J0, J2, 4), abs=1e-5)


def test_twins_reuse_the_cache_and_check_blocks(pair, monkeypatch):
    import coupling_utils.engine.jacobians as jac

    monkeypatch.setattr(
        jac, "token_jacobians", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed"))
    )
    monkeypatch.setattr(
        jac, "context_jacobians", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed"))
    )
    again = tw.measure_twins(
        "tiny",
        pair.prompts,
        k=(2, 4),
        tile_layers=[1, 2],
        tile_k=3,
        token_layer=-1,
        options=pair.options,
        out=pair.out,
    )
    pd.testing.assert_frame_equal(again.summary, pair.m.summary)
    with pytest.raises(ParameterError, match="'token_layer' must be <= 3, got 9: tiny has 4 blocks"):
        tw.measure_twins("tiny", pair.prompts, k=2, token_layer=9, options=pair.options)
    smaller = tw.measure_twins(
        "tiny",
        pair.prompts,
        k=(2, 4),
        tile_layers=[1, 2],
        tile_k=2,
        token_layer=-1,
        options=pair.options,
        out=pair.out,
    )  # a crop of the stored tiles: nothing recomputed
    corner = pair.m.tiles.query("row < 2 and col < 2").drop(columns="K").reset_index(drop=True)
    pd.testing.assert_frame_equal(smaller.tiles.drop(columns="K").reset_index(drop=True), corner)
    assert set(smaller.tiles.K) == {2}
    with pytest.raises(ValueError, match="tile_k=5 must be between 1 and max"):
        tw.measure_twins("tiny", pair.prompts, k=(2, 4), tile_layers=[1, 2], tile_k=5, options=pair.options)
    with pytest.raises(ParameterError, match=r"'tile_layers' must be >= -4, got -7: .*or -4\.\.-1 counting"):
        tw.measure_twins("tiny", pair.prompts, k=2, tile_layers=[0, -7], options=pair.options)


# --------------------------------------------------------------------------- helpers
def test_mean_depthwise_keeps_one_minus_m2_exact():
    df = pd.DataFrame(
        {"weights": "trained", "K": 2, "prompt": ["a", "b"], "layer_i": 0, "layer_j": 1, "m": [0.2, 0.6]}
    )
    df["coupling"] = 1 - df.m**2
    out = tw.mean_depthwise(df).iloc[0]
    assert out.coupling == pytest.approx((0.96 + 0.64) / 2)
    assert 1 - out.m**2 == pytest.approx(out.coupling)


def test_coupling_by_distance():
    rows = [
        {"weights": "w", "K": 2, "layer_i": i, "layer_j": j, "coupling": 1.0 if i == j else 1 / abs(i - j)}
        for i in range(4)
        for j in range(4)
    ]
    d = bd.coupling_by_distance(pd.DataFrame(rows))
    assert list(d.distance) == [1, 2, 3]
    np.testing.assert_allclose(d.coupling, [1, 0.5, 1 / 3])


def test_tile_diagonality():
    K = 4
    eye = np.eye(K)
    rows = []
    for (i, j), tile in {(0, 0): eye, (0, 1): np.ones((K, K))}.items():
        for r in range(K):
            for c in range(K):
                rows.append(
                    {
                        "weights": "w",
                        "prompt": "a",
                        "token": 3,
                        "K": K,
                        "layer_i": i,
                        "layer_j": j,
                        "row": r,
                        "col": c,
                        "value": tile[r, c],
                    }
                )
    d = tile_grid.tile_diagonality(pd.DataFrame(rows)).set_index(["layer_i", "layer_j"]).diagonal_share
    assert d[(0, 0)] == pytest.approx(1.0) and d[(0, 1)] == pytest.approx(1 / K)


def test_offdiag_mean_and_token_labels():
    df = pd.DataFrame(
        {
            "weights": ["a", "a", "b", "b"],
            "token_i": [0, 0, 0, 1],
            "token_j": [0, 1, 1, 0],
            "coupling": [1.0, 0.4, 0.2, 0.4],
        }
    )
    s = tw.offdiag_mean(df, "token_i", "token_j")
    assert s["a"] == pytest.approx(0.4) and s["b"] == pytest.approx(0.3)
    sd = tw.offdiag_mean(df, "token_i", "token_j", how="std")
    assert sd["b"] == pytest.approx(np.std([0.2, 0.4], ddof=1)) and np.isnan(sd["a"])
    toks = [f"t{i}" for i in range(11)]
    toks[3] = "Ġcapital"
    lab = tw.label_tokens(pd.DataFrame({"token_i": [3, 10]}), toks, ["token_i"])
    assert list(lab.token_i) == ["03 ␣capital", "10 t10"]
    with pytest.raises(ValueError, match="outside the 11 tokens"):
        tw.label_tokens(pd.DataFrame({"token_i": [11]}), toks, ["token_i"])


# --------------------------------------------------------------------------- many models; f01's numbers
def test_measure_models_lists_what_it_cannot_measure(pair):
    def load(name, **kw):
        if name == "gated":
            raise OSError("401 Client Error: access to model gated is restricted")
        return pair.load(name, **kw)

    kw = dict(
        k=(2, 4), tile_layers=[1, 2], tile_k=3, token_layer=-1, out=pair.out, options=Options(load=load)
    )
    got = tw.measure_models(["tiny", "gated", "tiny"], pair.prompts, **kw)
    assert list(got.results) == ["tiny"] and set(got.failures.model) == {"gated"}
    assert set(got.failures.weights) == set(tw.WEIGHTS) and "401" in " ".join(got.failures.message)
    assert "gated" in got.report() and "left out" in got.report()
    pd.testing.assert_frame_equal(got.results["tiny"].summary, pair.m.summary)  # the same as one twin
    wide = tw.summary_table(got)
    assert list(wide.columns) == ["model", "K", "trained", "random init", "trained − random"]
    assert np.allclose(wide["trained − random"], wide["trained"] - wide["random init"])
    with pytest.raises(RuntimeError, match="gated: the chapter's main model"):
        tw.measure_models(["gated", "tiny"], pair.prompts, **kw)


def test_depth_contrast_counts_pairs_where_trained_beats_the_twin():
    rows = []
    for weights, base in (("trained", 0.5), ("random init", 0.1)):
        for K in (2, 4):
            for i in range(3):
                for j in range(3):
                    c = 0.0 if i == j else base + (0.6 if (weights, i, j) == ("random init", 0, 2) else 0)
                    rows.append(dict(model="m", weights=weights, prompt="p", K=K, layer_i=i, layer_j=j,
                                     coupling=c, m=float(np.sqrt(1 - c))))  # fmt: skip
    pair = SimpleNamespace(model="m", depthwise=pd.DataFrame(rows))
    pair.summary = pd.DataFrame(
        [dict(model="m", weights=w, K=K, coupling=pair.depthwise.query("weights == @w and K == @K and "
              "layer_i != layer_j").coupling.mean()) for w in tw.WEIGHTS for K in (2, 4)]
    )  # fmt: skip
    got = tw.depth_contrast(pair, how="offdiag")
    assert got["share_above"] == pytest.approx(5 / 6)  # one pair of six: the twin is higher, at both K
    assert got["trained"] == pytest.approx(0.5) and got["twin"] == pytest.approx(0.2)
    assert got["excess"].estimate == pytest.approx(0.3)
    assert got["excess_k"] == 2  # the same gap at both K: the smaller K is named
    lower = pair.summary.assign(coupling=lambda d: d.coupling - 0.1 * ((d.weights == "trained") & (d.K == 4)))
    at4 = tw.depth_contrast(
        SimpleNamespace(model="m", depthwise=pair.depthwise, summary=lower), how="offdiag"
    )
    assert at4["excess"].estimate == pytest.approx(0.2) and at4["excess_k"] == 4  # the K that decides
    assert got["excess"].over == "1 prompt" and got["excess"].low == -np.inf  # one prompt: no interval
    q = pair.depthwise.assign(prompt="q", coupling=lambda d: d.coupling * 1.2)
    two = SimpleNamespace(model="m", summary=pair.summary, depthwise=pd.concat([pair.depthwise, q]))
    iv = tw.depth_contrast(two, how="offdiag")["excess"]
    assert iv.over == "2 prompts" and iv.low <= iv.estimate <= iv.high and iv.high > iv.low
    adjacent = tw.depth_contrast(pair, how="adjacent")  # (0, 2) is not a neighbour pair
    assert adjacent["share_above"] == 1.0
    with pytest.raises(ValueError, match="how must be"):
        tw.depth_contrast(pair, how="all")


def test_tile_and_token_contrast(pair):
    tiles = tile_grid.tile_contrast(pair.m.tiles, 3)
    assert tiles["chance"] == pytest.approx(1 / 3)
    for key in ("diagonal_trained", "diagonal_twin"):
        iv = tiles[key]
        assert 0 <= iv.estimate <= 1 and iv.low <= iv.estimate <= iv.high
    diag = tile_grid.tile_diagonality(pair.m.tiles)
    off = diag[diag.layer_i != diag.layer_j]
    assert tiles["trained"] == pytest.approx(off[off.weights == "trained"].diagonal_share.mean())
    tokens = tw.token_contrast(pair.m, 2)
    tok = pair.m.tokenwise.query("K == 2 and token_i != token_j")
    assert tokens["self_trained"] == pytest.approx(tok[tok.weights == "trained"].coupling.mean())
    assert tokens["self_twin"] == pytest.approx(tok[tok.weights == "random init"].coupling.mean())
    assert set(tokens) == {
        "self_trained",
        "self_twin",
        "self_sd",
        "context_trained",
        "context_twin",
        "context_sd",
    }
    trend = bd.distance_trend(bd.coupling_by_distance(pair.m.depthwise))
    assert set(trend.weights) == set(tw.WEIGHTS) and trend.spearman.between(-1, 1).all()


def test_twin_settings_as_one_object_or_its_fields(pair):
    s = tw.TwinSettings(k=[4, 2, 4], tile_layers=[1, 2], token_layer=-1)
    assert s.ks == [2, 4] and s.window == [1, 2] and s.crop == 2  # tile_k defaults to min(k)
    assert s.depth_only().window is None and s.depth_only().token_layer is None
    assert tw.twin_jobs("tiny", pair.prompts, s) == tw.twin_jobs(
        "tiny", pair.prompts, k=[4, 2, 4], tile_layers=[1, 2], token_layer=-1
    )
    with pytest.raises(TypeError, match="pass settings or its fields"):
        tw.measure_twins("tiny", pair.prompts, s, k=3)
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['load'\]"):
        tw.measure_twins("tiny", pair.prompts, k=2, load=pair.load)


def test_twin_jobs_are_stored_under_root(tmp_path):
    jobs = tw.twin_jobs("tiny", {"p": "abc"}, k=2, token_layer=-1, root=tmp_path)
    assert [j.labels["weights"] for j in jobs] == list(tw.WEIGHTS)
    assert all(tmp_path in j.out(part).parents for j in jobs for part in ("depth", "tokens"))
    assert all(j.out("depth") is None for j in tw.twin_jobs("tiny", {"p": "abc"}, k=2))  # no root: nowhere


def test_tile_rule_reads_every_k_the_tiles_hold_and_every_prompt():
    """A tile diagonal at K = 4 whose 3 x 3 corner is not: the trained share is the worst over K."""
    rows = []
    for weights in ("trained", "random init"):
        for prompt in ("a", "b", "c"):
            for i, j in ((0, 1), (1, 0)):
                tile = np.eye(4)
                if weights == "trained":
                    tile[3, 3], tile[0, 1] = 2.0, 1.5  # K=4: 7/9.25 on the diagonal; K=3: 3/5.25 < 2/3
                rows += [
                    {"weights": weights, "prompt": prompt, "token": 0, "K": 4, "layer_i": i, "layer_j": j,
                     "row": r, "col": c, "value": tile[r, c]}
                    for r in range(4) for c in range(4)
                ]  # fmt: skip
    tiles = pd.DataFrame(rows)
    assert tile_grid.nested_tile_ks(4) == [3, 4] and tile_grid.nested_tile_ks(2) == [2]
    out = tile_grid.tile_contrast(tiles, 4)
    assert out["diagonal_trained"].estimate == 0.0  # visible at K = 4, not at K = 3
    assert out["diagonal_twin"].estimate == 1.0
    assert out["diagonal_trained"].over == "3 prompts, K = 3–4"
    one = tile_grid.tile_contrast(tiles[tiles.prompt == "a"], 4)["diagonal_trained"]
    assert one.over == "1 prompt" and one.low == -np.inf  # one prompt: nothing to resample, no yes


def test_context_coupling_leaves_out_the_output_token_s_own_jacobian():
    """The context table holds the output token's own (self) Jacobian J_{t2 t2} beside its context
    Jacobians J_{t1 t2}; context coupling compares context Jacobians only (t1, t1' != t2): here
    0.2 between the two earlier tokens, where counting the pairs with token 2 gave 0.6."""

    def coupling(n, w, i, j):  # 1 on the diagonal, 0.8 with the output token, else about 0.2 or 0.7
        return 1.0 if i == j else 0.8 if 2 in (i, j) else 0.2 + 0.01 * n + 0.5 * (w != "trained")

    ctx = pd.DataFrame(
        [{"prompt": p, "weights": w, "output_token": 2, "K": 2, "layer_i": 5, "layer_j": 5, "token_i": i,
          "token_j": j, "coupling": coupling(n, w, i, j)}
         for n, p in enumerate("abcdef") for w in tw.WEIGHTS for i in range(3) for j in range(3)]
    )  # fmt: skip
    tok = ctx.drop(columns=["output_token", "layer_j"]).rename(columns={"layer_i": "layer"})
    pair = SimpleNamespace(model="m", tokenwise=tok, context=ctx)
    with_self = ctx[(ctx.token_i != ctx.token_j) & (ctx.weights == "trained")].coupling.mean()
    assert with_self == pytest.approx((2 * 0.225 + 4 * 0.8) / 6)  # what the old mean mixed in
    got = tw.token_contrast(pair, 2)
    assert got["context_trained"] == pytest.approx(0.225) and got["context_twin"] == pytest.approx(0.725)
    assert got["context_sd"] == pytest.approx(
        np.std([0.2 + 0.01 * n for n in range(6) for _ in "ij"], ddof=1)
    )
    iv = tw.token_intervals(pair, 2, n_resamples=100)
    assert iv["context_trained"].estimate == pytest.approx(0.225)
    assert iv["context_excess"].estimate == pytest.approx(-0.5)
    drawn = tw.context_pairs(ctx[ctx.prompt == "a"], 2, diagonal=True)  # what the heatmap draws
    assert set(drawn.token_i) == set(drawn.token_j) == {0, 1} and len(drawn) == 2 * 4
    assert len(tw.context_pairs(ctx[ctx.prompt == "a"], 2)) == 2 * 2  # (0, 1) and (1, 0), each weights
    two = ctx[ctx.token_i.isin([1, 2]) & ctx.token_j.isin([1, 2])]  # one token before the output token
    short = SimpleNamespace(model="m", tokenwise=tok, context=two)
    with pytest.raises(ValueError, match="two input tokens before the output token"):
        tw.token_contrast(short, 2)


def test_token_intervals_pool_token_pairs_and_resample_prompts(pair):
    point = tw.token_contrast(pair.m, 2)
    out = tw.token_intervals(pair.m, 2, n_resamples=200)
    assert out["self_trained"].estimate == pytest.approx(point["self_trained"])
    assert out["self_excess"].estimate == pytest.approx(point["self_trained"] - point["self_twin"])
    assert out["context_excess"].estimate == pytest.approx(point["context_trained"] - point["context_twin"])
    assert out["sd_excess"].estimate == pytest.approx(point["context_sd"] - point["self_sd"])
    n = pair.m.tokenwise.prompt.nunique()
    for iv in out.values():
        assert iv.low <= iv.estimate <= iv.high and iv.over == f"{n} prompts"


def test_distance_intervals_resample_prompts_with_all_their_rows():
    """distance_intervals' ρ and neighbours − all pairs are distance_trend's and coupling_summary's
    numbers, and its intervals those of the same statistics recomputed by pandas on each resample's
    rows (a prompt drawn twice counts twice; prompts of different lengths weigh their tokens in the
    profile, and count equally in the per-model coupling); two blocks give no ρ, one prompt no
    bounds."""
    from coupling_utils.analysis.stats import resample_rows
    from coupling_utils.measurement import coupling_summary

    rng = np.random.default_rng(3)
    rows = []
    for p, n_tokens in (("a", 3), ("b", 5), ("c", 1), ("d", 2), ("e", 4), ("f", 2), ("g", 3)):
        slope = rng.uniform(-0.1, 0.05)  # some prompts rise with distance: a mixed sign
        for w in tw.WEIGHTS:
            for t in range(n_tokens):
                rows += [
                    {"prompt": p, "weights": w, "K": 3, "token": t, "layer_i": i, "layer_j": j,
                     "coupling": 1.0 if i == j else 0.6 + slope * abs(i - j) + rng.normal(0, 0.05)}
                    for i in range(5) for j in range(5)
                ]  # fmt: skip
    d = pd.DataFrame(rows)
    d["m"] = np.sqrt(1 - d["coupling"].clip(upper=1))

    def statistics(sample: pd.DataFrame) -> dict[str, float]:
        trend = bd.distance_trend(bd.coupling_by_distance(sample))
        row = trend[(trend.weights == "trained") & (trend.K == 3)].iloc[0]
        trained = sample[sample.weights == "trained"]
        per_prompt = coupling_summary(trained, how="offdiag", k=3, per_prompt=True)
        return {"spearman": row.spearman, "adjacent_excess": row.adjacent - per_prompt.mean()}

    got = bd.distance_intervals(d, 3, "offdiag", n_resamples=200)
    whole = statistics(d)
    prompts = sorted(d.prompt.unique())
    draws = {k: [] for k in whole}
    for drawn in resample_rows(len(prompts), 200, 0):
        sample = pd.concat(
            [d[d.prompt == prompts[i]].assign(prompt=f"{n}") for n, i in enumerate(drawn)], ignore_index=True
        )
        for k, v in statistics(sample).items():
            draws[k].append(v)
    for k, v in whole.items():
        lo, hi = np.quantile(draws[k], [0.025, 0.975])
        iv = got[k]
        assert iv.estimate == pytest.approx(v, abs=1e-12) and iv.over == "7 prompts"
        assert (iv.low, iv.high) == pytest.approx((min(lo, v), max(hi, v)), abs=1e-12)
    assert got["spearman"].low < got["spearman"].high  # the prompts disagree: a real interval

    two = bd.distance_intervals(d[(d.layer_i < 2) & (d.layer_j < 2)], 3, "offdiag", n_resamples=50)
    assert set(two) == {"adjacent_excess"}  # one distance: no trend to rank
    one = bd.distance_intervals(d[d.prompt == "a"], 3, "offdiag")
    assert not one["spearman"].resampled and one["spearman"].over == "1 prompt"
    few = bd.distance_intervals(d[d.prompt < "f"], 3, "offdiag", n_resamples=50)  # 5: no 95% interval
    assert not few["spearman"].resampled and few["spearman"].over == "5 prompts"


def test_the_report_counts_models_in_words():
    """'all 1 models measured' read wrongly: one model is named as one."""
    import pandas as pd

    from coupling_utils.analysis.depth_and_tokens import TwinSet

    assert TwinSet({"a": None}, pd.DataFrame()).report() == "the one model measured, beside its twin"
    two = TwinSet({"a": None, "b": None}, pd.DataFrame())
    assert two.report() == "all 2 models measured, each beside its twin"


def test_vectorized_intervals_give_the_bits_of_a_pandas_statistic_per_resample():
    """token_intervals and tile_contrast take every resample in one numpy call per column; their
    intervals are those of the per-resample pandas statistics they replaced, to the bit (11
    prompts, so that sums run past numpy's 8-wide pairwise blocks; an all-zero tile gives a NaN
    share, which the prompt mean skips)."""
    import types

    from coupling_utils.analysis.stats import bootstrap_intervals

    rng = np.random.default_rng(5)
    prompts, W = [f"p{i:02d}" for i in range(11)], tw.WEIGHTS
    pairs = [(i, j) for i in range(3) for j in range(3)]
    tok = pd.DataFrame(
        [{"prompt": p, "weights": w, "K": 2, "layer": 0, "token_i": i, "token_j": j, "coupling": rng.random()}
         for p in prompts for w in W for i, j in pairs]
    )  # fmt: skip
    ctx = pd.DataFrame(
        [{"prompt": p, "weights": w, "output_token": 3, "K": 2, "layer_i": 0, "layer_j": 0, "token_i": i,
          "token_j": j, "coupling": rng.random()} for p in prompts for w in W for i, j in pairs]
    )  # fmt: skip

    def old_values(sample):
        t = sample.sum()
        mean = lambda part, w: float(t[(part, "sum", w)] / t[(part, "n", w)])  # noqa: E731

        def sd(part, w):
            n, total = t[(part, "n", w)], t[(part, "sum", w)]
            return float(np.sqrt(max(0.0, (t[(part, "sq", w)] - total**2 / n) / (n - 1))))

        return {
            "self_trained": mean("self", W[0]),
            "context_trained": mean("context", W[0]),
            "self_excess": mean("self", W[0]) - mean("self", W[1]),
            "context_excess": mean("context", W[0]) - mean("context", W[1]),
            "sd_excess": sd("context", W[0]) - sd("self", W[0]),
        }

    wide = pd.concat({"self": tw._pooled(tok), "context": tw._pooled(ctx)}, axis=1).fillna(0.0)
    got = tw.token_intervals(types.SimpleNamespace(tokenwise=tok, context=ctx), 2, n_resamples=300)
    assert got == bootstrap_intervals(wide, old_values, "prompt", n_resamples=300)

    tiles = pd.DataFrame(
        [{"weights": w, "prompt": p, "token": 0, "K": 4, "layer_i": i, "layer_j": j, "row": r, "col": c,
          "value": 0.0 if (p, w, i) == ("p03", W[0], 0) else rng.normal(0, 1 + 2 * (r == c))}
         for w in W for p in prompts for i, j in ((0, 1), (1, 0), (0, 2)) for r in range(4) for c in range(4)]
    )  # fmt: skip
    shares = tile_grid._corner_shares(tiles, tile_grid.nested_tile_ks(4))
    assert shares.isna().to_numpy().any()

    def old_extremes(shares):
        mean = shares.mean()
        ks = mean.index.get_level_values("K").to_numpy()
        visible = (
            pd.Series(mean.to_numpy() >= 2 / ks, index=mean.index).groupby(level=["weights", "K"]).mean()
        )
        return {
            "diagonal_trained": float(visible.get("trained", pd.Series([np.nan])).min()),
            "diagonal_twin": float(visible.get("random init", pd.Series([np.nan])).max()),
        }

    want = bootstrap_intervals(shares, old_extremes, "prompt", detail=", K = 3–4", n_resamples=1000)
    out = tile_grid.tile_contrast(tiles, 4)
    assert {k: out[k] for k in want} == want and want["diagonal_trained"].low < want["diagonal_trained"].high


@pytest.mark.parametrize("n,nk", [(11, 3), (23, 1), (40, 4)])
def test_the_smallest_mean_over_k_has_the_bits_of_the_pandas_statistic_it_replaced(n, nk):
    from coupling_utils.analysis.stats import bootstrap_ci

    rng = np.random.default_rng(n)
    per = pd.DataFrame({(k, w): rng.random(n) for k in range(nk) for w in tw.WEIGHTS})
    diff = pd.DataFrame(
        {k: per[(k, "trained")] - per[(k, "random init")] for k in range(nk)}
    )  # as made there
    old = bootstrap_ci(diff, lambda d: float(d.mean().min()), seed=0)
    new = bootstrap_ci(diff, tw._smallest_mean, seed=0, vectorized=True)
    cols = ["estimate", "ci_low", "ci_high"]
    assert (old[cols].to_numpy() == new[cols].to_numpy()).all()


def _corner_shares_grouped_by_their_keys(tiles: pd.DataFrame, ks) -> pd.DataFrame:
    """The corner shares as tile_grid computed them before it numbered the tiles once: filtered and
    grouped by the text keys again for every K' (the oracle of the test below)."""
    off = tiles[tiles["layer_i"] != tiles["layer_j"]]
    frames = []
    for kk in ks:
        corner = off[(off["row"] < kk) & (off["col"] < kk)]
        sq = corner.assign(sq=corner["value"].astype(float) ** 2)
        sq["diag_sq"] = sq["sq"].where(sq["row"] == sq["col"], 0.0)
        keys = [c for c in ("weights", "prompt", "token") if c in sq.columns]
        per = sq.groupby([*keys, "layer_i", "layer_j"], as_index=False)[["diag_sq", "sq"]].sum()
        per["share"] = per["diag_sq"] / per["sq"].where(per["sq"] > 0)
        frames.append(per.assign(K=kk))
    per = pd.concat(frames, ignore_index=True)
    return per.pivot_table(index="prompt", columns=["weights", "K", "layer_i", "layer_j"], values="share")


@pytest.mark.parametrize("shuffled", [False, True], ids=["as measured", "rows shuffled"])
def test_the_corner_shares_are_those_grouping_by_the_keys_for_every_k_gave(shuffled):
    """tile_grid lays each tile out once and reads every K' corner from running sums: the shares
    grouping by the text keys for every K' gave, up to rounding; several tokens, prompts in the
    measurement's string dtype, a tile of zeros (share undefined), a diagonal pair left out, and
    the rows in any order."""
    from coupling_utils.measurement.tables import concat

    rng = np.random.default_rng(8)
    W = tw.WEIGHTS
    rows = [{"weights": w, "prompt": p, "token": t, "K": 5, "layer_i": i, "layer_j": j, "row": r, "col": c,
             "value": 0.0 if (p, w, i) == ("b", W[1], 2) else rng.normal(0, 1 + 3 * (r == c))}
            for w in W for p in ("c", "a", "b10", "b") for t in (0, 3) for i, j in ((0, 1), (2, 0), (1, 1))
            for r in range(5) for c in range(5)]  # fmt: skip
    tiles = pd.DataFrame(rows)
    tiles["prompt"] = concat("tiles", [{c: tiles[c].to_numpy() for c in tiles}])["prompt"]  # string dtype
    if shuffled:
        tiles = tiles.sample(frac=1.0, random_state=3)
    ks = tile_grid.nested_tile_ks(5)
    want = _corner_shares_grouped_by_their_keys(tiles, ks)
    got = tile_grid._corner_shares(tiles, ks)
    assert want.isna().to_numpy().any()
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12, atol=0)
