"""f01 · Coupling across depth and tokens (``notebooks/f01_depth_and_tokens.md``).

Its parameters and their checks (:class:`Params`), its measurement plan (:func:`jobs`: each
model beside its random-init twin), the measurements read back (:func:`run` -> :class:`Results`,
whose properties are the condensed numbers the story reads), the figures it draws, its status
rows judged by the rules fixed before any number (:data:`RULES`, :func:`claims`), the
assumptions its prose makes about a run (:func:`assumptions`) and the values it glues
(:func:`glue_values`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from coupling_utils.analysis import depth_and_tokens as tw
from coupling_utils.analysis.verdicts import Rule, claim
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    block,
    boolean,
    check_model,
    check_top_k,
    choice,
    integer,
    k_values,
    list_of,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Options, collect
from coupling_utils.measurement.jobs import Job

__all__ = [
    "Params",
    "RULES",
    "Results",
    "prompt_table",
    "prompts",
    "models",
    "twin_settings",
    "jobs",
    "run",
    "tile_chart",
    "depth_chart",
    "distance_chart",
    "per_model_chart",
    "token_chart",
    "context_chart",
    "claims",
    "assumptions",
    "glue_values",
]

NOTEBOOK = "f01_depth_and_tokens"
ENCODER = "embedded:minilm-l6"  # the encoder whose post-LN blocks the encoder note explains
PAPER_AXIS = (0.89, 0.955)  # the range of the paper's Figure 1a axis (per-model coupling)


def _need_a_prompt(v: Mapping[str, Any]) -> str | None:
    if v.get("n_prompts") == 0 and v.get("include_demo") is False:
        return "parameter 'n_prompts' is 0 and 'include_demo' is false: no prompt to measure"
    return None


def _tile_k_within_k(v: Mapping[str, Any]) -> str | None:
    if v["tile_k"] > max(v["k"]):
        return f"parameter 'tile_k' must be <= max(k) = {max(v['k'])}, got {v['tile_k']}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_need_a_prompt, _tile_k_within_k)

    model: str = param("embedded:smollm2-135m", check_model)
    more_models: list = param(["embedded:minilm-l6"], list_of(check_model, min_len=0))
    include_gemma: bool = param(False, boolean)
    dtype: str = param("float32", choice(*DTYPES))
    n_prompts: int = param(2, integer(min=0))
    include_demo: bool = param(True, boolean)
    max_tokens: int = param(16, integer(min=2))
    k: list = param([10, 30, 50], k_values)
    layers: list = param([], list_of(block, min_len=0))
    tile_layers: list = param([11, 12, 13, 14, 15, 16, 17, 18], list_of(block, min_len=2, max_len=12))
    tile_k: int = param(10, check_top_k)
    token_layer: int = param(15, block)
    how: str = param("offdiag", choice(*HOWS))
    init_seed: int = param(0, integer(min=0))
    method: str = param("exact", choice(*METHODS))


# --------------------------------------------------------------------------- the rules, fixed first
RULES = {
    # depth: more coupled than the twin in (nearly) every block pair, at every K, by a clear margin
    "depth": Rule(yes="share_above >= 0.9 and excess >= 0.05", partly="share_above >= 0.5 and excess > 0"),
    # tiles: a visible diagonal (at least twice the chance share) in (nearly) every off-diagonal
    # tile, and in (almost) none of the twin's
    "tiles": Rule(
        yes="diagonal_trained >= 0.9 and diagonal_twin <= 0.1", partly="diagonal_trained > diagonal_twin"
    ),
    # token-wise self coupling: strong (>= 0.5) and beyond what random weights give
    "tokens": Rule(yes="self_trained >= 0.5 and self_trained > self_twin", partly="self_trained >= 0.25"),
    # context coupling: present (>= 0.2) and less uniform across token pairs than self coupling
    "context": Rule(
        yes="context_trained >= 0.2 and context_sd > self_sd",
        partly="context_trained >= 0.2 or context_sd > self_sd",
    ),
}


# --------------------------------------------------------------------------- the plan
def prompt_table(p: Params) -> pd.DataFrame:
    """The prompts of the project's prompt set the chapter measures (id, category, text, ...)."""
    from coupling_utils.analysis.data import load_prompts

    return load_prompts(n=p.n_prompts, include_demo=p.include_demo)


