"""f01's figures, its status rows judged by the rules fixed before any number (:func:`claims`),
the assumptions its prose makes about a run (:func:`assumptions`) and the values it glues
(:func:`glue_values`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import depth_and_tokens as tw
from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis import tile_grid
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.verdicts import Interval, claim, verdict_word
from coupling_utils.chapters import own_claim
from coupling_utils.chapters.f01_depth_and_tokens.findings import (
    distance_words,
    finding_words,
    interval_side,
    named_model,
    spread_words,
)
from coupling_utils.chapters.f01_depth_and_tokens.plan import (
    DRAWN_TILE_K,
    ENCODER,
    PAPER_AXIS,
    RULES,
    Results,
    models,
)
from coupling_utils.schemas import Schema


# --------------------------------------------------------------------------- figures
def tile_chart(r: Results, label: str):
    """The drawn model's tile grid over ``tile_layers`` (``label``: "trained" or "random init"),
    last token of the drawn prompt: each tile's top-left corner up to :data:`DRAWN_TILE_K` (the
    tile at that K, as the singular vectors come in order); the rule reads every K to ``tile_k``."""
    from coupling_utils.analysis import plots

    p, tiles = r.params, r.main.tiles
    drawn = min(p.tile_k, DRAWN_TILE_K)
    tiles = tiles[
        (tiles.weights == label) & (tiles.prompt == r.focus) & (tiles.row < drawn) & (tiles.col < drawn)
    ]
    return plots.tile_grid(
        tiles,
        look=plots.Look(title=f"{p.model}, {label}: |U_jᵀ J_i V_j|, K = {drawn}, last token", width=44),
    )


def depth_chart(r: Results):
    """The depth-wise coupling matrices (mean over prompts), one panel per weights and K: the
    trained model's first, K ascending."""
    from coupling_utils.analysis import plots

    mats = tw.mean_depthwise(r.main.depthwise)
    mats["panel"] = mats["weights"] + ", K = " + mats["K"].astype(str)
    order = [f"{w}, K = {k}" for w in tw.WEIGHTS for k in sorted(r.params.k)]
    return plots.coupling_heatmap(
        mats, "layer_j", "layer_i", "m", facet="panel",
        look=plots.Look(title=f"{r.params.model}: depth-wise coupling of the last token (mean over prompts)",
                        subtitle="row i = J_i, column j = the block whose singular vectors are used",
                        width=150, columns=len(r.params.k), order=order),
    )  # fmt: skip


def distance_chart(r: Results):
    """Mean coupling against the distance between blocks, one line per weights and K."""
    from coupling_utils.analysis import plots

    d = r.by_distance
    return plots.layer_profile(
        d.assign(series=d.weights + ", K = " + d.K.astype(str)), "coupling", layer="distance", color="series",
        band=False, look=plots.Look(title="Mean 1 − m² against the distance |i − j| between blocks",
                                    y_title="mean 1 − m²"),
    )  # fmt: skip


def per_model_chart(r: Results):
    """One dot per model and weights (per-model coupling), one panel per K."""
    import altair as alt

    from coupling_utils.analysis import plots

    wide = r.per_model
    long = wide.melt(id_vars=["model", "K"], value_vars=["trained", "random init"], var_name="weights",
                     value_name="coupling")  # fmt: skip
    weights = alt.Scale(domain=list(tw.WEIGHTS), range=plots.OKABE_ITO[:2])
    dots = alt.Chart(long).mark_point(filled=True, size=60).encode(
        x=alt.X("coupling:Q", title="per-model coupling (mean 1 − m²)"),
        y=alt.Y("model:N", title=None, sort=models(r.params)),
        color=alt.Color("weights:N", scale=weights, title="weights"),
        shape=alt.Shape("weights:N", title="weights"),
        tooltip=["model:N", "weights:N", "K:O", alt.Tooltip("coupling:Q", format=".3f")],
    )  # fmt: skip
    height = max(60, 22 * len(wide.model.unique()))
    return dots.properties(width=300, height=height).facet(column=alt.Column("K:O", title="K"))


