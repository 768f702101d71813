"""f03's worked solutions: the numbers its exercises' solutions quote (on K, the early step,
adjacent pairs, the loss, the graphs' threshold and the learning rate), each computed from this
run so that the solution says what was measured."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import emergence
from coupling_utils.analysis.emergence_search import SEARCH_LAST_BLOCK
from coupling_utils.analysis.prose_list import listed
from coupling_utils.chapters.f03_training_emergence.plan import MAIN, PAPER_EARLY_STEP, RULES
from coupling_utils.chapters.f03_training_emergence.results import Results
from coupling_utils.chapters.f03_training_emergence.search import recipe_cost_words
from coupling_utils.chapters.f03_training_emergence.words import (
    density_peak_words,
    first_checkpoint,
    steps_words,
)
from coupling_utils.models import zoo


def exercise_k(r: Results) -> dict[str, Any]:
    """Numbers for the worked solutions on K and on the early step."""
    from IPython.display import Markdown

    p, s = r.params, r.summary
    held_summary = s[(s.panel == MAIN) & (s.model == r.showcase)]
    by_k = emergence.growth_summary(held_summary, "coupling", by="K", early_step=p.early_step).set_index("K")
    others = [int(x) for x in by_k.index if int(x) != r.k_main]
    above = [x for x in others if x > r.k_main]
    kb = max(above) if above else (min(others) if others else r.k_main)  # the K of k farthest from k_main
    levels = r.levels.set_index(["model", "K"])["first"]
    big0, main0 = float(levels.loc[(r.showcase, kb)]), float(levels.loc[(r.showcase, r.k_main)])
    out = {
        "f03_ex_kbig": kb,
        "f03_ex_kbig_peak": float(by_k.loc[kb, "peak"]),
        "f03_ex_kbig_peak_step": int(by_k.loc[kb, "peak_step"]),
        "f03_ex_kmain_peak_step": int(by_k.loc[r.k_main, "peak_step"]),
        "f03_ex_kbig_step0": big0,
        "f03_ex_kmain_step0": main0,
        "f03_ex_kbig_vs_main": Markdown(_one_draw_words(kb, big0, main0, r.first_step)),
        "f03_ex_k_expect": "lower" if kb > r.k_main else ("higher" if kb < r.k_main else "the same level"),
    }
    g128 = r.from_paper_early
    out["f03_ex_128"] = Markdown(
        f"from step {int(g128.early_step)} the ratio final / early is {g128.ratio:.2f} "
        f"(ρ = {g128.spearman:.2f}), and the rule, judged on the mean curve alone (no "
        f"intervals), gives {RULES['rises'].judge(g128.to_dict())}"
        if g128 is not None
        else f"there are too few checkpoints from step {PAPER_EARLY_STEP} on to say (the ratio needs two)"
    )
    return out


def _one_draw_words(kb: int, big0: float, main0: float, step: int) -> str:
    """Completes "K = 16 starts at 0.023 and k_main at 0.072: ...": both levels come from one set of
    weights (the first checkpoint) measured once, so the comparison holds for this draw only."""
    where = "in this draw" if int(step) == 0 else "in these weights"
    order = "lower" if big0 < main0 else ("higher" if big0 > main0 else "at the same level")
    return (
        f"both from one set of weights, {first_checkpoint(step)}, measured once (no interval), so "
        f"{where} $K$ = {kb} starts {order}"
    )


def exercise_pairs(r: Results) -> dict[str, Any]:
    """Numbers for the worked solutions on adjacent pairs, the loss and the graphs' threshold."""
    from IPython.display import Markdown

    p, d = r.params, r.depthwise
    adjacent = emergence.checkpoint_summary(d[(d.panel == MAIN) & (d.model == r.showcase)], how="adjacent")
    g_adj = emergence.growth_summary(
        adjacent[adjacent["K"] == r.k_main], "coupling", early_step=p.early_step
    ).iloc[0]
    thresholds = [0.2, p.graph_threshold, 0.6]
    dens = pd.concat(
        [emergence.edge_counts(r.all_matrices, t, by="step").assign(threshold=t) for t in thresholds]
    )
    dens = dens[dens.step >= p.early_step]
    rho_val = float(r.together.set_index("y").statistic.get("val_loss", float("nan")))
    return {
        "f03_ex_adj_peak_step": int(g_adj.peak_step),
        "f03_ex_adj_ratio": float(g_adj.ratio),
        "f03_ex_adj_heatmaps": Markdown(_heatmap_words(r, int(g_adj.peak_step))),
        "f03_ex_rho_val": rho_val,
        "f03_ex_rho_val_words": Markdown(
            f"is {rho_val:.2f} in this run (table above)"
            if np.isfinite(rho_val)
            else "cannot be computed in this run: its checkpoints carry no validation loss (hub checkpoints)"
        ),
        "f03_ex_thresholds": Markdown(
            "; ".join(
                _threshold_words(t, dens[dens.threshold == t].sort_values("step"))
                for t in sorted(set(thresholds))
            )
        ),
    }


