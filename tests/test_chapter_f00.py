"""Chapter f00's module: its plan (one stored job: the last token's Jacobians of two blocks), what
run() reads back from the store and computes from it, and the values its notebook glues."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from coupling_utils.analysis import coupling_metric as cm
from coupling_utils.analysis.model_names import model_words, planned
from coupling_utils.chapters import ParameterError
from coupling_utils.chapters import f00_coupling_metric as f00
from coupling_utils.engine.metric import coupling, svd
from coupling_utils.measurement import Options
from coupling_utils.pipeline.sweep import planned_params

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "f00_coupling_metric.md"
HUB = {"model": "meta-llama/Meta-Llama-3-8B", "layer": 12, "k": 10, "d_toy": 16, "n_random": 5}


@pytest.mark.parametrize("profile", ["smoke", "default", "laptop", "paper"])
def test_the_plan_is_one_job_of_two_jacobians(profile):
    p = planned_params(f00.NOTEBOOK, profile)
    (job,) = f00.jobs(p)  # planned without the model: the paper's hub model is not here
    assert job.storable and job.settings == {} and job.model == p.model and job.prompts == [p.prompt]
    assert job.extra.fn is cm.block_jacobians and dict(job.extra.options) == {"layer": p.layer}
    assert job.extra.passes(32, 4096) == 2 * 4097  # d VJPs and a forward, for each of two blocks
    assert job.load_kwargs["dtype"] == p.dtype and job.revision == (p.revision or None)
    assert job.weights == "trained" and job.check.keywords == {"layer": p.layer, "k": p.k}
    assert pickle.loads(pickle.dumps(job)) == job  # a sweep ships it to its workers


def test_only_what_the_jacobians_depend_on_keys_the_job():
    p = f00.Params.checked({})
    key = f00.jobs(p)[0].key
    cpu_only = {"k": 4, "noise_levels": [0.0, 1.0], "d_toy": 8, "n_random": 3, "seed": 2}
    assert f00.jobs(f00.Params.checked(cpu_only))[0].key == key  # computed from the stored matrices
    for change in ({"layer": 3}, {"prompt": "Paris is"}, {"dtype": "bfloat16"}):
        assert f00.jobs(f00.Params.checked(change))[0].key != key
    # a checkpoint (of a run that saves them: the default model keeps only its final weights)
    run = {"model": "embedded:pythia-smoke"}
    final = f00.jobs(f00.Params.checked(run))[0].key
    assert f00.jobs(f00.Params.checked({**run, "revision": "step1"}))[0].key != final


def _glue_names() -> tuple[set[str], set[str]]:
    """The names the notebook's prose reads, and those pinned for it (tests/pinned/smoke_values.yaml)."""
    import yaml

    prose = set(re.findall(r"\{glue:text\}`(f00_[a-zA-Z0-9_]+)", NOTEBOOK.read_text()))
    pinned = yaml.safe_load((Path(__file__).parent / "pinned" / "smoke_values.yaml").read_text())
    return prose, set(pinned["notebooks"][f00.NOTEBOOK]["glue"])