def prompts(p: Params) -> dict[str, str]:
    """The prompts every model is measured on: ``{prompt id: text}`` (the first is the drawn one)."""
    table = prompt_table(p)
    return dict(zip(table["id"], table["text"]))


def models(p: Params) -> list[str]:
    """The measured models: ``model`` first, then ``more_models`` (and Gemma when asked)."""
    extra = ["embedded:gemma3-270m"] if p.include_gemma else []
    return list(dict.fromkeys([p.model, *p.more_models, *extra]))


def twin_settings(p: Params) -> tw.TwinSettings:
    """What is measured on the drawn model and its twin; the other models get its ``depth_only()``."""
    return tw.TwinSettings(
        k=p.k, layers=p.layers or None, tile_layers=p.tile_layers, tile_k=p.tile_k, token_layer=p.token_layer,
        how=p.how, dtype=p.dtype, seed=p.init_seed, method=p.method, max_tokens=p.max_tokens,
    )  # fmt: skip


def jobs(p: Params) -> list[Job]:
    """The measurement plan: each model and its random-init twin (``twin_jobs``); the first model
    with its tiles and token block, the others without."""
    s, texts = twin_settings(p), prompts(p)
    out: list[Job] = []
    for name in models(p):
        out += tw.twin_jobs(
            name, texts, s if name == p.model else s.depth_only(), out=cache_dir("f01", p.method)
        )
    return out


# --------------------------------------------------------------------------- the measurements, condensed
@dataclass(frozen=True)
class Results:
    """What the story reads from one run: every model measured beside its twin (``twins``; models
    left out in ``failures``), on ``prompts``; the properties condense them (each computed once)."""

    params: Params
    twins: tw.TwinSet
    prompts: dict[str, str]

    @property
    def main(self) -> tw.TwinMeasurement:
        """The drawn model (``params.model``) beside its twin."""
        return self.twins.results[self.params.model]

    @property
    def failures(self) -> pd.DataFrame:
        """The models left out, and why (model, weights, error, message)."""
        return self.twins.failures

    @property
    def focus(self) -> str:
        """The prompt drawn in the tile and token figures (the demo prompt by default)."""
        return next(iter(self.prompts))

    @functools.cached_property
    def tile_values(self) -> dict:
        """How diagonal the drawn model's off-diagonal tiles are, trained and twin (``tile_contrast``)."""
        pair = self.main
        return tw.tile_contrast(pair.tiles[pair.tiles.prompt == self.focus], self.params.tile_k)

    @functools.cached_property
    def by_distance(self) -> pd.DataFrame:
        """Mean coupling against the distance between blocks, per weights and K."""
        return tw.coupling_by_distance(self.main.depthwise)

    @functools.cached_property
    def trend(self) -> pd.DataFrame:
        """Spearman's ρ of coupling with block distance; coupling of neighbours and farthest pair."""
        return tw.distance_trend(self.by_distance)

    @functools.cached_property
    def per_model(self) -> pd.DataFrame:
        """One row per (model, K): trained, random init, trained − random (``summary_table``)."""
        return tw.summary_table(self.twins)

    @functools.cached_property
    def depth(self) -> dict[str, dict]:
        """Per model: the trained model against its twin across depth (``depth_contrast``)."""
        p = self.params
        return {name: tw.depth_contrast(r, p.k, p.how) for name, r in self.twins.results.items()}

    @functools.cached_property
    def token_values(self) -> dict:
        """Token-wise self and context coupling of the drawn model at K = min(k) (``token_contrast``)."""
        return tw.token_contrast(self.main, min(self.params.k))

    @functools.cached_property
    def first_token(self) -> tuple[float, float]:
        """Mean self coupling (trained, the drawn prompt) of pairs involving the first token, and
        of pairs of other tokens."""
        tok = self._tokens()
        trained = tok[(tok.weights == "trained") & (tok.token_i != tok.token_j)]
        first = float(trained[(trained.token_i == 0) | (trained.token_j == 0)].coupling.mean())
        other = float(trained[(trained.token_i != 0) & (trained.token_j != 0)].coupling.mean())
        return first, other

    @functools.cached_property
    def per_model_head(self) -> pd.Series:
        """The drawn model's row of :attr:`per_model` at K = max(k)."""
        wide, kmax = self.per_model, max(self.params.k)
        return wide[(wide.model == self.params.model) & (wide["K"] == kmax)].iloc[0]

    def _tokens(self) -> pd.DataFrame:
        """The drawn prompt's token-wise self coupling at K = min(k)."""
        tok, kmin = self.main.tokenwise, min(self.params.k)
        return tok[(tok.prompt == self.focus) & (tok["K"] == kmin)]

    def _context(self) -> pd.DataFrame:
        """The drawn prompt's context coupling at K = min(k), within the token block."""
        ctx, kmin = self.main.context, min(self.params.k)
        return ctx[(ctx.prompt == self.focus) & (ctx["K"] == kmin) & (ctx.layer_i == ctx.layer_j)]


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (``options``: how they run; default: failures recorded) and the
    chapter's :class:`Results`; the drawn model must be measured, the others may be left out."""
    done = collect(jobs(p), options)
    return Results(p, tw.twin_set(done, twin_settings(p), main=p.model), prompts(p))


