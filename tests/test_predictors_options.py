"""The bootstrap's options as one object (stats.Bootstrap), and predictor_lead for a predictor named
in advance (``leader``) or for the lowest R² (``lowest``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis.predictors import predictor_comparison, predictor_lead, r2_difference
from coupling_utils.analysis.stats import Bootstrap, resample_rows


def _table(n=16, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return pd.DataFrame(
        {
            "x": x,
            "near": x + 0.5 * rng.normal(size=n),
            "far": x + 2.0 * rng.normal(size=n),
            "noise": rng.normal(size=n),
            "y": x + 0.3 * rng.normal(size=n),
        }
    )


def _r2s(df, y, names, n_resamples, seed):
    """Each resample's R² of every predictor, from numpy's correlation: [R, predictors]."""
    rows = resample_rows(len(df), n_resamples, seed)
    return np.array(
        [[np.corrcoef(df[n].to_numpy()[r], df[y].to_numpy()[r])[0, 1] ** 2 for n in names] for r in rows]
    )


def test_the_options_travel_as_one_object_with_the_old_defaults():
    assert Bootstrap() == Bootstrap(n_resamples=1000, level=0.95, seed=0)
    df, preds = _table(), {"x": "x", "far": "far"}
    plain = predictor_comparison(df, "y", preds)
    assert plain.equals(predictor_comparison(df, "y", preds, Bootstrap()))
    boot = Bootstrap(200, level=0.9, seed=3)
    assert not predictor_comparison(df, "y", preds, boot).equals(plain)
    assert r2_difference(df, "y", "x", "far", boot)["level"] == 0.9
    lead = predictor_lead(df, "y", preds, boot)
    assert (lead["n_resamples"], lead["level"]) == (200, 0.9)
    with pytest.raises(TypeError, match="n_resamples"):
        r2_difference(df, "y", "x", "far", n_resamples=200)  # the options travel only as one object
    with pytest.raises(TypeError, match="boot must be a stats.Bootstrap, got int"):
        predictor_lead(df, "y", preds, 200)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_resamples": 5}, "n_resamples must be an integer of at least 10, got 5"),
        ({"n_resamples": 100.0}, "n_resamples must be an integer"),
        ({"level": 95}, "level must lie strictly between 0 and 1, got 95"),
        ({"seed": -1}, "seed must be a non-negative integer, got -1"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Bootstrap(**kwargs)


def test_a_leader_named_in_advance_is_set_against_the_best_of_the_others_in_each_resample():
    df, names = _table(), ["near", "x", "far"]
    boot = Bootstrap(300, seed=4)
    lead = predictor_lead(df, "y", {n: n for n in names}, boot, leader="near")
    r2 = _r2s(df, "y", names, 300, 4)
    whole = np.array([np.corrcoef(df[n], df.y)[0, 1] ** 2 for n in names])
    assert lead["best"] == "near" and lead["runner_up"] == "x"  # x has the highest R² as drawn
    assert lead["estimate"] == pytest.approx(whole[0] - whole[1], abs=1e-12) and lead["estimate"] < 0
    expected = np.quantile(r2[:, 0] - r2[:, 1:].max(axis=1), [0.025, 0.975])
    assert [lead["ci_low"], lead["ci_high"]] == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="leader 'width' is not among"):
        predictor_lead(df, "y", {n: n for n in names}, boot, leader="width")


def test_the_lowest_is_set_against_the_lowest_of_the_others_in_each_resample():
    df, names = _table(), ["x", "far", "noise"]
    boot = Bootstrap(300, seed=2)
    low = predictor_lead(df, "y", {n: n for n in names}, boot, lowest=True)
    r2 = _r2s(df, "y", names, 300, 2)
    whole = np.array([np.corrcoef(df[n], df.y)[0, 1] ** 2 for n in names])
    order = np.argsort(whole)
    assert low["best"] == names[order[0]] and low["runner_up"] == names[order[1]]
    assert low["estimate"] == pytest.approx(whole[order[1]] - whole[order[0]], abs=1e-12)
    i = order[0]
    expected = np.quantile(np.delete(r2, i, axis=1).min(axis=1) - r2[:, i], [0.025, 0.975])
    assert [low["ci_low"], low["ci_high"]] == pytest.approx(expected, abs=1e-12)
    assert low["share"][low["best"]] == pytest.approx(float((r2.argmin(axis=1) == i).mean()))
