"""The scale question: which per-model number could be the paper's "coupling"?

The paper condenses each model's coupling matrices into one number but does not say how. Its
Fig. 1a puts 28 LLMs between about 0.89 and 0.955; its Fig. 1b draws Pythia's "normalized
coupling" between about 0.06 and 0.17. This book's per-model number (mean ``1 − m_K²`` over
pairs of different blocks, last token, 'norm' denominator) gives SmolLM2-135M about 0.08 at
K = 50: Fig. 1b's scale, not Fig. 1a's. This module computes every candidate aggregation
(:data:`CANDIDATE_COLUMNS`) on models and their random-init twins and says which candidates
land on each figure's scale *and* separate a trained model from its twin.

One :func:`~coupling_utils.measurement.measure` per model and twin (:func:`scale_jobs`: all
tokens, every K, the 'norm' metric; stored, so a rerun loads no model; :func:`measure_scale`
makes them, :func:`scale_summary` condenses their results) gives every candidate:

- ``view``: "depth" compares one token's Jacobians across blocks (the depth-wise table);
  "tokens" compares the Jacobians of different tokens within a block (the token-wise table);
- ``K``: the measured K values;
- ``denominator``: "norm" (‖s_K‖₂, the metric as measured) or "trace" (Σ s_K). Both divide the
  same numerator by a function of J1's own top-K singular values, so
  ``m_trace = m_norm · ‖s_K‖₂ / Σ s_K`` exactly, from the stored singular values;
- ``form``: "1 - m" or "1 - m²";
- ``pairs``: "all" pairs of different blocks (tokens) or "adjacent" ones only;
- ``ends``: "with" or "without" the first and last block (both ends are atypical, and what the
  last block is depends on the ``last_block`` setting the models were measured with: the block
  alone, or with the final norm as the authors' code measured it; "without" does not depend on
  it);
- ``tokens``: "last" (the last token, as in the paper; in the token view the pairs that
  involve it) or "all".

Within a prompt a candidate is the mean over its pairs (and tokens or blocks); prompts then
count equally, as in :func:`~coupling_utils.measurement.coupling_summary`.
:func:`axis_rule` states when a candidate is on a figure's scale and separates trained from
twin; :func:`judge` applies it to every candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis.verdicts import Rule
from coupling_utils.engine.metric import NORMALIZATIONS
from coupling_utils.measurement import (
    Collected,
    Job,
    Loads,
    Measurement,
    Options,
    Result,
    Settings,
    collect,
    plan,
)
from coupling_utils.measurement.jobs import WEIGHTS

__all__ = [
    "AXES",
    "CANDIDATE_COLUMNS",
    "VIEWS",
    "DENOMINATORS",
    "FORMS",
    "PAIRS",
    "ENDS",
    "TOKENS",
    "BOOK_CHOICE",
    "ScaleMeasurement",
    "scale_jobs",
    "measure_scale",
    "scale_summary",
    "candidates",
    "trace_factor",
    "axis_window",
    "axis_rule",
    "axis_rules",
    "judge",
    "book_choice",
    "compatible",
    "closest_miss",
    "candidate_label",
    "scale_chart",
]

AXES = {"Fig. 1a": (0.89, 0.955), "Fig. 1b": (0.06, 0.17)}
"""The ranges of the paper's per-model coupling axes (read from the published figures)."""

VIEWS = ("depth", "tokens")
DENOMINATORS = NORMALIZATIONS  # the metric's own: the candidates' denominators
FORMS = ("1 - m", "1 - m²")
PAIRS = ("all", "adjacent")
ENDS = ("with", "without")
TOKENS = ("last", "all")
CANDIDATE_COLUMNS = ["view", "K", "denominator", "form", "pairs", "ends", "tokens"]
BOOK_CHOICE = {
    "view": "depth",
    "denominator": "norm",
    "form": "1 - m²",
    "pairs": "all",
    "ends": "with",
    "tokens": "last",
}
"""The aggregation the other chapters use (``how="offdiag"``, ``tokens="last"``; any K)."""