# --------------------------------------------------------------------------- figures
def tile_chart(r: Results, label: str):
    """The drawn model's tile grid over ``tile_layers`` (``label``: "trained" or "random init"),
    last token of the drawn prompt."""
    from coupling_utils.analysis import plots

    p, tiles = r.params, r.main.tiles
    tiles = tiles[(tiles.weights == label) & (tiles.prompt == r.focus)]
    return plots.tile_grid(
        tiles,
        look=plots.Look(title=f"{p.model}, {label}: |U_jᵀ J_i V_j|, K = {p.tile_k}, last token", width=44),
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
    return _token_heatmap(r, r._tokens(), f"Token-wise self coupling at block {block}, K = {min(r.params.k)}")


def context_chart(r: Results):
    """Context coupling (the last output token, input tokens against each other), trained and twin."""
    title = f"Context coupling: ∂f(X)_last / ∂x_t at block {r.main.token_layer}, K = {min(r.params.k)}"
    return _token_heatmap(r, r._context(), title)


# --------------------------------------------------------------------------- claims and glued values
def _depth_rows(r: Results) -> list[dict]:
    """One status row per measured model: coupled across depth, its twin not."""
    p, wide, rows = r.params, r.per_model, []
    for name, v in r.depth.items():
        per_k = wide[wide.model == name]
        rows.append(claim(
            f"depth-wise coupling in the trained model, absent in its random twin: {name}",
            paper="clear diagonal in every tile (Llama-3-8B, layers 9–16); none off-diagonal at random init"
                  if name == p.model else "coupling in a multitude of LLMs",
            rule=RULES["depth"], values=v,
            ours="; ".join(f"K = {K}: {a:.3f} vs {b:.3f}"
                           for K, a, b in zip(per_k["K"], per_k["trained"], per_k["random init"])),
            note=f"mean 1 − m² over {p.how} block pairs, last token, {len(r.prompts)} prompts; "
                 "trained vs twin"))  # fmt: skip
    return rows


def claims(r: Results) -> list[dict]:
    """The status rows, each judged by its rule in :data:`RULES`: depth (one per model), tiles,
    token-wise self coupling, context coupling. Pass them to ``pipeline.status.report``."""
    p, tiles, tokens = r.params, r.tile_values, r.token_values
    block, kmin = r.main.token_layer, min(p.k)
    return _depth_rows(r) + [
        claim("tiles of the trained model are diagonal, the twin's are not",
              paper="trained: diagonal in every tile; untrained: only where i = j", rule=RULES["tiles"],
              values=tiles, ours=f"{tiles['diagonal_trained']:.0%} vs {tiles['diagonal_twin']:.0%} of tiles",
              note=f"{p.model}, blocks {p.tile_layers[0]}–{p.tile_layers[-1]}, K = {p.tile_k}; "
                   f"visible diagonal: ≥ {2 / p.tile_k:.2f} of a tile's squared mass"),
        claim("token-wise self coupling is strong in the trained model",
              paper="strong coupling of the tokens' own Jacobians (project page)", rule=RULES["tokens"],
              values=tokens, ours=f"{tokens['self_trained']:.3f} (twin {tokens['self_twin']:.3f})",
              note=f"mean 1 − m² over token pairs, block {block}, K = {kmin}"),
        claim("context coupling exists but varies across token pairs",
              paper="context coupling present, less uniform than self coupling", rule=RULES["context"],
              values=tokens,
              ours=f"mean {tokens['context_trained']:.3f}, s.d. {tokens['context_sd']:.3f} "
                   f"(self: s.d. {tokens['self_sd']:.3f})",
              note=f"fixed output token (the last), block {block}, K = {kmin}; twin mean "
                   f"{tokens['context_twin']:.3f}"),
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
         tiles["diagonal_trained"] > tiles["diagonal_twin"] and tiles["trained"] > tiles["twin"],
         "the trained model's tiles are more diagonal than the twin's"),
        ("f01-first-token-decouples", first < other,
         "pairs involving the first token are less coupled than pairs of other tokens"),
    ]  # fmt: skip


