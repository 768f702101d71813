"""Chapter f01's module: run() measures exactly jobs(p), and its claims, assumptions and glued
values are the numbers the notebook's prose names, on tiny Llama models loaded by a fake loader."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from coupling_utils.analysis import depth_and_tokens as tw
from coupling_utils.analysis import tile_grid
from coupling_utils.chapters import f01_depth_and_tokens as f01
from coupling_utils.measurement import Options
from coupling_utils.pipeline.status import status_table

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "f01_depth_and_tokens.md"


class _Tok:
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[ord(c) % 64 for c in text]])}

    def convert_ids_to_tokens(self, ids):
        return [chr(65 + i % 26) for i in ids]

    def decode(self, ids):
        return "".join(self.convert_ids_to_tokens(ids))


class _Loader:
    """Tiny Llama models by name ("gated" is refused, as a gated hub repo is); records its calls."""

    def __init__(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        sizes = dict(hidden_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
        cfg = LlamaConfig(vocab_size=64, intermediate_size=32, max_position_embeddings=64, **sizes)
        self.models, self.calls = {}, []
        for random_init, seed in ((False, 7), (True, 0)):
            torch.manual_seed(seed)
            self.models[random_init] = LlamaForCausalLM(cfg).eval()

    def __call__(self, name, *, dtype, random_init, seed):
        self.calls.append((name, random_init))
        if name == "gated":
            raise OSError("401 Client Error: access to model gated is restricted")
        return SimpleNamespace(model=self.models[random_init], tokenizer=_Tok(), name=name, revision=None,
                               dtype=dtype, arch="llama", n_layers=4, d_model=16, provenance={})  # fmt: skip


def _params(**changes) -> f01.Params:
    base = dict(model="tiny", more_models=["gated", "tiny-b"], n_prompts=1, max_tokens=8, k=[2, 4],
                tile_layers=[1, 2], tile_k=3, token_layer=3)  # fmt: skip
    return f01.Params(**{**base, **changes})


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    cache = tmp_path_factory.mktemp("f01-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COUPLING_CACHE", str(cache))
        p, load = _params(), _Loader()
        results = f01.run(p, Options(load=load))
        again = f01.run(p, Options(compute=False))  # only reads what the first run stored
        planned = f01.jobs(p)
    return SimpleNamespace(p=p, load=load, results=results, again=again, planned=planned, cache=cache)


def test_run_measures_exactly_the_plan(measured):
    planned = {job.out(part) for job in measured.planned for part in job.settings}
    stored = {path.parent for path in Path(measured.cache).rglob("provenance.json")}
    beside = {
        path for path in stored if path.name == "last_block-block"
    }  # the other map, in its run's folder
    assert stored - beside == {p for p in planned if "gated" not in str(p)}
    assert {path.parent for path in beside} == {
        job.out(part) for job in measured.planned[:2] for part in job.settings
    }
    assert len(measured.planned) == 6 and [j.labels["model"] for j in measured.planned[::2]] == [
        "tiny", "gated", "tiny-b"
    ]  # fmt: skip
    assert sorted(measured.planned[0].settings) == ["depth", "tokens"]  # the drawn model
    assert sorted(measured.planned[4].settings) == ["depth"]  # the others: depth only
    # the drawn model and its twin measure the authors' map of the last block (the chapter's
    # default) and, in the same jobs, the paper's: the last block once more; the others do not
    assert {part: (s.last_block, s.last_block_also) for part, s in measured.planned[0].settings.items()} == {
        "depth": ("final_norm", "block"), "tokens": ("final_norm", "block")
    }  # fmt: skip
    assert measured.planned[4].settings["depth"].last_block_also is None
    assert [c for c in measured.load.calls if c[0] != "gated"] == [
        ("tiny", False), ("tiny", True), ("tiny-b", False), ("tiny-b", True)
    ]  # fmt: skip
    under = measured.results.companions["block"]  # read from the same run: the last block's rows differ
    last = int(under.n_layers) - 1

    def rows(m, outside: bool) -> pd.DataFrame:
        d = m.depthwise
        hit = (d.layer_i == last) | (d.layer_j == last)
        return d[~hit if outside else d.layer_i == last].reset_index(drop=True)

    pd.testing.assert_frame_equal(rows(measured.results.main, True), rows(under, True))
    assert not rows(measured.results.main, False).coupling.equals(rows(under, False).coupling)
    r, again = measured.results, measured.again
    assert list(r.twins.results) == ["tiny", "tiny-b"] and set(r.failures.model) == {"gated"}
    for name in ("depthwise", "tiles", "tokenwise", "context", "summary"):
        pd.testing.assert_frame_equal(getattr(again.main, name), getattr(r.main, name))
    assert r.focus == next(iter(f01.prompts(measured.p))) and r.main.token_layer == 3
    assert set(r.main.tiles.K) == {3} and r.twins.results["tiny-b"].tiles.empty


def test_the_drawn_model_must_be_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    with pytest.raises(RuntimeError, match="gated: the chapter's main model"):
        f01.run(_params(model="gated", more_models=[]), Options(load=_Loader()))


def test_claims_follow_the_rules(measured):
    r = measured.results
    rows = f01.claims(r)
    depth = (
        "more coupled across depth than its random twin (on average by at least 0.05 at every K, and in "
        "nearly every block pair)"
    )  # what the depth rule reads (excess >= 0.05, share_above >= 0.9), not "absent in the twin"
    assert [row["claim"] for row in rows[:2]] == [f"{depth}: tiny", f"{depth}: tiny-b"]
    assert "every tile" not in rows[0]["paper"] and "every tile" in rows[2]["paper"]  # the tiles row's
    assert rows[0]["agree"] == f01.RULES["depth"].judge(tw.depth_contrast(r.main, r.params.k, r.params.how))
    # the tiles judged are every prompt's, at every K they hold
    assert rows[2]["agree"] == f01.RULES["tiles"].judge(tile_grid.tile_contrast(r.main.tiles, 3))
    tokens = tw.token_contrast(r.main, 2) | tw.token_intervals(r.main, 2)  # with intervals over prompts
    assert rows[3]["agree"] == f01.RULES["tokens"].judge(tokens)
    assert rows[4]["agree"] == f01.RULES["context"].judge(r.token_judged)
    assert "K = 2: " in rows[0]["ours"] and "K = 4: " in rows[0]["ours"]
    # the depth rule reads the smallest gap over every K: each row names the K where it falls
    for row, name in zip(rows[:2], ("tiny", "tiny-b")):
        gaps = r.per_model[r.per_model.model == name].set_index("K")["trained − random"]
        assert r.depth[name]["excess_k"] == gaps.idxmin()
        assert f"judged on the smallest gap over K (here at K = {gaps.idxmin()})" in row["note"]
    keys = [key for key, _, _ in f01.assumptions(r)]
    # the distance trend is glued in words (distance_words), no longer assumed by the prose
    assert keys == ["f01-twin-near-chance", "f01-twin-tokens-uniform", "f01-tiles-shared",
                    "f01-first-token-decouples"]  # fmt: skip
    holds = {key: h for key, h, _ in f01.assumptions(r)}
    first, other = r.first_token
    assert holds["f01-first-token-decouples"] == (first < other)


def test_a_model_of_the_book_s_own_is_a_contrast_not_the_paper_s_claim():
    """The paper made no claim about a model it did not measure (the embedded MiniLM encoder): its
    depth row is this book's contrast, which the intro's tally keeps apart from the paper's claims."""
    from coupling_utils.chapters import is_own_claim
    from coupling_utils.chapters.f01_depth_and_tokens.story import _depth_claim

    drawn, paper = _depth_claim("embedded:smollm2-135m", "embedded:smollm2-135m")
    assert not is_own_claim(drawn) and "Llama-3-8B" in paper and "every tile" not in paper
    contrast, paper = _depth_claim("embedded:minilm-l6", "embedded:smollm2-135m")
    assert is_own_claim(contrast) and contrast.startswith("Contrast (this book's, not the paper's claim): ")
    assert contrast.endswith(": embedded:minilm-l6") and paper.startswith("no claim")
    hub, paper = _depth_claim("openai-community/gpt2", "meta-llama/Meta-Llama-3-8B")
    assert not is_own_claim(hub) and paper == "coupling in a multitude of LLMs"