def _token_heatmap(r: Results, table: pd.DataFrame, title: str):
    """A token-by-token coupling heatmap, trained and twin (the trained model first)."""
    from coupling_utils.analysis import plots

    labelled = tw.label_tokens(table, r.main.tokens[r.focus], ["token_i", "token_j"])
    return plots.coupling_heatmap(
        labelled,
        "token_j",
        "token_i",
        "m",
        facet="weights",
        look=plots.Look(title=title, width=220, columns=2, order=tw.WEIGHTS),
    )


def token_chart(r: Results):
    """Token-wise self coupling of the drawn prompt at the token block, trained and twin."""
    block = r.main.token_layer
    return _token_heatmap(r, r._tokens(), f"Token-wise self coupling at block {block}, K = {r.k_verdict}")


def context_chart(r: Results):
    """Context coupling (the last output token; the earlier input tokens against each other, the
    last token's own Jacobian left out as the context rule leaves it out), trained and twin."""
    block = r.main.token_layer
    title = f"Context coupling: ∂f(X)_last / ∂x_t, t before the last, block {block}, K = {r.k_verdict}"
    return _token_heatmap(r, r._context(), title)


def last_block_chart(r: Results):
    """The last block's row and column of the drawn model's L × L matrix, K = max(k), under both
    maps, trained and twin (mean over prompts)."""
    return lb.last_lines_chart(r.maps, max(r.params.k))


# --------------------------------------------------------------------------- claims and glued values
def _other_model_note(r: Results, name: str) -> str:
    """The convention note of a model other than the drawn one: its free "excluded" verdict (the
    other map was measured for the drawn model alone), and whether that map differs for it."""
    p, pair = r.params, r.twins.results[name]
    others = {}
    if p.last_block != "excluded" and pair.n_layers >= 3:
        cut = lb.without_last_block(pair, p.how)
        others["excluded"] = RULES["depth"].judge(tw.depth_contrast(cut, p.k, p.how))
    note = lb.convention_note(p.last_block, RULES["depth"].judge(r.depth[name]), others)
    if p.last_block == "final_norm" and lb.folds_norm(pair.provenance.get("trained") or {}) is False:
        return note + "; the same map as 'block' for this model (no final norm in hidden_states[L])"
    return note + ("; the other map measured for the drawn model only" if p.last_block != "excluded" else "")


def _convention_note(r: Results, row: str, name: str | None = None) -> str:
    """Which convention a row's verdict uses, and where it would change under the others."""
    if name is not None and name != r.params.model:
        return _other_model_note(r, name)
    others = {c: verdicts[row] for c, verdicts in r.other_verdicts.items()}
    return lb.convention_note(r.params.last_block, r.main_verdicts()[row], others)


# what RULES["depth"] reads: the smallest mean gap over K (excess) >= 0.05, share_above >= 0.9 of block pairs
DEPTH_CLAIM = (
    "more coupled across depth than its random twin (on average by at least 0.05 at every K, and in "
    "nearly every block pair)"
)


def _depth_claim(name: str, drawn: str) -> tuple[str, str]:
    """A depth row's claim and the paper's column: the drawn model against the project page's
    Llama-3-8B grid; another model of the book's own (embedded) as this book's contrast, which the
    paper made no claim about; a hub model against the paper's many LLMs."""
    claim_text = f"{DEPTH_CLAIM}: {name}"
    if name == drawn:
        return claim_text, (
            "coupled across depth when trained; no coupling off the diagonal of the depth-wise grid at "
            "random init (Llama-3-8B, project page)"
        )
    if name.startswith("embedded:"):
        contrast = own_claim("Contrast", claim_text)
        return contrast, "no claim: a model the paper did not measure, here for contrast"
    return claim_text, "coupling in a multitude of LLMs"


