"""The K/d policy: the choosing rule on synthetic curves (the chapters' K are checked below it)."""

from __future__ import annotations

import pandas as pd
import pytest

from coupling_utils.analysis import k_policy
from coupling_utils.engine.metric import k_for_width


def _curve(rows: dict[str, list[float]], low: dict[str, list[float]] | None = None) -> pd.DataFrame:
    """A curve with the interval's lower end at excess - 0.01, unless ``low`` gives it."""
    grid = k_policy.GRID
    low = low or {}
    return pd.DataFrame(
        [
            {"model": m, "k_over_d": r, "excess": e, "low": (low[m][i] if m in low else e - 0.01)}
            for m, es in rows.items()
            for i, (r, e) in enumerate(zip(grid, es, strict=True))
        ]
    )


def test_the_eligible_values_keep_four_pairs_at_the_narrowest_width():
    assert k_policy.eligible() == (1 / 8, 1 / 4, 1 / 2)
    assert all(k_for_width(k_policy.NARROWEST, r) >= k_policy.MIN_K for r in k_policy.eligible())


def test_narrowest_is_the_narrowest_model_a_chapter_measures():
    from coupling_utils.models import zoo

    widths = [
        int(spec.d_model)
        for e in zoo.REGISTRY.values()
        if not e.opt_in and not e.name.endswith("-smoke") and e.is_family
        for spec in e.specs().values()
    ]
    assert min(widths) == k_policy.NARROWEST


def test_choose_takes_the_best_median_share_or_a_smaller_candidate_within_the_tolerance():
    # grid 1/64 1/32 1/16 1/8 1/4 1/2; eligible 1/8, 1/4, 1/2
    curve = _curve(
        {
            "a": [0.1, 0.5, 0.95, 0.9, 1.0, 0.6],
            "b": [0.1, 0.2, 0.5, 0.8, 1.0, 0.3],
            "c": [0.5, 0.92, 1.0, 0.7, 0.8, 0.5],
            "flat": [-0.1, -0.2, 0.0, -0.1, -0.3, -0.4],
        }
    )
    decision = k_policy.decide(curve)
    # medians: 1/8 -> 0.8, 1/4 -> 1.0 (c: 0.8), 1/2 -> 0.5; the best is 1/4, 1/8 is 0.2 below it
    assert decision.k_over_d == pytest.approx(1 / 4)
    assert decision.left_out == ("flat",) and set(decision.models) == {"a", "b", "c"}
    assert decision.eligible == (1 / 8, 1 / 4, 1 / 2)
    # 1/16 has the best share (0.95) but keeps 2 pairs at d = 32: not a candidate
    assert decision.share[1 / 16] < decision.share[1 / 4]
    # within the tolerance the smaller candidate wins
    assert k_policy.decide(curve, tolerance=0.25).k_over_d == pytest.approx(1 / 8)
    # scaling one model's excess does not move the choice
    scaled = curve.assign(excess=curve.excess.where(curve.model != "a", curve.excess * 7))
    scaled["low"] = scaled["excess"] - 0.01
    assert k_policy.choose(scaled) == pytest.approx(1 / 4)


def test_a_model_whose_largest_excess_interval_touches_zero_is_left_out():
    curve = _curve(
        {"a": [0.1, 0.2, 0.3, 1.0, 0.5, 0.2], "noisy": [0.9, 0.1, 0.1, 0.1, 0.1, 1.0]},
        low={"noisy": [0.5, 0.0, 0.0, 0.0, 0.0, -0.2]},
    )
    decision = k_policy.decide(curve)
    assert decision.left_out == ("noisy",) and decision.k_over_d == pytest.approx(1 / 8)


