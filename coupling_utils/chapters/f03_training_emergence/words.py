"""f03's prose words that depend on what was measured, so that the typed sentences around them
are true at every profile: the first checkpoint (a local run's step 0 is its random
initialisation; Pythia's first public checkpoint is step 1), where a curve ends against its peak
(a share of the peak means nothing once the values reach 0 or below), where the layer graph is
densest (ties named), and a verdict's numbers with their intervals."""

from __future__ import annotations

import operator

import numpy as np
import pandas as pd

from coupling_utils.analysis.prose_list import listed
from coupling_utils.analysis.verdicts import Interval


def first_checkpoint(step: int) -> str:
    """The first checkpoint as a noun: "the random initialisation (step 0)", or, for a run whose
    first measured checkpoint was already trained, "the first checkpoint (step 1)"."""
    return (
        "the random initialisation (step 0)" if int(step) == 0 else f"the first checkpoint (step {int(step)})"
    )


def at_first_checkpoint(step: int) -> str:
    """Completes "coupling starts at 0.07 ...": "at step 0 (the random initialisation)", or "at its
    first checkpoint, step 1 (no step-0 checkpoint was measured)"."""
    if int(step) == 0:
        return "at step 0 (the random initialisation)"
    return f"at its first checkpoint, step {int(step)} (no step-0 checkpoint was measured)"


def versus_first(final: float, first: float, step: int) -> str:
    """The final value against the first checkpoint's: a ratio when both are above 0, else the
    difference (a ratio of values at or below 0 has no meaning)."""
    name = first_checkpoint(step)
    if final > 0 and first > 0:
        return f"The final value is {final / first:.1f}× that of {name}, {first:.3f}."
    return f"The final value is {final - first:+.3f} from {name}'s {first:.3f}."


def peak_words(row: pd.Series) -> str:
    """Completes "The curve ...": where it ends against its peak, from a ``growth_summary`` row."""
    if int(row.peak_step) == int(row.final_step):
        return "ends at its top: coupling is highest at the last checkpoint"
    share = float(row.final_vs_peak)
    if np.isfinite(share):
        return (
            f"does not end at its top: the final value is {share:.0%} of the peak (step {int(row.peak_step)})"
        )
    return (
        f"does not end at its top: it is highest at step {int(row.peak_step)} (no share of the peak is "
        "given: the values are not all above 0)"
    )


def turn_words(curve: pd.Series, meaning: dict[str, str] | None = None, spec: str = ".3f") -> str:
    """Where a curve (values by step) turns, for a sentence that would otherwise give only its ends:
    its lowest and highest points that lie between its first and last checkpoints, in step order,
    then how it moves after the later of them: "lowest (1.162) at step 64, then higher at each of
    the 13 later checkpoints than at the one before"; "highest (1.726) at step 32, lowest (0.577) at
    step 128, then higher at 10 of the 11 later checkpoints than at the one before". A curve whose
    extremes are its ends: "lowest at the last checkpoint, lower at 3 of the 4 checkpoints after the
    first than at the one before". ``meaning`` adds what a direction means ({"higher": "less
    straight"}) after it."""
    curve = curve.sort_index()
    v, steps = curve.to_numpy(dtype=float), [int(s) for s in curve.index]
    if v.max() == v.min():
        return f"the same ({v[0]:{spec}}) at every checkpoint"
    lo, hi = int(np.argmin(v)), int(np.argmax(v))
    inner = sorted((i, kind) for i, kind in ((lo, "lowest"), (hi, "highest")) if 0 < i < len(v) - 1)
    if inner:  # after the later turn, count the moves away from it
        last, kind = inner[-1]
        named = [f"{k} ({v[i]:{spec}}) at step {steps[i]}" for i, k in inner]
        after, then = v[last:], "then "
    else:  # the extremes are the ends: count the moves toward the last
        ends_high = hi == len(v) - 1
        named = [f"{'highest' if ends_high else 'lowest'} at the last checkpoint"]
        kind, after, then = ("lowest" if ends_high else "highest"), v, ""
    way = "higher" if kind == "lowest" else "lower"
    moved = int(((np.diff(after) > 0) if way == "higher" else (np.diff(after) < 0)).sum())
    n = len(after) - 1
    way += f" ({meaning[way]})" if meaning and way in meaning else ""
    later = "later checkpoints" if inner else "checkpoints after the first"
    count = f"each of the {n}" if moved == n else f"{moved} of the {n}"
    return ", ".join(named) + f", {then}{way} at {count} {later} than at the one before"


