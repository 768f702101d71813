"""Statistics: OLS, rank correlations, bootstrap, predictor comparison; the paper's R² = 0.80."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from coupling_utils.analysis import data as D
from coupling_utils.analysis import stats as S
from coupling_utils.analysis.stats import Bootstrap


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


# ----------------------------------------------------------------------------- every column, by hand
def test_ols_every_column_by_hand(noisy_line):
    """Each output column against its textbook formula (independent of scipy's linregress too)."""
    df = noisy_line.assign(y=noisy_line.y + 0.5, x=noisy_line.x + 3.0)  # means away from 0
    x, y = df.x.to_numpy(), df.y.to_numpy()
    n = len(x)
    X = np.column_stack([np.ones(n), x])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    s2 = resid @ resid / (n - 2)
    cov = s2 * np.linalg.inv(X.T @ X)
    se_int, se_slope = np.sqrt(np.diag(cov))
    r2 = 1 - resid @ resid / ((y - y.mean()) @ (y - y.mean()))
    t = st.t.ppf(0.9, n - 2)  # level 0.8
    fit = S.ols(df, "y", "x", level=0.8).iloc[0]
    expected = {
        "y": "y",
        "x": "x",
        "n": n,
        "slope": beta[1],
        "slope_se": se_slope,
        "slope_ci_low": beta[1] - t * se_slope,
        "slope_ci_high": beta[1] + t * se_slope,
        "intercept": beta[0],
        "intercept_se": se_int,
        "intercept_ci_low": beta[0] - t * se_int,
        "intercept_ci_high": beta[0] + t * se_int,
        "r2": r2,
        "r2_adj": 1 - (1 - r2) * (n - 1) / (n - 2),
        "r": np.corrcoef(x, y)[0, 1],
        "t": beta[1] / se_slope,
        "p": 2 * st.t.sf(abs(beta[1] / se_slope), n - 2),
        "intercept_p": 2 * st.t.sf(abs(beta[0] / se_int), n - 2),
        "residual_se": np.sqrt(s2),
        "level": 0.8,
    }
    assert list(fit.index) == list(expected)
    for key, value in expected.items():  # (abs=0: p-values are tiny, approx's default abs would hide them)
        assert fit[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-9, abs=0)), key
    assert 0 < fit["intercept_p"] < 0.05 and 0 < fit["p"] < 1e-6  # neither underflows to 0


def test_ols_on_three_rows_a_negative_slope_and_a_flat_line():
    three = S.ols(pd.DataFrame({"x": [0.0, 1.0, 2.0], "y": [2.0, 1.2, 0.1]}), "y", "x").iloc[0]
    assert three["n"] == 3 and three["slope"] == pytest.approx(-0.95) and three["r"] < 0
    assert three["r"] == pytest.approx(-np.sqrt(three["r2"]))
    flat = S.ols(pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "y": [5.0] * 4}), "y", "x").iloc[0]
    assert flat["slope"] == 0 and flat["p"] == 0.0 and np.isinf(flat["t"])  # a perfect (flat) fit
    assert np.isnan(flat["r2"]) and np.isnan(flat["r2_adj"]) and np.isnan(flat["r"])
    assert flat["intercept"] == 5.0 and flat["intercept_p"] == 0.0
    small = S.ols(pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "y": [0.0, 0.1, 0.2, 0.31]}), "y", "x").iloc[0]
    assert small["r2"] == pytest.approx(st.linregress([0, 1, 2, 3], [0, 0.1, 0.2, 0.31]).rvalue ** 2)
    assert 0 < small["slope_se"] < 1 and small["p"] == pytest.approx(
        2 * st.t.sf(abs(small["slope"] / small["slope_se"]), 2), rel=1e-9
    )


