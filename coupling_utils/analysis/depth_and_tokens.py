"""A trained model beside its random-init twin: coupling across depth and tokens, side by side.

The paper's first finding is a contrast: block Jacobians of a trained model are coupled across
depth and tokens, those of the same architecture with random weights are not. :func:`measure_twins`
measures both with :func:`coupling_utils.measurement.measure` (what, as one :class:`TwinSettings`:
depth-wise coupling of the last token, raw tiles over a window of layers, token-wise self and
context coupling at one block) and returns the tables with a ``weights`` column ("trained" /
"random init"); :func:`measure_models` does it for many models, listing those that could not be
measured instead of stopping (:func:`twin_jobs` plans the jobs, :func:`twin_set` assembles what
:func:`coupling_utils.measurement.collect` gave). The helpers below
condense the tables for the figures (mean matrices, coupling against the distance between
blocks, token labels for axes) and into the numbers chapter f01's verdict rules judge
(:func:`depth_contrast`, :func:`token_contrast`; the tiles in
:mod:`coupling_utils.analysis.tile_grid`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis.block_range import check_block, check_blocks
from coupling_utils.analysis.verdicts import Interval
from coupling_utils.measurement import (
    Collected,
    Job,
    Loads,
    Options,
    Settings,
    collect,
    coupling_summary,
    plan,
)
from coupling_utils.measurement.jobs import WEIGHTS
from coupling_utils.measurement.tables import SCHEMAS as MEASURED
from coupling_utils.schemas import Schema, check_table

__all__ = [
    "WEIGHTS",
    "TwinSettings",
    "TwinMeasurement",
    "measure_twins",
    "measure_models",
    "TwinSet",
    "twin_jobs",
    "twin_set",
    "summary_table",
    "depth_contrast",
    "context_pairs",
    "token_contrast",
    "token_intervals",
    "mean_depthwise",
    "offdiag_mean",
    "label_tokens",
    "token_label",
]


@dataclass
class TwinMeasurement:
    """Tables of one model and its random-init twin (each with ``model`` and ``weights`` columns).

    ``depthwise``, ``tiles``, ``singular_values``: last token over the measured blocks;
    ``tokenwise``, ``context``: all tokens at block ``token_layer``; ``summary``: one row per
    (model, weights, K) with the scalar coupling; ``tokens``: prompt id -> token strings.
    """

    model: str
    n_layers: int
    d_model: int
    token_layer: int
    depthwise: pd.DataFrame
    tiles: pd.DataFrame
    singular_values: pd.DataFrame
    tokenwise: pd.DataFrame
    context: pd.DataFrame
    summary: pd.DataFrame
    tokens: dict[str, list[str]] = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)  # twins not measured, with the reason


@dataclass(frozen=True)
class TwinSettings:
    """What is measured on a model and on its twin, and how its per-model number is condensed.

    ``k``: one K or several; ``layers``: the blocks of the depth-wise coupling (None: all);
    ``tile_layers``: a window of blocks whose raw tiles are kept (added to ``layers``), cropped
    to ``tile_k`` (default min(k)); ``token_layer``: the block of token-wise self coupling (all
    tokens) and context coupling (output token: the last), None for none; ``how``: the block
    pairs of the per-model summary ("offdiag" or "adjacent"); ``dtype``, ``seed`` (the twin's
    random init), ``method``, ``max_tokens``, ``last_block`` (what the last block is: "block",
    "final_norm" or "excluded"), ``last_block_also`` (the last block once more under the other
    map, in the same run; ``Result.under`` reads it): as ``load_model`` and ``measure`` take them.
    """

    k: int | Sequence[int] = (10, 30, 50)
    layers: Sequence[int] | None = None
    tile_layers: Sequence[int] | None = None
    tile_k: int | None = None
    token_layer: int | None = None
    how: str = "offdiag"
    dtype: str = "float32"
    seed: int = 0
    method: str = "exact"
    max_tokens: int | None = None
    last_block: str = "block"
    last_block_also: str | None = None

    @property
    def ks(self) -> list[int]:
        """The K values, sorted, each once."""
        k = self.k
        return sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})

    @property
    def window(self) -> list[int] | None:
        """The tile window's blocks (None: no tiles kept)."""
        tiles = self.tile_layers
        return [int(l) for l in tiles] if tiles is not None and len(tiles) else None

    @property
    def crop(self) -> int | None:
        """The K of the kept tiles: ``tile_k``, or min(k) with a window and no ``tile_k``."""
        return min(self.ks) if self.window and self.tile_k is None else self.tile_k

    def but(self, **changes: Any) -> TwinSettings:
        """A copy with ``changes`` (e.g. ``settings.but(how="adjacent")``)."""
        return dataclasses.replace(self, **changes)

    def depth_only(self) -> TwinSettings:
        """Without the tile window, the token block and the second map of the last block: what the
        models not drawn get."""
        return self.but(tile_layers=None, token_layer=None, last_block_also=None)