def _depth_rows(r: Results) -> list[dict]:
    """One status row per measured model: more coupled across depth than its twin, as the rule
    reads it (:func:`_depth_claim`)."""
    p, wide, rows = r.params, r.per_model, []
    for name, v in r.depth.items():
        per_k = wide[wide.model == name]
        claim_text, paper = _depth_claim(name, p.model)
        rows.append(claim(
            claim_text, paper=paper, rule=RULES["depth"], values=v,
            ours="; ".join(f"K = {K}: {a:.3f} vs {b:.3f}"
                           for K, a, b in zip(per_k["K"], per_k["trained"], per_k["random init"])),
            note=f"mean 1 − m² over {p.how} block pairs, last token, {len(r.prompts)} prompts; "
                 f"trained vs twin, judged on the smallest gap over K (here at K = {v['excess_k']}); "
                 f"{_convention_note(r, 'depth', name)}"))  # fmt: skip
    return rows


def _share(v) -> str:
    """A share, with its interval when it has one: "62% [50%, 75%]"."""
    if isinstance(v, Interval):
        return f"{v.estimate:.0%} {v.bracketed('.0%')}"
    return f"{v:.0%}"


def _tile_glue(tiles: dict) -> dict[str, float]:
    """The tile values as glue: plain numbers, and an interval's estimate and words (which say when
    there is no interval)."""
    out = {}
    for key, value in tiles.items():
        if isinstance(value, Interval):
            out |= {f"f01_diag_{key}": value.estimate, f"f01_diag_{key}_interval": value.words(".0%")}
        else:
            out[f"f01_diag_{key}"] = value
    if "f01_diag_diagonal_twin" in out:  # "in at most 0% of the twin's" says "none" in a roundabout way
        out["f01_diag_twin_share_words"] = _at_most(float(out.pop("f01_diag_diagonal_twin")))
    return out


def _at_most(share: float) -> str:
    """An upper share in words: "none", "under 1%" or "at most 4%"."""
    if share == 0:
        return "none"
    return "under 1%" if share < 0.005 else f"at most {share:.0%}"


def claims(r: Results) -> list[dict]:
    """The status rows, each judged by its rule in :data:`RULES`: depth (one per model), tiles,
    token-wise self coupling, context coupling. Pass them to ``pipeline.status.report``."""
    p, tiles, tokens = r.params, r.tile_values, r.token_values
    block, kv = r.main.token_layer, r.k_verdict
    return _depth_rows(r) + [
        claim("tiles of the trained model are diagonal, the twin's are not",
              paper="trained: diagonal in every tile; untrained: only where i = j", rule=RULES["tiles"],
              values=tiles, ours=f"at worst {_share(tiles['diagonal_trained'])} vs at most "
                                 f"{_share(tiles['diagonal_twin'])} of tiles",
              note=f"{p.model}, blocks {p.tile_layers[0]}–{p.tile_layers[-1]}, every prompt, every K from "
                   f"{tile_grid.nested_tile_ks(p.tile_k)[0]} to {p.tile_k}; visible diagonal: ≥ 2/K of a "
                   "tile's squared mass; "
                   f"{_convention_note(r, 'tiles')}"),
        claim("token-wise self coupling is strong in the trained model and stronger than in its "
              "random-init twin",
              paper="strong coupling of the tokens' own Jacobians (project page); the comparison with "
                    "the twin is this book's test", rule=RULES["tokens"],
              values=r.token_judged, ours=f"{tokens['self_trained']:.3f} (twin {tokens['self_twin']:.3f})",
              note=f"mean 1 − m² over token pairs, block {block}, K = {kv}; "
                   f"{_convention_note(r, 'tokens')}"),
        claim("context coupling exists, is stronger than in its random-init twin, and varies across token "
              "pairs more than self coupling does",
              paper="context coupling exists but varies across token pairs (project page); the "
                    "comparisons with the twin and with self coupling's spread are this book's tests",
              rule=RULES["context"],
              values=r.token_judged,
              ours=f"mean {tokens['context_trained']:.3f}, s.d. {tokens['context_sd']:.3f} "
                   f"(self: s.d. {tokens['self_sd']:.3f})",
              note=f"fixed output token (the last), pairs of earlier input tokens (its own Jacobian left "
                   f"out), block {block}, K = {kv}; twin mean "
                   f"{tokens['context_twin']:.3f}; {_convention_note(r, 'context')}"),
    ]  # fmt: skip


