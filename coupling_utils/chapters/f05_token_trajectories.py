"""f05 · Token trajectories (``notebooks/f05_token_trajectories.md``): its parameters and their
checks, its measurement plan (:func:`jobs`: the trained model and its random twin, each with its
trajectory tables as a stored extra), :func:`run` (what the story shows, from the stored
tables), its verdict rules and claims, and the values its prose glues."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis.depth_and_tokens import token_label
from coupling_utils.analysis.model_names import model_words, of_result
from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.straightness import (
    STRAIGHTER,
    short_of_straighter,
    straighter_text,
    straightness,
)
from coupling_utils.analysis.verdicts import Interval, Rule, claim, verdict_word
from coupling_utils.chapters.checks import (
    DTYPES,
    NotMeasured,
    ParameterError,
    block,
    boolean,
    check_model,
    check_state,
    choice,
    integer,
    list_of,
    text,
    with_check,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.chapters.reruns import deeper_model, reruns
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Extra, Job, Options, collect

__all__ = [
    "Params", "LINEAR", "EXPONENTIAL", "EXPONENTIAL_CLAIM", "VERDICT_RULES", "weights", "jobs", "NotMeasured",
    "Results", "run", "claims", "interval_words", "lss_compared", "glue_values",
]  # fmt: skip

NOTEBOOK = "f05_token_trajectories"
TRAINED, TWIN = "trained", "random init"  # the tables' ``model`` column


def _pca_prompt_exists(v: Mapping[str, Any]) -> str | None:
    if v["pca_prompt"] >= len(v["prompts"]):
        return f"parameter 'pca_prompt' must be < len(prompts) = {len(v['prompts'])}, got {v['pca_prompt']}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_pca_prompt_exists,)

    model: str = param("embedded:smollm2-135m", check_model)
    revision: str = param("", text(empty=True))
    dtype: str = param("float32", choice(*DTYPES))
    compare_random_init: bool = param(True, boolean)
    init_seed: int = param(0, integer(min=0))
    prompts: list = param(
        [  # f01's six (the demo and one of each category of data/prompts.csv): a 95% interval needs 6
            "What is the capital of France? The capital is",
            "Question: Maya has 12 apples. She gives 5 to her brother and then buys 8 more. "
            "How many apples does she have now? Answer:",
            "Question: Which gas do plants take in from the air to make their food? Answer:",
            "A man pours pancake batter into a hot pan. After a minute, he",
            "Question: What is the derivative of x^2 with respect to x? A) x B) 2x C) x^3 D) 2 Answer:",
            "Q: What happens if you swallow a piece of chewing gum? A:",
        ],
        list_of(text()),
    )
    skip_first_token: bool = param(True, boolean)
    first_layer: int = param(0, block)
    last_layer: int = param(-1, integer())
    linearization: bool = param(True, boolean)
    pca_prompt: int = param(0, integer(min=0))
    pca_fit: str = param("joint", choice("joint", "per_token"))


# --------------------------------------------------------------------------- the verdict rules
# more linear: the trained model's mean LSS at least 10% lower than the twin's, and lower for
# at least three quarters of the (prompt, token) trajectories
# straighter trajectories: the book's one rule (analysis/straightness.py), against a random walk
# of the same length and the random twin, each ratio with its interval over prompts
LINEAR = STRAIGHTER
# exponential growth: steps that grow (growth > 1 per block) and both reconstructions of the
# expodistance closer to exact exponential growth than the twin's (ratio trained / twin < 1);
# each with its interval over prompts
EXPONENTIAL = Rule(
    yes="growth > 1 and log_linear_r2_ratio < 1 and ratio_cv_ratio < 1",
    partly="growth > 1 and (log_linear_r2_ratio < 1 or ratio_cv_ratio < 1)",
)
# what that rule measures, as the status row states it: growth > 1 says the steps grow, not that
# they grow exponentially; the ratios say closer to exponential spacing than the twin, not faster growth
# The claim names the condition a "yes" needs, not a measured result: which reconstruction came out
# lower and which higher is the row's note (:func:`_expodistance_note`, from the intervals).
EXPONENTIAL_CLAIM = (
    "step sizes of the trained model grow with depth (fitted growth above 1 per block) and are closer to "
    "exponential spacing than at random init (a yes needs both expodistances lower than the twin's)"
)
VERDICT_RULES = {"linear": LINEAR, "exponential": EXPONENTIAL}
NOT_JUDGED = "not judged (no twin)"


# --------------------------------------------------------------------------- the measurement plan
def weights(p: Params) -> list[str]:
    """The weights measured: the trained model, and its random twin with ``compare_random_init``;
    each is the ``model`` column of the tables."""
    return [TRAINED, TWIN] if p.compare_random_init else [TRAINED]


def jobs(p: Params) -> list[Job]:
    """The measurement plan: one job per weights (trained, and the twin drawn with ``init_seed``),
    each an :class:`Extra` of :func:`~coupling_utils.analysis.trajectories.trajectory_study`
    (trajectory tables, per-token statistics, linearisation cosines, PCA, the prompts' tokens)
    and no ``measure()`` part; L block passes per prompt, 2L with the linearisation. Each job
    checks the window against its loaded model (:func:`_check_window`) before measuring."""
    from coupling_utils.analysis import trajectories as tr

    options = {
        "window": [p.first_layer, p.last_layer],
        "linearization": p.linearization,
        "skip_first_token": p.skip_first_token,
        "pca_prompt": p.pca_prompt,
        "pca_fit": p.pca_fit,
    }
    passes = tr.linearized_study_passes if p.linearization else tr.study_passes
    out = []
    for name in weights(p):
        load = {"dtype": p.dtype, **({"revision": p.revision} if p.revision else {})}
        if name == TWIN:
            load.update(random_init=True, seed=p.init_seed)
        extra = Extra("trajectory_study", tr.trajectory_study, {"label": name, **options},
                      sources=("analysis/trajectories.py", "analysis/linearization.py"),
                      passes=passes)  # fmt: skip
        labels = {"model": p.model, **({"revision": p.revision} if p.revision else {}), "weights": name}
        out.append(Job(p.model, list(p.prompts), {}, load, labels, cache_dir("f05"), extra))
    # the variant right after the trained model's job: collect() then loads that model once for both
    return with_check([out[0], _first_token_job(p, options, out[0]), *out[1:]], _check_window, p=p)


def _check_window(lm, *, p: Params, job: Job) -> None:
    """``first_layer`` and ``last_layer`` against ``job``'s model loaded (each job's check, before
    measuring): a ParameterError naming the parameter(s), the model, its depth and the states to
    choose."""
    L, model = int(lm.n_layers), job.model
    first = check_state("first_layer", p.first_layer, model, L, high=L - 1,
                        why=", and last_layer needs a later one")  # fmt: skip
    last = check_state("last_layer", p.last_layer, model, L, low=1, negative=True)
    if last <= first:
        raise ParameterError(
            f"parameters first_layer={p.first_layer} and last_layer={p.last_layer} give an empty window: "
            f"{model} has {L} blocks, so residual states 0..{L} (-1: state {L}), and the window runs "
            f"from state first_layer to a later state last_layer; choose first_layer < last_layer, e.g. "
            f"-p first_layer={first} -p last_layer={L}"
        )


FIRST_TOKEN = "first token variant"  # the variant job's label (f05-ex-first-token)


def _first_token_job(p: Params, options: dict, trained: Job) -> Job:
    """f05-ex-first-token's variant: the trained model with ``skip_first_token`` flipped, no
    linearisation (L block passes per prompt); its tables give the solution's numbers."""
    from coupling_utils.analysis import trajectories as tr

    flipped = {**options, "skip_first_token": not p.skip_first_token, "linearization": False}
    extra = Extra("trajectory_study", tr.trajectory_study, {"label": FIRST_TOKEN, **flipped},
                  sources=("analysis/trajectories.py", "analysis/linearization.py"),
                  passes=tr.study_passes)  # fmt: skip
    labels = {**trained.labels, "variant": "first_token"}
    return Job(p.model, list(p.prompts), {}, trained.load_kwargs, labels, cache_dir("f05"), extra)