def _twin_settings(settings: TwinSettings | None, fields: dict[str, Any], where: str) -> TwinSettings:
    """``settings``, or a :class:`TwinSettings` made of ``fields`` (one of the two)."""
    if settings is not None and fields:
        raise TypeError(f"{where}(): pass settings or its fields ({', '.join(fields)}), not both")
    if settings is not None:
        return settings
    known = {f.name for f in dataclasses.fields(TwinSettings)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(
            f"{where}() got unknown setting(s) {unknown}; settings: {', '.join(sorted(known))} "
            "(how it runs goes in options=Options(...))"
        )
    return TwinSettings(**fields)


def _check_twin(lm, *, model: str, layers, tile_layers, token_layer) -> None:
    """The blocks asked for exist in the loaded model, named in measure_twins' terms."""
    L = int(lm.n_layers)
    blocks = set(range(L)) if not layers else set(check_blocks("layers", layers, model, L, negative=True))
    blocks |= set(check_blocks("tile_layers", tile_layers or (), model, L, negative=True))
    if len(blocks) < 2:
        raise ValueError(f"depth-wise coupling needs at least two blocks, got layers={sorted(blocks)}")
    if token_layer is not None:
        check_block("token_layer", int(token_layer), model, L, negative=True)


def twin_jobs(
    model: str,
    prompts: Any,
    settings: TwinSettings | None = None,
    *,
    root: str | Path | None = None,
    **fields: Any,
) -> list[Job]:
    """The two jobs of :func:`measure_twins` (trained, random init), each with a "depth" and,
    with ``token_layer``, a "tokens" measurement; stored under ``root`` (None: nowhere; see
    :mod:`coupling_utils.measurement.jobs`). ``settings``: a :class:`TwinSettings`, or its fields
    as keyword arguments."""
    s = _twin_settings(settings, fields, "twin_jobs")
    ks, window, layers = s.ks, s.window, s.layers
    block_list = None if layers is None or not len(layers) else [int(l) for l in layers] + (window or [])
    # tiles are stored at K = max(k); a smaller tile_k is their top-left corner (the bases are
    # nested), so changing tile_k needs no new measurement
    common = dict(
        k=ks,
        method=s.method,
        max_tokens=s.max_tokens,
        last_block=s.last_block,
        last_block_also=s.last_block_also,
    )
    parts = {
        "depth": Settings(
            layers=block_list, tokens="last", tiles=max(ks) if window else None, tile_layers=window, **common
        )
    }
    if s.token_layer is not None:
        parts["tokens"] = Settings(layers=[int(s.token_layer)], tokens="all", context="last", **common)
    check = functools.partial(
        _check_twin, model=model, layers=layers, tile_layers=window, token_layer=s.token_layer
    )
    loads = Loads(weights=WEIGHTS, seed=s.seed, dtype=s.dtype)
    return plan([model], prompts, parts, loads=loads, root=root, check=check)


def measure_twins(
    model: str,
    prompts: Any,
    settings: TwinSettings | None = None,
    *,
    out: str | Path | None = None,
    options: Options | None = None,
    **fields: Any,
) -> TwinMeasurement:
    """Measure ``model`` and its random-init twin (``load_model(..., random_init=True, seed=seed)``).

    What is measured is one :class:`TwinSettings` (``settings``, or its fields as keyword
    arguments): depth-wise coupling of the last token over ``layers`` (default all) for K in
    ``k``; with ``tile_layers`` (added to ``layers``) also the raw ``tile_k`` × ``tile_k`` tiles
    of that window (measured at K = max(k) and cropped); with ``token_layer`` also token-wise
    self coupling (all tokens) and context coupling (output token: the last) at that block.
    ``out``: a cache directory; measurements are stored under
    ``out/<model>/main/<weights>/<part>-<key>`` and reused without loading the model
    (:func:`twin_jobs`, :func:`coupling_utils.measurement.collect`). ``options``: how the jobs
    run (:class:`~coupling_utils.measurement.Options`; default: the first failure raises); with
    ``on_error="record"`` a twin that cannot be loaded or measured is listed in ``failures``.
    """
    s = _twin_settings(settings, fields, "measure_twins")
    if s.crop is not None and not 1 <= int(s.crop) <= max(s.ks):
        raise ValueError(f"tile_k={s.crop} must be between 1 and max(k) = {max(s.ks)}")
    jobs = twin_jobs(model, prompts, s, root=out)
    done = collect(jobs, options or Options(on_error="raise"))
    if not done.ok:
        raise RuntimeError(f"{model}: no twin could be measured\n{done.report()}")
    return _assemble(model, done, s)


def _assemble(model: str, done: Collected, s: TwinSettings) -> TwinMeasurement:
    """The tables of :class:`TwinMeasurement` from the collected jobs of one model."""
    names = ("depthwise", "tiles", "singular_values", "tokenwise", "context")
    frames: dict[str, list[pd.DataFrame]] = {n: [] for n in names}
    summary, tokens, prov = [], {}, {}
    for r in done.ok:
        m, weights = r.measurements["depth"], r.job.weights
        frames["depthwise"].append(r.labelled("depthwise", "depth"))
        tiles = r.labelled("tiles", "depth")
        if s.window:
            tiles = tiles[(tiles["row"] < s.crop) & (tiles["col"] < s.crop)].assign(K=s.crop)
        frames["tiles"].append(tiles)
        frames["singular_values"].append(r.labelled("singular_values", "depth"))
        for K in s.ks:
            summary.append(
                {**r.job.labels, "K": K, "coupling": coupling_summary(m.depthwise, how=s.how, k=K)}
            )
        if "tokens" in r.measurements:
            frames["tokenwise"].append(r.labelled("tokenwise", "tokens"))
            frames["context"].append(r.labelled("context", "tokens"))
        if weights == "trained":
            for entry, ids in zip(m.provenance["prompts"], m.prompts["input_ids"]):
                tokens[str(entry["prompt"])] = entry.get("tokens") or [str(int(i)) for i in ids]
        prov[weights] = m.provenance
    tables = {n: pd.concat(fs, ignore_index=True) if fs else pd.DataFrame() for n, fs in frames.items()}
    facts = done.ok[0].model
    L = int(facts["n_layers"])
    return TwinMeasurement(
        model,
        L,
        int(facts["d_model"]),
        s.token_layer if s.token_layer is None else int(s.token_layer) % L,
        summary=pd.DataFrame(summary),
        tokens=tokens,
        provenance=prov,
        failures=done.failures,
        **tables,
    )


@dataclass
class TwinSet:
    """Several models, each beside its twin (:func:`measure_models`).

    ``results``: model -> :class:`TwinMeasurement`, only models whose trained weights *and* twin
    were measured (a contrast needs both); ``failures``: one row per model left out (``model``,
    ``weights``, ``error``, ``message``), so a chapter can say which are missing and why.
    """

    results: dict[str, TwinMeasurement]
    failures: pd.DataFrame

    def report(self) -> str:
        """One line per model left out, or a line saying none was."""
        if self.failures.empty:
            n = len(self.results)
            return (
                "the one model measured, beside its twin"
                if n == 1
                else f"all {n} models measured, each beside its twin"
            )
        lines = [f"{len(self.results)} model{'' if len(self.results) == 1 else 's'} measured; left out:"]
        for model, rows in self.failures.groupby("model", sort=False):
            reasons = {}
            for r in rows.itertuples():
                first = re.split(r"(?<=[.;:])\s", str(r.message).strip(), maxsplit=1)[0][:160]
                reasons.setdefault(f"{r.error}: {first}", []).append(str(r.weights))
            why = "; ".join(f"{' and '.join(w)}: {reason}" for reason, w in reasons.items())
            lines.append(f"  - {model} ({why})")
        return "\n".join(lines)


def measure_models(
    models: Sequence[str],
    prompts: Any,
    settings: TwinSettings | None = None,
    *,
    main: str | None = None,
    out: str | Path | None = None,
    options: Options | None = None,
    **fields: Any,
) -> TwinSet:
    """:func:`measure_twins` for every model in ``models`` (duplicates once), never stopping at one.

    ``main`` (default: the first model) also gets the tile window and the token-wise
    measurements; it must be measured (a RuntimeError names why not). Any other model whose
    trained weights or twin cannot be loaded or measured (gated, missing from the cache, out of
    memory, blocks the settings do not fit) is left out and listed in ``failures``.
    ``options``: how the jobs run (default :class:`~coupling_utils.measurement.Options`: failures
    recorded).
    """
    s = _twin_settings(settings, fields, "measure_models")
    names = list(dict.fromkeys(models))
    if not names:
        raise ValueError("models is empty: name at least one model to measure beside its twin")
    main = names[0] if main is None else main
    if main not in names:
        names.insert(0, main)
    jobs = []
    for name in names:
        jobs += twin_jobs(name, prompts, s if name == main else s.depth_only(), root=out)
    return twin_set(collect(jobs, options), s, main=main)


def twin_set(done: Collected, settings: TwinSettings, *, main: str) -> TwinSet:
    """The :class:`TwinSet` of collected twin jobs (:func:`twin_jobs` of each model, ``main``'s
    with the tile window and token block of ``settings``, the others' without).

    A model is kept when both its trained weights and its twin were measured; ``main`` must be
    (a RuntimeError names why not); any other is listed in ``failures``.
    """
    by_model: dict[str, list] = {}
    for r in done.results:
        by_model.setdefault(r.job.labels["model"], []).append(r)
    if main not in by_model:
        raise ValueError(f"no job of the main model {main!r} among the collected ones: {sorted(by_model)}")
    results, failures = {}, []
    for name, rs in by_model.items():
        one = Collected(rs)
        if len(one.ok) == len(WEIGHTS):
            own = settings if name == main else settings.depth_only()
            results[name] = _assemble(name, one, own)
            continue
        if name == main:
            raise RuntimeError(
                f"{name}: the chapter's main model and its twin must be measured\n{one.report()}"
            )
        fail = one.failures.assign(model=name)
        failures.append(fail[["model", "weights", "error", "message"]])
    columns = ["model", "weights", "error", "message"]
    table = pd.concat(failures, ignore_index=True) if failures else pd.DataFrame(columns=columns)
    return TwinSet(results, table)


def summary_table(results: dict[str, TwinMeasurement] | TwinSet) -> pd.DataFrame:
    """One row per (model, K): the per-model coupling of the trained weights, of the twin, and
    ``trained − random`` (columns model, K, trained, random init, trained − random)."""
    if isinstance(results, TwinSet):
        results = results.results
    table = pd.concat([r.summary for r in results.values()], ignore_index=True)
    wide = table.pivot_table(index=["model", "K"], columns="weights", values="coupling", sort=False)
    wide = wide.reindex(columns=list(WEIGHTS)).reset_index()
    wide.columns.name = None
    wide["trained − random"] = wide["trained"] - wide["random init"]
    return wide


# --------------------------------------------------------------------------- condensing
def mean_depthwise(depthwise: pd.DataFrame) -> pd.DataFrame:
    """Depth-wise matrices averaged over prompts and tokens, per (model, weights, K).

    ``coupling`` is the mean of 1 − m²; ``m`` is the root mean square of m, so that
    ``1 − m²`` of the result equals that mean coupling exactly (figures draw 1 − m²).
    """
    check_table(depthwise, MEASURED["depthwise"].need("K", "layer_i", "layer_j", "m", "coupling"))
    keys = [c for c in ("model", "weights") if c in depthwise.columns] + ["K", "layer_i", "layer_j"]
    out = depthwise.assign(m2=depthwise["m"] ** 2).groupby(keys, as_index=False)[["m2", "coupling"]].mean()
    out["m"] = np.sqrt(out.pop("m2"))
    return out


def offdiag_mean(
    df: pd.DataFrame, i: str, j: str, value: str = "coupling", by: str = "weights", *, how: str = "mean"
) -> pd.Series:
    """Mean (or, with ``how="std"``, the standard deviation) of ``value`` over rows with
    ``i != j`` (e.g. pairs of different tokens), per ``by``: a Series."""
    check_table(df, Schema("the table", dict.fromkeys((i, j, value, by), "any")))
    if how not in ("mean", "std"):
        raise ValueError(f"how must be 'mean' or 'std', got {how!r}")
    sub = df[df[i] != df[j]]
    if sub.empty:
        raise ValueError(f"no rows with {i} != {j}: the prompt needs at least two tokens")
    return sub.groupby(by, sort=False)[value].agg(how)


def label_tokens(df: pd.DataFrame, tokens: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """Replace token positions in ``columns`` by labels ``"03 Paris"`` (position, then the token
    text), which sort in position order on a chart axis."""
    width = len(str(max(len(tokens) - 1, 0)))
    # the vocabulary's byte-level BPE and SentencePiece markers read back as a space and a newline
    text = [str(s).replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n") for s in tokens]
    labels = [f"{t:0{width}d} {token_label(s)}" for t, s in enumerate(text)]
    check_table(df, Schema("the table", dict.fromkeys(columns, "any")))
    out = df.copy()
    for c in columns:
        pos = out[c].to_numpy()
        if len(pos) and (pos.max() >= len(tokens) or pos.min() < 0):
            raise ValueError(f"column {c!r} has positions outside the {len(tokens)} tokens given")
        out[c] = [labels[p] for p in pos]
    return out


def token_label(text: str) -> str:
    """A token's text as the book shows it in labels and tables: its spaces visible as "␣" (" is"
    -> "␣is"), a newline as "⏎"; a token still blank is shown by its repr."""
    s = str(text).replace(" ", "␣").replace("\n", "⏎")
    return s if s.strip() else repr(s)


# --------------------------------------------------------------------------- the numbers f01 judges
def _pairs(df: pd.DataFrame, how: str) -> pd.DataFrame:
    """The block pairs a per-model summary averages: all different blocks, or neighbours."""
    if how == "offdiag":
        return df[df["layer_i"] != df["layer_j"]]
    if how == "adjacent":
        layers = np.sort(np.unique(np.concatenate([df["layer_i"].to_numpy(), df["layer_j"].to_numpy()])))
        pos = {int(l): i for i, l in enumerate(layers)}
        return df[(df["layer_i"].map(pos) - df["layer_j"].map(pos)).abs() == 1]
    raise ValueError(f"how must be 'offdiag' or 'adjacent', got {how!r}")


def depth_contrast(pair: TwinMeasurement, ks: Sequence[int] | None = None, how: str = "offdiag") -> dict:
    """The trained model against its twin across depth, over the K values ``ks`` (default all).

    ``trained``, ``twin``: the per-model coupling (mean 1 − m² over the ``how`` block pairs and
    prompts) at the largest K; ``excess``: the smallest ``trained − twin`` over the K values, an
    :class:`~coupling_utils.analysis.verdicts.Interval` (bootstrap over prompts), and ``excess_k``
    the K at which it falls (the K that decides a rule on ``excess``);
    ``share_above``: the share of (K, block pair) cells of the prompt-mean matrices in which the
    trained model is more coupled than its twin (1: in every pair, the paper's "every tile").
    """
    check_table(pair.depthwise, MEASURED["depthwise"].need("weights", "K", "layer_i", "layer_j", "coupling"))
    ks = sorted({int(x) for x in (ks if ks is not None else pair.depthwise["K"].unique())})
    wide = summary_table({pair.model: pair})
    wide = wide[wide["K"].isin(ks)]
    mats = _pairs(mean_depthwise(pair.depthwise), how)
    mats = mats[mats["K"].isin(ks)].pivot_table(
        index=["K", "layer_i", "layer_j"], columns="weights", values="coupling"
    )
    top = wide[wide["K"] == max(ks)].iloc[0]
    smallest = wide.sort_values(["trained − random", "K"], kind="stable").iloc[0]  # ties: the smaller K
    excess = float(smallest["trained − random"])
    return {
        "trained": float(top["trained"]),
        "twin": float(top["random init"]),
        "excess": _excess_interval(pair.depthwise, ks, how, excess),
        "excess_k": int(smallest["K"]),
        "share_above": float((mats["trained"] > mats["random init"]).mean()),
    }


def _smallest_mean(columns: Mapping) -> dict[str, np.ndarray]:
    """The smallest, over K, of the prompt-mean excess, on every resample at once (``columns``:
    K -> ``[n_resamples, n]``): ``d.mean().min()`` of the resampled table, in its bits (each
    column of a table made from a dict of Series is a block of its own: a pairwise sum)."""
    from coupling_utils.analysis.stats import resampled_means

    return {"statistic": np.min(np.stack([resampled_means(a, "pairwise") for a in columns.values()]), axis=0)}


def _excess_interval(depthwise: pd.DataFrame, ks: Sequence[int], how: str, excess: float) -> Interval:
    """``excess`` (the smallest trained − twin over K) with a 95% bootstrap interval over prompts."""
    from coupling_utils.analysis.stats import bootstrap_ci

    cells = _pairs(depthwise[depthwise["K"].isin(ks)], how)
    per = cells.pivot_table(index="prompt", columns=["K", "weights"], values="coupling", aggfunc="mean")
    if "prompt" not in depthwise or per.shape[0] < 2:
        return Interval(excess, -np.inf, np.inf, over="1 prompt")  # nothing to resample
    diff = pd.DataFrame({k: per[(k, "trained")] - per[(k, "random init")] for k in ks}).dropna()
    ci = bootstrap_ci(diff, _smallest_mean, seed=0, vectorized=True).iloc[0]
    lo, hi = min(float(ci["ci_low"]), excess), max(float(ci["ci_high"]), excess)
    return Interval(excess, lo, hi, over=f"{len(diff)} prompts")


def context_pairs(context: pd.DataFrame, k: int, *, diagonal: bool = False) -> pd.DataFrame:
    """The rows of a ``context`` table that compare two context Jacobians at K = ``k``: the same
    block, two different input tokens, neither of them the output token (with ``diagonal``, also
    each of those input tokens with itself, m = 0, which a heatmap greys).

    The measured table holds every input token t1 whose Jacobian ``J_{t1 t2}`` is not zero, the
    output token t2 itself included; ``J_{t2 t2}`` is that token's own (self) Jacobian, so a pair
    with t1 = t2 or t1' = t2 compares self with context, not context with context (the paper's
    context coupling compares ``J_{t1 t2}`` with ``J_{t1' t2}``, t1, t1' ≠ t2)."""
    need = ("output_token", "K", "layer_i", "layer_j", "token_i", "token_j")
    c = check_table(context, MEASURED["context"].need(*need))
    keep = (c["K"] == k) & (c["layer_i"] == c["layer_j"]) & (c["token_i"] != c["output_token"])
    keep &= c["token_j"] != c["output_token"]
    return c[keep if diagonal else keep & (c["token_i"] != c["token_j"])]


def token_contrast(pair: TwinMeasurement, k: int) -> dict:
    """Token-wise self and context coupling at block ``pair.token_layer``, K = ``k``.

    Means and standard deviations of 1 − m² over pairs of different tokens (all prompts), for
    the trained model (``self_trained``, ``self_sd``, ``context_trained``, ``context_sd``) and
    its twin (``self_twin``, ``context_twin``). Context coupling compares the Jacobians of the
    last output token with respect to two different earlier input tokens, at the same block
    (:func:`context_pairs`: its own Jacobian left out).
    """
    if pair.tokenwise.empty:
        raise ValueError(f"{pair.model} was measured without token_layer: no token-wise tables")
    tok = pair.tokenwise[pair.tokenwise["K"] == k]
    ctx = context_pairs(pair.context, k)
    if ctx.empty:
        raise ValueError(
            f"{pair.model}: no two context Jacobians to compare at K = {k}: context coupling needs two "
            "input tokens before the output token (prompts of at least 3 tokens)"
        )
    self_mean = offdiag_mean(tok, "token_i", "token_j")
    self_sd = offdiag_mean(tok, "token_i", "token_j", how="std")
    ctx_mean = offdiag_mean(ctx, "token_i", "token_j")
    ctx_sd = offdiag_mean(ctx, "token_i", "token_j", how="std")
    return {
        "self_trained": float(self_mean.get("trained", np.nan)),
        "self_twin": float(self_mean.get("random init", np.nan)),
        "self_sd": float(self_sd.get("trained", np.nan)),
        "context_trained": float(ctx_mean.get("trained", np.nan)),
        "context_twin": float(ctx_mean.get("random init", np.nan)),
        "context_sd": float(ctx_sd.get("trained", np.nan)),
    }


def _pooled(df: pd.DataFrame) -> pd.DataFrame:
    """Per prompt and weights: the sum, sum of squares and count of ``coupling`` over pairs of
    different tokens (what a pooled mean and standard deviation are made of)."""
    sub = df[df["token_i"] != df["token_j"]]
    g = sub.assign(sq=sub["coupling"] ** 2).groupby(["prompt", "weights"])
    parts = {"sum": g["coupling"].sum(), "sq": g["sq"].sum(), "n": g["coupling"].count()}
    return pd.concat(parts, axis=1).unstack("weights")


def token_intervals(pair: TwinMeasurement, k: int, *, n_resamples: int = 1000) -> dict[str, Interval]:
    """What the token rules compare, with 95% intervals over prompts (a prompt resampled with all
    its token pairs, trained and twin together): ``self_trained`` and ``context_trained`` (as
    :func:`token_contrast`; context: :func:`context_pairs`), the paired differences
    ``self_excess`` and ``context_excess`` (trained − twin) and ``sd_excess`` (context s.d. − self
    s.d., trained). One prompt gives unbounded intervals (nothing to resample)."""
    from coupling_utils.analysis.stats import bootstrap_intervals, resampled_sums

    tok = pair.tokenwise[pair.tokenwise["K"] == k]
    ctx = context_pairs(pair.context, k)
    wide = pd.concat({"self": _pooled(tok), "context": _pooled(ctx)}, axis=1).fillna(0.0)

    def values(columns) -> dict[str, np.ndarray]:  # every resample at once: column -> [R, n]
        t = {c: resampled_sums(a, "left_to_right") for c, a in columns.items()}  # as sample.sum() adds

        def mean(part: str, w: str) -> np.ndarray:
            return t[(part, "sum", w)] / t[(part, "n", w)]

        def sd(part: str, w: str) -> np.ndarray:
            n, total = t[(part, "n", w)], t[(part, "sum", w)]
            var = (t[(part, "sq", w)] - total**2 / n) / (n - 1)
            return np.sqrt(np.where(var > 0.0, var, 0.0))  # max(0, var), a NaN taken as 0 as max() does

        trained, twin = WEIGHTS
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "self_trained": mean("self", trained),
                "context_trained": mean("context", trained),
                "self_excess": mean("self", trained) - mean("self", twin),
                "context_excess": mean("context", trained) - mean("context", twin),
                "sd_excess": sd("context", trained) - sd("self", trained),
            }

    return bootstrap_intervals(wide, values, "prompt", n_resamples=n_resamples, vectorized=True)