def test_inputs_as_text_and_functions_keep_their_rows():
    df = pd.DataFrame({"x": ["1", "2", "oops", "4", "5"], "y": ["2.0", "4.1", "6", "8.2", "9.9"]})
    fit = S.ols(df, "y", "x").iloc[0]
    assert fit["n"] == 4  # the unreadable row is dropped
    ref = st.linregress([1, 2, 4, 5], [2.0, 4.1, 8.2, 9.9])
    assert fit["slope"] == pytest.approx(ref.slope)
    shuffled = pd.DataFrame({"v": [3.0, 1.0, 2.0, 5.0]}, index=[10, 3, 7, 1])
    shuffled["w"] = 2 * shuffled["v"] + 1
    by_function = S.ols(shuffled, "w", lambda d: d["v"] * 1.0).iloc[0]
    assert by_function["x"] == "<lambda>" and by_function["slope"] == pytest.approx(2.0)
    named = S.ols(shuffled, "w", lambda d: d["v"])
    assert named.loc[0, "x"] == "<lambda>"
    rc = S.rank_correlation(shuffled, lambda d: -d["v"], "w").set_index("method")
    assert rc.loc["spearman", "statistic"] == pytest.approx(-1.0)
    cmp = S.compare_predictors(shuffled, "w", [lambda d: d["v"] ** 2])
    assert cmp.loc[0, "predictor"] == "<lambda>" and cmp.loc[0, "n"] == 4


def test_rank_correlation_columns_and_minimum():
    df = pd.DataFrame({"a": [1.0, 2, 3, 4], "b": [1.0, 3, 2, 4]})
    rc = S.rank_correlation(df, "a", "b")
    assert list(rc.columns) == ["x", "y", "method", "statistic", "p", "n"]
    assert (
        list(rc["x"]) == ["a", "a"]
        and list(rc["y"]) == ["b", "b"]
        and list(rc["method"]) == ["spearman", "kendall"]
    )
    sp, kt = st.spearmanr(df.a, df.b), st.kendalltau(df.a, df.b)
    assert rc["statistic"].tolist() == pytest.approx([sp.statistic, kt.statistic])
    assert rc["p"].tolist() == pytest.approx([sp.pvalue, kt.pvalue])
    assert S.rank_correlation(df.head(3), "a", "b")["n"].tolist() == [3, 3]
    with pytest.raises(ValueError) as info:
        S.rank_correlation(df.head(2), "a", "b")
    assert str(info.value) == "rank correlation needs at least 3 complete rows, got 2."


def test_bootstrap_is_the_percentile_bootstrap_of_its_documentation():
    """Resample rows with numpy's default_rng(seed).integers(0, n, n), take percentiles."""
    rng0 = np.random.default_rng(5)
    df = pd.DataFrame({"v": rng0.normal(size=30)})
    stat = lambda d: float(d["v"].mean())  # noqa: E731
    out = S.bootstrap_ci(df, stat, n_resamples=50, level=0.8, seed=3)
    rng = np.random.default_rng(3)
    draws = [stat(df.iloc[rng.integers(0, 30, size=30)]) for _ in range(50)]
    lo, hi = np.quantile(draws, [0.1, 0.9])
    assert list(out.columns) == [
        "statistic",
        "estimate",
        "ci_low",
        "ci_high",
        "level",
        "n_resamples",
        "n_valid",
        "seed",
    ]
    row = out.iloc[0]
    assert row["statistic"] == "statistic" and row["estimate"] == stat(df)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    assert (row["level"], row["n_resamples"], row["n_valid"], row["seed"]) == (0.8, 50, 50, 3)
    default = S.bootstrap_ci(df, stat, n_resamples=10)  # seed 0 by default
    assert default.equals(S.bootstrap_ci(df, stat, n_resamples=10, seed=0))
    assert default.loc[0, "seed"] == 0 and default.loc[0, "level"] == 0.95
    with pytest.raises(ValueError) as info:
        S.bootstrap_ci(df, stat, n_resamples=9)
    assert str(info.value) == "n_resamples must be at least 10, got 9."
    import inspect

    assert inspect.signature(S.bootstrap_ci).parameters["n_resamples"].default == 2000


