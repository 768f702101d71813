"""f01's "What matched" sentences that interpret a number (:func:`finding_words`), each worded
from that number or verdict, so that none asserts what the run did not show, at any profile; a
mechanism the chapter does not measure is said to be one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import tile_grid
from coupling_utils.analysis.depth_and_tokens import WEIGHTS, TwinMeasurement
from coupling_utils.analysis.model_names import measured, model_words
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.verdicts import MIN_UNITS, Interval
from coupling_utils.chapters.f01_depth_and_tokens.plan import TILES_TRAINED, TILES_TWIN, Results
from coupling_utils.chapters.reruns import deeper_model, reruns

PAPER_MODEL = "meta-llama/Meta-Llama-3-8B"  # the model of the paper's tile figure (project page)
TWIN_CHANCE = 0.05  # the per-model coupling under which a twin counts as uncoupled (f01-twin-near-chance)


def finding_words(r: Results, status: pd.DataFrame) -> dict[str, Any]:
    """The "What matched" sentences that interpret a number, each worded from that number or verdict
    (so none of them asserts what this run did not show): the twin's level, the tiles, where the
    drawn model differs from the paper's, token-wise and context coupling."""
    from IPython.display import Markdown

    n, n_k = len(r.depth), len(tile_grid.nested_tile_ks(r.params.tile_k))
    return {
        "f01_twin_level": twin_level_words(float(r.per_model_head["random init"])),
        "f01_tiles_words": tiles_words(str(status.iloc[n].agree), r.tile_values),
        "f01_level_reasons": Markdown(
            level_reasons(r.params.model, named_model(r.main), r.main.n_layers, r.main.d_model)
        ),
        "f01_tokens_words": Markdown(tokens_words(r.token_judged, r.first_token)),
        "f01_context_words": Markdown(context_words(r.token_judged)),
        "f01_token_layer_reruns": Markdown(token_layer_reruns(r.main.n_layers, r.params.token_layer)),
        "f01_window_reruns": Markdown(
            tile_window_reruns(r.main.n_layers, len(r.params.tile_layers), r.params.last_block)
        ),
        "f01_adjacent_thirds": adjacent_thirds(r.main.depthwise, max(r.params.k)),
        "f01_adjacent_models": adjacent_models(r.twins.results, max(r.params.k)),
        "f01_others_by_k": Markdown(k_gap_words(r.per_model, r.params.model, r.depth)),
        "f01_diag_interval_note": Markdown(tile_interval_note(r.tile_values.get("diagonal_trained"), n_k)),
    }


def twin_level_words(twin: float) -> str:
    """Whether the twin's per-model coupling 1 − m² is within :data:`TWIN_CHANCE` of 0 (unrelated
    matrices give m near 1), as the paper's untrained model shows no coupling off the diagonal."""
    if abs(twin) < TWIN_CHANCE:
        return (f"The twin stays within {TWIN_CHANCE} of 0, uncoupled as the paper's untrained model is "
                "off the diagonal")  # fmt: skip
    return (f"The twin is not within {TWIN_CHANCE} of 0, unlike the paper's untrained model, which "
            "shows no coupling off the diagonal")  # fmt: skip


def tiles_words(verdict: str, values: Mapping[str, Interval] | None = None) -> str:
    """What the tiles' verdict says about the paper's figure (a diagonal in every tile); for a
    "partly", why not a yes, from ``values`` (``diagonal_trained`` and ``diagonal_twin``, the
    rule's intervals): an estimate short of the rule's threshold, or else an interval that
    reaches past it (or no interval at all)."""
    if verdict != "partly":
        return {
            "yes": "The top singular directions are shared across depth, as in the paper's figure",
            "no": "This run's tiles do not show the shared top directions of the paper's figure",
        }[verdict]
    start = "The trained model's tiles are more diagonal than the twin's"
    trained, twin = (values or {}).get("diagonal_trained"), (values or {}).get("diagonal_twin")
    if trained is None or twin is None:
        return f"{start}, but not in every tile as in the paper's figure"
    short = []
    if trained.estimate < TILES_TRAINED:
        short.append(f"at the worst K a visible diagonal shows in {trained.estimate:.0%} of the trained "
                     f"tiles, short of the {TILES_TRAINED:.0%} a yes needs")  # fmt: skip
    if twin.estimate > TILES_TWIN:
        short.append(f"in {twin.estimate:.0%} of the twin's, above the {TILES_TWIN:.0%} a yes allows")
    if short:
        return f"{start}, but {'; and '.join(short)} (the paper's figure shows a diagonal in every tile)"
    meet = (
        f"{start}, and the estimates meet the rule's yes (a visible diagonal in at least "
        f"{TILES_TRAINED:.0%} of the trained tiles and at most {TILES_TWIN:.0%} of the twin's)"
    )
    missing = next((iv for iv in (trained, twin) if not iv.resampled), None)
    if missing is not None:
        return f"{meet}, but a yes needs their 95% intervals, and there is {missing.words()}"
    wide = [f"the trained share's reaches down to {trained.low:.0%}"] if trained.low < TILES_TRAINED else []
    wide += [f"the twin's reaches up to {twin.high:.0%}"] if twin.high > TILES_TWIN else []
    return f"{meet}, but not over their whole 95% intervals: {' and '.join(wide)}"


