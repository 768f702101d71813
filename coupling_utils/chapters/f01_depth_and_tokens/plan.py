"""f01's parameters and their checks (:class:`Params`), its rules (:data:`RULES`), its measurement
plan (:func:`jobs`: each model beside its random-init twin, and the drawn model under the other
map of the last block) and the measurements read back (:func:`run` -> :class:`Results`, whose
properties are the condensed numbers the story reads)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from coupling_utils.analysis import block_distance as bd
from coupling_utils.analysis import depth_and_tokens as tw
from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis import tile_grid
from coupling_utils.analysis.verdicts import Rule
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    NotMeasured,
    ParameterError,
    block,
    boolean,
    check_blocks_and_k,
    check_model,
    check_top_k,
    choice,
    integer,
    k_values,
    list_of,
    with_check,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.engine.blocks import LAST_BLOCKS
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Collected, Options, collect
from coupling_utils.measurement.jobs import Job

NOTEBOOK = "f01_depth_and_tokens"
ENCODER = "embedded:minilm-l6"  # the encoder whose post-LN blocks the encoder note explains
PAPER_AXIS = (0.89, 0.955)  # the range of the paper's Figure 1a axis (per-model coupling)
DRAWN_TILE_K = 10  # the tile chart draws this K (the paper's smallest): a 72 × 72 tile is too fine to read


def _need_a_prompt(v: Mapping[str, Any]) -> str | None:
    if v.get("n_prompts") == 0 and v.get("include_demo") is False:
        return "parameter 'n_prompts' is 0 and 'include_demo' is false: no prompt to measure"
    return None


def _tile_k_within_k(v: Mapping[str, Any]) -> str | None:
    if v["tile_k"] > max(v["k"]):
        top = max(v["k"])
        return (
            f"parameter 'tile_k' must be <= max(k) = {top}, got {v['tile_k']}: "
            f"lower it with the K values (-p tile_k={top}) or add a larger K to k"
        )
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
    n_prompts: int = param(5, integer(min=0))
    include_demo: bool = param(True, boolean)
    max_tokens: int = param(12, integer(min=3))  # context coupling: two tokens before the last
    k: list = param([10, 30, 50, 72], k_values)
    layers: list = param([], list_of(block, min_len=0))
    tile_layers: list = param([11, 12, 13, 14, 15, 16, 17, 18], list_of(block, min_len=2, max_len=12))
    tile_k: int = param(72, check_top_k)
    token_layer: int = param(15, block)
    how: str = param("offdiag", choice(*HOWS))
    init_seed: int = param(0, integer(min=0))
    method: str = param("exact", choice(*METHODS))
    last_block: str = param("final_norm", choice(*LAST_BLOCKS))


# --------------------------------------------------------------------------- the rules, fixed first
TILES_TRAINED, TILES_TWIN = 0.9, 0.1  # the tiles' yes: shares of tiles with a visible diagonal
RULES = {
    # depth: more coupled than the twin in (nearly) every block pair, at every K, by a clear margin
    # (the margin's 95% interval over prompts must clear 0.05 for a yes)
    "depth": Rule(yes="share_above >= 0.9 and excess >= 0.05", partly="share_above >= 0.5 and excess > 0"),
    # tiles: a visible diagonal (at least twice the chance share) in (nearly) every off-diagonal
    # tile, and in (almost) none of the twin's
    "tiles": Rule(
        yes=f"diagonal_trained >= {TILES_TRAINED} and diagonal_twin <= {TILES_TWIN}",
        partly="diagonal_trained > diagonal_twin",
    ),
    # token-wise self coupling: strong (>= 0.5) and beyond what random weights give; never even
    # partly when the trained model is at or below its twin
    # (self_excess: trained − twin, paired over prompts; a yes needs every interval clear)
    "tokens": Rule(
        yes="self_trained >= 0.5 and self_excess > 0",
        partly="self_trained >= 0.25 and self_excess > 0",
    ),
    # context coupling: present (>= 0.2), beyond the twin's, and less uniform across token pairs
    # than self coupling (sd_excess: context s.d. − self s.d.); never even partly at or below the twin
    "context": Rule(
        yes="context_trained >= 0.2 and context_excess > 0 and sd_excess > 0",
        partly="context_excess > 0 and (context_trained >= 0.2 or sd_excess > 0)",
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
        last_block=p.last_block, last_block_also=lb.beside(p.last_block),
    )  # fmt: skip


def _companion_jobs(p: Params) -> dict[str, list[Job]]:
    """The drawn model and its twin under each map of the last block that the chapter's own jobs
    do not hold (with the same tiles and token block): what "The last block" sets side by side.
    None under "block" or "final_norm", whose jobs measure the other map beside theirs
    (``lb.beside``); both measured maps under "excluded", which measures no last block."""
    if lb.beside(p.last_block) is not None:
        return {}
    s, texts, out = twin_settings(p), prompts(p), cache_dir("f01", p.method)
    return {
        c: with_check(tw.twin_jobs(p.model, texts, s.but(last_block=c), root=out), _check_fits, p=p)
        for c in lb.companions(p.last_block)
    }


def _check_fits(lm, *, p: Params, job: Job) -> None:
    """The block and K parameters against ``job``'s model loaded (``lm``; each job's check, before
    measuring; :func:`~coupling_utils.chapters.checks.check_blocks_and_k`): a
    :class:`ParameterError` naming the parameter, the model and its depth or width. The drawn
    model (``p.model``) also gets ``tile_layers`` and ``token_layer``."""
    model = job.labels["model"]
    blocks = {"layers": p.layers}
    if model == p.model:  # the tile window is measured too
        blocks.update(tile_layers=p.tile_layers, token_layer=[p.token_layer])
    fit = check_blocks_and_k(lm, model, blocks, p.k, p.last_block)
    measured = set(fit["layers"]) | set(fit.get("tile_layers", []))
    if p.layers and len(measured) < 2:
        raise ParameterError(
            f"parameter 'layers' names one block, {p.layers[0]}, and coupling compares blocks: name at "
            f"least two of the {int(lm.n_layers)} of {model}, or leave it empty (all blocks)"
        )


def jobs(p: Params) -> list[Job]:
    """The measurement plan: each model and its random-init twin (``twin_jobs``), the first model
    with its tiles, its token block and the other map of its last block measured beside (one more
    block, ``lb.beside``), the others without; under ``last_block="excluded"``, then the first
    model and its twin under each measured map. Each job checks the parameters against its loaded
    model (:func:`_check_fits`) before measuring."""
    s, texts = twin_settings(p), prompts(p)
    out: list[Job] = []
    for name in models(p):
        own = s if name == p.model else s.depth_only()
        out += with_check(tw.twin_jobs(name, texts, own, root=cache_dir("f01", p.method)), _check_fits, p=p)
    return out + [job for part in _companion_jobs(p).values() for job in part]


# --------------------------------------------------------------------------- the measurements, condensed
@dataclass(frozen=True)
class Results:
    """What the story reads from one run: every model measured beside its twin (``twins``; models
    left out in ``failures``), on ``prompts``; the properties condense them (each computed once)."""

    params: Params
    twins: tw.TwinSet
    prompts: dict[str, str]
    companions: dict[str, tw.TwinMeasurement] = dataclasses.field(default_factory=dict)

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
        """How diagonal the drawn model's off-diagonal tiles are, trained and twin, over every prompt
        and every K the tiles hold (``tile_contrast``)."""
        return tile_grid.tile_contrast(self.main.tiles, self.params.tile_k)

    @functools.cached_property
    def by_distance(self) -> pd.DataFrame:
        """Mean coupling against the distance between blocks, per weights and K."""
        return bd.coupling_by_distance(self.main.depthwise)

    @functools.cached_property
    def trend(self) -> pd.DataFrame:
        """Spearman's ρ of coupling with block distance; coupling of neighbours and farthest pair."""
        return bd.distance_trend(self.by_distance)

    @functools.cached_property
    def distance(self) -> dict:
        """What the distance words compare, trained at K = max(k), with 95% intervals over prompts
        (``distance_intervals``): ``spearman`` (absent with two blocks) and ``adjacent_excess``
        (the nearest pairs' coupling minus the per-model coupling)."""
        return bd.distance_intervals(self.main.depthwise, max(self.params.k), self.params.how)

    @functools.cached_property
    def per_model(self) -> pd.DataFrame:
        """One row per (model, K): trained, random init, trained − random (``summary_table``)."""
        return tw.summary_table(self.twins)

    @functools.cached_property
    def depth(self) -> dict[str, dict]:
        """Per model: the trained model against its twin across depth, over every K measured
        (``depth_contrast``: ``excess`` is the smallest gap, at ``excess_k``)."""
        p = self.params
        return {name: tw.depth_contrast(r, p.k, p.how) for name, r in self.twins.results.items()}

    @property
    def k_verdict(self) -> int:
        """The K the token-wise and context verdicts read: the largest measured, which the book's
        profiles set to its K/d (``analysis.k_policy.BOOK_K_OVER_D``) at the drawn model's width.
        The depth verdict reads every K (its ``excess`` is the smallest gap over them, at
        ``depth[model]["excess_k"]``), the tiles' rule every K from 3 to ``tile_k``."""
        return max(self.params.k)

    @functools.cached_property
    def token_values(self) -> dict:
        """Token-wise self and context coupling of the drawn model at :attr:`k_verdict`
        (``token_contrast``)."""
        return tw.token_contrast(self.main, self.k_verdict)

    @functools.cached_property
    def token_judged(self) -> dict:
        """:attr:`token_values` with what the token rules compare as intervals over prompts
        (``token_intervals``): the values the rules judge."""
        return self.token_values | tw.token_intervals(self.main, self.k_verdict)

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

    @property
    def maps(self) -> dict[str, tw.TwinMeasurement]:
        """The drawn model and its twin under each measured map of the last block ("block",
        "final_norm"): the chapter's own measurement and its companions."""
        own = {self.params.last_block: self.main} if self.params.last_block in lb.MEASURED_MAPS else {}
        return {**own, **self.companions}

    @functools.cached_property
    def last_block_lines(self) -> pd.DataFrame:
        """The last row and column of the drawn model's L × L matrix (K = max(k)) under both maps."""
        return lb.lines_side_by_side(lb.last_lines(self.maps, max(self.params.k)))

    @functools.cached_property
    def last_block_table(self) -> pd.DataFrame:
        """The drawn model's per-model coupling (K = max(k)) under every convention."""
        return lb.convention_table(self.maps, max(self.params.k), self.params.how)

    @functools.cached_property
    def last_block_values(self) -> dict[str, float]:
        """How far apart the conventions are on the drawn model (``lb.convention_summary``)."""
        return lb.convention_summary(self.maps, max(self.params.k), self.params.how)

    @functools.cached_property
    def other_verdicts(self) -> dict[str, dict[str, str | None]]:
        """``{convention: {row: verdict}}`` of the drawn model's rows (depth, tiles, tokens,
        context) under each convention but the chapter's (None: not measurable there)."""
        p, out = self.params, {}
        pairs = {**self.maps}
        if p.last_block != "excluded" and self.main.n_layers >= 3:
            pairs["excluded"] = lb.without_last_block(self.main, p.how)
        for convention, pair in pairs.items():
            if convention != p.last_block:
                twins = tw.TwinSet({p.model: pair}, self.twins.failures.iloc[:0])
                other = Results(dataclasses.replace(p, last_block=convention), twins, self.prompts)
                if other.main.tiles.equals(self.main.tiles):  # a tile window short of the last block
                    other.__dict__["tile_values"] = self.tile_values  # the same tiles: resampled once
                out[convention] = other.main_verdicts()
        return out

    def main_verdicts(self) -> dict[str, str | None]:
        """The verdicts of the drawn model's rows (None where this run cannot judge a row)."""
        p, out = self.params, {}
        judges = {
            "depth": lambda: RULES["depth"].judge(self.depth[p.model]),
            "tiles": lambda: RULES["tiles"].judge(self.tile_values),
            "tokens": lambda: RULES["tokens"].judge(self.token_judged),
            "context": lambda: RULES["context"].judge(self.token_judged),
        }
        for row, judge in judges.items():
            try:
                out[row] = judge()
            except ValueError:  # e.g. no off-diagonal tile or no token block left without the last block
                out[row] = None
        return out

    def _tokens(self) -> pd.DataFrame:
        """The drawn prompt's token-wise self coupling at :attr:`k_verdict`."""
        tok = self.main.tokenwise
        return tok[(tok.prompt == self.focus) & (tok["K"] == self.k_verdict)]

    def _context(self) -> pd.DataFrame:
        """The drawn prompt's context coupling at :attr:`k_verdict`, within the token block: the
        pairs of context Jacobians the context rule reads (``tw.context_pairs``; the output token's
        own Jacobian left out), with each input token against itself for the heatmap's grey diagonal."""
        ctx = self.main.context
        return tw.context_pairs(ctx[ctx.prompt == self.focus], self.k_verdict, diagonal=True)


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (``options``: how they run; default: failures recorded) and the
    chapter's :class:`Results`; the drawn model and its twin must be measured, under every map of
    the last block (a :class:`NotMeasured` names why not: a parameter its model does not fit is
    a ParameterError there); the other models may be left out."""
    planned, extra = jobs(p), _companion_jobs(p)
    done = collect(planned, options).results
    drawn = Collected([r for r in done if r.job.labels["model"] == p.model and not r.ok])
    if drawn.results:  # NotMeasured: its report says whether a parameter did not fit the model
        raise NotMeasured(
            f"{p.model}: the chapter's main model and its twin must be measured\n{drawn.report()}"
        )
    n_own = len(planned) - sum(len(part) for part in extra.values())
    twins = tw.twin_set(Collected(done[:n_own]), twin_settings(p), main=p.model)
    companions, at = {}, n_own
    beside = lb.beside(p.last_block)
    if beside is not None:  # the drawn model's own jobs hold the other map too
        mine = Collected([r.under(beside) for r in done[:n_own] if r.job.labels["model"] == p.model])
        s = twin_settings(p).but(last_block=beside, last_block_also=None)
        companions[beside] = tw.twin_set(mine, s, main=p.model).results[p.model]
    for convention, part in extra.items():  # the same model and twin: they must be measured too
        s = twin_settings(p).but(last_block=convention)
        got = tw.twin_set(Collected(done[at : at + len(part)]), s, main=p.model)
        companions[convention] = got.results[p.model]
        at += len(part)
    return Results(p, twins, prompts(p), companions)
