"""predictor_lead: whether the predictor with the highest R² is the best of all, with its interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis.predictors import predictor_lead
from coupling_utils.analysis.stats import Bootstrap, resample_rows


def _table(n=10, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return pd.DataFrame(
        {
            "x": x,
            "twin": x + 0.01 * rng.normal(size=n),  # all but the same predictor
            "far": x + 2.0 * rng.normal(size=n),
            "noise": rng.normal(size=n),
            "flat": 3.0,
            "y": x + 0.3 * rng.normal(size=n),
        }
    )


def _by_hand(df, y, names, n_resamples, seed):
    """Each resample's R² of every predictor, from numpy's correlation (an independent route)."""
    rows = resample_rows(len(df), n_resamples, seed)
    return np.array(
        [
            [np.corrcoef(df[name].to_numpy()[r], df[y].to_numpy()[r])[0, 1] ** 2 for name in names]
            for r in rows
        ]
    )  # [R, predictors]


def test_the_lead_is_over_the_best_of_the_others_in_each_resample():
    df = _table(n=20)
    names = ["x", "far", "noise"]
    lead = predictor_lead(df, "y", {n: n for n in names}, Bootstrap(n_resamples=300, seed=4))
    r2 = _by_hand(df, "y", names, 300, 4)
    whole = np.array([np.corrcoef(df[n], df.y)[0, 1] ** 2 for n in names])
    second = int(np.argsort(-whole)[1])
    assert lead["best"] == "x" and lead["runner_up"] == names[second] and lead["n"] == 20
    assert lead["estimate"] == pytest.approx(whole[0] - whole[second], abs=1e-12)
    expected = np.quantile(r2[:, 0] - r2[:, 1:].max(axis=1), [0.025, 0.975])
    assert [lead["ci_low"], lead["ci_high"]] == pytest.approx(expected, abs=1e-12)
    shares = np.bincount(r2.argmax(axis=1), minlength=3) / 300
    assert [lead["share"][n] for n in names] == pytest.approx(shares)
    assert lead["ci_low"] > 0 and lead["n_valid"] == 300


def test_a_leader_by_a_hair_is_not_separated_and_a_constant_predictor_is_left_out():
    df = _table()
    lead = predictor_lead(df, "y", {"x": "x", "twin": "twin", "flat": "flat"}, Bootstrap(n_resamples=300))
    assert lead["ci_low"] < 0 < lead["ci_high"]  # x and its twin trade places across resamples
    assert 0 < lead["share"][lead["best"]] < 1 and sum(lead["share"].values()) == pytest.approx(1)
    assert lead["left_out"] == ["flat"] and "flat" not in lead["share"]
    with pytest.raises(ValueError, match="at least 2 predictors that vary"):
        predictor_lead(df, "y", {"x": "x", "flat": "flat"})