def _heatmap_words(r: Results, peak_step: int) -> str:
    """Whether the heatmaps (drawn at the graphs' checkpoints) show the adjacent pairs' peak."""
    drawn = steps_words(sorted(r.chosen))
    if peak_step in r.chosen:
        return f"The depth-wise heatmaps, drawn at {drawn}, include that peak: they show which pairs carry it"
    return (
        f"The depth-wise heatmaps are drawn at {drawn}, not at that peak: `results.all_matrices` holds "
        f"the matrices of every checkpoint, step {peak_step} among them"
    )


def _threshold_words(threshold: float, density: pd.DataFrame) -> str:
    """One threshold's layer graphs in words, every densest checkpoint named
    (:func:`.words.density_peak_words`): "threshold 0.4: the density is highest (0.17) at steps 32, 64
    and 128, final 0.00", or "threshold 0.6: the density is 0.00 at every checkpoint"."""
    d = density.density
    final = "" if d.max() == d.min() else f", final {d.iloc[-1]:.2f}"
    return f"threshold {threshold:g}: the density {density_peak_words(density)}{final}"


def exercise_lr(r: Results) -> dict[str, Any]:
    """Numbers for the worked solution on the learning rate: the search's runs at two learning
    rates, said as what they are (their length against pythia-tiny's recipe, one seed each, the
    search's K and last block), and what training the recipe cost (:func:`.search.recipe_cost_words`)."""
    from IPython.display import Markdown

    tiny = zoo.training_spec("pythia-tiny")
    cost = recipe_cost_words(r, tiny.to_dict())
    estimate = f"the zoo's estimate for pythia-tiny's build: {zoo.REGISTRY['pythia-tiny'].expected_cost}"
    return {
        "f03_ex_lr": Markdown(_lr_words(r, tiny.steps)),
        "f03_ex_lr_cost": Markdown(f"{cost}; {estimate}" if cost else estimate),
    }


def _lr_words(r: Results, recipe_steps: int) -> str:
    """The searched runs that differ in learning rate only, with what they can tell of a run of
    ``recipe_steps`` steps at a third of the learning rate: values of single runs, no direction."""
    table = r.search_table
    lower = table[table.lr != table.lr.max()]
    if lower.empty:
        return "The search has no run at another learning rate."
    base = table[
        (table.lr == table.lr.max()) & table.config.isin(lower.config.str.replace(r"-lr.*", "", regex=True))
    ]
    runs = pd.concat([lower, base])
    steps = sorted(int(x) for x in runs.steps.unique())
    seeds = sorted({int(r.search.provenance[c]["spec"]["seed"]) for c in runs.config})
    length = (
        f"runs of {listed([f'{x:,}' for x in steps])} steps, not the recipe's {recipe_steps:,}"
        if steps != [recipe_steps]
        else f"runs of the recipe's {recipe_steps:,} steps"
    )
    values = "; ".join(
        f"{x.config} (lr {x.lr:g}) peaks at step {int(x.peak_step)} and ends at {x.final:.3f}"
        for x in runs.itertuples()
    )
    return (
        f"The search answers only in part: its runs at these learning rates are {length}, one run each "
        f"(seed {listed(seeds)}), measured at K = d/16 with the last block alone "
        f'(`last_block = "{SEARCH_LAST_BLOCK}"`): {values}. These are values of single runs with no '
        "interval: they say what one seed did in those runs, not which way a smaller learning rate moves "
        "the peak or the end of coupling, in those runs or in pythia-tiny's recipe"
    )
