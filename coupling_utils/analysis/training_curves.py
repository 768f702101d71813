"""The shape of a quantity over training: the numbers a claim such as "rises progressively" is
judged on.

- :func:`growth_summary`: ratio final / early, Spearman correlation with the step, how monotone
  the curve is and where its peak lies, per group;
- :func:`log_position`: where a step lies on the log-step axis between two checkpoints;
- :func:`relative_curve`: a curve rescaled to its final value against the fraction of
  training, so runs of very different lengths (ours, Pythia's) share one axis;
- :func:`judge_rows`: a verdict rule applied to each row of such shape descriptors;
- :func:`shape_intervals`: bootstrap intervals of a curve's descriptors over what it averages
  (prompts, images), so a rule's "yes" needs the whole interval; :func:`growth_shape_intervals` the
  same for :func:`growth_summary`'s descriptors, every resample at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from coupling_utils.schemas import Schema, check_table

__all__ = [
    "growth_summary", "log_position", "relative_curve", "judge_rows", "shape_intervals",
    "growth_shape_intervals",
]  # fmt: skip


def _groups(df: pd.DataFrame, by):
    if by is None:
        return [((), df)]
    by = [by] if isinstance(by, str) else list(by)
    return [((key,) if not isinstance(key, tuple) else key, g) for key, g in df.groupby(by, sort=True)]


def growth_summary(
    df: pd.DataFrame,
    value: str,
    *,
    step: str = "step",
    by: str | Sequence[str] | None = None,
    early_step: int | None = None,
) -> pd.DataFrame:
    """How ``value`` grows over training, one row per group ``by``.

    ``early_step`` is the reference early checkpoint (the paper: 128); the first checkpoint at
    or after it is used (default: the first checkpoint after step 0). Rows with several values
    per step (e.g. prompts) are averaged first. Columns: early_step, final_step, early, final,
    ratio (final / early), spearman (rank correlation of value with step over checkpoints
    from the early one on, and its p-value spearman_p), rises (fraction of consecutive
    checkpoints where the value goes up), max_drop (largest fall between consecutive
    checkpoints, relative to the curve's range; 0 for a monotone rise), peak_step and peak
    (the largest value and where it lies), peak_position (where the peak lies on the log-step
    axis from the early to the final checkpoint: 0 = at the early one, 1 = at the end),
    final_vs_peak (final / peak: 1 when the curve ends at its top) and n_checkpoints.

    These are the shape descriptors a claim such as "rises progressively" is judged on: a curve
    that peaks early and falls back has a small peak_position and final_vs_peak < 1, whatever
    its two end points say.
    """
    check_table(df, Schema("df", dict.fromkeys((value, step), "any")))
    by_cols = [] if by is None else ([by] if isinstance(by, str) else list(by))
    rows = []
    for key, g in _groups(df, by):
        curve = g.groupby(step, sort=True)[value].mean()
        if not np.isfinite(curve.to_numpy()).all():
            raise ValueError(f"{value!r} has NaN or inf values{_where(by_cols, key)}")
        later = curve[curve.index > 0] if early_step is None else curve[curve.index >= early_step]
        if later.empty:
            raise ValueError(
                f"no checkpoint at or after step {early_step or 1}{_where(by_cols, key)}; "
                f"steps: {list(curve.index)}"
            )
        curve = later
        if len(curve) < 2:
            raise ValueError(
                f"need at least two checkpoints from the early one on{_where(by_cols, key)}, "
                f"got steps {list(curve.index)}"
            )
        rows.append({**dict(zip(by_cols, key)), **_shape(curve)})
    return pd.DataFrame(rows)


def _shape(curve: pd.Series) -> dict:
    """The shape descriptors of one curve (value per step, from the early checkpoint on): row 0 of
    :func:`_shapes`, with the p-value of its Spearman ρ."""
    from scipy import stats

    steps, v = curve.index.to_numpy(), curve.to_numpy(dtype=float)
    out = {k: a[0] for k, a in _shapes(steps, v[None, :]).items()}
    p = stats.spearmanr(steps.astype(float), v).pvalue if len(v) >= 3 and np.ptp(v) > 0 else np.nan
    return {
        "early_step": int(steps[0]),
        "final_step": int(steps[-1]),
        **{k: float(out[k]) for k in ("early", "final", "ratio", "spearman")},
        "spearman_p": float(p),
        "rises": float(out["rises"]),
        "max_drop": float(out["max_drop"]),
        "peak_step": int(out["peak_step"]),
        **{k: float(out[k]) for k in ("peak", "peak_position", "final_vs_peak")},
        "n_checkpoints": int(len(v)),
    }


def _shapes(steps: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
    """The shape descriptors of every row of ``v`` (``[curves, checkpoints]``, one value per step of
    ``steps``, increasing, from the early checkpoint on), each a ``[curves]`` array: what
    :func:`_shape` says of one curve, for a bootstrap's resampled curves at once. Spearman's ρ is the
    Pearson correlation of the values' ranks (ties averaged) with the steps' (NaN for a flat curve;
    with two checkpoints, the sign of the change)."""
    from scipy.stats import rankdata

    from coupling_utils.analysis.stats import rowwise_pearson

    v = np.asarray(v, dtype=float)
    steps = np.asarray(steps)
    early, final, top = v[:, 0], v[:, -1], v.max(axis=1)
    diffs = np.diff(v, axis=1)
    span = np.ptp(v, axis=1)
    flat = ~(span > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        if v.shape[1] >= 3:  # the steps increase: their ranks are 1, 2, …
            order = np.broadcast_to(np.arange(1.0, v.shape[1] + 1), v.shape)
            rho = rowwise_pearson(rankdata(v, axis=1), order)
        else:
            rho = np.sign(final - early)
        peak = np.argmax(v, axis=1)
        first, last = steps[0], steps[-1]
        position = np.full_like(early, np.nan)  # no log axis from step 0
        if first > 0:
            position = np.log(steps[peak] / first) / np.log(last / first)
        return {
            "early": early,
            "final": final,
            "ratio": np.where(early != 0, final / early, np.nan),
            "spearman": np.where(flat, np.nan, rho),
            "rises": np.mean(diffs > 0, axis=1),
            "max_drop": np.where(flat, 0.0, np.maximum(0.0, -diffs.min(axis=1)) / span),
            "peak_step": steps[peak],
            "peak": top,
            "peak_position": position,
            "final_vs_peak": np.where(top > 0, final / top, np.nan),
        }


def log_position(step: float, first: float, last: float) -> float:
    """Where ``step`` lies on the log-step axis from ``first`` to ``last`` (0 to 1; steps > 0).

    Pythia's checkpoints are log-spaced early, so "the peak is in the last third" means a
    position >= 2/3 on this axis (for steps 1 to 4096: from step 256 on)."""
    if not 0 < first < last:
        raise ValueError(f"need 0 < first < last steps for a log axis, got first={first}, last={last}")
    if not first <= step <= last:
        raise ValueError(f"step {step} lies outside [{first}, {last}]")
    return float(np.log(step / first) / np.log(last / first))


def _where(by_cols, key) -> str:
    return "" if not by_cols else " for " + ", ".join(f"{c}={k!r}" for c, k in zip(by_cols, key))


def relative_curve(
    df: pd.DataFrame, value: str, *, step: str = "step", by: str | Sequence[str] | None = None
) -> pd.DataFrame:
    """The curve averaged per step and rescaled: ``relative`` = value / final value, against
    ``training_fraction`` = step / final step (per group). Steps 0 are dropped (no log axis)."""
    check_table(df, Schema("df", dict.fromkeys((value, step), "any")))
    by_cols = [] if by is None else ([by] if isinstance(by, str) else list(by))
    frames = []
    for key, g in _groups(df, by):
        curve = g.groupby(step, sort=True)[value].mean()
        curve = curve[curve.index > 0]
        if curve.empty:
            continue
        final = float(curve.iloc[-1])
        if final == 0:
            raise ValueError(f"the final value of {value!r} is 0{_where(by_cols, key)}; cannot rescale")
        out = pd.DataFrame(
            {
                step: curve.index.to_numpy(),
                value: curve.to_numpy(),
                "training_fraction": curve.index.to_numpy() / curve.index.max(),
                "relative": curve.to_numpy() / final,
            }
        )
        for c, k in zip(by_cols, key):
            out.insert(0, c, k)
        frames.append(out)
    if not frames:
        raise ValueError("no checkpoint after step 0 to rescale")
    return pd.concat(frames, ignore_index=True)


def judge_rows(rows: pd.DataFrame, rule, *, column: str = "verdict") -> pd.DataFrame:
    """``rows`` with ``column`` = ``rule.judge(row)`` for each row (a :class:`~verdicts.Rule`
    judged on the shape columns each row carries, e.g. the search's runs)."""
    return rows.assign(**{column: [rule.judge(r) for r in rows.to_dict("records")]})


def shape_intervals(
    per_unit: pd.DataFrame,
    value: str,
    shape,
    names: Sequence[str],
    *,
    unit: str = "prompt",
    step: str = "step",
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """Bootstrap intervals of a curve's shape descriptors over the units it averages.

    ``per_unit`` has one ``value`` per (``unit``, ``step``), every unit measured at every step;
    the curve is their mean per step, and ``shape(curve)`` (a DataFrame of ``step`` and
    ``value``) returns its descriptors, e.g. ``growth_summary(...).iloc[0]``'s. Units are
    resampled with replacement (seeded); each descriptor in ``names`` (those a rule judges)
    comes back as a 95% :class:`~coupling_utils.analysis.verdicts.Interval` ``over`` the units.
    One unit leaves nothing to resample: the interval is then unbounded, so no rule can give it
    a "yes".
    """
    from coupling_utils.analysis.stats import bootstrap_intervals

    check_table(per_unit, Schema("per_unit", dict.fromkeys((unit, step, value), "any")))
    wide = per_unit.pivot_table(index=unit, columns=step, values=value, aggfunc="mean").sort_index(axis=1)
    if wide.isna().to_numpy().any():
        raise ValueError(f"every {unit} must be measured at every {step}: some are missing")
    steps = wide.columns.to_numpy()

    def descriptors(sample: pd.DataFrame) -> dict[str, float]:
        out = shape(pd.DataFrame({step: steps, value: sample.to_numpy().mean(axis=0)}))
        return {k: float(out[k]) for k in names if np.isfinite(float(out[k]))}

    return bootstrap_intervals(wide, descriptors, unit, n_resamples=n_resamples, seed=seed)


def growth_shape_intervals(
    per_unit: pd.DataFrame,
    value: str,
    names: Sequence[str],
    *,
    early_step: int | None = None,
    unit: str = "prompt",
    step: str = "step",
    n_resamples: int = 1000,
    seed: int = 0,
) -> dict:
    """:func:`shape_intervals` of :func:`growth_summary`'s descriptors (``early_step`` as there), with
    every resample's curve judged at once (:func:`_shapes`): the same resamples, and the same
    descriptors to rounding, in a fraction of the time (f03's reran its pandas summary per resample).
    """
    from coupling_utils.analysis.stats import bootstrap_intervals, resampled_means

    check_table(per_unit, Schema("per_unit", dict.fromkeys((unit, step, value), "any")))
    wide = per_unit.pivot_table(index=unit, columns=step, values=value, aggfunc="mean").sort_index(axis=1)
    if wide.isna().to_numpy().any():
        raise ValueError(f"every {unit} must be measured at every {step}: some are missing")
    steps = wide.columns.to_numpy()
    keep = steps > 0 if early_step is None else steps >= early_step
    if keep.sum() < 2:
        raise ValueError(f"need two checkpoints or more from the early one on, got steps {list(steps[keep])}")

    def descriptors(columns: dict) -> dict[str, np.ndarray]:
        # each step's mean over the units, added left to right as the wide table's rows were
        curves = np.stack([resampled_means(columns[s], "left_to_right") for s in steps[keep]], axis=1)
        out = _shapes(steps[keep], curves)
        return {k: out[k] for k in names}

    return bootstrap_intervals(wide, descriptors, unit, n_resamples=n_resamples, seed=seed, vectorized=True)