def test_bootstrap_with_every_resample_failing_or_missing_a_statistic():
    df = pd.DataFrame({"x": [1.0, 1.0, 1.0, 2.0], "y": [0.0, 1.0, 2.0, 3.0]})

    def fails_unless_full(d):
        if len(set(d.index)) < 4:
            raise ValueError("degenerate")
        return 1.0

    out = S.bootstrap_ci(df, fails_unless_full, n_resamples=10, seed=1)
    assert out.loc[0, "n_valid"] < 10 and out.loc[0, "estimate"] == 1.0
    none_valid = S.bootstrap_ci(
        df,
        lambda d: 1.0 if len(d.index.unique()) == 4 and d.index.is_monotonic_increasing else float("nan"),
        n_resamples=10,
    )
    assert none_valid.loc[0, "n_valid"] == 0
    assert np.isnan(none_valid.loc[0, "ci_low"]) and np.isnan(none_valid.loc[0, "ci_high"])

    def partial(d):
        return {"a": 1.0} if d.index[0] == 0 else {"a": 1.0, "b": 2.0}

    both = S.bootstrap_ci(df, lambda d: {"a": 1.0, "b": 2.0}, n_resamples=10).set_index("statistic")
    assert both.loc["b", "n_valid"] == 10
    some = S.bootstrap_ci(df.iloc[::-1], partial, n_resamples=20, seed=2).set_index("statistic")
    assert some.loc["a", "n_valid"] == 20 and 0 < some.loc["b", "n_valid"] < 20


def test_compare_predictors_columns_values_and_errors(noisy_line):
    cmp = S.compare_predictors(noisy_line, "y", {"the x": "x"}, level=0.9).iloc[0]
    fit = S.ols(noisy_line, "y", "x", level=0.9).iloc[0]
    rc = S.rank_correlation(noisy_line, "x", "y").set_index("method")
    expected = {
        "predictor": "the x",
        "y": "y",
        "n": 40,
        "r2": fit["r2"],
        "slope": fit["slope"],
        "slope_ci_low": fit["slope_ci_low"],
        "slope_ci_high": fit["slope_ci_high"],
        "p": fit["p"],
        "spearman": rc.loc["spearman", "statistic"],
        "spearman_p": rc.loc["spearman", "p"],
        "kendall": rc.loc["kendall", "statistic"],
        "kendall_p": rc.loc["kendall", "p"],
        "level": 0.9,
    }
    assert list(cmp.index) == list(expected)
    for key, value in expected.items():
        assert cmp[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-12)), key
    text = noisy_line.astype(str).assign(x=lambda d: d.x.where(d.index != 3, "n/a"))
    assert S.compare_predictors(text, "y", ["x"]).loc[0, "n"] == 39
    shuffled = noisy_line.sample(frac=1, random_state=0)
    same = S.compare_predictors(shuffled, "y", {"f": lambda d: d["x"]})
    assert same.loc[0, "r2"] == pytest.approx(cmp["r2"], rel=1e-12)
    with pytest.raises(ValueError) as info:
        S.compare_predictors(noisy_line, "y", [])
    assert str(info.value) == "compare_predictors needs at least one predictor."
    with pytest.raises(KeyError) as info:
        S.compare_predictors(noisy_line, "y", ["nope"])
    assert info.value.args[0] == "column 'nope' not in the table (columns: ['x', 'y', 'z'])"
    with pytest.raises(KeyError) as info:
        S.compare_predictors(noisy_line, "score", ["x"])
    assert info.value.args[0] == "column 'score' not in the table (columns: ['x', 'y', 'z'])"
    with pytest.raises(KeyError) as info:
        S.ols(noisy_line, "score", "x")
    assert info.value.args[0] == "column 'score' not in the table (columns: ['x', 'y', 'z'])"
    with pytest.raises(ValueError) as info:
        S.ols(pd.DataFrame({"x": [1.0, 1.0, 1.0], "y": [1.0, 2.0, 3.0]}), "y", "x")
    assert str(info.value) == "OLS: the predictor is constant, so the slope is undefined."
    with pytest.raises(ValueError) as info:
        S.ols(pd.DataFrame({"x": [1.0, 2.0], "y": [1.0, 2.0]}), "y", "x")
    assert str(info.value) == "OLS needs at least 3 complete rows, got 2."