def test_a_family_speaks_with_one_voice():
    eight = {f"embedded:fam/m{i}": [0.1, 0.1, 0.1, 0.1, 0.1, 1.0] for i in range(8)}
    curve = _curve({**eight, "x": [0.1, 0.1, 0.1, 1.0, 0.2, 0.2], "y": [0.1, 0.1, 0.1, 1.0, 0.3, 0.1]})
    decision = k_policy.decide(curve)
    assert set(decision.models) == {"embedded:fam", "x", "y"}
    # two voices of three peak at 1/8; counted one by one the eight siblings would choose 1/2
    assert decision.k_over_d == pytest.approx(1 / 8)
    assert k_policy.voice("EleutherAI/pythia-160m") == "EleutherAI/pythia-160m"


def test_choose_refuses_curves_it_cannot_read():
    with pytest.raises(k_policy.NoChoiceError, match="clear of 0"):
        k_policy.choose(_curve({"flat": [0, -1, -1, -1, -1, -1]}))
    with pytest.raises(k_policy.NoChoiceError, match="positive median share"):
        k_policy.choose(_curve({"early": [1.0, 0.5, 0.1, -0.5, -0.6, -0.7]}))
    with pytest.raises(ValueError, match="lacks the columns"):
        k_policy.choose(pd.DataFrame({"model": ["a"], "k_over_d": [0.5], "excess": [0.1]}))
    holey = _curve({"a": [1, 1, 1, 1, 1, 1]}).iloc[1:]
    holey = pd.concat([holey, _curve({"b": [1, 1, 1, 1, 1, 1]})])
    with pytest.raises(ValueError, match="misses grid values"):
        k_policy.choose(holey)


def test_the_measured_curve_gives_what_the_module_says():
    """k_policy states rule 2's value on data/k_sensitivity.csv; if the curve moves, say so there."""
    from pathlib import Path

    rows = pd.read_csv(Path(__file__).resolve().parents[1] / "data" / "k_sensitivity.csv")
    assert set(rows.k_over_d.round(6)) == {round(r, 6) for r in k_policy.GRID}
    decision = k_policy.decide(k_policy.curve(rows))
    assert decision.k_over_d == pytest.approx(1 / 8)
    assert "gives K/d = 1/8 on the second curve" in k_policy.__doc__
    assert len(decision.models) == 6 and set(decision.left_out) == {
        "embedded:pythia-tiny",
        "embedded:lm-training-family/s2",
    }


def test_k_for_width_at_the_grid():
    for d in (64, 384, 576, 4096):
        assert [k_for_width(d, r) for r in k_policy.GRID] == sorted(k_for_width(d, r) for r in k_policy.GRID)


def test_the_sensitivity_curve_is_measured_on_every_member_of_the_embedded_families():
    from coupling_utils.models import zoo
    from coupling_utils.pipeline import k_sensitivity as ks

    s = ks.SensitivitySettings()
    for family in ks.LANGUAGE_FAMILIES + ks.VIT_FAMILIES:
        names = zoo.REGISTRY[family.removeprefix(zoo.PREFIX)].members()
        refs = {f"{family}/{m}" for m in names}
        assert refs <= set(s.models + s.vits) and len(names) >= 6
        assert {k_policy.voice(r) for r in refs} == {family}
    assert not set(s.models) & set(s.vits)


def test_the_book_k_over_d_is_what_the_measured_curve_chooses():
    assert k_policy.choose(k_policy.measured_curve()) == pytest.approx(k_policy.BOOK_K_OVER_D)


def _width(model: str) -> int:
    """The width of an embedded model, from the zoo (a run's spec, or a pretrained entry's text)."""
    import re

    from coupling_utils.models import zoo

    entry = zoo.REGISTRY[model.removeprefix(zoo.PREFIX)]
    if entry.source is not None:
        return int(re.search(r"d=(\d+)", entry.description).group(1))
    return int(entry.specs().d_model)