def assumptions(r: Results) -> list[tuple[str, bool, str]]:
    """What the prose under "What matched" assumes about this run: ``(key, holds, text)`` for
    ``analysis.verdicts.assume``."""
    twin = r.per_model_head["random init"]
    tok, tiles = r.token_values, r.tile_values
    first, other = r.first_token
    return [
        ("f01-twin-near-chance", twin < 0.05,
         "the twin's per-model coupling is below 0.05, the level of unrelated matrices (see f00)"),
        ("f01-twin-tokens-uniform",
         tok["self_twin"] > tok["self_trained"] and tok["context_twin"] > tok["context_trained"],
         "the twin's token-wise self and context coupling are both higher than the trained model's"),
        ("f01-tiles-shared",
         tiles["diagonal_trained"].estimate > tiles["diagonal_twin"].estimate
         and tiles["trained"] > tiles["twin"],
         "the trained model's tiles are more diagonal than the twin's"),
        ("f01-first-token-decouples", first < other,
         "pairs involving the first token are less coupled than pairs of other tokens"),
    ]  # fmt: skip


def _distance_values(r: Results) -> dict[str, Any]:
    """How far along depth the drawn model's coupling reaches (trained, K = max(k))."""
    p, trend = r.params, r.trend
    kmax = max(p.k)
    tr = trend[(trend.weights == "trained") & (trend["K"] == kmax)].iloc[0]
    return {
        "f01_adjacent": float(tr.adjacent),
        "f01_farthest": float(tr.farthest),
        "f01_farthest_distance": int(r.by_distance["distance"].max()),
        **distance_words(r.distance.get("spearman"), r.distance["adjacent_excess"]),
    }


def _per_model_values(r: Results) -> dict[str, Any]:
    """The drawn model's per-model coupling at K = max(k), trained and twin, against the paper's axis."""
    head, (lo, hi) = r.per_model_head, PAPER_AXIS
    return {
        "f01_trained": float(head["trained"]),
        "f01_twin": float(head["random init"]),
        "f01_kmax": int(max(r.params.k)),
        "f01_kmin": int(min(r.params.k)),
        "f01_vs_paper_axis": "below"
        if head["trained"] < lo
        else ("above" if head["trained"] > hi else "within"),
    }


PAPER_K = (10, 30, 50)  # the K of the paper's figures


def k_words(ks: list[int], d_model: int, others: Mapping[str, int] | None = None) -> str:
    """The K this run measures, against the paper's and the book's K/d at the drawn model's width
    (each profile measures other K on a model of another width), and what the same K are at the
    width of each other model (``others``: name -> width) whose width differs."""
    from coupling_utils.analysis.k_policy import BOOK_K_OVER_D
    from coupling_utils.engine.metric import k_for_width

    ks, book = sorted(set(ks)), k_for_width(d_model, BOOK_K_OVER_D)
    paper = [k for k in PAPER_K if k in ks]
    ours = "none" if not paper else "all three" if len(paper) == len(PAPER_K) else listed(paper)
    if book in ks:
        where = f"K = {book} is the book's K/d at this width" + (
            ", the largest K of this run" if book == ks[-1] else ""
        )
    else:
        where = f"the book's K/d would be K = {book} at this width, which this run does not measure"
    text = f"This run measures K = {listed(ks)} at width {d_model} ({ours} of the paper's); {where}."
    for name, d in (others or {}).items():
        if d == d_model:
            continue
        book = k_for_width(d, BOOK_K_OVER_D)
        there = (
            f"K = {book} is the book's K/d there" if book in ks
            else f"the book's K/d there would be K = {book}, which this run does not measure"
        )  # fmt: skip
        span = f"{ks[0] / d:.2f}" if len(ks) == 1 else f"{ks[0] / d:.2f} to {ks[-1] / d:.2f}"
        text += f" {name} (width {d}) is measured at the same K, K/d {span}; {there}."
    return text