# --------------------------------------------------------------------------- measuring
def scale_jobs(
    models: Sequence[Any] | Mapping[str, Any],
    prompts,
    *,
    k: Sequence[int] | Mapping[str, Sequence[int]] = (10, 30, 50),
    loads: Loads | None = None,
    root: str | Path | None = None,
    settings: Settings | None = None,
):
    """Two jobs per model (trained, random init), stored under ``root`` (None: nowhere): all
    tokens, the K values ``k`` (or ``{model name: K values}`` for models narrower than the largest
    K), the 'norm' metric. ``loads``: the dtype and the random init's ``seed``
    (:class:`~coupling_utils.measurement.Loads`, its weights both of ``WEIGHTS``, one revision;
    default float32, seed 0).
    ``settings``: the measurement's other settings (``method``, ``max_tokens``, ``last_block``;
    default ``Settings()``); its K and tokens are replaced by the scale question's."""
    loads = Loads(weights=WEIGHTS) if loads is None else loads
    if loads.weights is None or tuple(loads.weights) != WEIGHTS or loads.revisions is not None:
        raise ValueError(
            "the scale question measures each model once beside its random-init twin: loads needs "
            f"weights={WEIGHTS} and no revisions, got weights={loads.weights!r}, "
            f"revisions={loads.revisions!r}"
        )
    per_model = isinstance(k, Mapping)
    ks = sorted({int(x) for x in (next(iter(k.values()), ()) if per_model else k)})
    if not ks:
        raise ValueError("k names no K; give K values such as (10, 30, 50)")
    base = settings if settings is not None else Settings()
    if (base.normalize, base.p, base.orientation) != ("norm", 2, "ujv"):
        raise ValueError(
            "the scale question's candidates are computed from the 'norm' metric (p = 2, 'ujv'); "
            f"got normalize={base.normalize!r}, p={base.p}, orientation={base.orientation!r}"
        )
    settings = dataclasses.replace(base, k=tuple(ks), tokens="all")
    jobs = plan(models, prompts, settings, loads=loads, root=root)
    if not per_model:
        return jobs
    missing = sorted({j.labels["model"] for j in jobs} - set(k))
    if missing:
        raise ValueError(f"k gives no K values for {missing}")
    return [
        dataclasses.replace(
            j,
            settings={
                "measure": dataclasses.replace(settings, k=tuple(int(x) for x in k[j.labels["model"]]))
            },
        )
        for j in jobs
    ]


@dataclass
class ScaleMeasurement:
    """Every candidate of every model and twin, and what could not be measured.

    ``values``: one row per (model, weights, candidate): :data:`CANDIDATE_COLUMNS`, ``value``
    (mean over prompts), ``sd`` (over prompts), ``n_prompts``; ``models``: one row per model
    and weights with ``n_layers``, ``d_model``, ``tokens`` (mean prompt length), ``seconds``,
    ``cached``; ``failures``: the jobs that are missing, with the reason.
    """

    values: pd.DataFrame
    models: pd.DataFrame
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)

    def report(self) -> str:
        if self.failures.empty:
            return "every model and twin measured"
        return "\n".join(f"missing {r.job}: {r.error}: {r.message}" for r in self.failures.itertuples())


def measure_scale(
    jobs: Sequence[Job], *, options: Options | None = None, echo: Callable[[str], None] | None = None
) -> ScaleMeasurement:
    """Measure :func:`scale_jobs`' jobs (each model and its random-init twin, once) and compute
    every candidate aggregation (:func:`scale_summary`). ``options``: how the jobs run
    (:class:`~coupling_utils.measurement.Options`); with ``on_error="record"`` (the default) a
    model that cannot be loaded or measured is listed in ``failures`` and the others still run.
    ``echo(line)``: one line per job as it finishes."""

    def say(r: Result) -> None:
        echo(_line(r))

    got = collect(jobs, options, callback=None if echo is None else say)
    return scale_summary(got.results)