def named_model(pair: TwinMeasurement) -> str:
    """The trained model of a pair named as measured (reference, revision and commit, source
    format, dtype used), from its measurement's provenance."""
    return model_words(measured(pair.provenance["trained"]))


def level_reasons(model: str, named: str, n_layers: int, d_model: int) -> str:
    """The bullet on how the drawn model differs from the paper's Llama-3-8B (nothing measured:
    the differences, named; none of them is said to explain a number). ``named``: the model as
    measured (:func:`named_model`)."""
    if model == PAPER_MODEL:
        return (
            f"**This run's model is the paper's**, {named} ({n_layers} blocks, width {d_model}) (the "
            "authors' code loads it 4-bit); prompts and token choice may still differ from theirs."
        )
    return (
        f"**How this run's model differs from the paper's Llama-3-8B.** This run's model is {named} "
        f"({n_layers} blocks, width {d_model}); the paper's example has 8B parameters. What size, or "
        "weights dequantised from a quantised file, do to the level is not measured here (the "
        "authors also measured 4-bit models). Prompts and token choice may matter too. The `paper` "
        "profile (Llama-3-8B, layers 9–16) is the direct check."
    )


def spread_words(d: Interval, spec: str = ".3f") -> str:
    """A difference's interval in words: "95% interval over prompts 0.010 to 0.025" (", which
    includes 0" where it does), or that one prompt gave none."""
    if not d.resampled:
        if d.units is not None and d.units > 1:
            return f"from {d.units} prompts, too few for a 95% interval (it needs at least {MIN_UNITS})"
        return "from one prompt, which gives no interval"
    return f"95% interval over prompts {d.low:{spec}} to {d.high:{spec}}" + (
        ", which includes 0" if interval_side(d) == "neither" else ""
    )


def interval_side(d: Interval) -> str:
    """Which side of 0 a difference lies on over its whole interval: "above", "below" or "neither"."""
    return "above" if d.low > 0 else "below" if d.high < 0 else "neither"


def tokens_words(tok: Mapping[str, Any], first_token: tuple[float, float]) -> str:
    """The token-wise bullet's reading, from the trained model against its twin (``self_excess``,
    trained − twin, with its interval: a reading only where the interval lies on one side of 0)
    and the first token's pairs and the others' on the drawn prompt (values only: one prompt gives no
    interval)."""
    d = tok["self_excess"]
    diff = f"trained − twin {d.estimate:+.3f}, {spread_words(d)}"
    reading = {
        "above": "so in this run token-wise coupling is higher after training than at random "
        f"initialisation ({diff}).",
        "below": f"so in this run token-wise coupling is not a sign of training ({diff}; a likely "
        "reason, not measured here: at random initialisation attention is close to uniform, so every "
        "token's Jacobian is nearly the same matrix).",
        "neither": f"a difference this run does not tell from none ({diff}).",
    }[interval_side(d)]
    first, other = first_token
    return (
        f"{reading} On the drawn prompt, pairs involving the first token average {first:.3f} and pairs "
        f"of other tokens {other:.3f} (one prompt: no interval, so no comparison is judged)."
    )


def context_words(tok: Mapping[str, Any]) -> str:
    """The context bullet's second sentence: the twin's context coupling against the trained
    model's, read from their difference's interval (``context_excess``, trained − twin)."""
    twin, d = tok["context_twin"], tok["context_excess"]
    diff = f"trained − twin {d.estimate:+.3f}, {spread_words(d)}"
    if interval_side(d) == "below":
        return (
            f"The twin's context coupling is higher ({twin:.3f}; {diff}); a likely reason, not measured "
            "here: with near-uniform attention the context Jacobians of one output token are nearly one "
            "matrix up to scale."
        )
    if interval_side(d) == "above":
        return f"The twin's context coupling, {twin:.3f}, is lower than the trained model's ({diff})."
    return (
        f"The twin's context coupling is {twin:.3f}; this run does not tell it from the trained "
        f"model's ({diff})."
    )