# --------------------------------------------------------------------------- the results


@dataclass
class Results:
    """What the story shows, every number from the stored tables of :func:`jobs`.

    ``facts``: the trained model's name, n_layers, d_model and the resolved window (first,
    last), and ``named``: the model named as measured
    (:func:`~coupling_utils.analysis.model_names.model_words`); ``n_tokens``: tokens per prompt;
    ``steps``, ``metrics``, ``linearization``: the trajectory tables of every model (``model``
    column: "trained", "random init"); ``pca``: the
    PCA of prompt ``pca_prompt`` (position 0 left out with ``skip_first_token``) and
    ``pca_tokens`` its tokens; ``summary``, ``expodistance`` (long, rows with a value),
    ``linearization_means`` (mean cosine at the last state, by model) and ``linearization_table``
    (the same as a table): drawn from them; ``linear``, ``growth``: the contrasts the verdict
    rules judge.
    """

    facts: dict[str, Any]
    n_tokens: list[int]
    steps: pd.DataFrame
    metrics: pd.DataFrame
    linearization: pd.DataFrame
    pca: pd.DataFrame
    pca_tokens: pd.DataFrame
    summary: pd.DataFrame
    expodistance: pd.DataFrame
    linearization_means: pd.Series
    linearization_table: pd.DataFrame
    linear: dict[str, float]
    growth: dict[str, float]
    failures: pd.DataFrame
    straight: dict[str, Any]
    # f05-ex-first-token: the trained model's steps and metrics with skip_first_token flipped
    first_token: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.facts["n_layers"])

    @property
    def window(self) -> tuple[int, int]:
        return int(self.facts["first"]), int(self.facts["last"])

    @functools.cached_property
    def growth_judged(self) -> dict[str, Interval]:
        """What the exponential-growth rule and the words on it read: ``growth`` and the
        expodistance ratios with 95% intervals over prompts (``growth_intervals``), resampled once."""
        from coupling_utils.analysis.trajectories import growth_intervals

        return growth_intervals(self.metrics)

    def headline(self) -> str:
        """One line: the model, its size, the prompts' lengths and the window."""
        f = self.facts
        return (
            f"{f['named']}: {f['n_layers']} blocks, d = {f['d_model']}; {prompt_words(self.n_tokens)}; "
            f"window x^{f['first']}..x^{f['last']}"
        )