def test_run_reads_back_what_the_model_gives(standin_hub, tmp_path, monkeypatch):
    from coupling_utils import load_model, token_jacobians

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f00.Params.checked(HUB)
    with pytest.raises(f00.NotMeasured, match="not measured yet"):
        f00.run(p, Options(compute=False))
    loads = []

    def load(ref, **kw):
        loads.append(ref)
        return load_model(ref, **kw)

    r = f00.run(p, Options(load=load))
    assert loads == [HUB["model"]]
    lm = load_model(HUB["model"])
    ids = lm.tokenizer(p.prompt, return_tensors="pt").input_ids
    J, J_next = token_jacobians(lm, ids, 12)[-1], token_jacobians(lm, ids, 13)[-1]
    assert torch.equal(r.J, J) and torch.equal(r.J_next, J_next)  # exact: float32 through Parquet
    named = model_words(planned(HUB["model"], f00.jobs(p)[0].load_kwargs))  # an extra-only job
    assert named.startswith(f"{lm.name} (default revision), commit ") and named.endswith(", in float32")
    assert r.facts == {"name": lm.name, "n_layers": lm.n_layers, "d_model": lm.d_model, "T": ids.shape[1],
                       "layer": 12, "named": named}  # fmt: skip
    L, d, T = lm.n_layers, lm.d_model, ids.shape[1]
    assert r.headline() == f"{named}: {L} blocks, width d = {d}; prompt of T = {T} tokens"
    assert torch.equal(r.R, cm.random_reference(J, seed=p.seed)) and torch.equal(r.s.S, svd(J).S)
    assert r.m_case(f00.neighbour_case(12)) == coupling(J, J_next, 10) == r.m_forward
    assert r.m_backward == coupling(J_next, J, 10)
    pd.testing.assert_frame_equal(r.sweep, cm.noise_sweep(J, p.noise_levels, 10, seed=p.seed))
    assert list(r.by_k.K) == [1, 10, 30, 50] and list(r.variants.K.unique()) == [1, 10, 30, 50]

    again = f00.run(p, Options(load=load, compute=False))  # read only: nothing loaded, the same numbers
    assert loads == [HUB["model"]] and torch.equal(again.J, r.J)
    values = f00.glue_values(p, again)
    prose, pinned = _glue_names()
    assert prose <= set(values) and set(values) == pinned  # every name the prose reads; the pinned set

    def plain(glued: dict) -> dict:  # a Markdown value compares by its text
        return {name: getattr(v, "data", v) for name, v in glued.items()}

    assert plain(values) == plain(f00.glue_values(p, r))
    assert values["f00_layer_reruns"].data == f00.layer_reruns(lm.n_layers, p.layer)
    assert values["f00_d"] == lm.d_model and type(values["f00_d"]) is int
    assert values["f00_m_adjacent"] == coupling(J, J_next, 10)
    null = cm.random_bases(J, 10, f00.N_RANDOM_BASES, seed=p.seed)
    assert r.m_random_bases == pytest.approx(null, rel=1e-5) and len(null) == 39
    assert values["f00_adjacent_vs_random"] == f00.adjacent_vs_random(r.m_forward, r.m_random_bases)
    assert values["f00_energy_top_k"] == cm.energy_share(svd(J).S, 10)
    assert set(r.assumed) == {"f00-random-basis-near-one", "f00-random-near-one", "f00-trace-smaller"}