def _model_values(r: Results) -> dict[str, Any]:
    """The drawn model, its tile window, the other models and the K measured, as the prose under
    "The paper's figure" says them (true of whichever profile ran)."""
    p, m = r.params, r.main
    others = [name for name in r.twins.results if name != p.model]
    named = [named_model(r.twins.results[name]) for name in others]
    more = (
        "This run measures no other model." if not others
        else f"Beside it this run measures {'; '.join(named)}; each with its twin." if len(others) <= 3
        else f"Beside it this run measures {len(others)} more models, each with its twin (the per-model "
             "table lists them)."
    )  # fmt: skip
    lo, hi = min(p.tile_layers), max(p.tile_layers)
    return {
        "f01_model_words": f"{named_model(m)} ({m.n_layers} blocks, width {m.d_model})",
        "f01_d_model": int(m.d_model),
        "f01_tile_window": f"blocks {lo}–{hi} (0-based; {len(set(p.tile_layers))} of its {m.n_layers})",
        "f01_more_words": more,
        "f01_k_words": k_words(p.k, m.d_model, {name: r.twins.results[name].d_model for name in others}),
    }


def _token_values(r: Results) -> dict[str, Any]:
    """Token-wise self and context coupling, the first token's pairs, and the two comparisons."""
    tok = r.token_values
    first, other = r.first_token
    return {
        **{f"f01_{key}": value for key, value in tok.items()},
        "f01_first_token": first,
        "f01_other_tokens": other,
        "f01_self_vs_twin": self_vs_twin(r.token_judged["self_excess"]),
        "f01_context_vs_self_sd": sd_comparison(r.token_judged["sd_excess"]),
    }


def self_vs_twin(d: Interval) -> str:
    """The trained model's token-wise self coupling against its twin's, by the interval of their
    difference (``self_excess``), not the sign of the estimates."""
    return {"above": "higher than", "below": "lower than", "neither": "not told apart from"}[interval_side(d)]


def sd_comparison(d: Interval) -> str:
    """How much context coupling varies across token pairs against self coupling, in words chosen
    by the interval of the difference of their standard deviations (``sd_excess``), not its sign."""
    word = "more" if d.low > 0 else "less" if d.high < 0 else "neither clearly more nor less"
    return f"{word} than self coupling does (context − self s.d. {d.estimate:+.3f}, {spread_words(d)})"


def _reversed_k(r: Results) -> dict[str, list[int]]:
    """For each model other than the drawn one: the K values at which its twin is *more* coupled."""
    wide = r.per_model
    others = [name for name in r.depth if name != r.params.model]
    return {name: wide[(wide.model == name) & (wide["trained − random"] < 0)].K.tolist() for name in others}


def _others_text(r: Results, verdicts: Mapping[str, str], depth_claims: list[str]) -> str:
    """The sentence on the other models: their depth verdicts, those left out, reversed K values.
    ``depth_claims``: the depth rows' claims, the drawn model's first."""
    reversed_k = _reversed_k(r)
    if not reversed_k:
        return "No other model was measured (`more_models` is empty)."
    others = list(reversed_k)
    if len(others) == 1:
        said = {"yes": "passes the depth rule (yes)", "partly": "passes the depth rule partly",
                "no": "does not pass the depth rule (no)"}[verdicts[depth_claims[1]]]  # fmt: skip
        v = r.depth[others[0]]
        text = (f"The other model measured, {others[0]}, {said}: its smallest trained − twin gap over K, "
                f"which the rule reads, is {v['excess'].estimate:.3f}, at K = {v['excess_k']}")  # fmt: skip
    else:
        counts = pd.Series([verdicts[c] for c in depth_claims[1:]]).value_counts()
        text = (f"Of the {len(others)} other models measured, {counts.get('yes', 0)} pass the depth rule "
                f"(yes), {counts.get('partly', 0)} partly and {counts.get('no', 0)} not")  # fmt: skip
    if not r.failures.empty:
        n = r.failures.model.nunique()
        text += f"; {n} could not be measured and {'is' if n == 1 else 'are'} listed above"
    return text + ". " + " ".join(
        f"For {name} the twin is *more* coupled than the trained weights at K = {', '.join(map(str, ks))}."
        for name, ks in reversed_k.items() if ks
    )  # fmt: skip