def prompt_words(n_tokens: list[int]) -> str:
    """The prompts and their lengths for readers: "1 prompt of 14 tokens", "2 prompts of 10 and 11
    tokens", or past five prompts their range ("12 prompts of 8 to 30 tokens")."""
    n = len(n_tokens)
    if n == 1:
        return f"1 prompt of {n_tokens[0]} tokens"
    if n > 5:
        return f"{n} prompts of {min(n_tokens)} to {max(n_tokens)} tokens"
    return f"{n} prompts of {listed(n_tokens)} tokens"


def lss_by_prompt(metrics: pd.DataFrame) -> pd.DataFrame:
    """Each prompt's mean line-shape score over its tokens, by model (``model``, ``prompt``,
    ``lss``): the chapter's one aggregation of the LSS averages these over the prompts, as the
    straightness rule does (each prompt weighs the same, however many tokens it has)."""
    return metrics.groupby(["model", "prompt"], as_index=False)["lss"].mean()


def mean_lss(metrics: pd.DataFrame) -> pd.Series:
    """The mean LSS by model: the mean over prompts of :func:`lss_by_prompt`."""
    return lss_by_prompt(metrics).groupby("model")["lss"].mean()


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (measured where missing, else read) and derive what the story shows.
    Raises :class:`NotMeasured`, naming the reason, when a job has no result."""
    done = collect(jobs(p), options, desc=NOTEBOOK)
    if done.missing:
        raise NotMeasured(f"{NOTEBOOK} needs every job of its plan:\n{done.report()}")
    main = [r for r in done.ok if "variant" not in r.job.labels]
    tables = {
        name: pd.concat([r.extra[name] for r in main], ignore_index=True)
        for name in ("steps", "metrics", "linearization", "pca")
    }
    (own,) = [r for r in main if r.job.weights == "trained"]
    trained = own.extra
    facts = {**trained["facts"].iloc[0].to_dict(), "named": model_words(of_result(own))}
    results = _results(p, tables, facts, trained["tokens"], done.failures)
    (variant,) = [r.extra for r in done.ok if "variant" in r.job.labels]
    return dataclasses.replace(results, first_token={key: variant[key] for key in ("steps", "metrics")})


def _results(p: Params, t: dict, facts: dict, tokens: pd.DataFrame, failures: pd.DataFrame) -> Results:
    """The tables drawn from the stored ones, computed as the notebook always has."""
    from coupling_utils.analysis import trajectories as tr

    metrics, lin, pca = t["metrics"], t["linearization"], t["pca"]
    if p.skip_first_token:
        pca = pca[pca["token"] != 0]
    drawn = tokens[tokens["prompt"] == p.pca_prompt]
    shown = [token_label(s) for s in drawn["token"]]  # each token's text, its spaces visible
    pca_tokens = pd.DataFrame({"position": range(len(drawn)), "token": shown})
    summary = metrics.drop(columns=["prompt", "token"]).groupby("model").agg(["mean", "std"])
    summary.columns = [f"{a} ({b})" for a, b in summary.columns]
    expo = metrics.melt(id_vars=["model", "prompt", "token"],
                        value_vars=["expodistance_ratio_cv", "expodistance_log_linear_r2"],
                        var_name="reconstruction", value_name="expodistance")  # fmt: skip
    expo["reconstruction"] = expo["reconstruction"].str.replace("expodistance_", "")
    if p.linearization:
        final = lin[lin["layer"] == lin["layer"].max()]
        lin_means = final.groupby("model")["cosine"].mean()
    else:
        lin_means = pd.Series(dtype=float)
    n_tokens = [int(n) for n in tokens.groupby("prompt", sort=True).size()]
    return Results(
        facts, n_tokens, t["steps"], metrics, lin, pca, pca_tokens, summary.reset_index(), expo.dropna(),
        lin_means, lin_means.rename("cosine at x^L").reset_index(),
        tr.linearity_contrast(metrics), tr.growth_contrast(metrics), failures,
        straightness(metrics, model="trained", twin="random init",
                     n_steps=int(facts["last"]) - int(facts["first"]), d=int(facts["d_model"])),
    )  # fmt: skip


# --------------------------------------------------------------------------- claims and glue
def claims(p: Params, r: Results) -> list[dict[str, Any]]:
    """The reproduction-status rows (for ``pipeline.status.report``); none without the twin."""
    if not p.compare_random_init:
        return []
    first, last = r.window
    where = (f"{p.model}{'@' + p.revision if p.revision else ''} against its random twin, "
             f"{len(p.prompts)} prompt{'' if len(p.prompts) == 1 else 's'}, window x^{first}..x^{last}"
             + (", first token skipped" if p.skip_first_token else "")
             + "; last block: the block alone (x^L before the final norm)")  # fmt: skip
    growth, s, iv = r.growth, r.straight, r.growth_judged
    return [
        claim("token trajectories of the trained model are straighter (lower LSS) than a random walk "
              "and than at random init",
              paper="trajectories become more linear as coupling emerges during training (Pythia)",
              rule=LINEAR, values=s,
              ours=f"LSS {s['lss']:.3f} vs {s['lss_twin']:.3f} (twin) and {s['walk']:.3f} (random walk "
                   f"of {r.window[1] - r.window[0]} steps)",
              note=where + "; trained vs twin and walk, not along training"),
        claim(EXPONENTIAL_CLAIM,
              paper="layer-wise exponential growth emerges during training (formula unpublished)",
              rule=EXPONENTIAL, values=growth | iv,
              ours=f"growth {growth['growth']:.3f}×/block; expodistance log-linear "
                   f"{growth['log_linear_r2_trained']:.3f} vs {growth['log_linear_r2_twin']:.3f}, "
                   f"ratio-cv {growth['ratio_cv_trained']:.3f} vs "
                   f"{growth['ratio_cv_twin']:.3f}",
              note=where + "; " + _expodistance_note(iv)
                   + "; both expodistances are this book's reconstructions"),
    ]  # fmt: skip


_EXPODISTANCE_NAMES = {"log_linear_r2_ratio": "log-linear expodistance", "ratio_cv_ratio": "ratio spread"}


def _expodistance_note(iv: Mapping[str, Interval]) -> str:
    """What each reconstruction's ratio trained / twin says, from its interval over prompts: "lower
    than the twin's" only where the whole interval lies below 1, "higher" only where it lies above,
    "not told apart from the twin's" where it holds 1, and the value alone where there is no
    interval (one prompt)."""
    parts = []
    for key, name in _EXPODISTANCE_NAMES.items():
        if key not in iv:
            continue
        ratio = iv[key]
        value = f"ratio trained / twin {ratio.estimate:.2f}, {ratio.words()}"
        if not ratio.resampled:
            parts.append(f"{name}: {value}")
        elif ratio.high < 1 or ratio.low > 1:
            word, side = ("lower", "below") if ratio.high < 1 else ("higher", "above")
            parts.append(
                f"{name} {word} for the trained model than for the twin ({value}, {side} 1 throughout)"
            )
        else:
            parts.append(
                f"{name} not told apart between the trained model and the twin ({value}, an interval that "
                "includes 1)"
            )
    return listed(parts) if parts else "no expodistance ratio measured"


def interval_words(iv: Interval) -> str:
    """A ratio's interval as the prose says it (:meth:`Interval.words`: "95% interval 0.55 to 0.65
    over 2 prompts", or why there is none), or "not measured" without the twin."""
    if np.isnan([iv.low, iv.high]).any():
        return "no interval: not measured without the twin"
    return iv.words()


