"""Chapter f05's contrast of a trained model with its twin: the numbers its verdict rules judge."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis import trajectories as tr


def _metrics():
    rows = []
    cases = (("trained", [1.2, 2.0, 3.0], 0.1, 0.2, 1.2), ("random init", [2.0, 1.5, 4.0], 0.3, 0.4, 1.0))
    for model, lss, cv, r2, growth in cases:
        for t, value in enumerate(lss):
            rows.append(
                {"model": model, "prompt": 0, "token": t, "lss": value, "expodistance_ratio_cv": cv,
                 "growth_ratio_cv": 1.1, "expodistance_log_linear_r2": r2, "growth_log_linear_r2": growth}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_linearity_contrast_pairs_the_same_token():
    got = tr.linearity_contrast(_metrics())
    assert got["lss_trained"] == pytest.approx(6.2 / 3) and got["lss_twin"] == pytest.approx(7.5 / 3)
    assert got["lss_ratio"] == pytest.approx(6.2 / 7.5)
    assert got["share_lower"] == pytest.approx(2 / 3)  # token 1 is lower in the twin
    alone = tr.linearity_contrast(_metrics().query("model == 'trained'"))
    assert np.isnan(alone["lss_twin"]) and np.isnan(alone["share_lower"]) and np.isnan(alone["lss_ratio"])


def test_growth_contrast_and_window():
    got = tr.growth_contrast(_metrics())
    assert got["growth"] == pytest.approx(1.2)
    assert got["ratio_cv_ratio"] == pytest.approx(1 / 3) and got["log_linear_r2_ratio"] == pytest.approx(0.5)
    assert tr.layer_window(0, -1, 30) == (0, 30) and tr.layer_window(2, 10, 30) == (2, 10)
    with pytest.raises(ValueError, match="first_layer=5 and last_layer=3"):
        tr.layer_window(5, 3, 30)
    with pytest.raises(ValueError, match="model has 4 blocks"):
        tr.layer_window(0, 9, 4)
    with pytest.raises(ValueError, match=r"metrics: missing column\(s\) \['nope'\]"):
        tr.model_means(_metrics(), "nope")