def test_predictors_without_a_name_and_arrays_on_any_index():
    import functools

    df = pd.DataFrame({"v": [3.0, 1.0, 2.0, 5.0, 4.0]}, index=[10, 3, 7, 1, 8])
    df["w"] = 2 * df["v"] + np.array([0.1, -0.1, 0.0, 0.2, -0.2])
    scaled = functools.partial(lambda d, a: a * d["v"], a=2.0)  # no __name__
    assert S.ols(df, "w", scaled).loc[0, "x"] == "x"
    assert S.rank_correlation(df, scaled, "w").loc[0, "x"] == "x"
    assert S.compare_predictors(df, "w", [scaled]).loc[0, "predictor"] == "x"
    as_array = S.compare_predictors(df, "w", {"v": lambda d: d["v"].to_numpy()}).iloc[0]
    by_column = S.compare_predictors(df, "w", ["v"]).iloc[0]
    assert as_array["n"] == 5 and as_array["r2"] == pytest.approx(by_column["r2"], rel=1e-12)
    assert S.ols(df, "w", lambda d: d["v"].to_numpy()).loc[0, "slope"] == pytest.approx(by_column["slope"])


def test_unreadable_values_become_missing_everywhere():
    df = pd.DataFrame(
        {"x": [1.0, 2, 3, 4, 5], "y": ["2", "4.2", "?", "8.1", "9.9"], "z": ["1", "0", "3", "x", "2"]}
    )
    assert S.ols(df, "y", "x").loc[0, "n"] == 4
    cmp = S.compare_predictors(df, "y", {"x": "x", "z as text": lambda d: d["z"]})
    assert cmp["n"].tolist() == [3, 3]


def test_bootstrap_default_resamples():
    df = pd.DataFrame({"v": [1.0, 2.0, 4.0]})
    out = S.bootstrap_ci(df, lambda d: len(d))
    assert out.loc[0, "n_resamples"] == 2000 and out.loc[0, "n_valid"] == 2000


def test_a_predictor_function_is_paired_with_rows_by_label():
    df = pd.DataFrame({"v": [3.0, 1.0, 2.0, 5.0, 4.0]}, index=[10, 3, 7, 1, 8])
    df["w"] = 2 * df["v"] + np.array([0.1, -0.1, 0.0, 0.2, -0.2])
    reordered = S.ols(df, "w", lambda d: d["v"].sort_index()).iloc[0]  # same labels, other order
    assert reordered["slope"] == pytest.approx(S.ols(df, "w", "v").loc[0, "slope"], rel=1e-12)


def test_vectorized_bootstrap_draws_the_same_resamples_as_the_loop():
    """bootstrap_ci(vectorized=True) sees the rows the per-resample loop sees, so intervals agree."""
    rng = np.random.default_rng(4)
    df = pd.DataFrame({"x": rng.normal(size=9), "y": rng.normal(size=9)})
    df.loc[2, "x"] = df.loc[5, "x"]  # a tie, and small resamples that come out constant
    loop = S.bootstrap_ci(df, lambda d: {"mean": d["x"].mean(), "r": np.corrcoef(d["x"], d["y"])[0, 1]
                                          if np.ptp(d["x"]) and np.ptp(d["y"]) else np.nan},
                          n_resamples=300, seed=5)  # fmt: skip
    vec = S.bootstrap_ci(df, lambda c: {"mean": c["x"].mean(axis=-1), "r": S.rowwise_pearson(c["x"], c["y"])},
                         n_resamples=300, seed=5, vectorized=True)  # fmt: skip
    pd.testing.assert_frame_equal(loop, vec, check_exact=False, rtol=1e-12, atol=1e-12)
    assert S.resample_rows(9, 300, 5).shape == (300, 9)