def scale_summary(results: Sequence[Result]) -> ScaleMeasurement:
    """Every candidate (:func:`candidates`) of every measured job of :func:`scale_jobs`, the
    models' facts, and the missing jobs with their reasons (a chapter that collects these jobs
    with others condenses its own results here)."""
    values, facts = [], []
    for r in results:
        if not r.ok:
            continue
        labels = {"model": r.job.labels["model"], "weights": r.job.labels["weights"]}
        m = r.measurements["measure"]
        values.append(candidates(m).assign(**labels))
        info = r.model
        facts.append(
            {
                **labels,
                "n_layers": info.get("n_layers"),
                "d_model": info.get("d_model"),
                "tokens": float(m.prompts["n_tokens"].mean()),
                "seconds": r.seconds,
                "cached": not r.loaded,
            }
        )
    columns = ["model", "weights", *CANDIDATE_COLUMNS, "value", "sd", "n_prompts"]
    table = pd.concat(values, ignore_index=True) if values else pd.DataFrame(columns=columns)
    return ScaleMeasurement(table[columns], pd.DataFrame(facts), Collected(list(results)).failures)


def _line(r: Result) -> str:
    """One readable line about a job of :func:`scale_jobs`: what it measured, or why it failed."""
    name = f"{r.job.labels['model']} ({r.job.labels['weights']})"
    if not r.ok:
        return f"{name}: failed: {r.error}: {r.message}"
    n = len(r.measurements["measure"].prompts)
    return f"{name}: {n} prompt(s), {r.seconds:.1f} s" + (" (cached)" if not r.loaded else "")


# --------------------------------------------------------------------------- candidates
def trace_factor(singular_values: pd.DataFrame, ks: Sequence[int]) -> pd.DataFrame:
    """``‖s_K‖₂ / Σ s_K`` per (prompt, token, layer, K): what turns m_norm into m_trace.

    ``singular_values``: measure()'s table (``prompt, token, layer, rank, value``), holding at
    least max(K) values per Jacobian.
    """
    sv = singular_values.sort_values(["prompt", "token", "layer", "rank"])
    have = int(sv["rank"].max()) if len(sv) else 0
    if have < max(ks):
        raise ValueError(
            f"the singular_values table holds {have} values per Jacobian, fewer than K = {max(ks)}; "
            "measure with n_singular >= max(k) (the default)"
        )
    out = []
    for k in ks:
        top = sv[sv["rank"] <= k]
        g = top.groupby(["prompt", "token", "layer"], sort=False)["value"]
        l2 = g.apply(lambda s: float(np.sqrt(np.sum(np.square(s.to_numpy())))))
        total = g.sum()
        out.append((l2 / total).rename("factor").reset_index().assign(K=int(k)))
    return pd.concat(out, ignore_index=True)


def _forms(m: pd.Series) -> dict[str, pd.Series]:
    return {"1 - m": 1 - m, "1 - m²": 1 - m**2}


def _per_prompt(df: pd.DataFrame, value: pd.Series) -> pd.Series:
    """Mean of ``value`` within each prompt (over pairs and tokens or blocks)."""
    return value.groupby(df["prompt"].to_numpy()).mean()


