"""The K/d policy: the choosing rule on synthetic curves (the chapters' K are checked below it)."""

from __future__ import annotations

import pandas as pd
import pytest

from coupling_utils.analysis import k_policy
from coupling_utils.engine.metric import k_for_width


def _curve(rows: dict[str, list[float]]) -> pd.DataFrame:
    grid = k_policy.GRID
    return pd.DataFrame(
        [
            {"model": m, "k_over_d": r, "excess": e}
            for m, es in rows.items()
            for r, e in zip(grid, es, strict=True)
        ]
    )


def test_choose_takes_the_smallest_k_over_d_where_the_median_share_reaches_the_bar():
    # shares of each model's peak: a reaches 0.9 at 1/16, b at 1/8, c at 1/32; median crosses at 1/16
    curve = _curve(
        {
            "a": [0.1, 0.5, 0.95, 1.0, 0.8, 0.6],
            "b": [0.1, 0.2, 0.5, 1.0, 0.9, 0.3],
            "c": [0.5, 0.92, 1.0, 0.7, 0.6, 0.5],
            "flat": [-0.1, -0.2, 0.0, -0.1, -0.3, -0.4],
        }
    )
    assert k_policy.choose(curve) == pytest.approx(1 / 16)
    decision = k_policy.decide(curve)
    assert decision.left_out == ("flat",)
    assert set(decision.models) == {"a", "b", "c"}
    # scaling one model's excess does not move the choice; the bar does
    scaled = curve.assign(excess=curve.excess.where(curve.model != "a", curve.excess * 7))
    assert k_policy.choose(scaled) == pytest.approx(1 / 16)
    assert k_policy.decide(curve, share=0.99).k_over_d == pytest.approx(1 / 8)


def test_choose_refuses_curves_it_cannot_read():
    with pytest.raises(ValueError, match="no model's excess"):
        k_policy.choose(_curve({"flat": [0, -1, -1, -1, -1, -1]}))
    with pytest.raises(ValueError, match="lacks the columns"):
        k_policy.choose(pd.DataFrame({"model": ["a"], "k_over_d": [0.5]}))
    holey = _curve({"a": [1, 1, 1, 1, 1, 1]}).iloc[1:]
    holey = pd.concat([holey, _curve({"b": [1, 1, 1, 1, 1, 1]})])
    with pytest.raises(ValueError, match="misses grid values"):
        k_policy.choose(holey)


def test_the_rule_chooses_nothing_on_the_measured_curve_as_the_module_says():
    """k_policy's docstring says the measured curve chooses no K/d; if a new curve does, say so there."""
    from pathlib import Path

    rows = pd.read_csv(Path(__file__).resolve().parents[1] / "data" / "k_sensitivity.csv")
    assert set(rows.k_over_d.round(6)) == {round(r, 6) for r in k_policy.GRID}
    with pytest.raises(k_policy.NoChoiceError, match="chooses no K/d"):
        k_policy.choose(k_policy.curve(rows))


def test_k_for_width_at_the_grid():
    for d in (64, 384, 576, 4096):
        assert [k_for_width(d, r) for r in k_policy.GRID] == sorted(k_for_width(d, r) for r in k_policy.GRID)