def _straight_values(s: Mapping[str, Any]) -> dict[str, Any]:
    """The straightness rule's numbers: the walk's score and both ratios with their intervals."""
    from IPython.display import Markdown

    out = {"f05_lss_walk": s["walk"], "f05_straight_rule": straighter_text()}
    out["f05_straight_short"] = Markdown(short_of_straighter(s))
    for name in ("walk_ratio", "twin_ratio"):
        iv = s[name]
        out |= {f"f05_{name}": iv.estimate, f"f05_{name}_low": iv.low, f"f05_{name}_high": iv.high,
                f"f05_{name}_interval": interval_words(iv)}  # fmt: skip
    return out


def _third_expodistance(r: Results) -> dict[str, Any]:
    """Exercise f05-ex-expodistance's third measure, from the stored step sizes over the window:
    the mean absolute residual of a line through (l, log s_l), per trajectory, averaged by model
    (0 = exact exponential growth; NaN with fewer than 3 steps or a zero step)."""
    first, last = r.window
    steps = r.steps[(r.steps["layer"] > first) & (r.steps["layer"] <= last)]

    def residual(g: pd.DataFrame) -> float:
        s = g.sort_values("layer")
        if len(s) < 3 or (s["step_norm"] <= 0).any():
            return np.nan
        x, y = s["layer"].to_numpy(float), np.log(s["step_norm"].to_numpy(float))
        return float(np.abs(y - np.polyval(np.polyfit(x, y, 1), x)).mean())

    per = steps.groupby(["model", "prompt", "token"])[["layer", "step_norm"]].apply(residual)
    means = per.groupby(level="model").mean()
    a, b = float(means.get(TRAINED, np.nan)), float(means.get(TWIN, np.nan))
    ra, rb = round(a, 3), round(b, 3)  # as the prose prints them: equal there reads as equal
    # no interval is computed for this measure, so the two values are not ranked ("higher" needs one)
    word = (
        "not comparable"
        if not (np.isfinite(ra) and np.isfinite(rb))
        else "the same to three decimals"
        if ra == rb
        else "two values of one run, with no interval for this measure, so they are not ranked here"
    )
    return {"f05_expo_residual_trained": a, "f05_expo_residual_twin": b, "f05_expo_residual_word": word}