def plateau_window_words(plateau: dict, val_loss: pd.Series) -> str:
    """The plateau window (``training.val_loss_plateau``) and what the validation loss did in it,
    from its per-checkpoint values ``val_loss`` (by step): "steps 3072 to 4096 (the loss at step 3072
    interpolated between the checkpoints at steps 2752 and 3200), the validation loss fell from 4.076
    to 4.030 nats per token, a relative drop of 1.1%, and was lower at each of the 3 checkpoints in
    that window than at the checkpoint before"."""
    start, end = plateau["from_step"], plateau["to_step"]
    a, b = plateau["between"]
    where = (
        f"step {start:g} is a checkpoint"
        if a == b
        else f"the loss at step {start:g} interpolated between the checkpoints at steps {a} and {b}"
    )
    curve = val_loss.sort_index()
    inside = np.flatnonzero(curve.index.to_numpy() > start)
    n, lower = len(inside), int(sum(curve.iloc[i] < curve.iloc[i - 1] for i in inside if i > 0))
    count = f"each of the {n}" if lower == n else f"{lower} of the {n}"
    fell = (
        f"fell from {plateau['from_loss']:.3f} to {plateau['best_loss']:.3f} nats per token, a relative drop "
        f"of {plateau['relative_drop']:.1%}"
        if plateau["drop"] > 0
        else f"went no lower than its {plateau['from_loss']:.3f} nats per token at the start"
    )
    moved = (
        f"was {'' if lower else 'not '}lower at its one checkpoint than at the checkpoint before"
        if n == 1
        else f"was lower at {count} checkpoints in that window than at the checkpoint before"
    )
    return f"steps {start:g} to {end} ({where}), the validation loss {fell}, and {moved}"


def rises_words(share: float) -> str:
    """How often a curve rises, for the monotony row's note: "rises in 47% of the steps between
    consecutive checkpoints" (``share``: the ``rises`` of a ``growth_summary`` row)."""
    return f"rises in {share:.0%} of the steps between consecutive checkpoints"


def steps_words(steps: list[int]) -> str:
    """Checkpoint steps as prose: "step 32", "steps 32 and 64", "steps 32, 64 and 128", or for many
    "9 checkpoints from step 32 to 4096"."""
    steps = [int(s) for s in steps]
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= 3:
        return "steps " + listed(steps)
    return f"{len(steps)} checkpoints from step {steps[0]} to {steps[-1]}"


def density_peak_words(density: pd.DataFrame) -> str:
    """Where the layer graph is densest, from ``density`` (``step``, ``density``): "is highest
    (0.17) at steps 32, 64 and 128" (every tie named), or "is 0.00 at every checkpoint"."""
    d = density.density
    if d.max() == d.min():
        return f"is {d.max():.2f} at every checkpoint"
    return f"is highest ({d.max():.2f}) at {steps_words(list(density.step[d == d.max()]))}"


def density_words(density: pd.DataFrame, early: float, final: float) -> str:
    """How the layer graph's edge density moves, from ``density`` (``step``, ``density``) and its early
    and final values: "goes from 0.02 at the early checkpoint to 0.31 at the end, and is highest (0.31)
    at step 4096"; "is 0.00 at the early checkpoint and at the end, and highest (0.17) at steps 32, 64
    and 128" where the two read alike (it read "goes from 0.00 … to 0.00"); "is 0.00 at every
    checkpoint"."""
    peak = density_peak_words(density)
    if density.density.max() == density.density.min():
        return peak
    a, b = f"{early:.2f}", f"{final:.2f}"
    if a == b:
        return f"is {a} at the early checkpoint and at the end, and {peak.removeprefix('is ')}"
    return f"goes from {a} at the early checkpoint to {b} at the end, and {peak}"


def with_interval(name: str, value: Interval | float, spec: str = ".2f") -> str:
    """A judged number with its interval for a verdict's bullet: "ρ -0.84 (95% interval -0.87 to -0.78
    over 8 windows)"; a plain number when it carries none."""
    if isinstance(value, Interval):
        return f"{name} {value.estimate:{spec}} ({value.words(spec)})"
    return f"{name} {float(value):{spec}}"


def interval_of(value: Interval | float, spec: str = ".2f") -> str:
    """A judged number's interval in words (:meth:`Interval.words`), or "no interval" for a plain number."""
    return value.words(spec) if isinstance(value, Interval) else "no interval"


def windows_words(run) -> str:
    """What the main panel's windows are to ``run`` (an ``emergence.Checkpoints``): held out from
    its training only where the run was trained here on the corpus they come from (its
    ``training_spec.json`` names the validation plays); otherwise not known to be held out."""
    import json

    spec = run.path / "training_spec.json" if run.path is not None else None
    corpus = json.loads(spec.read_text()).get("corpus") or {} if spec is not None and spec.exists() else {}
    plays = [_play_title(play) for play in corpus.get("validation_plays", [])]
    if plays:
        return (
            f"Shakespeare windows held out from {run.model}'s training: its validation plays "
            f"({', '.join(plays)}), which it never trained on"
        )
    return (
        f"Shakespeare windows, not known to be held out from {run.model}'s training (it was not trained "
        "here; its training data, such as Pythia's Pile, may contain Shakespeare)"
    )


