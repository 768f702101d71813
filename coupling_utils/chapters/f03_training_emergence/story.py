"""f03's status rows judged by the rules fixed before any number (:func:`claims`) and the
values it glues (:func:`glue_values`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis.emergence_search import SEARCH_LAST_BLOCK
from coupling_utils.analysis.straightness import STRAIGHTER, short_of_straighter, straighter_text
from coupling_utils.analysis.verdicts import claim, verdict_word
from coupling_utils.chapters.f03_training_emergence.exercises import exercise_k, exercise_lr, exercise_pairs
from coupling_utils.chapters.f03_training_emergence.plan import (
    MAIN,
    PAPER_EARLY_STEP,
    RULES,
    TOGETHER_PARTS,
    quiz_prompts,
)
from coupling_utils.chapters.f03_training_emergence.results import Results
from coupling_utils.chapters.f03_training_emergence.search import search_values
from coupling_utils.chapters.f03_training_emergence.words import (
    at_first_checkpoint,
    density_words,
    first_checkpoint,
    interval_of,
    peak_words,
    plateau_window_words,
    reconstruction_words,
    rises_words,
    shortfall,
    together_words,
    turn_words,
    versus_first,
    windows_words,
    with_interval,
)

# the book's one straightness rule, in f03's terms: the windows are resampled, the first
# checkpoint stands in for the twin
STRAIGHT_RULE = straighter_text(unit=f"the {MAIN}", twin="the first checkpoint's")

CLAIMS = {
    "rises": "coupling rises progressively over training (shape of the curve)",
    "monotone": "the rise is nearly monotonic",
    "dense": "almost no coupling early, dense at the end (layer graphs)",
    "together": "coupling develops together with trajectory linearity (the trends over every checkpoint)",
    "straight": "trajectories are straighter at the last checkpoint than at the first and than a random walk "
    "(the end points only)",
    "expo": "layer-wise exponential growth develops (1 − R² of our log-linear reconstruction of expodistance "
    "falls)",
}
"""The status rows' claims, by key. Claim 3's linearity has two rows that judge different things:
"together" the trends over every checkpoint (and their rank correlation), "straight" the last
checkpoint against the first and a random walk (the book's one straightness rule)."""


def _verdict(r: Results, key: str):
    """The status row's verdict of the claim ``key`` (:data:`CLAIMS`), as the prose quotes it."""
    return verdict_word(next(row for row in claims(r) if row["claim"] == CLAIMS[key]))


CONVENTION_ROWS = {
    "rises": "rise",
    "monotone": "monotony",
    "dense": "layer-graph",
    "together": "coupling-with-linearity",
}
"""The rows whose verdict reads coupling (so depends on what the last block is), in words."""


def _convention(r: Results, row: str) -> str:
    """The row's note on the last block: the convention its verdict uses, and the others'."""
    others = {c: verdicts[row] for c, verdicts in r.other_conventions.items()}
    return lb.convention_note(r.params.last_block, r.coupling_verdicts[row], others)


def _coupling_rows(r: Results) -> list[dict]:
    """Claim 1 on our run and on the paper's own digitised curves."""
    p, first, pg, k = r.params, r.first, r.paper_growth, r.k_main
    return [
        claim(
            CLAIMS["rises"],
            paper=f"≈{pg.ratio.mean():.1f}× from step 128 to 143000 (Fig. 1b)",
            rule=RULES["rises"],
            values=r.rise_values,
            ours=f"{first.ratio:.2f}× from step {int(first.early_step)} (ρ = {first.spearman:.2f}, peak at "
            f"step {int(first.peak_step)}, position {first.peak_position:.2f})"
            + (f"; {_from_paper_early(r, '×')}" if _from_paper_early(r) else ""),
            note=f"{r.showcase}, {MAIN}, steps {int(first.early_step)}→{int(first.final_step)}, "
            f"K = {k}, {p.how} mean of 1 − m²; {_convention(r, 'rises')}",
        ),
        claim(
            "the paper's own Fig. 1b curves rise progressively (digitised points)",
            paper="Fig. 1b",
            rule=RULES["rises"],
            values=pg.set_index("model_id").min().to_dict(),
            ours=f"ratio {_floor(pg.ratio.min())}, ρ ≥ {_floor(pg.spearman.min())}, "
            f"peak position ≥ {_floor(pg.peak_position.min())}",
            note="the weaker of the two models on each descriptor",
            kind="replot",
        ),
        claim(
            CLAIMS["monotone"],
            paper="nearly monotonic for both models",
            rule=RULES["monotone"],
            values=r.rise_values,
            ours=f"ρ = {first.spearman:.2f}, largest fall {first.max_drop:.0%} of the range",
            note=f"{rises_words(first.rises)}; {_convention(r, 'monotone')}",
        ),
    ]


def _from_paper_early(r: Results, times: str = "") -> str | None:
    """The headline curve from the paper's early checkpoint on, for a ratio set beside Fig. 1b's
    (taken from step 128): "from step 128, where the paper's ratio starts: 0.59× (ρ = -0.90)"; None
    when ``early_step`` is already that step."""
    g = r.from_paper_early
    if int(r.first.early_step) == PAPER_EARLY_STEP:
        return None
    if g is None:
        return (
            f"too few checkpoints from step {PAPER_EARLY_STEP} on for a ratio from where the paper's starts"
        )
    return (
        f"from step {int(g.early_step)}, where the paper's ratio starts: {g.ratio:.2f}{times} "
        f"(ρ = {g.spearman:.2f})"
    )


def _floor(x: float, digits: int = 3) -> str:
    """``x`` rounded down to ``digits`` decimals: a bound written "≥ x" stays true (0.979 is not ≥ 0.98)."""
    return f"{math.floor(x * 10**digits) / 10**digits:.{digits}f}"


def _together_ours(v: dict) -> str:
    c, lss, both = (float(getattr(v[k], "estimate", v[k])) for k in ("coupling_step", "lss_step", "rho_lss"))
    return f"ρ with the step: coupling {c:.2f}, LSS {lss:.2f}; ρ(coupling, LSS) = {both:.2f}"


def _failed_words(values: dict, failed: list[str]) -> str:
    """Which parts of claim 3 did not hold over their intervals, and why, in words: "not held:
    “coupling rises with the step” (ρ 0.11, needs ρ ≥ 0.3); …"."""
    if not failed:
        return "every part holds over its interval"
    rhos = {part: values[TOGETHER_PARTS[part].split()[0]] for part in failed}
    return "not held: " + "; ".join(
        f"“{part}” (ρ {float(getattr(rho, 'estimate', rho)):.2f}, {shortfall(values, part)})"
        for part, rho in rhos.items()
    )


def _straight_ours(r: Results) -> str:
    s = r.straight
    return (
        f"LSS {s['lss_twin']:.3f} (step {s['first_step']}) → {s['lss']:.3f} (step {s['last_step']}); "
        f"between them {_lss_turns(r, s['first_step'])}; random walk of {s['n_steps']} steps "
        f"{s['walk']:.3f}; ρ with the step {r.lss_row.spearman:.2f}"
    )


def _curve(r: Results, quantity: str, start: int) -> pd.Series:
    """The showcase run's trajectory measure per checkpoint (mean over the windows) from ``start`` on."""
    curve = r.tsum.loc[r.showcase][quantity]
    return curve[curve.index >= start]


def _lss_turns(r: Results, start: int) -> str:
    """Where the line-shape score turns from ``start`` on (:func:`.words.turn_words`), each direction
    with what it means: "lowest (1.162) at step 64, then higher (less straight) at each of the 11 later
    checkpoints than at the one before"."""
    return turn_words(_curve(r, "lss", start), {"higher": "less straight", "lower": "straighter"})


def _reconstructions(r: Results) -> str:
    """:func:`.words.reconstruction_words` of the run's other trajectory measures, each with its curve
    from ``early_step`` on, so the words say where it turns, not only its ends."""
    curves = {q: v | {"curve": _curve(r, q, r.params.early_step)} for q, v in r.other_reconstructions.items()}
    return reconstruction_words(curves)


def claims(r: Results) -> list[dict]:
    """The status rows, each judged by its rule in :data:`RULES`: the rise (ours, the paper's
    curves), its monotony, the graphs, linearity, and expodistance when measured. Pass them to
    ``pipeline.status.report``."""
    p, exp = r.params, r.exp_row
    rows = _coupling_rows(r) + [
        claim(
            CLAIMS["dense"],
            paper="step 1: almost none; step 143000: dense (Fig. 1c–e)",
            rule=RULES["dense"],
            values=r.dense_judged,
            ours=f"edge density {_density_words(r)}",
            note=f"threshold 1 − m² > {p.graph_threshold}, K = {r.k_main}, "
            f"every checkpoint from step {p.early_step}; {_convention(r, 'dense')}",
        ),
        claim(
            CLAIMS["together"],
            paper="coupling emerges with increased linearity",
            rule=RULES["together"],
            values=r.together_values,
            ours=_together_ours(r.together_values),
            note=f"the trends, not the end points: Spearman ρ over the {len(r.together_in)} checkpoints "
            f"from step {p.early_step} on "
            f"(LSS: lower = straighter); {_failed_words(r.together_values, r.together_failed)}; "
            f"{_convention(r, 'together')}",
        ),
        claim(
            CLAIMS["straight"],
            paper="increased linearity during training",
            rule=STRAIGHTER,
            values=r.straight,
            ours=_straight_ours(r),
            note="the end points, not the path between (the row on developing together judges the trends); "
            f"mean over tokens and {MAIN}; the book's one straightness rule (as f05's)",
        ),
    ]
    if exp is not None:
        rows.append(
            claim(
                CLAIMS["expo"],
                paper="layer-wise exponential growth develops (formula not published)",
                rule=RULES["falls"],
                values=r.exp_judged,
                ours=f"1 − R² {exp.early:.3f} → {exp.final:.3f} (ρ = {exp.spearman:.2f})",
                note="the rule reads 1 − R² of the log-linear fit of step sizes over all blocks only; "
                + _reconstructions(r),
            )
        )
    return rows


# --------------------------------------------------------------------------- glued values
def _plateau_values(r: Results) -> dict[str, Any]:
    """The plateau sentence (and the numbers in it) for a run with loss records."""
    from IPython.display import Markdown

    p, plateau = r.params, r.plateau
    if plateau is None:
        return {
            "f03_plateau_sentence": Markdown(
                "These are hub checkpoints without loss records here (see the "
                "Pythia paper for their losses), so the plateau condition is not "
                "checked."
            )
        }
    flat = RULES["flat"].judge(plateau)
    own = r.losses[r.losses.model == r.showcase].set_index("step").val_loss
    return {
        "f03_val_loss": plateau["best_loss"],
        "f03_plateau_drop": plateau["relative_drop"],
        "f03_plateau_from": plateau["from_step"],
        "f03_plateau_sentence": Markdown(
            f"Over the last {p.plateau_fraction:.0%} of training, {plateau_window_words(plateau, own)}: "
            + {
                "yes": "by the rule above, it has **flattened**.",
                "partly": "by the rule above it has **nearly flattened** (between the two thresholds).",
                "no": "by the rule above it has **not flattened**: this run was stopped mid-descent.",
            }[flat]
        ),
    }


def _coupling_values(r: Results) -> dict[str, Any]:
    """The headline curve's shape and its verdict."""
    from IPython.display import Markdown

    first = r.first
    out: dict[str, Any] = {}
    for name in ("ratio", "spearman", "peak", "early", "final", "peak_position", "final_vs_peak"):
        out[f"f03_{name}"] = float(first[name])
    for name in ("early_step", "final_step", "peak_step"):
        out[f"f03_{name}"] = int(first[name])
    for name in ("ratio", "spearman", "peak_position"):
        iv = r.rise_values[name]
        out[f"f03_{name}_interval"] = iv.words(".2f")
    out["f03_n_windows"] = int(r.per_prompt.prompt.nunique())
    out["f03_k"] = r.k_main
    out["f03_step0"] = float(r.step0)
    out["f03_last_block"] = Markdown(f'`last_block = "{r.params.last_block}"`')
    out["f03_last_block_words"] = lb.CONVENTION_WORDS[r.params.last_block]
    out["f03_convention_sentence"] = Markdown(
        lb.changed_verdicts(r.coupling_verdicts, r.other_conventions, CONVENTION_ROWS)
    )
    out["f03_block_sentence"] = Markdown(_block_sentence(r))
    out["f03_rises_verdict"] = _verdict(r, "rises")
    out["f03_shape_sentence"] = Markdown(f"The curve {peak_words(first)}.")
    out["f03_showcase"] = r.showcase
    out["f03_showcase_named"] = r.named[r.showcase]
    out["f03_windows_words"] = windows_words(next(run for run in r.runs if run.model == r.showcase))
    out["f03_first_words"] = at_first_checkpoint(r.first_step)
    out["f03_first_name"] = first_checkpoint(r.first_step)
    return out


def _block_sentence(r: Results) -> str:
    """What the stored search (measured with the last block alone) says of this very run, beside
    this chapter's verdicts under both maps."""
    stored = r.search_table[r.search_table.this_chapter]
    if stored.empty or r.params.last_block == SEARCH_LAST_BLOCK:
        return ""
    mine, verdict = f'`last_block = "{r.params.last_block}"`', r.coupling_verdicts["rises"]
    here = f"({mine}, with intervals) it gets {verdict}"
    alone = r.other_conventions.get(SEARCH_LAST_BLOCK, {}).get("rises")
    if alone is not None:  # the same run measured the last block alone too
        both = f"{verdict} with {mine} and {alone} with the last block alone (one run measures both)"
        here = f"with intervals it gets {both}"
    return (
        f"The search below stored this very run with the last block alone "
        f'(`last_block = "{SEARCH_LAST_BLOCK}"`, '
        f"K = d/16): judged on its mean curve by the same rise rule (no intervals: the search kept no "
        f"per-window values), it gets {stored['rises progressively'].iloc[0]}; measured here {here}."
    )


def _wide_sentence(r: Results) -> str:
    """The widest searched run at its largest K, beside this run's largest K at the same K/d: the
    two values with the last-block map each was measured with, and no comparison (one set of
    weights each, measured once: no interval)."""
    big, curves = r.big, r.search.curves
    wide = curves[curves.d_model == curves.d_model.max()]
    wide = wide[(wide["K"] == wide.K.max()) & (wide.config == wide.config.iloc[0])].sort_values("step")
    w_K, w_d = int(wide.K.iloc[0]), int(wide.d_model.iloc[0])
    w_low = float(wide.coupling.min())
    sentence = (
        f"In the search below, the widest run ({wide.config.iloc[0]}, width {w_d}, "
        f'`last_block = "{SEARCH_LAST_BLOCK}"`) at K = {w_K} (K/d = {w_K / w_d:.2f}) starts at '
        f"{wide.coupling.iloc[0]:.3f} at step 0 with {wide.share_m_above_1.iloc[0]:.0%} of its layer pairs "
        f"at m > 1, its lowest point is {w_low:.3f} ({'below' if w_low < 0 else 'above'} zero), and at its "
        f"worst checkpoint {wide.share_m_above_1.max():.0%} of the pairs have m > 1."
    )
    if np.isfinite(big.d_model) and int(big.d_model) != w_d and np.isclose(big.K_over_d, w_K / w_d):
        maps = (
            "the same last-block map"
            if r.params.last_block == SEARCH_LAST_BLOCK
            else "different last-block maps"
        )
        sentence += (
            f" At the same K/d this run's K = {int(big.K)} (width {int(big.d_model)}, "
            f'`last_block = "{r.params.last_block}"`) starts at {big.first:.3f}. Each of the two values is '
            f"one set of weights measured once (no interval), under {maps}."
        )
    return sentence


def _level_values(r: Results) -> dict[str, Any]:
    """The level of 1 − m² at the largest K, against the width."""
    from IPython.display import Markdown

    big = r.big
    return {
        "f03_kbig": int(big.K),
        "f03_kbig_ratio": float(big.K_over_d),
        "f03_kbig_first": float(big.first),
        "f03_kbig_share_first": float(big.share_first),
        "f03_kbig_lowest": float(big.lowest),
        "f03_below_zero_words": Markdown(_below_zero_words(r)),
        "f03_d_model": int(big.d_model) if np.isfinite(big.d_model) else 0,
        "f03_k_main_ratio": r.k_main / float(big.d_model),
        "f03_k_wide_sentence": Markdown(_wide_sentence(r)),
    }


def _below_zero_words(r: Results) -> str:
    """Whether any of this run's curves (every K, the main panel) goes below zero, and its lowest
    point: the example of a curve below zero may have to come from elsewhere (the search)."""
    s = r.summary
    s = s[(s.panel == MAIN) & (s.model == r.showcase)]
    low = s.loc[s.coupling.idxmin()]
    where = f"{low.coupling:.3f}, at K = {int(low.K)} and step {int(low.step)}"
    if low.coupling < 0:
        return f"; this run's curves do go below zero (lowest {where})"
    return f"; no curve of this run, at any K measured, goes below zero (lowest {where})"


def _graph_values(r: Results) -> dict[str, Any]:
    """The paper's digitised curves' shape, and the layer graphs' edge density."""
    pg, dense = r.paper_growth, r.density[r.density.step >= r.params.early_step]
    return {
        "f03_paper_ratio": float(pg.ratio.mean()),
        "f03_paper_spearman": float(pg.spearman.mean()),
        "f03_paper_peak_position": float(pg.peak_position.min()),
        "f03_density_early": r.dense_values["density_early"],
        "f03_density_final": r.dense_values["density_final"],
        "f03_density_peak_step": r.d_peak,
        "f03_density_peak": float(dense.density.max()),
        "f03_density_words": _density_words(r),
    }


def _density_words(r: Results) -> str:
    """How the layer graph's edge density moves from ``early_step`` on (:func:`.words.density_words`)."""
    dense = r.dense_values
    return density_words(
        r.density[r.density.step >= r.params.early_step], dense["density_early"], dense["density_final"]
    )


def _trajectory_values(r: Results) -> dict[str, Any]:
    """The line-shape score, the expodistance sentence, and ρ(coupling, LSS)."""
    from IPython.display import Markdown

    lss, exp = r.lss_row, r.exp_row
    return {
        "f03_lss_early": float(lss.early),
        "f03_lss_final": float(lss.final),
        "f03_lss_spearman": float(lss.spearman),
        "f03_lss_turns": _lss_turns(r, r.params.early_step),
        "f03_lss_walk": float(r.straight["walk"]),
        "f03_straight_rule": STRAIGHT_RULE,
        "f03_straight_verdict": _verdict(r, "straight"),
        "f03_straight_short": Markdown(short_of_straighter(r.straight, twin="the first checkpoint's")),
        "f03_walk_ratio": float(r.straight["walk_ratio"].estimate),
        "f03_walk_ratio_interval": r.straight["walk_ratio"].words(),
        "f03_init_ratio": float(r.straight["twin_ratio"].estimate),
        "f03_init_ratio_interval": r.straight["twin_ratio"].words(),
        "f03_expo_sentence": Markdown(
            "the expodistance reconstruction is not available (it needs at least three blocks)"
            if exp is None
            else f"the log-linear reconstruction of expodistance (1 − R²) from {exp.early:.3f} to "
            f"{exp.final:.3f} (ρ {exp.spearman:.2f}; {_reconstructions(r)})"
        ),
        "f03_rho_lss": r.rho_lss,
        "f03_together_sentence": Markdown(_together_sentence(r)),
    }


def _together_sentence(r: Results) -> str:
    """Claim 3's verdict after ρ(coupling, LSS): moving together counts only with both trends."""
    return (
        "Moving together is not by itself developing together: the rule stated above also asks that "
        "coupling rise with the step and the line-shape score fall with it, and gives "
        f"{_verdict(r, 'together').data} ({together_words(r.together_values, r.together_failed)})."
    )


def _matched_rise(r: Results) -> list[str]:
    """The bullets on the rise and its monotony (verdicts: the status rows')."""
    first, pg, k, v = r.first, r.paper_growth, r.k_main, r.rise_values
    e, same = int(first.early_step), _from_paper_early(r)
    pythia = f"{int(pg.early_step.min())} to {int(pg.final_step.max())}"  # Fig. 1b's digitised span
    where = (
        "at the end"
        if int(first.peak_step) == int(first.final_step)
        else f"at step {int(first.peak_step)}, position {first.peak_position:.2f} on the log-step axis"
        + (f", {first.peak / first.final:.1f}× its final value" if first.final > 0 else "")
    )
    return [
        f"**Progressive rise** ({_verdict(r, 'rises').data}). Coupling of {r.showcase} on the {MAIN} "
        f"(K = {k}) goes from {first.early:.3f} at step {int(first.early_step)} to {first.final:.3f} at "
        f"step {int(first.final_step)}, with its highest point {where}: "
        f"{with_interval('final / early', v['ratio'])} from step {e}"
        + (f", and {same}," if same else "")
        + f" against about {pg.ratio.mean():.1f} for Pythia from step {pythia}; "
        f"{with_interval('ρ with the step', v['spearman'])} from step {e}, against {pg.spearman.mean():.2f} "
        f"for Pythia from step {int(pg.early_step.min())}. "
        + versus_first(first.final, r.step0, r.first_step),
        f"**Nearly monotonic** ({_verdict(r, 'monotone').data}). The largest fall between consecutive "
        f"checkpoints is {first.max_drop:.0%} of the curve's range "
        f"({interval_of(v['max_drop'], '.0%')}; Pythia's digitised curves: "
        f"{pg.max_drop.max():.0%} at most).",
    ]


def _matched(r: Results) -> str:
    """What matched and what did not, one bullet per claim (and the quiz panel's); each verdict
    with the numbers its rule judged and their intervals."""
    first, lss, exp = r.first, r.lss_row, r.exp_row
    bullets = _matched_rise(r)
    bullets.append(
        f"**Almost none early, dense at the end** ({_verdict(r, 'dense').data}). The layer graph's edge "
        f"density {_density_words(r)} (threshold {r.params.graph_threshold})."
    )
    straight, n_steps = r.straight, r.held.layer_i.nunique()
    walk, init = straight["walk_ratio"], straight["twin_ratio"]
    bullets.append(
        f"**Together with linearity** ({_verdict(r, 'together').data}; "
        f"{together_words(r.together_values, r.together_failed)}); **straighter trajectories** "
        f"({_verdict(r, 'straight').data}; LSS {straight['lss_twin']:.3f} at step {straight['first_step']} → "
        f"{lss.final:.3f} at step {straight['last_step']}, {_lss_turns(r, straight['first_step'])}, ρ with "
        f"the step {lss.spearman:.2f} from step {int(lss.early_step)}; the last "
        f"score {walk.estimate:.2f} of a random walk's ({walk.words()}) and "
        f"{init.estimate:.2f} of the score at {first_checkpoint(straight['first_step'])} ({init.words()}))"
        + (
            "."
            if exp is None
            else f"; **exponential growth** ({_verdict(r, 'expo').data}; the log-linear reconstruction of "
            f"expodistance, 1 − R², {exp.early:.3f} → {exp.final:.3f}, "
            f"{with_interval('final / early', r.exp_judged['ratio'])}, "
            f"{with_interval('ρ', r.exp_judged['spearman'])}; {_reconstructions(r)}"
            + (
                f"; with only {n_steps} steps per trajectory a log-linear fit says little"
                if n_steps < 8
                else ""
            )
            + ")."
        )
    )
    if quiz_prompts(r.params) is not None:
        q = r.growth[r.growth.panel != MAIN]
        if not q.empty:
            qrow = q[q.model == r.showcase].iloc[0]
            bullets.append(
                f"**Quiz prompts.** On the quiz prompts the curve {peak_words(qrow)}; on the {MAIN} it "
                f"{peak_words(first)}. The quiz curve's verdict by the same rule is "
                f"{qrow['rises progressively']}."
            )
    return "\n".join(f"- {b}" for b in bullets)


def glue_values(r: Results) -> dict[str, Any]:
    """Every value the prose glues, by name: the rules' texts, the plateau, the curve and its
    verdict, the levels against K/d, the paper's curves, the graphs, the trajectories, the
    search, what matched, and the numbers of the worked solutions."""
    from IPython.display import Markdown

    return {
        **{f"f03_rule_{name}": rule.text for name, rule in RULES.items()},
        **_plateau_values(r),
        **_coupling_values(r),
        **_level_values(r),
        **_graph_values(r),
        **_trajectory_values(r),
        **search_values(r),
        "f03_matched": Markdown(_matched(r)),
        **exercise_k(r),
        **exercise_pairs(r),
        **exercise_lr(r),
    }