def expodistance_sides(iv: Mapping[str, Interval]) -> dict[str, str]:
    """The trained model's expodistance against its twin's under each reconstruction, by the
    interval over prompts of their ratio (``iv``: :attr:`Results.growth_judged`; lower or higher
    only where it lies below or above 1), and whether the two reconstructions agree on which model
    is closer to exponential spacing."""

    def side(key: str) -> str:
        d = iv.get(key)
        if d is None or not d.resampled or d.low <= 1 <= d.high:
            return "neither"
        return "lower" if d.high < 1 else "higher"

    words = {"lower": "lower than the twin's (closer to exponential)",
             "higher": "higher than the twin's (farther from exponential)",
             "neither": "not told apart from the twin's (no interval of the ratio clear of 1)"}  # fmt: skip
    a, b = side("log_linear_r2_ratio"), side("ratio_cv_ratio")
    agree = "neither" if "neither" in (a, b) else ("agree" if a == b else "disagree")
    return {
        "f05_expo_direction": words[a],
        "f05_expo_cv_direction": words[b],
        "f05_expo_agree": {
            "agree": "agree",
            "disagree": "disagree",
            "neither": "do not both tell the two models apart",
        }[agree],  # fmt: skip
    }


def exponential_words(iv: Mapping[str, Interval]) -> str:
    """The numbers the exponential-growth rule judged (``iv``: :attr:`Results.growth_judged`), each
    with its interval over prompts, as a sentence for the verdict's bullet ("" without the twin:
    nothing is judged)."""
    parts = (
        [f"growth {iv['growth'].estimate:.3f}× per block ({iv['growth'].words('.3f')})"]
        if "growth" in iv
        else []
    )
    parts += [
        f"the trained model's {name} at {iv[key].estimate:.2f} of the twin's ({iv[key].words()})"
        for key, name in _EXPODISTANCE_NAMES.items()
        if key in iv
    ]
    if not parts:
        return ""
    return f"The rule read {listed(parts)}."