def _play_title(slug: str) -> str:
    """A play's title from its corpus slug: "histories/richard-ii" -> "Richard II"."""
    words = str(slug).rsplit("/", 1)[-1].split("-")
    return " ".join(w.upper() if set(w) <= set("ivx") else w.capitalize() for w in words)


def together_words(values: dict, failed: list[str]) -> str:
    """Claim 3 part by part, each part of ``TOGETHER_PARTS`` quoted with its ρ and interval: first
    those that held over the whole interval, then those that did not (``failed``) with the bound
    each needs, or "meets ρ ≥ 0.3 at the estimate only" where only the interval fell short:
    "held …: “coupling and … move oppositely …”, ρ -0.84 (95% interval …); not held: “coupling
    rises with the step”, ρ 0.11 (95% interval …), needs ρ ≥ 0.3"."""
    from coupling_utils.chapters.f03_training_emergence.plan import TOGETHER_PARTS

    def part_words(part: str, bound: bool) -> str:
        name = TOGETHER_PARTS[part].split()[0]
        need = f", {shortfall(values, part)}" if bound else ""
        return f"“{part}”, {with_interval('ρ', values[name])}{need}"

    held = [part_words(part, False) for part in TOGETHER_PARTS if part not in failed]
    lost = [part_words(part, True) for part in TOGETHER_PARTS if part in failed]
    whole = "its whole interval" if len(held) == 1 else "their whole intervals"
    return "; ".join(
        ([f"held over {whole}: " + "; ".join(held)] if held else [])
        + (["not held: " + "; ".join(lost)] if lost else [])
    )


def shortfall(values: dict, part: str) -> str:
    """Why a part of ``TOGETHER_PARTS`` that failed is not held: its estimate misses the bound
    ("needs ρ ≥ 0.3"), or meets it without its interval ("meets ρ ≥ 0.3 at the estimate only")."""
    from coupling_utils.chapters.f03_training_emergence.plan import TOGETHER_PARTS

    name, op, limit = TOGETHER_PARTS[part].split()
    if _COMPARE[op](_estimate(values[name]), float(limit)):
        return f"meets ρ {_SIGNS[op]} {limit} at the estimate only"
    return f"needs ρ {_SIGNS[op]} {limit}"


_SIGNS = {">=": "≥", "<=": "≤"}
_COMPARE = {">=": operator.ge, "<=": operator.le}


def _estimate(value: Interval | float) -> float:
    return float(value.estimate) if isinstance(value, Interval) else float(value)


def _moves(ratio: Interval | float) -> str | None:
    """ "ends higher than it starts" / "ends lower ..." where the whole interval of final / early lies
    above / below 1, else None."""
    if not isinstance(ratio, Interval) or not ratio.resampled:
        return None
    side = "higher" if ratio.low > 1 else ("lower" if ratio.high < 1 else None)
    return side and f"ends {side} than it starts"


def _course(name: str, values: dict) -> str:
    """A trajectory measure from its first to its last value, with where it turns between them
    (:func:`turn_words` of its ``curve``, when given) and how its ends compare: "ratio_cv goes 0.127
    → 0.407 (highest (0.591) at step 512, …) and ends higher than it starts: final / early 3.19 (…)"."""
    curve = values.get("curve")
    turns = f" ({turn_words(curve)})" if curve is not None else ""
    move, ratio = _moves(values["ratio"]), with_interval("final / early", values["ratio"])
    ends = f" and {move}: {ratio}" if move else f", {ratio}, first and last not told apart over the windows"
    return f"{name} goes {values['early']:.3f} → {_estimate(values['final']):.3f}{turns}{ends}"


def reconstruction_words(others: dict[str, dict]) -> str:
    """The trajectory measures beside the expodistance rule's (``Results.other_reconstructions``, each
    with its per-checkpoint ``curve`` where given), in words: "the other reconstruction, ratio_cv, goes
    0.127 → 0.407 (…) and ends higher than it starts: final / early 3.19 (95% interval …); the fitted
    growth per block goes 1.019 → 0.795 (…) and ends lower than it starts: final / early 0.78 (…), its
    last value below 1 (…): at the end the step sizes shrink with depth". A direction is said only where
    the interval over the windows lies on one side of 1; "" when neither was measured."""
    parts = []
    cv = others.get("expodistance_ratio_cv")
    if cv is not None:
        parts.append(_course("the other reconstruction, ratio_cv,", cv))
    g = others.get("growth_log_linear_r2")
    if g is not None:
        words, last = _course("the fitted growth per block", g), g["final"]
        if isinstance(last, Interval) and last.resampled and (last.high < 1 or last.low > 1):
            side, steps = ("below", "shrink") if last.high < 1 else ("above", "grow")
            words += (
                f", its last value {side} 1 ({interval_of(last, '.3f')}): at the end the step sizes {steps} "
                "with depth"
            )
        else:
            words += f", its last value not told apart from 1 ({interval_of(last, '.3f')})"
        parts.append(words)
    return "; ".join(parts)