def test_a_layer_without_a_next_block_is_refused_before_measuring(standin_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    p = f00.Params.checked({**HUB, "layer": 31})  # 32 blocks: block 31 has no neighbour
    with pytest.raises(f00.NotMeasured, match=r"ParameterError: parameter 'layer' must be <= 30, got 31"):
        f00.run(p)
    (job,) = f00.jobs(p)
    assert not job.extra_out().exists()  # the check ran before the Jacobians


def test_k_above_the_width_is_refused_for_new_and_for_stored_jacobians(standin_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    wide = f00.Params.checked({**HUB, "k": 65, "d_toy": 80})
    message = r"parameter 'k' \(K\) must be <= the model width d=64, got 65"
    with pytest.raises(f00.NotMeasured, match=message):
        f00.run(wide)
    f00.run(f00.Params.checked(HUB))  # stores the Jacobians (the same job: K is not in its key)
    with pytest.raises(ParameterError, match=message):
        f00.run(wide, Options(compute=False))


def test_the_noise_sentences_read_the_sweep():
    sweep = pd.DataFrame({"noise": [0.0, 1.0, 30.0], "m_K": [0.0, 0.5, 0.9]})
    reached = f00._noise_values(sweep, 2.0, 0.6)
    assert reached["f00_noise_equivalent_text"] == "ε ≈ 2"
    assert reached["f00_noise_sentence"] == (
        "The neighbouring block's basis leaves J as far from diagonal (m_K = 0.600) as the basis of "
        "J + εR does at ε ≈ 2: noise of about that size relative to J's norm"
    )
    beyond = f00._noise_values(sweep, float("nan"), 0.95)
    text = beyond["f00_noise_equivalent_text"]
    assert text == "beyond the sweep (no ε up to 30 reaches it: extend the sweep)"
    assert beyond["f00_noise_sentence"] == (
        "None of the swept noise levels (up to ε = 30, m_K = 0.900) leaves J as far from diagonal as the "
        "neighbouring block's basis does (m_K = 0.950): sweep further"
    )


def test_the_by_k_words_follow_the_table():
    """Exercise f00-ex-k: "widens"/"shrinks" only when the gap moves that way at every step, and the
    basis said to move more is the one whose m_K spans the wider range (the default book's table)."""
    by_k = pd.DataFrame(
        {"K": [1, 72, 216, 360], "neighbour's basis": [0.849, 0.900, 0.950, 1.008],
         "random basis": [0.993, 1.048, 1.116, 1.162]}
    )  # fmt: skip
    by_k["gap"] = by_k["random basis"] - by_k["neighbour's basis"]  # 0.144, 0.148, 0.166, 0.154
    values = f00._by_k_values(by_k)
    assert (values["f00_k_first"], values["f00_k_last"]) == (1, 360)
    # one draw of the random matrix, no interval: the old words "it ends wider than it starts" and
    # "the value in the random basis moves more (range 0.169 against 0.159)" implied a measured difference
    trend = values["f00_gap_trend"]
    assert trend == (
        "does not move one way at every step of the table in this draw of the random matrix "
        "(0.144 → 0.148 → 0.166 → 0.154)"
    )
    moves = values["f00_k_moves"]
    assert "moves more (range" not in moves and "wider" not in trend
    assert (
        "over the table's K it spans 0.169 in the random basis and 0.159 in the neighbour's basis, in this "
        "one draw of the random matrix (no interval, so neither basis is said to move more)"
    ) in moves
    assert "from 0.849 to 1.008" in moves and "From K = 1 to K = 360" in moves
    by_k["gap"] = [0.3, 0.2, 0.1, 0.05]
    assert f00._by_k_values(by_k)["f00_gap_trend"].startswith("shrinks at every step of the table in this")
    by_k["gap"] = [0.05, 0.1, 0.2, 0.3]
    assert f00._by_k_values(by_k)["f00_gap_trend"].startswith("widens at every step of the table in this")


def _tiny_results():
    """f00's results on two random 16 × 16 "Jacobians" at the smoke profile (seconds, no model)."""
    g = torch.Generator().manual_seed(0)
    J, J_next = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    p = planned_params(f00.NOTEBOOK, "smoke")
    return p, f00._results(p, {"d_model": 16}, J, J_next, pd.DataFrame())


def test_the_tiles_panels_run_in_the_order_the_caption_and_alt_text_name_them():
    """Fig. 7's facet had no sort, so its panels ran alphabetically (neighbour's basis, random
    basis, own basis) while the caption and the alt text name own, neighbour's, random: the chart's
    facet is now sorted in that order, read here from the spec and from the panels as laid out."""
    from coupling_utils.analysis.layout import shown_panels

    p, r = _tiny_results()
    chart = f00.tiles_chart(r)
    order = [f00.OWN, f00.neighbour_case(p.layer), f00.RANDOM]
    assert chart.to_dict()["facet"]["column"]["sort"] == order
    panels = shown_panels(chart)
    assert [x.title for x in panels] == order and [x.position for x in panels] == ["left", "middle", "right"]
    alt = f00.tiles_alt(f00.diagonal_shares(r.tiles), p.layer, p.k)  # names them in the same order
    said = [alt.index(w) for w in ("its own basis", "neighbouring block's basis", "random matrix's basis")]
    assert said == sorted(said)
    caption = re.search(r'caption=f"The \$K .*?coupled the pair\."', NOTEBOOK.read_text(), re.S).group(0)
    said = [caption.index(w) for w in ("its own", "the next block's", "random matrix's")]
    assert said == sorted(said)


def test_the_noise_table_heads_its_column_as_one_pair_value():
    """The noise table's 1 − m_K² column was headed by the book's global "coupling (mean 1 − m²)", a
    mean over block pairs, on the value of a single pair (J, J + εR); other figures keep that title."""
    from coupling_utils.analysis.display import table_bundle
    from coupling_utils.analysis.plots import title_of

    _, r = _tiny_results()
    table = f00.noise_table(r)
    assert list(table.columns) == ["noise", "m_K", "1 − m_K²"]
    assert table["1 − m_K²"].tolist() == r.sweep["coupling"].tolist()  # same numbers
    page = table_bundle(table, "noise_sweep")[0]["text/html"]
    assert "<th>1 − m_K²</th>" in page and "coupling (mean 1 − m²)" not in page
    assert title_of("coupling") == "coupling (mean 1 − m²)"  # unchanged for the other figures
    assert 'show_table(f00.noise_table(results), "noise_sweep"' in NOTEBOOK.read_text()


def test_the_layer_exercise_names_blocks_this_model_has():
    """Early, middle and late blocks of the model measured, not the default model's 1, 15 and 27."""
    assert f00.layer_reruns(30, 10) == (
        "Rerun `coupling-book run f00` with `-p layer=1`, `-p layer=15` and `-p layer=27`"
    )
    assert f00.layer_reruns(24, 12) == "Rerun `coupling-book run f00` with `-p layer=1` and `-p layer=21`"
    assert f00.layer_reruns(2, 0).startswith(
        "This run's model (2 blocks) has no other block with a next block"
    )


def _typed(text: str) -> str:
    """The notebook's prose with its glued roles removed: the words typed, true at every profile."""
    return re.sub(r"\{glue:\w*\}`[^`]*`", "⟦⟧", text)


def test_the_toy_and_tile_words_follow_this_runs_values():
    """The words "reproduces it", "close to 1", the histogram's "near 1" and the tiles' "a fainter
    diagonal" are read from the values (the stand-in paper profile's random pairs average 1.24, its
    neighbour's tile is as diagonal as the random one's); the old typed words are gone."""
    typed = _typed(NOTEBOOK.read_text())
    for stale in ("this run reproduces it", "close to 1,", "narrow distribution near 1",
                  "a fainter diagonal", "times {glue", "stay\nwell inside the bound",
                  "Since $J$ concentrates its gain", "depends on which Jacobian concentrates", "`-p k=50`",
                  "less aligned", "50 because the answer", "a real model"):  # fmt: skip
        assert stale not in typed, stale
    toy = cm.toy_properties(64, 8, 20, seed=0)  # the default profile's K/d
    words = f00.toy_findings(toy)
    assert words["f00_properties_sentence"].startswith("this run reproduces it: the metric is ")
    assert words["f00_random_words"].startswith("close to 1")
    wide = cm.toy_properties(16, 14, 20, seed=0)  # K near d: random pairs average well above 1
    far = f00.toy_findings(wide)
    assert far["f00_properties_sentence"].startswith("this run reproduces 4 of its 5 properties: unrelated")
    assert (
        far["f00_random_words"].startswith("not within 0.1 of 1")
        and "not near 1" in far["f00_random_caption"]
    )
    tiles = pd.DataFrame({"case": ["a"] * 9 + ["b"] * 9, "row": [0, 0, 0, 1, 1, 1, 2, 2, 2] * 2,
                          "col": [0, 1, 2] * 6, "value": [3, 0, 0, 0, 3, 0, 0, 0, 3] + [1] * 9})  # fmt: skip
    shares = f00.diagonal_shares(tiles)
    assert shares["a"] == pytest.approx(1.0) and shares["b"] == pytest.approx(1 / 3)
    shares.index = [f00.neighbour_case(4), f00.RANDOM]
    alt = f00.tiles_alt(shares, 4, 3)
    assert "neighbouring block's basis, a visible diagonal (100%" in alt
    assert "random matrix's basis, no visible diagonal (33%" in alt
    assert (
        f00.energy_words(0.51, 0.38) == "1.3 times as concentrated in the top directions as a random matrix's"
    )
    assert f00.energy_words(0.997, 0.993).startswith("about as concentrated")
    assert f00.energy_words(0.3, 0.5).startswith("less concentrated")
    assert f00.k_reruns(576) == "`coupling-book run f00 -p k=1` and `-p k=50`"
    assert f00.k_reruns(32) == "`coupling-book run f00 -p k=1` and `-p k=32`"  # the smoke model's width


def test_the_neighbour_is_lower_than_random_bases_only_below_every_one_of_them():
    null = np.linspace(0.95, 0.99, 39)
    below = f00.adjacent_vs_random(0.9, null)
    assert below.startswith("lower (more coupled) than in every one of 39 random bases")
    assert "0.950 to 0.990" in below and "1 in 40" in below
    # below the figure's one draw (0.99) but not below every draw: no direction word
    inside = f00.adjacent_vs_random(0.96, null)
    assert inside.startswith("not lower than in every one of 39") and "not told apart" in inside
    assert "10 of them give m_K at or below it" in inside  # 0.95 ... 0.959: ten draws
    assert f00.adjacent_vs_random(0.95, null).startswith("not lower")  # a tie is not lower