ENCODER_NOTE = (
    "MiniLM is an encoder with BERT-style blocks, which put the layer norm *after* the residual sum. "
    "A likely reason for its twin's coupling, not measured here: at initialisation that norm may "
    "dominate every block's Jacobian $\\partial\\,\\mathrm{block}(X)/\\partial X - I$, "
    "and it is the same operation in every block, which would couple random blocks. For such post-LN "
    'models, "the block\'s contribution to the residual stream" is not the clean object it is in '
    "pre-LN decoders."
)


ROW_NAMES = {"depth": "depth-wise", "tiles": "tiles", "tokens": "token-wise", "context": "context"}


def _last_block_glue(r: Results) -> dict[str, Any]:
    """The section "The last block": the chapter's convention, the aggregates under each, their
    differences and what they do to the drawn model's verdicts."""
    from IPython.display import Markdown

    v, p = r.last_block_values, r.params
    shared = p.last_block in lb.MEASURED_MAPS  # one run measured the last block under both maps
    rest = "is the same under both maps (measured once)" if shared else f"agrees {_agreement(v['rest_diff'])}"
    keys = ("trained_block", "trained_final_norm", "twin_block", "twin_final_norm",
            "trained_change", "twin_change", "trained_line_diff", "twin_line_diff",
            "trained_s1_block", "trained_s1_final_norm")  # fmt: skip
    return {
        "f01_last_block": Markdown(f'`last_block = "{p.last_block}"`'),
        "f01_last_block_words": lb.CONVENTION_WORDS[p.last_block],
        "f01_lb_last": int(r.main.n_layers - 1),
        **{f"f01_lb_{key}": float(v[key]) for key in keys},
        "f01_lb_excluded_words": excluded_words(v, int(r.main.n_layers), shared),
        "f01_lb_rest_words": f"every pair without the last block {rest}",
        "f01_lb_verdicts": Markdown(lb.changed_verdicts(r.main_verdicts(), r.other_verdicts, ROW_NAMES)),
    }


def excluded_words(v: Mapping[str, float], n_layers: int, shared: bool = False) -> str:
    """What leaving the last block out gives (``last_block_values``), or why it gives nothing: with
    two blocks no pair of different blocks is left. ``shared``: both maps from one run, which
    measured every other block once."""
    if np.isnan([v["trained_excluded"], v["twin_excluded"]]).any():
        return f"Leaving the last block out leaves no pair of different blocks to average ({n_layers} blocks)"
    said = f"Leaving the last block out gives {v['trained_excluded']:.4f} (twin {v['twin_excluded']:.4f})"
    if shared:
        return said
    return f"{said}, the same from either measurement ({_agreement(v['excluded_diff'], 'they ')})"


def _agreement(diff: float, subject: str = "") -> str:
    """How closely two measurements of the same values agree: "exactly" where their largest
    difference is 0, else "to within 3.1e-08" (with ``subject``: "they differ by 3.1e-08")."""
    if diff == 0:
        return "exactly" if not subject else f"{subject}agree exactly"
    return f"to within {diff:.1e}" if not subject else f"{subject}differ by {diff:.1e}"