def candidates(m: Measurement, *, per_prompt: bool = False) -> pd.DataFrame:
    """Every candidate aggregation of one measurement (measured with tokens="all", 'norm', p = 2).

    Returns one row per candidate (:data:`CANDIDATE_COLUMNS`) with ``value`` (mean over prompts),
    ``sd`` (over prompts) and ``n_prompts``; with ``per_prompt=True``, one row per candidate and
    prompt (``prompt``, ``value``). A candidate that the model cannot have (no adjacent pairs
    without the end blocks of a 3-block model, a K above the width) is left out.
    """
    settings = m.provenance.get("settings", {})
    if settings.get("normalize", "norm") != "norm" or float(settings.get("p", 2)) != 2:
        raise ValueError(
            "candidates() derives the 'trace' denominator from the 'norm' metric with p = 2; "
            f"this measurement used normalize={settings.get('normalize')!r}, p={settings.get('p')!r}"
        )
    dw, tw = m.depthwise, m.tokenwise
    if dw.empty:
        raise ValueError("the measurement has no depth-wise table (measure at least two blocks)")
    ks = sorted(int(k) for k in dw["K"].unique())
    factor = trace_factor(m.singular_values, ks)
    layers = sorted(set(dw["layer_i"]) | set(dw["layer_j"]))
    ends = {layers[0], layers[-1]}
    last = m.prompts.set_index("prompt")["n_tokens"].astype(int) - 1  # per prompt
    rows = []
    # depth view: rows (prompt, token, K, layer_i, layer_j); J1 = layer_i at that token
    d = dw.merge(
        factor.rename(columns={"layer": "layer_i"}), on=["prompt", "token", "layer_i", "K"], how="left"
    )
    pos = {layer: i for i, layer in enumerate(layers)}
    d_gap = (d["layer_i"].map(pos) - d["layer_j"].map(pos)).abs()
    d_last = d["token"] == d["prompt"].map(last)
    d_end = d["layer_i"].isin(ends) | d["layer_j"].isin(ends)
    rows += _view(d, "depth", d_gap, d_last, d_end, ks)
    if not tw.empty:
        t = tw.merge(
            factor.rename(columns={"token": "token_i"}), on=["prompt", "token_i", "layer", "K"], how="left"
        )
        t_gap = (t["token_i"] - t["token_j"]).abs()
        t_last = (t["token_i"] == t["prompt"].map(last)) | (t["token_j"] == t["prompt"].map(last))
        t_end = t["layer"].isin(ends)
        rows += _view(t, "tokens", t_gap, t_last, t_end, ks)
    table = pd.DataFrame(rows)
    if per_prompt:
        return table[[*CANDIDATE_COLUMNS, "prompt", "value"]]
    g = table.groupby(CANDIDATE_COLUMNS, sort=False)["value"]
    out = pd.DataFrame({"value": g.mean(), "sd": g.std(ddof=1), "n_prompts": g.size()}).reset_index()
    return out[[*CANDIDATE_COLUMNS, "value", "sd", "n_prompts"]]


def _view(df, view, gap, is_last, at_end, ks) -> list[dict]:
    if df["factor"].isna().any():
        raise ValueError("some Jacobians of the coupling table have no singular values stored")
    rows = []
    for k, den, pairs, ends, tokens in product(ks, DENOMINATORS, PAIRS, ENDS, TOKENS):
        sel = (df["K"] == k) & (gap > 0)
        if pairs == "adjacent":
            sel &= gap == 1
        if ends == "without":
            sel &= ~at_end
        if tokens == "last":
            sel &= is_last
        part = df[sel]
        if part.empty:
            continue
        m = part["m"] * (part["factor"] if den == "trace" else 1.0)
        for form, v in _forms(m).items():
            for prompt, value in _per_prompt(part, v).items():
                rows.append(
                    {
                        "view": view,
                        "K": int(k),
                        "denominator": den,
                        "form": form,
                        "pairs": pairs,
                        "ends": ends,
                        "tokens": tokens,
                        "prompt": prompt,
                        "value": float(value),
                    }
                )
    return rows