def test_rowwise_pearson_is_numpys_correlation_per_row():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))
    x[3] = 1.0  # a constant row has no correlation
    got = S.rowwise_pearson(x, y)
    want = [np.corrcoef(a, b)[0, 1] if np.ptp(a) else np.nan for a, b in zip(x, y)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.isnan(got[3])


def test_rowwise_pearson_takes_any_leading_shape_and_never_leaves_minus_one_to_one():
    """Rows along the last axis of ``[..., n]``; a constant row is NaN (quietly) even when its mean is
    off its value by rounding; a row with range 1 is not constant; rounding never pushes |r| past 1."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6))
    x[0, 1] = 1.1  # six 1.1s average to 1.1 - 2e-16, so the deviations are not exactly 0
    y[1, 2] = 2.3  # likewise
    x[1, 1] = 5.0  # deviations exactly 0: r is 0/0
    x[1, 0] = [0.0, 1.0, 0.5, 0.25, 0.75, 0.5]  # range exactly 1
    y[0, 2] = [1.0, 0.0, 0.2, 0.9, 0.4, 0.6]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a bootstrap's constant resamples must not flood the output
        got = S.rowwise_pearson(x, y)
    want = [
        [np.corrcoef(a, b)[0, 1] if np.ptp(a) and np.ptp(b) else np.nan for a, b in zip(*ab)]
        for ab in zip(x, y)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.isnan(got[0, 1]) and np.isnan(got[1, 2]) and np.isnan(got[1, 1])
    rows = rng.normal(size=(50, 7))
    on_a_line = S.rowwise_pearson(rows, 3.0 * rows + 1.0)
    assert on_a_line.max() == 1.0 and on_a_line.min() == pytest.approx(1.0, abs=1e-15)
    against = S.rowwise_pearson(rows, -3.0 * rows + 1.0)
    assert against.min() == -1.0 and against.max() == pytest.approx(-1.0, abs=1e-15)


def test_vectorized_bootstrap_takes_flags_and_counts_like_the_loop():
    """Boolean and integer columns reach a vectorized statistic as numbers, and a yes/no statistic counts as
    0/1, as in the per-resample loop."""
    rng = np.random.default_rng(6)
    df = pd.DataFrame({"correct": rng.random(15) < 0.5, "tokens": rng.integers(5, 50, size=15)})

    def loop(d):
        x, y = d["correct"].to_numpy(float), d["tokens"].to_numpy(float)
        r = np.corrcoef(x, y)[0, 1] if np.ptp(x) and np.ptp(y) else np.nan
        return {"r": r, "mostly right": d["correct"].mean() > 0.5}

    def vec(c):
        return {
            "r": S.rowwise_pearson(c["correct"], c["tokens"]),
            "mostly right": c["correct"].mean(axis=-1) > 0.5,
        }

    by_loop = S.bootstrap_ci(df, loop, n_resamples=200, seed=2)
    by_arrays = S.bootstrap_ci(df, vec, n_resamples=200, seed=2, vectorized=True)
    pd.testing.assert_frame_equal(by_loop, by_arrays, check_exact=False, rtol=1e-12, atol=1e-12)
    assert by_arrays.set_index("statistic").loc["mostly right", ["ci_low", "ci_high"]].tolist() == [0.0, 1.0]


def test_bootstrap_intervals_are_bootstrap_ci_as_intervals_over_the_units():
    from coupling_utils.analysis.verdicts import Interval

    rng = np.random.default_rng(2)
    df = pd.DataFrame({"a": rng.normal(size=12), "b": rng.normal(size=12)})

    def stats(d):
        return {
            "mean": d["a"].mean(),
            "gap": (d["a"] - d["b"]).mean(),
            "undefined": np.nan,  # no estimate: left out
            "all rows": 1.0 if d.index.is_unique else np.nan,  # no resample has every row: left out
        }

    got = S.bootstrap_intervals(df, stats, "prompt", detail=", 2 seeds", n_resamples=200, seed=4)
    ci = S.bootstrap_ci(df, stats, n_resamples=200, seed=4).set_index("statistic")
    assert ci.loc["all rows", "n_valid"] == 0
    assert got == {k: Interval.from_bootstrap(ci.loc[k], over="12 prompts, 2 seeds") for k in ("mean", "gap")}
    assert got["mean"].low < got["mean"].estimate == df["a"].mean() < got["mean"].high
    by_default = S.bootstrap_intervals(df, stats, "prompt")  # 1000 resamples, seed 0
    ci = S.bootstrap_ci(df, stats, n_resamples=1000, seed=0).set_index("statistic")
    assert by_default == {k: Interval.from_bootstrap(ci.loc[k], over="12 prompts") for k in ("mean", "gap")}
    # two rows already resample: the interval spans the two values
    two = S.bootstrap_intervals(df.head(2), lambda d: {"mean": d["a"].mean()}, "model")
    a0, a1 = df["a"].head(2)
    assert two == {"mean": Interval((a0 + a1) / 2, min(a0, a1), max(a0, a1), over="2 models")}
    # one row leaves nothing to resample: unbounded intervals
    one = S.bootstrap_intervals(df.head(1), stats, "prompt")
    unbounded = {"mean": a0, "gap": a0 - df.loc[0, "b"], "all rows": 1.0}
    assert one == {k: Interval(v, -np.inf, np.inf, over="1 prompt") for k, v in unbounded.items()}


@pytest.mark.parametrize("scale, other", [(1e-80, 1e-200), (1e-160, 1e-300), (1e80, 1e200), (1e160, 1e300)])
def test_rowwise_pearson_keeps_rows_of_any_spread(scale, other):
    """Sums of squares whose product leaves the float range (spread about 1e-80 or 1e80 and beyond) once
    gave r = 1 or 0 for r = 0.9; such rows are rescaled, and the others keep the plain formula's bits."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 9))
    y = 0.8 * x + 0.6 * rng.normal(size=(4, 9))
    want = S.rowwise_pearson(x, y)
    factor = np.array([1.0, scale, other, 1.0])[:, None]  # two rows far out, beside two ordinary ones
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = S.rowwise_pearson(x * factor, y * factor)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    assert got[0] == want[0] and got[3] == want[3]
    np.testing.assert_allclose(S.rowwise_pearson(x[1] * scale, y[1] * scale), want[1], rtol=1e-14)
    apart = np.array([1.0, 1e200, 1e-200, 1.0])[:, None]  # one side alone far out, one row each way
    np.testing.assert_allclose(S.rowwise_pearson(x * apart, y), want, rtol=1e-14)
    np.testing.assert_allclose(S.rowwise_pearson(x, y * apart), want, rtol=1e-14)
    assert np.isnan(S.rowwise_pearson(np.full(9, scale), y[0]))


def test_bootstrap_draws_are_the_resamples_bootstrap_ci_summarises(noisy_line):
    """bootstrap_draws hands back each resample's value, on the rows resample_rows draws; the
    percentile interval of those draws is bootstrap_ci's, loop or vectorized alike."""
    rows = S.resample_rows(len(noisy_line), 200, 7)
    estimate, draws = S.bootstrap_draws(
        noisy_line, lambda d: {"mean": d["x"].mean()}, n_resamples=200, seed=7
    )
    assert estimate == {"mean": pytest.approx(noisy_line["x"].mean())}
    np.testing.assert_allclose(draws["mean"], noisy_line["x"].to_numpy()[rows].mean(axis=1), rtol=1e-12)
    _, vec = S.bootstrap_draws(noisy_line, lambda c: {"mean": c["x"].mean(axis=-1)}, n_resamples=200, seed=7,
                               vectorized=True)  # fmt: skip
    np.testing.assert_allclose(vec["mean"], draws["mean"], rtol=1e-12)
    ci = S.bootstrap_ci(noisy_line, lambda d: {"mean": d["x"].mean()}, n_resamples=200, seed=7).iloc[0]
    assert [ci.ci_low, ci.ci_high] == pytest.approx(np.quantile(draws["mean"], [0.025, 0.975]))
    with pytest.raises(ValueError, match="at least 10"):
        S.bootstrap_draws(noisy_line, lambda d: {"mean": 0.0}, n_resamples=5)


def test_bootstrap_draws_default_to_bootstrap_ci_s_resamples(noisy_line):
    """Without options, bootstrap_draws hands back the 2000 draws of seed 0 that bootstrap_ci's
    default interval is read from."""
    _, draws = S.bootstrap_draws(noisy_line, lambda d: {"mean": d["x"].mean()})
    rows = S.resample_rows(len(noisy_line), 2000, 0)
    np.testing.assert_allclose(draws["mean"], noisy_line["x"].to_numpy()[rows].mean(axis=1), rtol=1e-12)
    ci = S.bootstrap_ci(noisy_line, lambda d: {"mean": d["x"].mean()}).iloc[0]
    assert [ci.ci_low, ci.ci_high] == pytest.approx(np.quantile(draws["mean"], [0.025, 0.975]))


def test_bootstrap_options_take_whole_counts_and_a_level_strictly_inside_0_1():
    """Bootstrap accepts the smallest count (10), seed 0, any level inside (0, 1) and numpy's
    numbers; each bad field is refused with a message naming it, the rule and the value."""
    for ok in (Bootstrap(10, 0.5, 0), Bootstrap(np.int64(20), np.float32(0.9), np.int64(3))):
        assert ok.n_resamples >= 10 and 0 < ok.level < 1 and ok.seed >= 0
    bad = [
        ({"n_resamples": 9}, "n_resamples must be an integer of at least 10, got 9"),
        ({"n_resamples": 20.0}, "n_resamples must be an integer of at least 10, got 20.0"),
        ({"n_resamples": True}, "n_resamples must be an integer of at least 10, got True"),
        ({"level": 0.0}, "level must lie strictly between 0 and 1, got 0.0"),
        ({"level": 1.0}, "level must lie strictly between 0 and 1, got 1.0"),
        ({"level": 1.5}, "level must lie strictly between 0 and 1, got 1.5"),
        ({"level": "0.9"}, "level must lie strictly between 0 and 1, got '0.9'"),
        ({"seed": -1}, "seed must be a non-negative integer, got -1"),
        ({"seed": 1.5}, "seed must be a non-negative integer, got 1.5"),
    ]
    for change, said in bad:
        with pytest.raises(ValueError) as info:
            Bootstrap(**change)
        assert str(info.value) == f"Bootstrap: {said}", change


@pytest.mark.parametrize("n", [2, 11, 40])
def test_mean_ci_is_the_bootstrap_of_the_pandas_mean_to_the_bit(n):
    """``mean_ci`` takes every resample at once: the row bootstrap_ci gave with a pandas mean per
    resample, for a column alone, beside a text column (as twin_gap's table was), and with NaNs."""
    rng = np.random.default_rng(n)
    values = rng.standard_normal(n) * 1e3 + 0.1
    gappy = values.copy()
    gappy[:: max(2, n // 4)] = np.nan
    for v in (values, gappy):
        frames = [
            pd.DataFrame({"x": v}),
            pd.DataFrame({"prompt": [f"p{i}" for i in range(n)], "x": v}),
        ]
        for frame in frames:
            for kw in ({}, {"n_resamples": 300, "level": 0.9, "seed": 4}):
                want = S.bootstrap_ci(frame, lambda f: float(f["x"].mean()), **kw).iloc[0]
                got = S.mean_ci(v, **kw)
                assert got.drop("statistic").to_dict() == want.drop("statistic").to_dict(), (n, kw)


def test_resampled_sums_add_in_the_order_asked_to_the_bit():
    """Pairwise (the default) is numpy's sum over the last axis; left to right adds the columns one
    by one, as pandas adds a column that shares its block; another order is refused by name. The
    values are chosen so that the two orders give different bits."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 17)) * 10.0 ** rng.integers(-8, 9, (2, 3, 17))
    assert np.array_equal(S.resampled_sums(a), a.sum(axis=-1))
    by_hand = np.zeros((2, 3))
    for j in range(17):
        by_hand = by_hand + a[..., j]
    assert np.array_equal(S.resampled_sums(a, "left_to_right"), by_hand)
    assert not np.array_equal(by_hand, a.sum(axis=-1))  # the orders differ here: each is checked
    with pytest.raises(ValueError, match=r"^order='rowwise': give 'pairwise' or 'left_to_right'$"):
        S.resampled_sums(a, "rowwise")


def test_resampled_means_skip_nans_in_the_order_asked_and_say_nothing_for_a_resample_of_nans():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4, 3, 17)) * 10.0 ** rng.integers(-8, 9, (4, 3, 17))
    a[0, 0, ::3] = np.nan
    a[1, 2, :] = np.nan  # a resample with no value: NaN, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = S.resampled_means(a, "left_to_right")
    seen = ~np.isnan(a)
    kept = np.ones((4, 3), dtype=bool)
    kept[1, 2] = False
    want = S.resampled_sums(np.where(seen, a, 0.0), "left_to_right")[kept] / seen.sum(-1)[kept]
    assert np.array_equal(got[kept], want)
    assert np.isnan(got[1, 2]) and np.isnan(got).sum() == 1
    assert not np.array_equal(got, S.resampled_means(a))  # the order asked is the order used


def test_mean_ci_of_integers_and_its_statistic_s_name():
    """Integers are averaged as floats; the row is named as bootstrap_ci names a single statistic."""
    ints, floats = S.mean_ci(np.arange(7)), S.mean_ci(np.arange(7.0))
    assert ints.to_dict() == floats.to_dict()
    assert (
        floats["statistic"]
        == S.bootstrap_ci(pd.DataFrame({"x": np.arange(7.0)}), lambda f: float(f["x"].mean())).iloc[0][
            "statistic"
        ]
    )


def test_vectorized_bootstrap_intervals_are_those_of_the_per_resample_statistic():
    """The vectorized estimate (the statistic on the table as one resample) and intervals equal the
    per-resample ones, a statistic that is not finite is left out, and one row gives unbounded intervals."""
    rng = np.random.default_rng(8)
    df = pd.DataFrame({"x": rng.standard_normal(9), "y": rng.random(9)}, index=[f"p{i}" for i in range(9)])

    def each(f):
        return {"mean_x": float(f["x"].mean()), "sum_y": float(f["y"].sum()), "never": float("nan")}

    def every(c):
        n = c["x"].shape[-1]
        return {
            "mean_x": S.resampled_sums(c["x"]) / n,
            "sum_y": S.resampled_sums(c["y"]),
            "never": np.full(c["x"].shape[0], np.nan),
        }

    slow = S.bootstrap_intervals(df, each, "prompt", n_resamples=200)
    fast = S.bootstrap_intervals(df, every, "prompt", n_resamples=200, vectorized=True)
    assert sorted(fast) == sorted(slow) == ["mean_x", "sum_y"]
    for k in slow:
        assert (fast[k].estimate, fast[k].low, fast[k].high, fast[k].over) == (
            slow[k].estimate,
            slow[k].low,
            slow[k].high,
            slow[k].over,
        ), k
    assert fast["mean_x"].estimate == float(df["x"].sum() / 9) and fast["sum_y"].estimate == float(
        df["y"].sum()
    )
    one = S.bootstrap_intervals(df.iloc[:1], every, "prompt", vectorized=True)
    assert (
        one["sum_y"].estimate == float(df["y"].iloc[0])
        and one["sum_y"].low == -np.inf
        and one["sum_y"].over == "1 prompt"
    )
