"""How straight token trajectories are: one definition, one null, one rule for the whole book.

The paper says trajectories become "more linear" as coupling emerges. This book measures that
with Gai & Zhang's line-shape score (:func:`coupling_utils.analysis.trajectories.line_shape_score`:
``LSS = n / ‖sum of the n unit step directions‖``, 1 for a straight line) and judges it against
two nulls at once:

- a **random walk** of the same number of steps: LSS only sees step *directions*, so the walk's
  score depends on ``n`` (and, weakly, the width ``d``) alone — about ``√n`` (5.5 for 30 steps);
  :func:`random_walk_lss` computes it exactly enough by a seeded simulation;
- the model's **random-init twin** (f05), or its first checkpoint (f03): the same architecture
  before training.

:data:`STRAIGHTER` is the one rule, applied per model (f03's final checkpoint, f05's trained
model) to :func:`straightness`'s values, each with a bootstrap interval over prompts (f03: windows): ``yes``
when the trajectories are clearly straighter than both (at most 0.8 of the walk's score and 0.9
of the twin's, over the whole interval); ``partly`` when both estimates are merely below 1; ``no``
when the model is at or past its twin or the walk.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from coupling_utils.analysis.stats import bootstrap_ci, resampled_means
from coupling_utils.analysis.verdicts import Interval, Rule

__all__ = ["STRAIGHTER", "straighter_text", "short_of_straighter", "random_walk_lss", "straightness"]

STRAIGHTER = Rule(yes="walk_ratio <= 0.8 and twin_ratio <= 0.9", partly="walk_ratio < 1 and twin_ratio < 1")


def straighter_text(unit: str = "prompts", twin: str = "the random-init model's") -> str:
    """:data:`STRAIGHTER` in words, naming what the interval resamples (``unit``: f05's prompts,
    f03's windows) and what stands in for the twin (f03: its first checkpoint)."""
    return (
        "yes (straighter trajectories) for a mean line-shape score at most 0.8 of a random walk's with "
        f"the same number of steps and at most 0.9 of {twin}, both over the whole 95% interval "
        f"(bootstrap over {unit}); partly if both estimates are merely below 1; otherwise no"
    )


def short_of_straighter(values: dict, twin: str = "the twin's") -> str:
    """Why :data:`STRAIGHTER` gives ``values`` (:func:`straightness`'s) no yes, as a sentence in the
    rule's own terms (walk_ratio: the score over the walk's; twin_ratio: over ``twin``, f03's first
    checkpoint's), from :meth:`Rule.short_of_yes`; "" for a yes, and where nothing was judged (no
    twin: NaN ratios)."""
    if any(np.isnan(float(getattr(values[n], "estimate", values[n]))) for n in STRAIGHTER.names):
        return ""
    short = STRAIGHTER.short_of_yes(values)
    if not short:
        return ""
    return (
        "Not a yes: in the rule's terms (walk_ratio, the score over the walk's; twin_ratio, over "
        f"{twin}), {short}."
    )


@functools.lru_cache(maxsize=64)
def random_walk_lss(n_steps: int, d: int, *, samples: int = 4000, seed: int = 0) -> float:
    """Mean line-shape score of a random walk of ``n_steps`` isotropic steps in R^d (seeded).

    Only the directions count, so the steps are uniform unit vectors; the mean of ``n / ‖Σ u_i‖``
    over ``samples`` walks (about √n for large d)."""
    if isinstance(n_steps, bool) or int(n_steps) != n_steps or n_steps < 1:
        raise ValueError(f"n_steps must be a positive integer, got {n_steps!r}")
    if isinstance(d, bool) or int(d) != d or d < 2:
        raise ValueError(f"d must be an integer >= 2, got {d!r}")
    rng = np.random.default_rng(seed)
    total = np.zeros((samples, int(d)))
    for _ in range(int(n_steps)):
        u = rng.standard_normal((samples, int(d)))
        total += u / np.linalg.norm(u, axis=1, keepdims=True)
    return float(np.mean(n_steps / np.linalg.norm(total, axis=1)))


def straightness(
    lss: pd.DataFrame, *, model: str, twin: str, n_steps: int, d: int, seed: int = 0, unit: str = "prompt"
) -> dict[str, Interval | float]:
    """The values :data:`STRAIGHTER` judges, for ``model`` against ``twin``.

    ``lss``: one row per trajectory with ``model``, ``prompt``, ``lss`` (both models on the same
    prompts); ``n_steps``, ``d``: the trajectories' number of steps and width (for the walk);
    ``unit``: what a ``prompt`` is, as the intervals name it (f03's are held-out windows).
    Returns ``lss`` and ``lss_twin`` (means), ``walk`` (the walk's score) and, as intervals over
    prompts, ``walk_ratio`` = mean LSS / walk and ``twin_ratio`` = mean LSS / the twin's mean.
    """
    for col in ("model", "prompt", "lss"):
        if col not in lss.columns:
            raise ValueError(f"the line-shape table needs a {col!r} column, got {list(lss.columns)}")
    walk = random_walk_lss(n_steps, d)
    per_prompt = lss[lss["model"].isin([model, twin])].pivot_table(
        index="prompt", columns="model", values="lss", aggfunc="mean"
    )
    if model not in per_prompt or twin not in per_prompt:
        nan = Interval(np.nan, np.nan, np.nan, over=f"{unit}s")
        mean = float(lss.loc[lss["model"] == model, "lss"].mean())
        return {"lss": mean, "lss_twin": np.nan, "walk": walk, "walk_ratio": nan, "twin_ratio": nan}
    per_prompt = per_prompt[[model, twin]].dropna()

    def ratios(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Both ratios of every resample at once (``columns``: the two models' ``[n_resamples, n]``)."""
        a, b = resampled_means(columns["model"]), resampled_means(columns["twin"])
        with np.errstate(divide="ignore", invalid="ignore"):
            return {"walk_ratio": a / walk, "twin_ratio": np.where(b > 0, a / b, np.nan)}

    pair = pd.DataFrame({"model": per_prompt[model].to_numpy(), "twin": per_prompt[twin].to_numpy()})
    if len(per_prompt) >= 2:
        ci = bootstrap_ci(pair, ratios, seed=seed, vectorized=True).set_index("statistic")
        over = f"{len(per_prompt)} {unit}s"
        got = {k: Interval.from_bootstrap(ci.loc[k], over=over) for k in ci.index}
    else:  # one prompt: no interval to resample, so nothing can be clear of a threshold
        est = ratios({c: pair[c].to_numpy()[None, :] for c in pair})
        got = {k: Interval(float(v[0]), -np.inf, np.inf, over=f"1 {unit}") for k, v in est.items()}
    return {
        "lss": float(per_prompt[model].mean()),
        "lss_twin": float(per_prompt[twin].mean()),
        "walk": walk,
        **got,
    }