# --------------------------------------------------------------------------- judging
def axis_window(axis: tuple[float, float], margin: float = 0.5) -> tuple[float, float]:
    """An axis range ``(lo, hi)`` widened by ``margin`` × its width on each side."""
    lo, hi = (float(x) for x in axis)
    if not hi > lo:
        raise ValueError(f"an axis range needs lo < hi, got {axis}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    return lo - margin * (hi - lo), hi + margin * (hi - lo)


def axis_rule(axis: tuple[float, float], *, margin: float = 0.5, gap: float = 1 / 3) -> Rule:
    """When a candidate is compatible with a figure's axis ``(lo, hi)``: the trained model's value
    lies in the range widened by ``margin`` × its width on each side (:func:`axis_window`), and it
    exceeds the twin's value by at least ``gap`` × the width (a candidate whose trained–twin
    difference is smaller than a third of the spread among the paper's models cannot tell
    training from chance)."""
    lo, hi = axis_window(axis, margin)
    w = float(axis[1]) - float(axis[0])
    return Rule(yes=f"trained >= {lo:.4g} and trained <= {hi:.4g} and trained - twin >= {gap * w:.4g}")


def axis_rules(
    axes: Mapping[str, tuple[float, float]] = AXES, *, margin: float = 0.5, gap: float = 1 / 3
) -> dict[str, Rule]:
    """One :func:`axis_rule` per figure."""
    return {name: axis_rule(axis, margin=margin, gap=gap) for name, axis in axes.items()}


def judge(
    values: pd.DataFrame,
    reference: str,
    *,
    axes: Mapping[str, tuple[float, float]] = AXES,
    margin: float = 0.5,
    gap: float = 1 / 3,
) -> pd.DataFrame:
    """One row per candidate: the reference model's ``trained`` and ``twin`` values, the ranges
    over all trained models and all twins of ``values`` measured at the candidate's K
    (``trained_min`` ... ``twin_max``; not the reference's spread), and per figure
    ``<figure>`` ("yes" / "no" by :func:`axis_rule`) and ``<figure> on scale`` (the trained value
    alone lies in the widened range, whether or not it separates from the twin)."""
    ref = values[values["model"] == reference]
    if ref.empty:
        raise ValueError(
            f"no values for the reference model {reference!r}; models: {sorted(values['model'].unique())}"
        )
    wide = ref.pivot_table(index=CANDIDATE_COLUMNS, columns="weights", values="value").reset_index()
    for w in WEIGHTS:
        if w not in wide.columns:
            wide[w] = np.nan
    wide = wide.rename(columns={WEIGHTS[0]: "trained", WEIGHTS[1]: "twin"})
    wide.columns.name = None
    span = values.groupby([*CANDIDATE_COLUMNS, "weights"])["value"].agg(["min", "max"]).unstack("weights")
    span.columns = [f"{'trained' if w == WEIGHTS[0] else 'twin'}_{stat}" for stat, w in span.columns]
    out = wide.merge(span.reset_index(), on=CANDIDATE_COLUMNS, how="left")
    for name, axis in axes.items():
        rule = axis_rule(axis, margin=margin, gap=gap)
        out[name] = [rule.judge({"trained": a, "twin": b}) for a, b in zip(out["trained"], out["twin"])]
        lo, hi = axis_window(axis, margin)
        out[f"{name} on scale"] = out["trained"].between(lo, hi)
    return out


def book_choice(judged: pd.DataFrame, k: int) -> pd.Series | None:
    """The row of :data:`BOOK_CHOICE` at ``K = k`` in a :func:`judge` table (None if absent)."""
    rows = judged.merge(pd.DataFrame([{**BOOK_CHOICE, "K": int(k)}]), on=[*BOOK_CHOICE, "K"])
    return rows.iloc[0] if len(rows) else None


def compatible(judged: pd.DataFrame, axes: Mapping[str, tuple[float, float]] = AXES) -> pd.DataFrame:
    """The candidates compatible with each figure's axis: ``figure``, ``candidate`` (its label),
    denominator, form, the reference model's trained and twin values and the ranges (min–max of
    the candidate over every model of ``judged``'s values measured at its K, trained and twins
    apart: :func:`judge`)."""
    rows = []
    for name in axes:
        for row in judged[judged[name] == "yes"].to_dict("records"):
            rows.append(
                {
                    "figure": name,
                    "candidate": candidate_label(row),
                    "denominator": row["denominator"],
                    "form": row["form"],
                    "trained": row["trained"],
                    "twin": row["twin"],
                    "trained range": f"{row['trained_min']:.3f}–{row['trained_max']:.3f}",
                    "twin range": f"{row['twin_min']:.3f}–{row['twin_max']:.3f}",
                }
            )
    columns = ["figure", "candidate", "denominator", "form", "trained", "twin", "trained range", "twin range"]
    return pd.DataFrame(rows, columns=columns)


def closest_miss(judged: pd.DataFrame, figure: str) -> pd.Series | None:
    """Of the candidates that put the trained model on ``figure``'s scale without being
    compatible (they do not separate it from its twin), the one with the largest trained − twin
    gap; None if there is none."""
    miss = judged[judged[f"{figure} on scale"] & (judged[figure] != "yes")]
    if miss.empty:
        return None
    return miss.assign(gap=miss["trained"] - miss["twin"]).sort_values("gap").iloc[-1]


def candidate_label(row: Mapping[str, Any], *, k: bool = True) -> str:
    """A short readable name of a candidate, e.g. ``depth, last token, all pairs, with ends, K 50``."""
    parts = [
        "depth-wise" if row["view"] == "depth" else "token-wise",
        "last token" if row["tokens"] == "last" else "all tokens",
        "adjacent pairs" if row["pairs"] == "adjacent" else "all pairs",
        "with ends" if row["ends"] == "with" else "no end blocks",
    ]
    if k:
        parts.append(f"K {int(row['K'])}")
    return ", ".join(parts)


# --------------------------------------------------------------------------- the chart
def scale_chart(
    judged: pd.DataFrame,
    *,
    axes: Mapping[str, tuple[float, float]] = AXES,
    reference: str = "",
    title: str | None = None,
):
    """The reference model's trained (filled) and twin (hollow) value of every candidate, one
    row per structure and K, one panel per denominator and form (2 × 2), over bands of the
    figures' axis ranges."""
    import altair as alt

    df = judged.copy()
    df["candidate"] = [candidate_label(r) for r in df.to_dict("records")]
    df["metric"] = df["denominator"] + ", " + df["form"]
    points = df.melt(
        id_vars=["candidate", "metric"],
        value_vars=["trained", "twin"],
        var_name="weights",
        value_name="value",
    ).dropna(subset=["value"])
    bands = pd.DataFrame(
        [
            {"metric": metric, "figure": name, "lo": lo, "hi": hi}
            for metric in df["metric"].unique()
            for name, (lo, hi) in axes.items()
        ]
    )
    data = pd.concat([points.assign(layer="point"), bands.assign(layer="band")], ignore_index=True)
    order = sorted(df["candidate"].unique())
    x_title = f"value for {reference}" if reference else "value"
    x = alt.X("value:Q", title=x_title, scale=alt.Scale(domain=[-0.05, 1.05], nice=False))
    band, dots = _band_layer(x_title), _dot_layer(x, order)
    chart = (
        alt.layer(band, dots, data=data)
        .properties(width=150, height=alt.Step(8))
        .facet(facet=alt.Facet("metric:N", title=None, header=alt.Header(labelFontWeight="bold")), columns=2)
        .resolve_scale(color="independent")
    )
    return chart.properties(title=title) if title else chart


def _band_layer(x_title: str):
    """The figures' axis ranges, one shaded band each (the chart's "band" rows)."""
    import altair as alt

    from coupling_utils.analysis.plots import OKABE_ITO

    return (
        alt.Chart()
        .transform_filter("datum.layer == 'band'")
        .mark_rect(opacity=0.2)
        .encode(
            x=alt.X("lo:Q", scale=alt.Scale(domain=[-0.05, 1.05], nice=False), title=x_title),
            x2="hi:Q",
            color=alt.Color(
                "figure:N", title="the paper's axis", scale=alt.Scale(range=[OKABE_ITO[2], OKABE_ITO[3]])
            ),
            tooltip=[
                alt.Tooltip("figure:N", title="axis of"),
                alt.Tooltip("lo:Q", title="from"),
                alt.Tooltip("hi:Q", title="to"),
            ],
        )  # fmt: skip
    )


def _dot_layer(x, order: list[str]):
    """The trained (filled circle) and twin (hollow triangle) value of every candidate."""
    import altair as alt

    from coupling_utils.analysis.plots import OKABE_ITO

    return (
        alt.Chart()
        .transform_filter("datum.layer == 'point'")
        .mark_point(size=30, filled=False, strokeWidth=1.5)
        .encode(
            x=x,
            y=alt.Y("candidate:N", sort=order, title=None, axis=alt.Axis(labelLimit=320, labelFontSize=9)),
            shape=alt.Shape(
                "weights:N",
                title="weights",
                scale=alt.Scale(domain=["trained", "twin"], range=["circle", "triangle-down"]),
            ),
            fill=alt.Fill(
                "weights:N",
                title="weights",
                scale=alt.Scale(domain=["trained", "twin"], range=[OKABE_ITO[0], "transparent"]),
            ),
            stroke=alt.Stroke(
                "weights:N",
                title="weights",
                scale=alt.Scale(domain=["trained", "twin"], range=[OKABE_ITO[0], OKABE_ITO[5]]),
            ),
            tooltip=[
                alt.Tooltip("candidate:N", title="candidate"),
                alt.Tooltip("metric:N", title="metric"),
                alt.Tooltip("weights:N", title="weights"),
                alt.Tooltip("value:Q", title="value", format=".3f"),
            ],
        )  # fmt: skip
    )