def lss_compared(twin_ratio: Interval) -> str:
    """The trained model's mean line-shape score against its twin's, from their ratio's interval
    over prompts: "a lower (higher) line-shape score than its twin's" only where the whole
    interval lies below (above) 1, else the ratio not told apart from 1, with why."""
    if np.isnan(twin_ratio.estimate):
        return "a line-shape score with no twin to compare it with"
    if twin_ratio.resampled and twin_ratio.high < 1:
        return "a lower line-shape score than its twin's"
    if twin_ratio.resampled and twin_ratio.low > 1:
        return "a higher line-shape score than its twin's"
    return (
        f"a line-shape score not told apart from its twin's (ratio {twin_ratio.estimate:.2f}, "
        f"{interval_words(twin_ratio)})"
    )


def glue_values(p: Params, r: Results, status: pd.DataFrame | None) -> dict[str, Any]:
    """Every value the prose glues, by name; ``status``: the reported rows of :func:`claims`
    (None without the twin: the verdicts are then "not judged")."""
    from IPython.display import Markdown

    linear, growth = r.linear, r.growth
    means = mean_lss(r.metrics)  # over prompts, as the status row's (r.straight)
    a, b = float(means.get(TRAINED, np.nan)), float(means.get(TWIN, np.nan))
    values = {
        "f05_model_words": r.facts["named"],
        "f05_lss_trained": a,
        "f05_lss_random": b,
        "f05_lss_share_lower": linear["share_lower"],
        "f05_lss_compared": lss_compared(r.straight["twin_ratio"]),
        "f05_first_token_kept": "skipped" if p.skip_first_token else "kept",
        **first_token_values(p, r),
        "f05_sqrt_L": float(np.sqrt(r.window[1] - r.window[0])),
        **_straight_values(r.straight),
        **{f"f05_{key}": value for key, value in growth.items()},
        **expodistance_sides(r.growth_judged),
        **_third_expodistance(r),
        "f05_exponential_values": Markdown(exponential_words(r.growth_judged)),
        "f05_lincos_trained": float(r.linearization_means.get(TRAINED, np.nan)),
        "f05_lincos_random": float(r.linearization_means.get(TWIN, np.nan)),
        "f05_lincos_note": Markdown(_lincos_note(p, r)),
        "f05_window_reruns": Markdown(lss_window_reruns(r.n_layers)),
        "f05_tiny_blocks": tiny_blocks(),
        "f05_tiny_sqrt_L": float(np.sqrt(tiny_blocks())),
    }
    verdicts = [NOT_JUDGED, NOT_JUDGED] if status is None else [verdict_word(status.iloc[i]) for i in (0, 1)]
    values["f05_linear_verdict"], values["f05_exponential_verdict"] = verdicts
    return values


