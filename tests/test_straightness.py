"""The book's one straightness rule: a random walk of the same length and the twin as nulls."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis.straightness import STRAIGHTER, random_walk_lss, straightness
from coupling_utils.analysis.trajectories import line_shape_score


def test_the_random_walk_null_is_the_line_shape_score_of_random_walks():
    # in high dimension ‖sum of n unit vectors‖² ≈ n, so the score is close to √n
    for n in (4, 16, 30):
        assert random_walk_lss(n, 512) == pytest.approx(math.sqrt(n), rel=0.03)
    # and it is what line_shape_score gives on simulated walks of the same length
    rng = np.random.default_rng(1)
    walks = np.cumsum(rng.standard_normal((31, 400, 64)), axis=0)  # [L+1, T, d]
    assert line_shape_score(walks)["lss"].mean() == pytest.approx(random_walk_lss(30, 64), rel=0.03)
    assert random_walk_lss(1, 8) == pytest.approx(1.0)  # one step is a straight line
    with pytest.raises(ValueError, match="n_steps"):
        random_walk_lss(0, 8)


def _table(trained: list[float], twin: list[float]) -> pd.DataFrame:
    rows = [("trained", f"p{i}", v) for i, v in enumerate(trained)]
    rows += [("random init", f"p{i}", v) for i, v in enumerate(twin)]
    return pd.DataFrame(rows, columns=["model", "prompt", "lss"])


def test_clearly_straighter_than_walk_and_twin_is_yes():
    walk = random_walk_lss(30, 64)
    lss = _table([1.5, 1.6, 1.4, 1.55, 1.45, 1.5], [5.4, 5.6, 5.5, 5.7, 5.5, 5.6])  # 6 prompts
    s = straightness(lss, model="trained", twin="random init", n_steps=30, d=64)
    assert s["walk"] == walk and s["walk_ratio"].high < 0.8
    assert STRAIGHTER.judge(s) == "yes"


def test_a_little_lower_than_the_twin_but_near_a_walk_is_not_yes():
    # the case the issue names: LSS 4.6 against a twin of 5.6 and a walk of about 5.5
    lss = _table([4.5, 4.7, 4.6, 4.65, 4.55, 4.6], [5.5, 5.6, 5.7, 5.6, 5.65, 5.55])
    s = straightness(lss, model="trained", twin="random init", n_steps=30, d=64)
    assert 0.8 < s["walk_ratio"].estimate < 1
    assert STRAIGHTER.judge(s) == "partly"


def test_at_or_past_the_twin_is_no_and_one_prompt_is_never_yes():
    s = straightness(_table([5.6, 5.7], [5.5, 5.6]), model="trained", twin="random init", n_steps=30, d=64)
    assert STRAIGHTER.judge(s) == "no"
    one = straightness(_table([1.2], [5.5]), model="trained", twin="random init", n_steps=30, d=64)
    assert STRAIGHTER.judge(one) == "partly"  # no interval over one prompt: cannot be clear
    four = straightness(_table([1.5, 1.6, 1.4, 1.55], [5.4, 5.6, 5.5, 5.7]), model="trained",
                        twin="random init", n_steps=30, d=64)  # fmt: skip
    assert STRAIGHTER.judge(four) == "partly"  # 4 prompts: too few for a 95% interval, so never yes
    missing = straightness(_table([1.2, 1.3], [])[lambda d: d.model == "trained"], model="trained",
                           twin="random init", n_steps=30, d=64)  # fmt: skip
    assert STRAIGHTER.judge(missing) == "no"


@pytest.mark.parametrize("n", [6, 9, 40])
def test_the_ratios_of_every_resample_at_once_are_the_per_resample_pandas_ones_to_the_bit(n):
    """``straightness`` takes its ratios' resamples in one numpy pass: the intervals are those the
    per-resample pandas statistic gave (same resamples, same sums), a twin mean at or below 0
    leaving the twin ratio undefined as before."""
    from coupling_utils.analysis.stats import bootstrap_ci

    rng = np.random.default_rng(n)
    trained, twin = rng.uniform(1, 5, n), rng.uniform(-0.5, 6, n)  # some resamples' twin mean <= 0
    walk = random_walk_lss(30, 64)
    got = straightness(
        _table(list(trained), list(twin)), model="trained", twin="random init", n_steps=30, d=64
    )
    per_prompt = pd.DataFrame({"random init": twin, "trained": trained}, index=[f"p{i}" for i in range(n)])
    per_prompt = per_prompt.rename_axis("prompt").sort_index()  # as pivot_table orders the prompts

    def ratios(df):
        a, b = float(df["trained"].mean()), float(df["random init"].mean())
        return {"walk_ratio": a / walk, "twin_ratio": a / b if b > 0 else np.nan}

    old = bootstrap_ci(per_prompt.reset_index(), ratios).set_index("statistic")
    for k in ("walk_ratio", "twin_ratio"):
        want = (old.at[k, "estimate"], old.at[k, "ci_low"], old.at[k, "ci_high"], old.at[k, "n_valid"])
        assert (got[k].estimate, got[k].low, got[k].high, int(old.at[k, "n_valid"])) == want, k
