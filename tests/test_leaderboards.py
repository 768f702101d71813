"""Beyond the paper: the paper's coupling against each leaderboard task, checked by plain least squares."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from coupling_utils.analysis import leaderboards
from coupling_utils.analysis.stats import Bootstrap


def _r2(x: pd.Series, y: pd.Series) -> float:
    """R² of a one-predictor least-squares fit, from the correlation (an independent route)."""
    return float(np.corrcoef(x.to_numpy(float), y.to_numpy(float))[0, 1] ** 2)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_task_fits_are_least_squares_on_the_models_with_a_score(version):
    fits = leaderboards.task_fits(version, boot=Bootstrap(n_resamples=50, seed=0)).set_index("task")
    assert list(fits.index) == [*leaderboards.TASKS[version], "average"]
    table = leaderboards.score_table(version)
    for task in ("average", leaderboards.TASKS[version][0]):
        have = table.dropna(subset=[task, "coupling", "log10_params"])
        row = fits.loc[task]
        assert row.n == len(have) and row.n >= 10
        assert row.r2 == pytest.approx(_r2(have.coupling, have[task]), abs=1e-9)
        assert row.size_r2 == pytest.approx(_r2(have.log10_params, have[task]), abs=1e-9)
        slope = np.polyfit(have.coupling.to_numpy(float), have[task].to_numpy(float), 1)[0]
        assert row.slope == pytest.approx(slope, rel=1e-9)
        assert row.r2_ci_low <= row.r2 <= row.r2_ci_high
        assert len(row.models.split(", ")) == row.n
        assert set(row.missing.split(", ")) - {""} == set(table.label) - set(have.label)


def test_drop_one_refits_the_mean_of_the_other_tasks():
    out = leaderboards.drop_one("v1", boot=Bootstrap(n_resamples=50, seed=0)).set_index("left_out")
    tasks = list(leaderboards.TASKS["v1"])
    assert list(out.index) == ["none", *tasks] and out.loc["none", "r2_change"] == 0
    table = leaderboards.score_table("v1").dropna(subset=[*tasks, "coupling"])
    kept = [t for t in tasks if t != "gsm8k"]
    expected = _r2(table.coupling, table[kept].mean(axis=1))
    assert out.loc["gsm8k", "r2"] == pytest.approx(expected, abs=1e-9)
    assert out.loc["gsm8k", "r2_change"] == pytest.approx(expected - out.loc["none", "r2"], abs=1e-12)


def test_unknown_versions_and_tasks_are_named():
    with pytest.raises(ValueError, match="'v1' or 'v2'"):
        leaderboards.task_fits("v3")
    with pytest.raises(ValueError, match=r"\['gsm8k'\] are not v2 tasks"):
        leaderboards.task_fits("v2", tasks=["gsm8k"])


def test_each_task_carries_the_paired_interval_of_coupling_minus_parameter_count():
    """gap = R²(coupling) − R²(log10 params) on the task's models, with r2_difference's interval."""
    from coupling_utils.analysis.predictors import r2_difference

    fits = leaderboards.task_fits("v2", boot=Bootstrap(n_resamples=60, seed=3)).set_index("task")
    assert (fits.gap - (fits.r2 - fits.size_r2)).abs().max() < 1e-9
    table = leaderboards.score_table("v2")
    have = table.dropna(subset=["bbh", "coupling", "log10_params"])
    paired = r2_difference(have, "bbh", "coupling", "log10_params", Bootstrap(n_resamples=60, seed=3))
    assert (fits.loc["bbh", "gap_ci_low"], fits.loc["bbh", "gap_ci_high"]) == (
        paired["ci_low"],
        paired["ci_high"],
    )