def lss_window_reruns(n_layers: int) -> str:
    """Exercise f05-ex-window's reruns for a model of ``n_layers`` blocks: the middle half of its
    residual states, then its first and its last eight states; or why the model is too shallow."""
    if n_layers < 8:
        return (f"this run's model has {n_layers} blocks ({n_layers + 1} residual states), too few to split "
                "into windows: " + deeper_model("f05"))  # fmt: skip
    q = n_layers // 4
    windows = [(q, n_layers - q), (0, 7), (n_layers - 7, n_layers)]
    runs = [{"first_layer": a, "last_layer": b} for a, b in windows]
    return reruns("f05", runs, lead="none", then=True)


def tiny_blocks() -> int:
    """The depth of ``embedded:pythia-tiny`` (exercise f05-ex-training), from its recipe."""
    from coupling_utils.models import zoo

    return int(zoo.training_spec("pythia-tiny").n_layers)


def _lincos_note(p: Params, r: Results) -> str:
    """Why a mean cosine is missing, said only when one is (empty otherwise)."""
    missing = [m for m in (TRAINED, TWIN) if not np.isfinite(r.linearization_means.get(m, np.nan))]
    if not missing:
        return ""
    why = (
        "the linearisation was switched off (`linearization = False`)"
        if not p.linearization
        else "the twin was not measured (`compare_random_init = False`)"
        if not p.compare_random_init
        else "no value was measured"
    )
    return f"(NaN for {listed(missing)}: {why})"


def first_token_values(p: Params, r: Results) -> dict[str, Any]:
    """f05-ex-first-token's expected result: the trained model's mean LSS with position 0 kept and
    skipped (one of them is the variant's), and position 0's own LSS and relative steps against
    the other tokens'."""
    from IPython.display import Markdown

    ours = r.metrics[r.metrics.model == TRAINED]
    kept = r.first_token["metrics"] if p.skip_first_token else ours
    skipped = ours if p.skip_first_token else r.first_token["metrics"]
    steps = r.first_token["steps"] if p.skip_first_token else r.steps[r.steps.model == TRAINED]
    first, others = kept[kept.token == 0].lss, kept[kept.token != 0].lss
    biggest = steps.groupby(["prompt", "token"]).relative_step.max().reset_index()
    step0, step_rest = biggest[biggest.token == 0].relative_step, biggest[biggest.token != 0].relative_step
    a, b = float(mean_lss(kept).iloc[0]), float(mean_lss(skipped).iloc[0])  # the chapter's mean LSS
    word = "raises" if a > b else "lowers" if a < b else "leaves unchanged"
    return {
        "f05_ex_lss_kept": a,
        "f05_ex_lss_skipped": b,
        "f05_ex_first_token": Markdown(
            f"Measured here (trained model, the same window and prompts): keeping position 0 {word} the "
            f"mean LSS, {a:.3f} with it against {b:.3f} without. Position 0's own LSS is "
            f"{first.mean():.3f} (the other tokens': median {others.median():.3f}, range "
            f"{others.min():.3f}–{others.max():.3f}); its largest step relative to its norm is "
            f"{step0.mean():.3f}, against a median of {step_rest.median():.3f} for the other tokens."
        ),
    }
