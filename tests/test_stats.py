"""Statistics: OLS, rank correlations, bootstrap, predictor comparison; the paper's R² = 0.80."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from coupling_utils.analysis import data as D
from coupling_utils.analysis import stats as S


@pytest.fixture
def noisy_line():
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    return pd.DataFrame(
        {"x": x, "y": 1.5 + 2.0 * x + rng.normal(scale=0.8, size=40), "z": rng.normal(size=40)}
    )


def test_ols_matches_scipy(noisy_line):
    fit = S.ols(noisy_line, "y", "x").iloc[0]
    ref = st.linregress(noisy_line["x"], noisy_line["y"])
    assert fit["n"] == 40
    assert fit["slope"] == pytest.approx(ref.slope) and fit["intercept"] == pytest.approx(ref.intercept)
    assert fit["r2"] == pytest.approx(ref.rvalue**2) and fit["r"] == pytest.approx(ref.rvalue)
    assert fit["p"] == pytest.approx(ref.pvalue, rel=1e-6)
    assert fit["slope_se"] == pytest.approx(ref.stderr) and fit["intercept_se"] == pytest.approx(
        ref.intercept_stderr
    )
    t = st.t.ppf(0.975, 38)
    assert fit["slope_ci_low"] == pytest.approx(ref.slope - t * ref.stderr)
    assert fit["intercept_ci_high"] == pytest.approx(ref.intercept + t * ref.intercept_stderr)
    assert fit["slope_ci_low"] < 2.0 < fit["slope_ci_high"]
    narrow = S.ols(noisy_line, "y", "x", level=0.5).iloc[0]
    assert narrow["slope_ci_high"] - narrow["slope_ci_low"] < fit["slope_ci_high"] - fit["slope_ci_low"]


def test_ols_drops_incomplete_rows_and_takes_functions(noisy_line):
    df = noisy_line.copy()
    df.loc[[0, 5], "y"] = np.nan
    df.loc[7, "x"] = np.nan
    fit = S.ols(df, "y", "x")
    assert fit.loc[0, "n"] == 37 and list(fit.columns[:2]) == ["y", "x"]

    def x_squared(d):
        return d["x"] ** 2

    assert S.ols(noisy_line, "y", x_squared).loc[0, "x"] == "x_squared"


def test_ols_errors_and_perfect_fit():
    with pytest.raises(ValueError, match="at least 3"):
        S.ols(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}), "y", "x")
    with pytest.raises(ValueError, match="constant"):
        S.ols(pd.DataFrame({"x": [1.0] * 5, "y": [1.0, 2, 3, 4, 5]}), "y", "x")
    with pytest.raises(KeyError, match="nope"):
        S.ols(pd.DataFrame({"x": [1.0, 2, 3], "y": [1.0, 2, 3]}), "y", "nope")
    perfect = S.ols(pd.DataFrame({"x": [1.0, 2, 3, 4], "y": [3.0, 5, 7, 9]}), "y", "x").iloc[0]
    assert (
        perfect["r2"] == pytest.approx(1.0) and perfect["slope"] == pytest.approx(2.0) and perfect["p"] < 1e-6
    )


def test_rank_correlation(noisy_line):
    rc = S.rank_correlation(noisy_line, "x", "y").set_index("method")
    assert rc.loc["spearman", "statistic"] == pytest.approx(
        st.spearmanr(noisy_line.x, noisy_line.y).statistic
    )
    assert rc.loc["kendall", "p"] == pytest.approx(st.kendalltau(noisy_line.x, noisy_line.y).pvalue)
    # rank statistics ignore monotone transforms of x
    mono = S.rank_correlation(noisy_line, lambda d: np.exp(d["x"]), "y").set_index("method")
    assert mono.loc["spearman", "statistic"] == pytest.approx(rc.loc["spearman", "statistic"])
    assert (rc["n"] == 40).all()


def test_bootstrap_ci_is_seeded_and_sensible():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"v": rng.normal(size=200)})
    a = S.bootstrap_ci(df, lambda d: d["v"].mean(), n_resamples=400, seed=7)
    b = S.bootstrap_ci(df, lambda d: d["v"].mean(), n_resamples=400, seed=7)
    c = S.bootstrap_ci(df, lambda d: d["v"].mean(), n_resamples=400, seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert a.loc[0, "ci_low"] != c.loc[0, "ci_low"]
    row = a.iloc[0]
    assert row["ci_low"] < row["estimate"] < row["ci_high"]
    width = row["ci_high"] - row["ci_low"]
    assert 0.2 < width < 0.36  # about 2 * 1.96 / sqrt(200) = 0.28
    multi = S.bootstrap_ci(df, lambda d: {"mean": d["v"].mean(), "sd": d["v"].std()}, n_resamples=100)
    assert list(multi["statistic"]) == ["mean", "sd"] and (multi["n_valid"] == 100).all()


def test_bootstrap_skips_degenerate_resamples():
    df = pd.DataFrame({"x": [0.0, 0, 0, 0, 1], "y": [1.0, 2, 3, 4, 9]})
    out = S.bootstrap_ci(df, lambda d: S.ols(d, "y", "x").loc[0, "slope"], n_resamples=200, seed=0)
    assert 0 < out.loc[0, "n_valid"] < 200  # resamples without the x=1 row have a constant x


def test_compare_predictors_uses_common_rows(noisy_line):
    df = noisy_line.copy()
    df.loc[0, "z"] = np.nan
    cmp = S.compare_predictors(df, "y", ["x", "z"])
    assert list(cmp["predictor"]) == ["x", "z"] and (cmp["n"] == 39).all()
    assert cmp.loc[0, "r2"] > 0.7 > 0.2 > cmp.loc[1, "r2"]
    loose = S.compare_predictors(df, "y", ["x", "z"], complete_cases=False)
    assert list(loose["n"]) == [40, 39]
    labelled = S.compare_predictors(df, "y", {"two x": lambda d: 2 * d["x"]})
    assert labelled.loc[0, "predictor"] == "two x" and labelled.loc[0, "r2"] == pytest.approx(
        loose.loc[0, "r2"], rel=1e-9
    )


# ----------------------------------------------------------------------------- the paper's numbers


def test_fig1a_ols_reproduces_the_papers_r2():
    """OLS of the digitised Fig. 1(a) scores on coupling: the paper reports R² = 0.80 (p ~ 1e-10)."""
    fit = S.ols(D.load_paper_points("1a"), "score", "coupling").iloc[0]
    assert fit["n"] == 28
    assert 0.79 <= fit["r2"] <= 0.81
    assert fit["slope"] == pytest.approx(617.1, rel=0.02)
    assert 1e-11 < fit["p"] < 1e-9


def test_fig1a_coupling_beats_size_depth_and_width():
    """Same 28 models: R² of score on log10 params, depth and width are lower than on coupling.

    Computed values (digitised y): coupling 0.801, log10 params 0.776, width 0.671, depth 0.196.
    """
    t = D.fig1a_table()
    cmp = S.compare_predictors(
        t,
        "score",
        {"coupling": "coupling", "log10 params": "log10_params", "depth": "n_layers", "width": "d_model"},
    ).set_index("predictor")
    assert (cmp["n"] == 28).all()
    r2 = cmp["r2"]
    assert r2["coupling"] == pytest.approx(0.801, abs=0.003)
    assert r2["log10 params"] == pytest.approx(0.776, abs=0.003)
    assert r2["width"] == pytest.approx(0.671, abs=0.003)
    assert r2["depth"] == pytest.approx(0.196, abs=0.003)
    assert r2["coupling"] > max(r2["log10 params"], r2["depth"], r2["width"])
    assert (cmp["slope_ci_low"] > 0).all()  # all four relations are positive