def token_layer_reruns(n_layers: int, token_layer: int) -> str:
    """Exercise f01-ex-token-layer's reruns: an early and a late block of this model (about a tenth
    and nine tenths of its depth), other than ``token_layer``; or why there are none."""
    picks = sorted({min(max(round(n_layers * f), 0), n_layers - 1) for f in (0.1, 0.9)} - {token_layer})
    if not picks:
        return f"This run's model ({n_layers} blocks) has no other block to try: " + deeper_model("f01")
    return "Rerun with " + reruns("f01", [{"token_layer": b} for b in picks], lead="none")


def tile_window_reruns(n_layers: int, width: int, last_block: str) -> str:
    """Exercise f01-ex-window's reruns: the tile window (``width`` blocks) moved to the first and to
    the last blocks that can be measured (the last block is left out under ``last_block``
    "excluded"); or why there is nothing to move."""
    last = n_layers - 2 if last_block == "excluded" else n_layers - 1
    if width >= last + 1:
        return (f"this run's tile window already covers every block that can be measured ({last + 1}): "
                + deeper_model("f01"))  # fmt: skip
    first, final = list(range(width)), list(range(last + 1 - width, last + 1))
    return reruns("f01", [{"tile_layers": first}, {"tile_layers": final}], then=True)


def adjacent_thirds(depthwise: pd.DataFrame, k: int) -> str:
    """Exercise f01-ex-window's answer from this run: the trained model's mean coupling 1 − m² of
    neighbouring measured blocks (both orders, all prompts) at K = ``k``, in the early, middle and
    late third of the neighbouring pairs (values: the highest is named as an estimate, with no interval
    to tell the thirds apart); or why there are too few pairs to split."""
    d = depthwise[(depthwise["weights"] == "trained") & (depthwise["K"] == k)]
    blocks = sorted(set(d["layer_i"]) | set(d["layer_j"]))
    if len(blocks) < 4:
        return (f"this run measured {len(blocks)} blocks, too few neighbouring pairs to compare thirds of "
                "the network")  # fmt: skip
    pos = {b: i for i, b in enumerate(blocks)}
    i, j = d["layer_i"].map(pos), d["layer_j"].map(pos)
    near = d[(i - j).abs() == 1]
    start = np.minimum(i, j)[near.index]  # the pair's first block, as a position
    thirds = np.array_split(np.arange(len(blocks) - 1), 3)
    means = [float(near["coupling"][start.isin(t)].mean()) for t in thirds]
    parts = [
        f"{m:.3f} in the {name} third (the pairs of blocks {blocks[t[0]]} to {blocks[t[-1] + 1]})"
        for m, name, t in zip(means, ("early", "middle", "late"), thirds)
    ]
    best = ("early", "middle", "late")[int(np.argmax(means))]
    return (f"by thirds of the network the trained model's neighbouring blocks average {', '.join(parts)} "
            f"at K = {k}: the {best} third's is the highest estimate (no interval is drawn for the thirds, "
            "so they are not told apart)")  # fmt: skip


def adjacent_models(results: Mapping[str, TwinMeasurement], k: int) -> str:
    """Exercise f01-ex-adjacent's answer for every model and weights of this run: the per-model
    coupling at K = ``k`` over all pairs of different blocks and over neighbours only (what a
    rerun with ``how="adjacent"`` reads, from the same measurements), the change, and which rises
    most (estimates: no interval is drawn for these changes)."""
    from coupling_utils.measurement import coupling_summary

    changes, parts = {}, []
    for name, pair in results.items():
        said = []
        for w in WEIGHTS:
            d = pair.depthwise[pair.depthwise["weights"] == w]
            everywhere, near = (coupling_summary(d, how=how, k=k) for how in ("offdiag", "adjacent"))
            change = near - everywhere if abs(near - everywhere) > 1e-12 else 0.0  # not rounding's bits
            changes[f"{name}'s {'twin' if w != 'trained' else 'trained weights'}"] = change
            said.append(f"{'its twin' if w != 'trained' else 'trained'} {everywhere:#.3g} to {near:#.3g} "
                        f"({change:+.2g})")  # fmt: skip
        parts.append(f"{name}, {' and '.join(said)}")
    if max(len(set(p.depthwise["layer_i"]) | set(p.depthwise["layer_j"])) for p in results.values()) < 3:
        return "Every model's measured blocks are neighbours, so the rerun's per-model table is this run's"
    top = max(changes, key=changes.get)
    most = f"the largest rise is {top} ({changes[top]:+.2g})" if changes[top] > 0 else "none rises"
    return (f"At K = {k}, from all pairs of blocks to neighbours only, the per-model coupling goes: "
            f"{'; '.join(parts)}. So {most} (estimates: no interval is drawn for them)")  # fmt: skip