def glue_values(r: Results, status: pd.DataFrame) -> dict[str, Any]:
    """Every value the prose glues, by name. ``status``: the table ``report(NOTEBOOK, claims(r))``
    returned, whose verdicts the prose quotes (rows in :func:`claims` order)."""
    from IPython.display import Markdown

    verdicts = dict(zip(status.claim, status.agree))
    claimed = list(status.claim)
    n = len(r.depth)  # the depth rows come first, one per model, the drawn model's first
    main = r.depth[r.params.model]
    return {
        **_tile_glue(r.tile_values),
        "f01_tile_k": r.params.tile_k,
        **_distance_values(r),
        **_per_model_values(r),
        **_model_values(r),
        **_token_values(r),
        **_last_block_glue(r),
        "f01_share_above": main["share_above"],
        "f01_excess": main["excess"].estimate,
        "f01_excess_interval": main["excess"].words(".3f"),
        "f01_excess_k": main["excess_k"],
        "f01_depth_verdict": verdict_word(status.iloc[0]),
        "f01_tiles_verdict": verdict_word(status.iloc[n]),
        "f01_tokens_verdict": verdict_word(status.iloc[n + 1]),
        "f01_context_verdict": verdict_word(status.iloc[n + 2]),
        "f01_others": Markdown(_others_text(r, verdicts, claimed[:n])),
        "f01_encoder_note": Markdown(ENCODER_NOTE if _reversed_k(r).get(ENCODER) else ""),
        "f01_encoder_last_token": _encoder_last_token(r),
        "f01_ex_matrix_free": Markdown(matrix_free_sentence()),
        **finding_words(r, status),
    }


# the columns of bench/bench_jacobians.py's matrix-free table that the sentence reads
MATRIX_FREE_BENCHMARK = Schema(
    "data/benchmarks/matrix_free.csv",
    {"model": "str", "method": "str", "solver": "str", "steps": "number", "scope": "str", "K": "int",
     "block_passes_per_layer": "int", "passes_reduction": "number", "seconds": "number",
     "max_abs_coupling_error": "number", "date_utc": "str", "command": "str"},
    fix="rerun python bench/bench_jacobians.py --cases matrix_free --out data/benchmarks",
)  # fmt: skip


def matrix_free_sentence() -> str:
    """Exercise f01-ex-matrix-free's expected result, from the stored benchmark
    (``data/benchmarks/matrix_free.csv``): block Lanczos with its default settings against the
    exact method on the embedded SmolLM2, per K and set of layer pairs (error, passes, seconds)."""
    from coupling_utils.files import data_dir
    from coupling_utils.schemas import check_table

    t = check_table(pd.read_csv(data_dir() / "benchmarks" / "matrix_free.csv"), MATRIX_FREE_BENCHMARK)
    exact = t[t.method == "exact"]
    lanczos = t[(t.solver == "lanczos") & (t.steps == 45)].sort_values(["scope", "K"])  # the defaults
    if exact.empty or lanczos.empty:
        return "The stored benchmark holds no default matrix-free row: rerun the exercise to see."
    d = int(exact.block_passes_per_layer.iloc[0])
    parts = [
        f"K = {row.K}, {row.scope}: coupling values at most {row.max_abs_coupling_error:.1g} from exact, "
        f"{row.block_passes_per_layer} block passes per layer ({row.passes_reduction:.1f}× fewer than "
        f"d = {d}), {row.seconds:.0f} s"
        for row in lanczos.itertuples()
    ]
    slower = (lanczos.seconds > exact.seconds.max()).all()
    return (
        f"The stored benchmark ({t.model.iloc[0]}; measured on {t.date_utc.iloc[0][:10]} by "
        f"`{t.command.iloc[0]}`) gives, for block Lanczos with its default settings: "
        + "; ".join(parts)
        + f". The exact method took {exact.seconds.max():.0f} s, so matrix-free was "
        + ("slower in every case" if slower else "faster in some cases")
        + " on that CPU; its largest difference from the exact coupling values was "
        + f"{lanczos.max_abs_coupling_error.max():.1g}."
    )


def _encoder_last_token(r: Results) -> str:
    """The encoder's last-token ([SEP]) coupling against its twin at K = max(k), or why there is
    none (exercise f01-ex-encoder: the reference a [CLS] measurement is compared with)."""
    wide, kmax = r.per_model, max(r.params.k)
    rows = wide[(wide.model == ENCODER) & (wide["K"] == kmax)]
    if rows.empty:
        return f"this run measured no encoder (the default profile adds {ENCODER})"
    row = rows.iloc[0]
    return (
        f"this run's {ENCODER} gives, at its last token ([SEP]) and K = {kmax}, "
        f"{row['trained']:.3f} against its twin's {row['random init']:.3f}"
    )