def _distance_values(r: Results) -> dict[str, Any]:
    """How far along depth the drawn model's coupling reaches (trained, K = max(k))."""
    p, n, trend = r.params, r.main.n_layers, r.trend
    kmax = max(p.k)
    tr = trend[(trend.weights == "trained") & (trend["K"] == kmax)].iloc[0]
    blocks = len(set(p.layers)) if p.layers else n
    return {
        "f01_adjacent": float(tr.adjacent),
        "f01_farthest": float(tr.farthest),
        "f01_distance_rho": float(tr.spearman),
        "f01_distance_word": "falls" if tr.spearman < 0 else "does not fall",
        "f01_n_pairs": blocks * (blocks - 1),
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


def _token_values(r: Results) -> dict[str, Any]:
    """Token-wise self and context coupling, the first token's pairs, and the two comparisons."""
    tok = r.token_values
    first, other = r.first_token
    return {
        **{f"f01_{key}": value for key, value in tok.items()},
        "f01_first_token": first,
        "f01_other_tokens": other,
        "f01_self_vs_twin": "higher" if tok["self_trained"] > tok["self_twin"] else "lower",
        "f01_context_vs_self_sd": "more" if tok["context_sd"] > tok["self_sd"] else "less",
    }


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
        text = f"The other model measured, {others[0]}, " + said
    else:
        counts = pd.Series([verdicts[c] for c in depth_claims[1:]]).value_counts()
        text = (f"Of the {len(others)} other models measured, {counts.get('yes', 0)} pass the depth rule "
                f"(yes), {counts.get('partly', 0)} partly and {counts.get('no', 0)} not")  # fmt: skip
    if not r.failures.empty:
        text += f"; {r.failures.model.nunique()} could not be measured and are listed above"
    return text + ". " + " ".join(
        f"For {name} the twin is *more* coupled than the trained weights at K = {', '.join(map(str, ks))}."
        for name, ks in reversed_k.items() if ks
    )  # fmt: skip


ENCODER_NOTE = (
    "MiniLM is an encoder with BERT-style blocks, which put the layer norm *after* the residual sum. "
    "At initialisation that norm dominates every block's Jacobian "
    "$\\partial\\,\\mathrm{block}(X)/\\partial X - I$, "
    "and it is the same operation in every block, which would couple random blocks. For such post-LN "
    'models, "the block\'s contribution to the residual stream" is not the clean object it is in '
    "pre-LN decoders."
)


def glue_values(r: Results, status: pd.DataFrame) -> dict[str, Any]:
    """Every value the prose glues, by name. ``status``: the table ``report(NOTEBOOK, claims(r))``
    returned, whose verdicts the prose quotes (rows in :func:`claims` order)."""
    from IPython.display import Markdown

    verdicts = dict(zip(status.claim, status.agree))
    claimed = list(status.claim)
    n = len(r.depth)  # the depth rows come first, one per model, the drawn model's first
    main = r.depth[r.params.model]
    return {
        **{f"f01_diag_{key}": value for key, value in r.tile_values.items()},
        **_distance_values(r),
        **_per_model_values(r),
        **_token_values(r),
        "f01_share_above": main["share_above"],
        "f01_excess": main["excess"],
        "f01_depth_verdict": verdicts[claimed[0]],
        "f01_tiles_verdict": verdicts[claimed[n]],
        "f01_tokens_verdict": verdicts[claimed[n + 1]],
        "f01_context_verdict": verdicts[claimed[n + 2]],
        "f01_others": Markdown(_others_text(r, verdicts, claimed[:n])),
        "f01_encoder_note": Markdown(ENCODER_NOTE if _reversed_k(r).get(ENCODER) else ""),
    }