def test_the_distance_trend_and_the_excluded_last_block_are_said_for_any_depth():
    """Two blocks (the smoke model) are one distance apart: no "Spearman ρ = nan", no "Up" answer,
    and no "gives nan" for the blocks without the last."""
    from coupling_utils.analysis.verdicts import Interval
    from coupling_utils.chapters.f01_depth_and_tokens.story import distance_words, excluded_words

    def iv(estimate, low, high):
        return Interval(estimate, low, high, over="8 prompts")

    two = distance_words(None, iv(0.0, -0.01, 0.01))
    assert "no Spearman ρ" in two["f01_distance_trend"] and "nan" not in str(two)
    assert two["f01_adjacent_answer"].startswith("Neither in this run")
    deep = distance_words(iv(-0.45, -0.6, -0.3), iv(0.1, 0.05, 0.15))
    assert deep["f01_distance_trend"] == (
        "coupling falls with the distance between blocks (Spearman ρ = -0.45, 95% interval over prompts "
        "-0.60 to -0.30), so the distant pairs pull the mean over all pairs down (neighbours − all pairs "
        "+0.100, 95% interval over prompts 0.050 to 0.150)"
    )
    drawn = "for the drawn model's trained weights"  # one model and weights, not all
    assert deep["f01_adjacent_answer"].startswith(f"Up {drawn}: coupling falls")
    from coupling_utils.chapters.f01_depth_and_tokens.findings import tokens_words
    from coupling_utils.chapters.f01_depth_and_tokens.story import self_vs_twin

    # the default book read "0.479, lower than its twin's 0.910" beside "a difference this run does not
    # tell from none": the word follows the difference's interval
    assert self_vs_twin(Interval(-0.431, -0.5, -0.3, over="2 prompts")) == "not told apart from"
    assert (
        self_vs_twin(iv(-0.431, -0.5, -0.3)) == "lower than"
        and self_vs_twin(iv(0.2, 0.1, 0.3)) == "higher than"
    )

    said = tokens_words({"self_excess": iv(0.02, 0.01, 0.03)}, (0.066, 0.575))
    assert said.endswith(
        "On the drawn prompt, pairs involving the first token average 0.066 and pairs of other tokens "
        "0.575 (one prompt: no interval, so no comparison is judged)."
    )
    assert "less coupled" not in said  # the demo prompt alone: no interval, no comparison word
    # the words follow the intervals, not the signs of the estimates (the audit's f01 distance trend)
    unclear = distance_words(iv(-0.45, -0.7, 0.1), iv(0.1, -0.02, 0.15))
    assert unclear["f01_distance_trend"].startswith(
        "coupling shows no clear trend with the distance between blocks (Spearman ρ = -0.45, 95% interval "
        "over prompts -0.70 to 0.10, which includes 0), and the neighbours are neither clearly more nor less "
        "coupled than the mean over all pairs"
    )
    assert unclear["f01_adjacent_answer"].startswith(f"Neither clearly up nor down {drawn}")
    rising = distance_words(iv(0.2, 0.1, 0.3), iv(-0.1, -0.2, -0.05))
    assert rising["f01_distance_trend"].startswith("coupling rises with the distance")
    assert "the neighbours are less coupled than" in rising["f01_distance_trend"]
    assert rising["f01_adjacent_answer"].startswith(f"Down {drawn}")
    flat_up = distance_words(iv(-0.2, -0.5, 0.1), iv(0.1, 0.05, 0.15))  # up, but no clear fall to say why
    assert flat_up["f01_adjacent_answer"].startswith(f"Up {drawn}: coupling shows no clear trend")
    assert "pull the mean" not in flat_up["f01_distance_trend"]
    nan = float("nan")
    none = excluded_words({"trained_excluded": nan, "twin_excluded": nan, "excluded_diff": nan}, 2)
    assert none == "Leaving the last block out leaves no pair of different blocks to average (2 blocks)"
    some = excluded_words({"trained_excluded": 0.41, "twin_excluded": 0.07, "excluded_diff": 0.0}, 30)
    assert some.startswith("Leaving the last block out gives 0.4100 (twin 0.0700)")
    shared = excluded_words({"trained_excluded": 0.41, "twin_excluded": 0.07, "excluded_diff": 0.0}, 30, True)
    assert shared == "Leaving the last block out gives 0.4100 (twin 0.0700)"  # one run: nothing to compare