def k_gap_words(per_model: pd.DataFrame, drawn: str, depth: Mapping[str, Mapping]) -> str:
    """For each model other than ``drawn`` whose trained − twin gap (``per_model``) changes sign
    across the K measured: the K at which the depth rule's smallest gap falls (``depth``), and the
    gap at every other K beside the drawn model's at the same K, so a reader sees the verdict
    depend on K; "" where no such model was measured."""
    gaps = per_model.pivot_table(index="K", columns="model", values="trained − random")
    out = []
    for name, v in depth.items():
        g = gaps[name].dropna() if name != drawn else pd.Series(dtype=float)
        if g.empty or not g.min() < 0 < g.max():
            continue
        at, rest = int(v["excess_k"]), g.drop(int(v["excess_k"]))
        mine = gaps[drawn].reindex(rest.index)
        out.append(
            f"The sign of {name}'s trained − twin gap depends on K: {g[at]:+.3f} at K = {at} (the smallest, "
            f"which the rule reads), {listed(f'{x:+.3f} at K = {K}' for K, x in rest.items())} (the "
            f"drawn model's at those K: {listed(f'{x:+.3f}' for x in mine)})."
        )
    return " ".join(out)


def tile_interval_note(trained: Interval | None, n_k: int) -> str:
    """Why the trained share's estimate is its interval's upper end, where it is: the interval is a
    percentile bootstrap over prompts, and the share the smallest over ``n_k`` values of K, which a
    resample's shifted prompt means seldom raise; "" where the estimate lies below the upper end."""
    if trained is None or not trained.resampled or trained.estimate < trained.high:
        return ""
    return (
        f"The trained share's estimate, {trained.estimate:.0%}, is also its interval's upper end: the "
        "interval is a percentile bootstrap over prompts, and the share is the smallest over the "
        f"{n_k} values of K, so resampled prompts, whose means move tiles near the 2/K line to one "
        "side or the other at some K, seldom give more (at most "
        f"{(1 - trained.level) / 2:.1%} of the resamples do)."
    )


def distance_words(rho: Interval | None, excess: Interval) -> dict[str, str]:
    """How the trained model's coupling varies with the distance between blocks, for the results
    (``f01_distance_trend``) and exercise f01-ex-adjacent's answer (``f01_adjacent_answer``).

    ``rho``: Spearman's ρ of coupling with the distance (None with every pair at one distance: two
    blocks have no trend); ``excess``: the neighbours' coupling minus the mean over all pairs. The
    words follow their intervals over prompts: coupling "falls" (or "rises") only where ρ's whole
    interval lies below (above) 0, and the neighbours are more (less) coupled than all pairs only
    where the excess's does."""
    gap = f"neighbours − all pairs {excess.estimate:+.3f}, {spread_words(excess)}"
    side = interval_side(excess)
    if rho is None:
        return {
            "f01_distance_trend": "all the blocks measured are neighbours, so coupling shows no trend with "
            "the distance between blocks (no Spearman ρ)",
            "f01_adjacent_answer": "Neither in this run: all its blocks are neighbours, so averaging over "
            "neighbours only takes the same pairs",
        }
    word = "falls" if rho.high < 0 else "rises" if rho.low > 0 else "shows no clear trend"
    trend = (f"coupling {word} with the distance between blocks (Spearman ρ = {rho.estimate:.2f}, "
             f"{spread_words(rho, '.2f')})")  # fmt: skip
    if side == "above" and word == "falls":
        return {
            "f01_distance_trend": f"{trend}, so the distant pairs pull the mean over all pairs down ({gap})",
            "f01_adjacent_answer": f"Up for the drawn model's trained weights: {trend}, so averaging over "
            "neighbours only "
            f"leaves out the weakly coupled distant pairs ({gap}; a likely reason, not measured here: each "
            "block refines the representation the previous one wrote, in the same directions of the "
            "residual stream)",
        }
    neighbours = {"above": "more coupled than", "below": "less coupled than",
                  "neither": "neither clearly more nor less coupled than"}[side]  # fmt: skip
    answer = {"above": "Up", "below": "Down", "neither": "Neither clearly up nor down"}[side]
    said = f"the neighbours are {neighbours} the mean over all pairs ({gap})"
    return {
        "f01_distance_trend": f"{trend}, and {said}",
        "f01_adjacent_answer": f"{answer} for the drawn model's trained weights: {trend}, and {said}",
    }