def test_every_chapter_judges_at_the_book_k_over_d_in_the_default_book():
    """The default profile of every chapter that judges coupling reads K = K/d × width at the
    book's K/d: f00's K, f01's largest K (its verdicts' K, and the tiles' rule up to it), f02's
    and f04's families, f03's k_main and f04's run."""
    from pathlib import Path

    from coupling_utils.pipeline.execution import _planned_values

    root = Path(__file__).resolve().parents[1] / "notebooks"
    names = ("f00_coupling_metric", "f01_depth_and_tokens", "f02_generalization")
    names += ("f03_training_emergence", "f04_vision_transformers")
    f00, f01, f02, f03, f04 = (_planned_values(root / f"{nb}.md", "default", {}) for nb in names)
    book = k_policy.BOOK_K_OVER_D
    assert f00["k"] == k_for_width(_width(f00["model"]), book)
    assert max(f01["k"]) == f01["tile_k"] == k_for_width(_width(f01["model"]), book)
    assert f02["k_over_d"] == f04["family_k_over_d"] == book
    (run,) = f03["models"]
    assert f03["k_main"] == k_for_width(_width(run), book)
    assert f04["k"] == k_for_width(_width(f04["model"]), book)


def test_family_sentence_reads_the_members_from_the_measured_rows():
    """An exercise's expected result from the stored curve: each member's mean over prompts, then
    the mean over members, at the asked K/d; a family the curve lacks says so."""
    from pathlib import Path

    rows = pd.read_csv(Path(__file__).resolve().parents[1] / "data" / "k_sensitivity.csv")
    fam = rows[rows.model.str.startswith("embedded:vit-family/") & (rows.k_over_d == 0.5)]
    twin = fam.groupby("model").coupling_twin.mean().mean()
    excess = fam.groupby("model").excess.mean().mean()
    means = k_policy.member_means("embedded:vit-family")
    assert set(means.k_over_d) == set(k_policy.GRID) and means.run.nunique() == fam.model.nunique()
    text = k_policy.family_sentence("embedded:vit-family", (0.5,))
    assert f"the twins average {twin:.3f} and the excess {excess:.3f}" in text
    acc = pd.Series({r: i for i, r in enumerate(sorted(means.run.unique()))}, name="rank")
    by_run = fam.assign(run=fam.model.str.split("/").str[1]).groupby("run").excess.mean()
    rho = by_run.rank().corr(acc.reindex(by_run.index).rank())
    with_rho = k_policy.family_sentence("embedded:vit-family", (0.5,), acc)
    assert f"ρ(excess, rank) = {rho:.2f}" in with_rho
    assert "holds no member" in k_policy.family_sentence("embedded:vit-family-smoke", (0.5,))
    off_grid = k_policy.family_sentence("embedded:vit-family", (0.1, 0.5))
    assert "at K/d = 0.1 it was not measured" in off_grid and "nan" not in off_grid


def test_the_curve_takes_every_resample_at_once_with_pandas_means_to_the_bit():
    """curve() averages each resample's prompts in one numpy call per K/d; it gives the bits of
    bootstrap_ci with a pandas mean per resample (missing prompts skipped), as it did before."""
    import numpy as np

    from coupling_utils.analysis.stats import bootstrap_ci

    rng = np.random.default_rng(3)
    rows = pd.DataFrame(
        [
            {
                "model": m,
                "prompt": f"p{i}",
                "k_over_d": r,
                "excess": rng.normal(0.1, 0.3),
                "K": 4,
                "d_model": 8,
            }
            for m in ("a", "b")
            for i in range(13)  # more than numpy's 8-wide blocks of a pairwise sum
            for r in k_policy.GRID
        ]
    )
    rows = rows.drop(index=[5, 40])  # two prompts missing at one K/d each
    got = k_policy.curve(rows, n_resamples=200)
    for model, one in rows.groupby("model", sort=False):
        wide = one.pivot(index="prompt", columns="k_over_d", values="excess")
        ci = bootstrap_ci(
            wide, lambda df: {str(r): float(df[r].mean()) for r in df.columns}, n_resamples=200
        ).set_index("statistic")
        mine = got[got["model"] == model].set_index("k_over_d")
        for r in wide.columns:
            assert (mine.loc[r, ["excess", "low", "high"]].tolist()) == ci.loc[
                str(r), ["estimate", "ci_low", "ci_high"]
            ].tolist()
