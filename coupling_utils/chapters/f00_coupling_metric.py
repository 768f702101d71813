"""f00 · Jacobians and the coupling metric (``notebooks/f00_coupling_metric.md``): its parameters
and their checks, its measurement plan (:func:`jobs`: one model, the last token's Jacobians of
blocks ``layer`` and ``layer + 1`` as a stored extra), :func:`run` (every number the story shows,
computed on the CPU from the stored matrices), its charts and the values its prose glues.

The chapter reports no status row: the metric's properties are properties of a definition, not
findings (its assumptions are checked with ``assume`` next to the sentences that make them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from coupling_utils.analysis import coupling_metric as cm
from coupling_utils.analysis.model_names import model_words, of_result
from coupling_utils.analysis.prose_list import listed
from coupling_utils.chapters.checks import (
    DTYPES,
    NotMeasured,
    block,
    check_block,
    check_model,
    check_top_k,
    choice,
    integer,
    k_values,
    list_of,
    number,
    text,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.chapters.reruns import deeper_model, reruns
from coupling_utils.engine.metric import SVD, coupling, k_for_width, svd
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Extra, Job, Options, collect

__all__ = [
    "Params",
    "check_sizes",
    "check_fits",
    "jobs",
    "NotMeasured",
    "Results",
    "run",
    "OWN",
    "RANDOM",
    "neighbour_case",
    "spectrum_chart",
    "tiles_chart",
    "noise_chart",
    "noise_table",
    "random_pairs_chart",
    "glue_values",
    "diagonal_shares",
    "tiles_alt",
    "toy_findings",
    "energy_words",
    "k_reruns",
    "eps_at_kth",
    "adjacent_vs_random",
    "N_RANDOM_BASES",
    "noise_reruns",
]

NOTEBOOK = "f00_coupling_metric"
OWN, RANDOM = "J in its own basis", "J in a random matrix's basis"  # two of the tile cases
# the rule for "the neighbour's basis gives a lower m_K than a random basis", fixed first: lower
# than in every one of N_RANDOM_BASES random bases of J's shape (coupling_metric.random_bases:
# drawn as the figure's random matrix's singular vectors are distributed, seeds seed, seed + 1,
# ...); a value drawn from the random bases' own spread is below all of them with probability
# 1 / (N + 1) = 2.5%
N_RANDOM_BASES = 39


def neighbour_case(layer: int) -> str:
    """The name of the tile case "J in the next block's basis"."""
    return f"J (block {layer}) in block {layer + 1}'s basis"


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK

    model: str = param("embedded:smollm2-135m", check_model)
    revision: str = param("", text(empty=True))
    dtype: str = param("float32", choice(*DTYPES))
    prompt: str = param("What is the capital of France? The capital is", text())
    layer: int = param(10, block)
    k: int = param(72, k_values)
    noise_levels: list = param([0.0, 0.1, 0.3, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0], list_of(number(min=0.0)))
    d_toy: int = param(64, integer(min=2))
    n_random: int = param(200, integer(min=2))
    seed: int = param(0, integer(min=0))


# --------------------------------------------------------------------------- the measurement plan
def check_sizes(layer: int, k: int, n_layers: int, d_model: int, model: str) -> None:
    """The parameters against the model (named ``model``): block ``layer + 1`` must exist, K at
    most its width."""
    check_block("layer", layer, model, n_layers, last=n_layers - 2, why=", and layer + 1 must be a block too")
    check_top_k("k", k, d=d_model, model=model)


def check_fits(model, *, layer: int, k: int) -> None:
    """:func:`check_sizes` on a loaded model (the job's check, before anything is measured)."""
    check_sizes(layer, k, model.n_layers, model.d_model, model.name)


def jobs(p: Params) -> list[Job]:
    """The measurement plan: one job, the model at ``revision`` and ``dtype`` on ``prompt``, with
    no ``measure()`` part and one :class:`Extra`,
    :func:`~coupling_utils.analysis.coupling_metric.block_jacobians` of block ``layer`` (the last
    token's Jacobians of blocks ``layer`` and ``layer + 1``, and the model's facts); 2(d + 1)
    block passes per prompt. Its check refuses a ``layer`` without a next block and a ``k``
    above the width, after loading and before measuring."""
    load = {"dtype": p.dtype, **({"revision": p.revision} if p.revision else {})}
    extra = Extra("block_jacobians", cm.block_jacobians, {"layer": p.layer},
                  sources=("analysis/coupling_metric.py",), passes=cm.jacobian_passes)  # fmt: skip
    labels = {"model": p.model, **({"revision": p.revision} if p.revision else {})}
    check = functools.partial(check_fits, layer=p.layer, k=p.k)
    return [Job(p.model, [p.prompt], {}, load, labels, cache_dir("f00"), extra, check)]


# --------------------------------------------------------------------------- the results


@dataclass
class Results:
    """What the story shows, every number computed on the CPU from the stored Jacobians.

    ``facts``: the model's name, n_layers, d_model, the prompt's length T and the block, and
    ``named``: the model named as measured (:func:`~coupling_utils.analysis.model_names.model_words`);
    ``J``, ``J_next``: the last token's Jacobians of blocks ``layer`` and ``layer + 1``; ``R``:
    the random reference (J's norm, drawn from ``seed``); ``s``, ``s_next``: the SVDs of J and
    J_next; the tables and values of the sections in the order the story shows them;
    ``assumed``: whether each sentence's assumption holds (by its ``assume`` key).
    """

    facts: dict[str, Any]
    J: torch.Tensor
    J_next: torch.Tensor
    R: torch.Tensor
    s: SVD
    s_next: SVD
    spectrum: pd.DataFrame
    energy_top_k: float
    energy_random: float
    tiles: pd.DataFrame
    m_cases: pd.Series
    cases: pd.DataFrame
    by_k: pd.DataFrame
    m_forward: float
    m_backward: float
    sweep: pd.DataFrame
    noise_equivalent: float
    toy: cm.ToyProperties
    properties: pd.DataFrame
    variants: pd.DataFrame
    assumed: dict[str, bool]
    failures: pd.DataFrame
    m_random_bases: np.ndarray  # m_K of J in N_RANDOM_BASES random bases (coupling_metric.random_bases)

    @property
    def d_model(self) -> int:
        return int(self.facts["d_model"])

    def headline(self) -> str:
        """One line: the model, its depth and width, the prompt's length."""
        f = self.facts
        return (
            f"{f['named']}: {f['n_layers']} blocks, width d = {f['d_model']}; prompt of T = {f['T']} tokens"
        )

    def m_case(self, case: str) -> float:
        return float(self.m_cases[case])


def _facts(table: pd.DataFrame) -> dict[str, Any]:
    row = table.iloc[0]
    return {"name": str(row["name"]), **{c: int(row[c]) for c in ("n_layers", "d_model", "T", "layer")}}


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (measured where missing, else read) and compute what the story shows.
    Raises :class:`NotMeasured`, naming the reason, when the job has no result, and
    :class:`~coupling_utils.chapters.checks.ParameterError` when ``layer`` or ``k`` does not fit
    the model."""
    done = collect(jobs(p), options, desc=NOTEBOOK)
    if done.missing:
        raise NotMeasured(f"{NOTEBOOK} needs the job of its plan:\n{done.report()}")
    tables = done.ok[0].extra
    facts = {**_facts(tables["facts"]), "named": model_words(of_result(done.ok[0]))}
    # k may be new for stored Jacobians
    check_sizes(p.layer, p.k, facts["n_layers"], facts["d_model"], facts["name"])
    J, J_next = cm.jacobian_matrices(tables)
    return _results(p, facts, J, J_next, done.failures)


def _ks(k: int, d: int) -> list[int]:
    """The K of the by-K tables: 1, K, 3K and 5K (at most d)."""
    return sorted({1, k, min(3 * k, d), min(5 * k, d)})


def _results(p: Params, facts: dict, J: torch.Tensor, J_next: torch.Tensor, failures) -> Results:
    """Every table and value of the story, computed as the notebook always has, section by section."""
    k, layer, d = p.k, p.layer, facts["d_model"]
    R = cm.random_reference(J, seed=p.seed)  # [d_out, d_in], on J's device
    s, s_next = svd(J), svd(J_next)
    spectrum = pd.DataFrame({"rank": range(1, len(s.S) + 1), "singular value": s.S.tolist()})
    spectrum["in top K"] = spectrum["rank"] <= k
    energy_J, energy_R = cm.energy_share(s.S, k), cm.energy_share(svd(R).S, k)
    cases = {OWN: (J, J), neighbour_case(layer): (J, J_next), RANDOM: (J, R)}
    tiles, m_cases = cm.tile_cases(cases, k)
    m = m_cases.values
    case_table = pd.DataFrame({"case": m_cases.index, "m_K": m, "1 − m_K²": cm.strength(m)})
    by_k = pd.DataFrame([
        {"K": kk, "neighbour's basis": coupling(J, s_next, kk), "random basis": coupling(J, R, kk)}
        for kk in _ks(k, d)])  # fmt: skip
    by_k["gap"] = by_k["random basis"] - by_k["neighbour's basis"]
    m_forward, m_backward = coupling(J, J_next, k), coupling(J_next, J, k)
    sweep = cm.noise_sweep(J, p.noise_levels, k, seed=p.seed)
    eps = cm.noise_equivalent(sweep, float(m_cases[neighbour_case(layer)]))
    toy = cm.toy_properties(p.d_toy, k_for_width(p.d_toy, k / d), p.n_random, seed=p.seed)  # at J's K/d
    variants = cm.metric_variants(J, J_next, _ks(k, d))
    assumed = _assumptions(by_k, toy, variants)
    null = cm.random_bases(J, k, N_RANDOM_BASES, seed=p.seed, singular_values=s.S)
    return Results(
        facts, J, J_next, R, s, s_next, spectrum, energy_J, energy_R, tiles, m_cases, case_table, by_k,
        m_forward, m_backward, sweep, eps, toy, toy.table.round({"value": 6}), variants, assumed, failures,
        null,
    )  # fmt: skip


def _assumptions(by_k: pd.DataFrame, toy: cm.ToyProperties, variants: pd.DataFrame) -> dict[str, bool]:
    """Whether each assumption the prose makes holds, by its ``assume`` key."""
    random_mean, random_max = float(toy.random_pairs.m_K.mean()), float(toy.random_pairs.m_K.max())
    wide = variants.pivot_table(index="K", columns=["normalize", "orientation"], values="m_K")
    above = wide.index > 1
    trace, norm = wide.loc[above, ("trace", "ujv")], wide.loc[above, ("norm", "ujv")]
    return {
        "f00-random-basis-near-one": bool((by_k["random basis"] > 0.9).all()),
        "f00-random-near-one": abs(random_mean - 1) < 0.1 and random_max <= 2**0.5,
        "f00-trace-smaller": bool((trace <= norm).all()),
    }


# --------------------------------------------------------------------------- the charts
def spectrum_chart(r: Results, p: Params):
    """J's singular values against their rank (log scale), the top K in blue."""
    import altair as alt

    title = f"Singular values of J (block {p.layer}, last token)"
    return alt.Chart(r.spectrum).mark_point(filled=True, size=12).encode(
        x=alt.X("rank:Q", title="rank"),
        y=alt.Y("singular value:Q", scale=alt.Scale(type="log"), title="singular value"),
        color=alt.Color("in top K:N", scale=alt.Scale(range=["#bbbbbb", "#1f77b4"])),
    ).properties(width=420, height=220, title=title)  # fmt: skip


def tiles_chart(r: Results):
    """The K×K tiles of the three cases side by side, left to right in the order the caption and
    the alt text name them: J's own basis, the neighbouring block's, a random matrix's (the order
    of ``r.cases``; unsorted, the panels would run alphabetically)."""
    import altair as alt

    panels = alt.Column("case:N", title=None, sort=list(r.cases["case"]))
    return alt.Chart(r.tiles).mark_rect().encode(
        x=alt.X("col:O", title=None, axis=None), y=alt.Y("row:O", title=None, axis=None),
        color=alt.Color("value:Q", scale=alt.Scale(scheme="viridis"), title="|UᵀJV|"),
        tooltip=["case:N", "row:O", "col:O", alt.Tooltip("value:Q", format=".3g")],
    ).properties(width=150, height=150).facet(column=panels)  # fmt: skip


def noise_chart(r: Results, p: Params):
    """m_K(J, J + εR) against the noise level ε (symmetric-log axis)."""
    import altair as alt

    return alt.Chart(r.sweep).mark_line(point=True).encode(
        x=alt.X("noise:Q", scale=alt.Scale(type="symlog", constant=0.01),
                title="noise level ε (relative to ‖J‖_F)"),
        y=alt.Y("m_K:Q", title=f"m_K(J, J + εR), K = {p.k}"),
        tooltip=[alt.Tooltip("noise:Q", title="ε"), alt.Tooltip("m_K:Q", format=".3f")],
    ).properties(width=420, height=220, title="The metric under growing noise")  # fmt: skip


def noise_table(r: Results) -> pd.DataFrame:
    """The noise sweep as its table shows it: ``m_K`` of the one pair (J, J + εR) at each level and
    its ``1 − m_K²``, headed as such (the book's ``coupling`` column title, "coupling (mean 1 − m²)",
    names a mean over block pairs, which this is not)."""
    return r.sweep.rename(columns={"coupling": "1 − m_K²"})


def random_pairs_chart(r: Results, p: Params):
    """The histogram of m_K over the unrelated random pairs."""
    import altair as alt

    return alt.Chart(r.toy.random_pairs).mark_bar().encode(
        x=alt.X("m_K:Q", bin=alt.Bin(maxbins=30), title=f"m_K, K = {r.toy.k}, d = {p.d_toy}"),
        y=alt.Y("count():Q", title="pairs"),
    ).properties(width=420, height=160, title="Coupling of unrelated random matrices")  # fmt: skip


# --------------------------------------------------------------------------- glue
def adjacent_vs_random(m: float, null: np.ndarray) -> str:
    """The neighbour's ``m`` against J's ``m_K`` in random bases (``null``), by the rule fixed with
    :data:`N_RANDOM_BASES`: "lower (more coupled)" only where ``m`` is below every one of them."""
    null = np.asarray(null, dtype=float)
    n, lo, hi = len(null), float(null.min()), float(null.max())
    spread = f"their m_K {lo:.3f} to {hi:.3f}; below all {n} by chance: 1 in {n + 1}"
    if m < lo:
        return f"lower (more coupled) than in every one of {n} random bases of J's shape ({spread})"
    at_or_below = int((null <= m).sum())
    return (
        f"not lower than in every one of {n} random bases of J's shape ({at_or_below} of them give "
        f"m_K at or below it; {spread}), so not told apart from a random basis"
    )


def glue_values(p: Params, r: Results) -> dict[str, Any]:
    """Every value the prose glues, by name."""
    from IPython.display import Markdown

    m_adjacent, m_random_basis = r.m_case(neighbour_case(p.layer)), r.m_case(RANDOM)
    random_mean, random_max = float(r.toy.random_pairs.m_K.mean()), float(r.toy.random_pairs.m_K.max())
    return {
        "f00_energy_top_k": r.energy_top_k,
        "f00_energy_random": r.energy_random,
        "f00_d": r.d_model,
        "f00_k": p.k,
        "f00_energy_comparison": energy_words(r.energy_top_k, r.energy_random),
        "f00_energy_where": "in" if r.energy_top_k >= 0.5 else "outside",
        "f00_m_own": r.m_case(OWN),
        "f00_m_adjacent": m_adjacent,
        "f00_m_random_basis": m_random_basis,
        "f00_adjacent_vs_random": adjacent_vs_random(m_adjacent, r.m_random_bases),
        "f00_m_forward": r.m_forward,
        "f00_m_backward": r.m_backward,
        **_noise_values(r.sweep, r.noise_equivalent, m_adjacent),
        "f00_layer": p.layer,
        "f00_model_words": r.facts["named"],
        "f00_layer_reruns": Markdown(layer_reruns(r.facts["n_layers"], p.layer)),
        "f00_random_mean": random_mean,
        "f00_random_max": random_max,
        "f00_n_random": p.n_random,
        **_by_k_values(r.by_k),
        **toy_findings(r.toy),
        "f00_tiles_alt": tiles_alt(diagonal_shares(r.tiles), p.layer, p.k),
        "f00_k_reruns": Markdown(k_reruns(r.d_model)),
        "f00_eps_kth": eps_at_kth(r.s.S, p.k, r.d_model),
        "f00_noise_last_eps": float(r.sweep.noise.max()),
        "f00_noise_last_m": float(r.sweep.sort_values("noise").m_K.iloc[-1]),
        "f00_noise_reruns": Markdown(noise_reruns(r.sweep, r.noise_equivalent)),
    }


def eps_at_kth(S: torch.Tensor, k: int, d: int) -> float:
    """Exercise f00-ex-noise: the noise level ε at which εR's largest singular value, about
    2ε‖J‖_F/√d (R Gaussian with J's Frobenius norm, d × d), reaches J's K-th singular value
    (``S``: J's singular values, descending)."""
    return float(S[k - 1]) * d**0.5 / (2 * float(S.norm()))


def noise_reruns(sweep: pd.DataFrame, eps: float) -> str:
    """Exercise f00-ex-noise's finer sweep: six levels between the two swept levels around the
    neighbour's equivalent noise ``eps``, or, when the sweep never reaches it, levels beyond its end."""
    levels = sorted(float(e) for e in sweep.noise)
    if eps != eps:  # NaN: no swept level reaches the neighbour's value
        grid = [levels[-1] * 2**i for i in range(5)]
    else:
        lo = max([e for e in levels if e < eps], default=levels[0])
        hi = min([e for e in levels if e >= eps], default=levels[-1])
        grid = [lo + (hi - lo) * i / 5 for i in range(6)]
    values = ", ".join(f"{v:.3g}" for v in dict.fromkeys(round(v, 6) for v in grid))
    return reruns("f00", [{"noise_levels": f"[{values}]"}])


def k_reruns(d: int) -> str:
    """Exercise f00-ex-k's reruns: K = 1 and K = 50 (the paper's largest), or the width where it is
    smaller (a K above the width is refused)."""
    return reruns("f00", [{"k": 1}, {"k": min(50, d)}])


def layer_reruns(n_layers: int, layer: int) -> str:
    """Exercise f00-ex-layer's reruns: an early, a middle and a late block of this model that has
    a next block (1, n/2 and n - 3 where they exist), other than the one measured; or why none."""
    last = n_layers - 2  # the last block with a neighbour
    picks = sorted({min(max(b, 0), last) for b in (1, n_layers // 2, n_layers - 3)} - {layer})
    if not picks:
        return (f"This run's model ({n_layers} blocks) has no other block with a next block: "
                + deeper_model("f00", named=True))  # fmt: skip
    return "Rerun " + reruns("f00", [{"layer": b} for b in picks], lead="before")


def _by_k_values(by_k: pd.DataFrame) -> dict[str, Any]:
    """The by-K table's ends and path (exercise f00-ex-k): the gap at the smallest and the largest
    K, whether it moves the same way at every step of the table, and which basis's m_K spans the
    wider range over the table's K (the words follow these values)."""
    first, last = by_k.iloc[0], by_k.iloc[-1]
    steps = by_k["gap"].diff().iloc[1:]
    path = " → ".join(f"{g:.3f}" for g in by_k["gap"])
    # the random basis is one draw of R (no interval): the words say what this draw's table does
    if (steps > 0).all():
        trend = f"widens at every step of the table in this draw of the random matrix ({path})"
    elif (steps < 0).all():
        trend = f"shrinks at every step of the table in this draw of the random matrix ({path})"
    else:
        trend = f"does not move one way at every step of the table in this draw of the random matrix ({path})"
    return {
        "f00_k_first": int(first["K"]),
        "f00_k_last": int(last["K"]),
        "f00_gap_first": float(first["gap"]),
        "f00_gap_last": float(last["gap"]),
        "f00_gap_trend": trend,
        "f00_k_moves": _moves_sentence(by_k),
    }


def _moves_sentence(by_k: pd.DataFrame) -> str:
    """Both bases' m_K over the by-K table: their paths and their ranges (max − min), as values of
    this one draw of the random matrix; with no interval, neither is said to move more."""
    cols = {"neighbour's basis": "the neighbour's basis", "random basis": "the random basis"}
    span = {c: float(by_k[c].max() - by_k[c].min()) for c in cols}
    paths = "; ".join(f"in {cols[c]} from {by_k[c].iloc[0]:.3f} to {by_k[c].iloc[-1]:.3f}" for c in cols)
    (a, sa), (b, sb) = sorted(span.items(), key=lambda kv: -kv[1])
    which = (
        f"over the table's K it spans {sa:.3f} in {cols[a]} and {sb:.3f} in {cols[b]}, in this one draw "
        "of the random matrix (no interval, so neither basis is said to move more)"
        if round(sa, 3) != round(sb, 3)
        else f"over the table's K both span {sa:.3f}, in this one draw of the random matrix"
    )
    k0, k1 = int(by_k["K"].iloc[0]), int(by_k["K"].iloc[-1])
    return f"From K = {k0} to K = {k1}, m_K goes {paths}: {which}"


def _noise_values(sweep: pd.DataFrame, eps: float, m_adjacent: float) -> dict[str, Any]:
    """The noise section's glued values: the equivalent noise level and the sentences about it."""
    if eps == eps:  # NaN when no swept level reaches the neighbour's value
        text_ = f"ε ≈ {eps:.2g}"
        sentence = (
            f"The neighbouring block's basis leaves J as far from diagonal (m_K = {m_adjacent:.3f}) as the "
            f"basis of J + εR does at ε ≈ {eps:.2g}: noise of about that size relative to J's norm"
        )
    else:
        text_ = f"beyond the sweep (no ε up to {sweep.noise.max():g} reaches it: extend the sweep)"
        sentence = (
            f"None of the swept noise levels (up to ε = {sweep.noise.max():g}, "
            f"m_K = {sweep.m_K.iloc[-1]:.3f}) leaves J as far from diagonal as the neighbouring block's "
            f"basis does (m_K = {m_adjacent:.3f}): sweep further"
        )
    return {"f00_noise_equivalent": eps, "f00_noise_equivalent_text": text_, "f00_noise_sentence": sentence}


# --------------------------------------------------------------------------- findings in words
SIGN_TOL = 1e-6  # |m| or a difference of m below this is zero up to rounding (float64 toy matrices)
NEAR_ONE = 0.1  # unrelated pairs "average about 1": within this of 1 (f00-random-near-one)


def energy_words(top_k: float, random: float) -> str:
    """How J's top-K share of the squared norm compares with the random matrix's: their ratio
    when it is at least 1.05 or at most 1/1.05, else "about as concentrated"."""
    ratio = top_k / random
    if ratio >= 1.05:
        return f"{ratio:.1f} times as concentrated in the top directions as a random matrix's"
    if ratio <= 1 / 1.05:
        return f"less concentrated in the top directions than a random matrix's (ratio {ratio:.2f})"
    return f"about as concentrated in the top directions as a random matrix's (ratio {ratio:.2f})"


def diagonal_shares(tiles: pd.DataFrame) -> pd.Series:
    """Per case, the share of its tile's squared mass on the tile's diagonal (a structureless K×K
    tile puts about 1/K there), by case in the table's order."""
    sq = tiles.assign(sq=tiles["value"] ** 2)
    total = sq.groupby("case", sort=False)["sq"].sum()
    return sq[sq["row"] == sq["col"]].groupby("case", sort=False)["sq"].sum() / total


def tiles_alt(shares: pd.Series, layer: int, k: int) -> str:
    """The tiles figure's alt text, each tile read by f01's rule: a visible diagonal holds at least
    twice the chance share 1/K of the tile's squared mass (below K = 3 no reading: 2/K ≥ 0.67)."""

    def reading(case: str) -> str:
        share = float(shares[case])
        if k < 3:
            return f"{share:.0%} of its squared mass on the diagonal (at K < 3 not told from chance)"
        word = "a visible diagonal" if share >= 2 / k else "no visible diagonal"
        return f"{word} ({share:.0%} of its squared mass on the diagonal)"

    return (
        f"Three {k} by {k} heatmaps side by side: J in its own basis, exactly diagonal; J in the "
        f"neighbouring block's basis, {reading(neighbour_case(layer))}; J in a random matrix's basis, "
        f"{reading(RANDOM)}. A tile with no structure puts about {1 / k:.0%} on its diagonal."
    )


def toy_findings(toy: cm.ToyProperties) -> dict[str, str]:
    """The toy section's words, each property checked on this run's values (rows of
    :func:`~coupling_utils.analysis.coupling_metric.toy_properties`, in its order): the random
    pairs' reading, the histogram's caption and the "What matched" sentence."""
    own, flip, mean, top, shift = (float(v) for v in toy.table["value"])
    near = abs(mean - 1) < NEAR_ONE
    lo, hi = float(toy.random_pairs.m_K.min()), float(toy.random_pairs.m_K.max())
    checks = [  # (holds, said when it holds, said when it does not)
        (abs(own) < SIGN_TOL, f"the metric is {own:.1e} between a toy matrix and itself (0 up to float64 "
         "rounding)", f"m(J, J) is {own:.1e}, not 0"),
        (abs(flip) < SIGN_TOL, "invariant to the signs of singular pairs",
         f"flipping singular-pair signs moves it by {flip:.1e}"),
        (near, f"{mean:.3f} on average for unrelated random matrices",
         f"unrelated random matrices average {mean:.3f}, not within {NEAR_ONE} of 1 at this K/d"),
        (abs(shift - 2**0.5) < SIGN_TOL, f"reaches √2 ({shift:.3f} for the cyclic shift)",
         f"the cyclic shift gives {shift:.3f}, not √2"),
        (top <= 2**0.5 + SIGN_TOL, f"never exceeds it (largest random pair {top:.3f})",
         f"a random pair exceeds √2 ({top:.3f})"),
    ]  # fmt: skip
    missed = [no for ok, _, no in checks if not ok]
    if not missed:
        sentence = "this run reproduces it: " + listed(yes for _, yes, _ in checks)
    else:
        sentence = (f"this run reproduces {len(checks) - len(missed)} of its {len(checks)} properties: "
                    + "; ".join(missed))  # fmt: skip
    return {
        "f00_random_words": (
            "close to 1, because a random basis spreads J₁'s gain over the whole tile" if near
            else f"not within {NEAR_ONE} of 1 at this K/d (K = {toy.k})"
        ),
        "f00_random_caption": (
            f"between {lo:.2f} and {hi:.2f}, near 1, the value that means \"uncoupled\"" if near
            else f"between {lo:.2f} and {hi:.2f}: not near 1 at this K/d"
        ),
        "f00_properties_sentence": sentence,
    }  # fmt: skip