def test_glue_values_are_the_names_the_prose_uses(measured):
    r = measured.results
    status = status_table(f01.claims(r))
    values = f01.glue_values(r, status)
    text = NOTEBOOK.read_text()
    used = set(re.findall(r"\{glue:(?:text|md)\}`([a-z0-9_]+)", text))
    assert set(values) - used == {"f01_kmin"}  # glued as before, though no sentence quotes it yet
    assert used <= set(values)
    assert values["f01_trained"] == float(r.per_model.query("model == 'tiny' and K == 4").trained.iloc[0])
    assert values["f01_kmax"] == 4 and values["f01_kmin"] == 2 and values["f01_farthest_distance"] == 3
    gaps = r.per_model[r.per_model.model == "tiny"].set_index("K")["trained − random"]
    assert values["f01_excess_k"] == gaps.idxmin() and values["f01_excess"] == pytest.approx(gaps.min())
    assert values["f01_diag_chance"] == pytest.approx(1 / 3)
    assert f"**{status.agree.iloc[0]}**" in values["f01_depth_verdict"].data  # the status row's, tagged
    assert f'data-claim="{html.escape(status.claim.iloc[4])}"' in values["f01_context_verdict"].data
    assert f"**{status.agree.iloc[4]}**" in values["f01_context_verdict"].data
    for name, v in values.items():
        assert type(v).__module__ in ("builtins", "IPython.core.display"), (name, type(v))
    others = values["f01_others"].data
    assert others.startswith("The other model measured, tiny-b, ")
    b = r.depth["tiny-b"]
    assert (f": its smallest trained − twin gap over K, which the rule reads, is {b['excess'].estimate:.3f}, "
            f"at K = {b['excess_k']}; ") in others  # fmt: skip
    assert "; 1 could not be measured and is listed above." in others  # not "1 ... are"
    assert values["f01_encoder_note"].data == ""
    # the drawn model and its K as measured, not the default profile's SmolLM2 (width 576)
    assert (
        values["f01_model_words"] == "tiny, in float32 (4 blocks, width 16)" and values["f01_d_model"] == 16
    )
    assert values["f01_tile_window"] == "blocks 1–2 (0-based; 2 of its 4)"
    assert (
        values["f01_more_words"] == "Beside it this run measures tiny-b, in float32; each with its twin."
    )  # not "gated"
    assert values["f01_k_words"] == (
        "This run measures K = 2 and 4 at width 16 (none of the paper's); "
        "K = 2 is the book's K/d at this width."
    )


