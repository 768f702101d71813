"""The scale question: every candidate aggregation from one measurement, and the rule that judges them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import scale
from coupling_utils.measurement import Options, collect, coupling_summary, measure

PROMPTS = {"p0": torch.tensor([[1, 2, 3, 4, 5]]), "p1": torch.tensor([[6, 7, 8, 9]])}


def _tiny_neox(n_layers: int = 4, d: int = 8, seed: int = 0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=32, hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=2,
                        intermediate_size=2 * d, max_position_embeddings=32)  # fmt: skip
    return GPTNeoXForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def measured():
    model = _tiny_neox()
    norm = measure(model, PROMPTS, k=[2, 4], tokens="all")
    trace = measure(model, PROMPTS, k=[2, 4], tokens="all", normalize="trace")
    return norm, trace


def _pick(table, **kw):
    sel = np.ones(len(table), dtype=bool)
    for name, value in kw.items():
        sel &= table[name].to_numpy() == value
    assert sel.sum() == 1, kw
    return float(table.loc[sel, "value"].iloc[0])


def test_the_trace_denominator_is_the_norm_one_rescaled_exactly(measured):
    norm, trace = measured
    factor = scale.trace_factor(norm.singular_values, [2, 4])
    rows = norm.depthwise.merge(
        factor.rename(columns={"layer": "layer_i"}), on=["prompt", "token", "layer_i", "K"]
    )
    merged = rows.merge(
        trace.depthwise, on=["prompt", "token", "K", "layer_i", "layer_j"], suffixes=("", "_trace")
    )
    assert len(merged) == len(norm.depthwise)
    np.testing.assert_allclose(merged["m"] * merged["factor"], merged["m_trace"], rtol=1e-6, atol=1e-9)
    assert (factor["factor"] <= 1 + 1e-12).all() and (
        factor["factor"] >= 1 / np.sqrt(factor["K"]) - 1e-12
    ).all()


def test_candidates_agree_with_the_summaries_they_generalise(measured):
    norm, trace = measured
    table = scale.candidates(norm)
    assert len(table) == 2 * 2 * 2 * 2 * 2 * 2 * 2  # view, K, denominator, form, pairs, ends, tokens
    last = norm.prompts.set_index("prompt")["n_tokens"] - 1
    dw = norm.depthwise[norm.depthwise.token == norm.depthwise.prompt.map(last)]
    tw = trace.depthwise[trace.depthwise.token == trace.depthwise.prompt.map(last)]
    base = dict(view="depth", form="1 - m²", ends="with", tokens="last")
    for K in (2, 4):
        assert _pick(table, **base, K=K, denominator="norm", pairs="all") == pytest.approx(
            coupling_summary(dw, "offdiag", K), abs=1e-12)  # fmt: skip
        assert _pick(table, **base, K=K, denominator="norm", pairs="adjacent") == pytest.approx(
            coupling_summary(dw, "adjacent", K), abs=1e-12)  # fmt: skip
        assert _pick(table, **base, K=K, denominator="trace", pairs="all") == pytest.approx(
            coupling_summary(tw, "offdiag", K), abs=1e-7)  # fmt: skip
        # all tokens: the summary of the whole table (every token, then prompts equally)
        every_token = _pick(table, **{**base, "tokens": "all"}, K=K, denominator="norm", pairs="all")
        assert every_token == pytest.approx(coupling_summary(norm.depthwise, "offdiag", K), abs=1e-12)
    # 1 - m from the same pairs
    inner = dw[(dw.K == 4) & (dw.layer_i != dw.layer_j) & ~dw.layer_i.isin([0, 3]) & ~dw.layer_j.isin([0, 3])]
    expect = (1 - inner.m).groupby(inner.prompt).mean().mean()
    assert _pick(table, **{**base, "form": "1 - m", "ends": "without"}, K=4, denominator="norm",
                 pairs="all") == pytest.approx(expect, abs=1e-12)  # fmt: skip
    # the token view: pairs of different tokens within a block, blocks then prompts averaged
    t = norm.tokenwise[(norm.tokenwise.K == 2) & (norm.tokenwise.token_i != norm.tokenwise.token_j)]
    expect = t.coupling.groupby(t.prompt).mean().mean()
    assert _pick(table, view="tokens", K=2, denominator="norm", form="1 - m²", pairs="all", ends="with",
                 tokens="all") == pytest.approx(expect, abs=1e-12)  # fmt: skip
    per_prompt = scale.candidates(norm, per_prompt=True)
    assert len(per_prompt) == 2 * len(table) and set(per_prompt.prompt) == {"p0", "p1"}


def test_candidates_need_the_norm_metric():
    m = measure(_tiny_neox(3), PROMPTS, k=[2], tokens="all", normalize="trace")
    with pytest.raises(ValueError, match="'norm' metric"):
        scale.candidates(m)
    # three blocks: no adjacent pair is left without the end blocks, so those candidates are absent
    table = scale.candidates(measure(_tiny_neox(3), PROMPTS, k=[2], tokens="all"))
    depth = table[table.view == "depth"]
    assert depth[(depth.ends == "without")].empty


def _values(ref_trained, ref_twin, other=0.5):
    rows = []
    for model, (a, b) in {"ref": (ref_trained, ref_twin), "other": (other, other - 0.1)}.items():
        for w, v in (("trained", a), ("random init", b)):
            rows.append({"model": model, "weights": w, "view": "depth", "K": 10, "denominator": "norm",
                         "form": "1 - m²", "pairs": "all", "ends": "with", "tokens": "last", "value": v,
                         "sd": np.nan, "n_prompts": 1})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("trained", "twin", "fig1a", "fig1b"),
    [
        (0.92, 0.80, "yes", "no"),  # on Fig. 1a's scale and well above the twin
        (0.92, 0.91, "no", "no"),  # on the scale, but the twin is as high
        (0.086, 0.012, "no", "yes"),  # SmolLM2's norm 1 - m² at K = 50
        (0.30, 0.01, "no", "no"),  # separates, but on neither scale
    ],
)
def test_the_axis_rule_needs_the_scale_and_a_separation(trained, twin, fig1a, fig1b):
    judged = scale.judge(_values(trained, twin), "ref")
    row = judged.iloc[0]
    assert (row["Fig. 1a"], row["Fig. 1b"]) == (fig1a, fig1b)
    assert row["trained_min"] == min(trained, 0.5) and row["twin_max"] == max(twin, 0.4)
    assert scale.axis_window((0.06, 0.17)) == pytest.approx((0.005, 0.225))
    assert "trained - twin" in scale.axis_rule((0.89, 0.955)).yes


def test_closest_miss_and_the_book_choice():
    judged = scale.judge(_values(0.92, 0.91), "ref")
    miss = scale.closest_miss(judged, "Fig. 1a")
    assert miss is not None and miss.trained == 0.92
    assert scale.closest_miss(judged, "Fig. 1b") is None
    assert scale.book_choice(judged, 10).trained == 0.92 and scale.book_choice(judged, 50) is None
    assert scale.compatible(judged).empty
    with pytest.raises(ValueError, match="reference model"):
        scale.judge(_values(0.9, 0.1), "absent")


def test_scale_jobs_load_as_their_loads_say_and_store_under_root(tmp_path):
    from coupling_utils.measurement import Loads
    from coupling_utils.measurement.jobs import WEIGHTS

    loads = Loads(weights=WEIGHTS, seed=7, dtype="bfloat16")
    jobs = scale.scale_jobs(["m"], PROMPTS, k=[2], loads=loads, root=tmp_path)
    assert [j.load_kwargs for j in jobs] == [
        {"dtype": "bfloat16", "random_init": w == WEIGHTS[1], "seed": 7} for w in WEIGHTS
    ]
    assert all(tmp_path in j.out("measure").parents for j in jobs)
    for bad in (Loads(dtype="bfloat16"), Loads(weights=WEIGHTS, revisions=["step1"])):
        with pytest.raises(ValueError, match="beside its random-init twin"):
            scale.scale_jobs(["m"], PROMPTS, k=[2], loads=bad)


def test_measure_scale_measures_model_and_twin_once_and_records_failures(tmp_path):
    calls = []

    def load(name, *, dtype="float32", random_init=False, seed=0):
        calls.append((name, random_init))
        if name == "gated":
            raise OSError("gated repo")
        return _tiny_neox(4, 8 if name == "wide" else 4, 100 * random_init + seed)

    ks = {"wide": [2, 6], "narrow": [2], "gated": [2]}
    jobs = scale.scale_jobs(list(ks), PROMPTS, k=ks, root=tmp_path)
    got = scale.measure_scale(jobs, options=Options(load=load))
    assert set(got.models.model) == {"wide", "narrow"} and list(got.failures.model.unique()) == ["gated"]
    assert sorted(got.values[got.values.model == "wide"].K.unique()) == [2, 6]
    assert sorted(got.values[got.values.model == "narrow"].K.unique()) == [2]
    assert "missing" in got.report()
    calls.clear()
    lines = []
    again = scale.measure_scale(jobs, options=Options(load=load), echo=lines.append)
    assert calls == [("gated", False), ("gated", True)]  # the stored ones load nothing
    pd.testing.assert_frame_equal(again.values, got.values)
    assert lines[0] == "wide (trained): 2 prompt(s), " + lines[0].split(", ")[1] and "(cached)" in lines[0]
    assert lines[-1] == "gated (random init): failed: OSError: gated repo"
    # the same jobs collected among others (as a chapter does) condense to the same tables
    mixed = collect(jobs, Options(load=load)).results
    alone = scale.scale_summary(mixed)
    pd.testing.assert_frame_equal(alone.values, got.values)
    pd.testing.assert_frame_equal(
        alone.failures.drop(columns="message"), got.failures.drop(columns="message")
    )
    with pytest.raises(OSError, match="gated repo"):
        scale.measure_scale(jobs, options=Options(load=load, on_error="raise"))
    chart = scale.scale_chart(scale.judge(got.values, "wide"), reference="wide")
    assert chart.to_dict()["facet"]["field"] == "metric"