def test_the_k_sentence_follows_the_width_and_the_k_measured():
    from coupling_utils.chapters.f01_depth_and_tokens.story import k_words

    assert k_words([10, 30, 50, 72], 576) == (
        "This run measures K = 10, 30, 50 and 72 at width 576 (all three of the paper's); "
        "K = 72 is the book's K/d at this width, the largest K of this run."
    )
    assert k_words([4, 2], 32).endswith("K = 4 is the book's K/d at this width, the largest K of this run.")
    assert k_words([10, 30, 50], 768).endswith(
        "would be K = 96 at this width, which this run does not measure."
    )
    assert "(10 and 30 of the paper's)" in k_words([10, 30, 4], 32)
    # the default profile's other model, MiniLM-L6, is measured at SmolLM2's K
    assert k_words([10, 30, 50, 72], 576, {"embedded:minilm-l6": 384, "same": 576}).endswith(
        "the largest K of this run. embedded:minilm-l6 (width 384) is measured at the same K, "
        "K/d 0.03 to 0.19; the book's K/d there would be K = 48, which this run does not measure."
    )
    assert k_words([4], 16, {"b": 32}).endswith(
        "b (width 32) is measured at the same K, K/d 0.12; K = 4 is the book's K/d there."
    )


def test_the_sentence_on_several_other_models(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    r = f01.run(_params(more_models=["tiny-b", "tiny-c"]), Options(load=_Loader()))
    status = status_table(f01.claims(r))
    others = f01.glue_values(r, status)["f01_others"].data
    counts = status.agree.iloc[1:3].value_counts()
    assert others.startswith(
        f"Of the 2 other models measured, {counts.get('yes', 0)} pass the depth rule (yes), "
        f"{counts.get('partly', 0)} partly and {counts.get('no', 0)} not. "
    )
    assert "could not be measured" not in others


def test_the_figures_build(measured):
    r = measured.results
    charts = [f01.tile_chart(r, "trained"), f01.tile_chart(r, "random init"), f01.depth_chart(r)]
    charts += [f01.distance_chart(r), f01.per_model_chart(r), f01.token_chart(r), f01.context_chart(r)]
    for chart in charts:
        assert chart.to_dict()["$schema"].startswith("https://vega.github.io/schema/vega-lite")
    # the token charts draw K = k_verdict (their titles say so), and so do their captions
    for chart in (f01.token_chart(r), f01.context_chart(r)):
        assert f"K = {r.k_verdict}" in str(chart.to_dict()["title"])
    text = NOTEBOOK.read_text()
    for name in ("fig-f01-tokens", "fig-f01-context"):
        cell = text.split(f'name="{name}"')[1].split("```")[0]
        assert "($K = {results.k_verdict}$)" in cell and "min(k)" not in cell, name


def test_the_last_block_under_both_maps(measured):
    r = measured.results
    assert r.params.last_block == "final_norm" and set(r.maps) == {"block", "final_norm"}
    v = r.last_block_values
    # the other blocks are the same map under both conventions; the last block is not
    assert v["rest_diff"] < 1e-6 and v["excluded_diff"] < 1e-6
    assert abs(v["trained_final_norm"] - v["trained_block"]) > 1e-4 and v["trained_line_diff"] > 1e-4
    block = r.companions["block"].summary
    assert v["trained_block"] == float(block[(block.weights == "trained") & (block.K == 4)].coupling.iloc[0])
    assert v["trained_final_norm"] == float(r.per_model_head["trained"])  # the chapter's own number
    table = r.last_block_table
    assert sorted(set(table.convention)) == ["block", "excluded", "final_norm"] and len(table) == 6
    assert set(table[table.convention == "excluded"].blocks) == {"0–2"}
    lines = r.last_block_lines
    assert set(lines.line) == {"row", "column"} and set(lines.partner) == {0, 1, 2}
    assert (lines["difference"] == lines["final_norm"] - lines["block"]).all()
    assert set(r.other_verdicts) == {"block", "excluded"}
    rows = f01.claims(r)
    assert all("last block: 'final_norm'" in row["note"] for row in rows)
    own = r.main_verdicts()
    for row, name in zip(rows[2:], ("tiles", "tokens", "context")):
        for convention, verdicts in r.other_verdicts.items():
            if verdicts[name] is not None and verdicts[name] != own[name]:
                assert f"under '{convention}' the verdict would be {verdicts[name]}" in row["note"]
    assert "the other map measured for the drawn model only" in rows[1]["note"]  # tiny-b
    assert f01.last_block_chart(r).to_dict()["$schema"].startswith("https://vega.github.io/schema/vega-lite")


def test_the_paper_definition_measures_the_authors_map_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = _params(more_models=[], last_block="block")
    planned = f01.jobs(p)
    conventions = [{(s.last_block, s.last_block_also) for s in j.settings.values()} for j in planned]
    assert conventions == [{("block", "final_norm")}] * 2  # one run: the last block under both maps
    excluded = [
        {s.last_block for s in j.settings.values()}
        for j in f01.jobs(dataclasses.replace(p, last_block="excluded"))
    ]
    assert (
        excluded == [{"excluded"}] * 2 + [{"block"}] * 2 + [{"final_norm"}] * 2
    )  # no last block: two more runs
    from coupling_utils.chapters import ParameterError

    with pytest.raises(ParameterError, match="last_block"):
        f01.Params.checked({"last_block": "norm"})


def _typed(text: str) -> str:
    """The notebook's prose with its glued roles removed: the words typed, true at every profile."""
    return re.sub(r"\{glue:\w*\}`[^`]*`", "⟦⟧", text)


def test_what_matched_says_what_the_run_showed_not_a_mechanism_it_did_not_measure():
    """The twin's level, the tiles' reading, the token-wise and context readings and the bullet
    on the drawn model are worded from their numbers (the old typed words were false at the paper
    profile: a twin far from chance 'sits at the level of unrelated matrices', tiles judged 'no'
    'are shared as in the paper's figure', Llama-3-8B 'below the paper's Llama-3-8B'), and an
    unmeasured mechanism is said to be one."""
    typed = _typed(NOTEBOOK.read_text())
    for stale in ("The twin sits at the level", "The top singular directions are shared\n",
                  "Possible reasons where the level is below", "so in this run token-wise coupling is not",
                  "attention is\n  almost uniform", "carries no information",
                  "The per-model table shows the same on real blocks", "`-p token_layer=3`"):  # fmt: skip
        assert stale not in typed, stale
    from coupling_utils.chapters.f01_depth_and_tokens import findings as story

    assert story.twin_level_words(0.01).startswith("The twin stays within 0.05 of 0")
    assert story.twin_level_words(-0.47).startswith("The twin is not within 0.05 of 0")
    assert "not in every tile" in story.tiles_words("partly")  # no values: the generic reason
    from coupling_utils.analysis.verdicts import Interval

    def tiles(trained, twin, units=6):
        over = f"{units} prompts, K = 3–72"
        return {"diagonal_trained": Interval(*trained, over=over),
                "diagonal_twin": Interval(*twin, over=over)}  # fmt: skip

    # the default book's partly: both estimates pass, the trained share's interval does not
    wide = story.tiles_words("partly", tiles((0.982, 0.661, 0.982), (0.0, 0.0, 0.0357)))
    assert "the estimates meet the rule's yes" in wide
    assert wide.endswith("the trained share's reaches down to 66%")
    assert "not in every tile" not in wide and "twin's reaches" not in wide
    short = story.tiles_words("partly", tiles((0.5, 0.4, 0.6), (0.3, 0.2, 0.4)))
    assert "in 50% of the trained tiles, short of the 90% a yes needs" in short
    assert "in 30% of the twin's, above the 10% a yes allows" in short and "meet" not in short
    few = story.tiles_words("partly", tiles((0.95, 0.9, 0.96), (0.0, 0.0, 0.0), units=2))
    assert few.endswith("there is no 95% interval: only 2 prompts (K = 3–72), too few to resample "
                        "(a 95% interval needs at least 6)")  # fmt: skip
    assert story.tiles_words("no").startswith("This run's tiles do not show")
    named = "meta-llama/Meta-Llama-3-8B (default revision), commit 0123456789ab, in float32 (bfloat16 asked"
    paper = story.level_reasons("meta-llama/Meta-Llama-3-8B", named, 32, 4096)
    assert "is the paper's" in paper and "below" not in paper and "4-bit" in paper and named in paper
    assert "differs from the paper's Llama-3-8B" in story.level_reasons("embedded:smollm2-135m", "x", 30, 576)

    def excess(est, low, high):
        return Interval(est, low, high, over="prompts")

    up = story.tokens_words({"self_excess": excess(0.4, 0.3, 0.5)}, (0.8, 0.7))
    assert (
        up.startswith(
            "so in this run token-wise coupling is higher after training than at random initialisation "
            "(trained − twin +0.400, 95% interval over prompts 0.300 to 0.500)."
        )
        and "pairs involving the first token average 0.800 and pairs of other tokens 0.700" in up
    )
    down = story.tokens_words({"self_excess": excess(-0.4, -0.5, -0.3)}, (0.1, 0.6))
    assert "not a sign of training (trained − twin -0.400" in down and "not measured here" in down
    assert "are less coupled" not in down and "(one prompt: no interval, so no comparison is judged)" in down
    unclear = story.tokens_words({"self_excess": excess(0.02, -0.01, 0.05)}, (0.1, 0.6))
    assert unclear.startswith("a difference this run does not tell from none (trained − twin +0.020, ")
    one = story.tokens_words({"self_excess": Interval(0.4, float("-inf"), float("inf"))}, (0.1, 0.6))
    assert "(trained − twin +0.400, from one prompt, which gives no interval)" in one
    ctx = {"context_twin": 0.8}
    assert "lower than the trained model's" in story.context_words(
        ctx | {"context_excess": excess(0.1, 0.05, 0.2)}
    )
    higher = story.context_words(ctx | {"context_excess": excess(-0.5, -0.6, -0.4)})
    assert (
        higher.startswith("The twin's context coupling is higher (0.800; ") and "not measured here" in higher
    )
    # the smoke run's twin sits 0.00002 below the trained model: not said to be lower
    same = story.context_words(ctx | {"context_excess": excess(0.00002, -0.001, 0.001)})
    assert same.startswith("The twin's context coupling is 0.800; this run does not tell it from the trained")
    assert story.token_layer_reruns(30, 15) == "Rerun with `-p token_layer=3` and `-p token_layer=27`"
    assert story.token_layer_reruns(2, 1) == "Rerun with `-p token_layer=0`"
    assert "no other block" in story.token_layer_reruns(1, 0)
    assert "not measured here" in f01.ENCODER_NOTE and "norm dominates" not in f01.ENCODER_NOTE


def test_the_thirds_of_the_network_are_values_not_a_ranking():
    """Exercise f01-ex-window's answer said "highest in the middle third" of an argmax with no interval,
    and "blocks 0–10, 10–20" read as overlapping thirds: it names the pairs each third averages and the
    highest as an estimate only."""
    from coupling_utils.chapters.f01_depth_and_tokens.findings import adjacent_thirds

    rows = [
        {"weights": w, "K": 4, "prompt": "a", "layer_i": i, "layer_j": j, "coupling": 0.1 * (1 + (i + j) % 3)}
        for w in ("trained", "random init") for i in range(7) for j in range(7)
    ]  # fmt: skip
    words = adjacent_thirds(pd.DataFrame(rows), 4)
    assert "(the pairs of blocks 0 to 2)" in words and "(the pairs of blocks 4 to 6)" in words
    assert (
        "third's is the highest estimate (no interval is drawn for the thirds, so they are not told apart)"
        in words
    )
    assert "highest in the" not in words


def test_the_answers_that_quote_every_model_and_the_tile_interval_note():
    """Exercise f01-ex-adjacent answers "for which model most" from every model and weights of the run
    (the default book's twin fell, 0.00230 to 0.00229, where the answer said "Up" and "rerun"); a
    verdict decided at one K says the gap at the other K; the tile share at its interval's top says why."""
    from coupling_utils.analysis.verdicts import Interval
    from coupling_utils.chapters.f01_depth_and_tokens import findings

    def run(trained, twin):  # (level, fall per block of distance) of each: neighbours the highest
        level = {"trained": trained, "random init": twin}
        return SimpleNamespace(depthwise=pd.DataFrame(
            [{"weights": w, "K": 4, "prompt": "a", "layer_i": i, "layer_j": j, "m": 0.5,
              "coupling": 1.0 if i == j else level[w][0] - level[w][1] * abs(i - j)}
             for w in tw.WEIGHTS for i in range(4) for j in range(4)]
        ))  # fmt: skip

    runs = {"a": run((0.5, 0.1), (0.1, -0.01)), "b": run((0.8, 0.2), (0.2, 0.0))}
    words = findings.adjacent_models(runs, 4)
    # all pairs: distances 1, 2, 3 in 6, 4, 2 of the 12 ordered pairs: mean distance 5/3
    assert "a, trained 0.333 to 0.400 (+0.067) and its twin 0.117 to 0.110 (-0.0067)" in words
    assert "b, trained 0.467 to 0.600 (+0.13) and its twin 0.200 to 0.200 (+0)" in words
    assert "the largest rise is b's trained weights (+0.13) (estimates" in words
    flat = {"a": run((0.5, 0.0), (0.1, 0.0))}
    assert "none rises" in findings.adjacent_models(flat, 4)
    two = {"a": SimpleNamespace(depthwise=runs["a"].depthwise.query("layer_i < 2 and layer_j < 2"))}
    assert findings.adjacent_models(two, 4).startswith("Every model's measured blocks are neighbours")

    per_model = pd.DataFrame(
        {"model": ["d"] * 3 + ["e"] * 3 + ["f"] * 3, "K": [10, 30, 50] * 3,
         "trained − random": [0.06, 0.07, 0.08, -0.26, 0.08, 0.2, 0.1, 0.2, 0.3]}
    )  # fmt: skip
    depth = {"d": {"excess_k": 10}, "e": {"excess_k": 10}, "f": {"excess_k": 10}}
    assert findings.k_gap_words(per_model, "d", depth) == (
        "The sign of e's trained − twin gap depends on K: -0.260 at K = 10 (the smallest, which the rule "
        "reads), +0.080 at K = 30 and +0.200 at K = 50 (the drawn model's at those K: +0.070 and +0.080)."
    )  # f keeps its sign at every K: nothing to say
    without_e = {name: v for name, v in depth.items() if name != "e"}
    assert findings.k_gap_words(per_model[per_model.model != "e"], "d", without_e) == ""

    top = Interval(0.982, 0.661, 0.982, over="6 prompts, K = 3–72")
    note = findings.tile_interval_note(top, 70)
    assert note.startswith("The trained share's estimate, 98%, is also its interval's upper end")
    assert "smallest over the 70 values of K" in note and "at most 2.5% of the resamples do" in note
    assert findings.tile_interval_note(Interval(0.9, 0.8, 0.95, over="6 prompts"), 70) == ""
    assert findings.tile_interval_note(Interval(0.9, 0.8, 0.95, over="1 prompt"), 70) == ""
