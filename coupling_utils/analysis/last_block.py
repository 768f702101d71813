"""The last block under each convention, side by side, for a model measured beside its twin.

What the last block is, is a measurement setting (``Settings.last_block``, module doc of
``engine/blocks.py``): the block alone (the paper's definition, "block"), the block followed by
the model's final norm as ``output_hidden_states`` returns it (the authors' code,
"final_norm"), or left out ("excluded"). Only the last block's Jacobian differs between the
first two, so the L × L depth-wise matrices differ in their last row and column only, and
"excluded" is either matrix without them. This module takes the same model and twin measured
under the two maps (``{convention: TwinMeasurement}``) and condenses how far apart they are:
the last row and column (:func:`last_lines`, :func:`lines_side_by_side`), the per-model
aggregates under all three conventions (:func:`convention_table`) and the headline numbers a
chapter glues (:func:`convention_summary`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from coupling_utils.analysis.depth_and_tokens import WEIGHTS, TwinMeasurement, mean_depthwise
from coupling_utils.engine.blocks import LAST_BLOCKS, check_last_block
from coupling_utils.measurement import coupling_summary
from coupling_utils.measurement.settings import LAST_BLOCK_MAPS

__all__ = [
    "MEASURED_MAPS",
    "CONVENTION_WORDS",
    "companions",
    "beside",
    "without_last_block",
    "checkpoints_without_last_block",
    "last_lines",
    "lines_side_by_side",
    "convention_table",
    "convention_summary",
    "folds_norm",
    "convention_note",
    "changed_verdicts",
    "last_lines_chart",
]

MEASURED_MAPS = LAST_BLOCK_MAPS
"""The two conventions that are different maps; "excluded" is either one without its last block."""

CONVENTION_WORDS = {
    "block": "the last block alone, the paper's definition",
    "final_norm": "the last block with the model's final norm folded in, hidden_states[L-1] → "
    "hidden_states[L], as the authors' code measured it",
    "excluded": "the last block left out, as older helpers of the authors' code did",
}
"""Each convention in words, for prose that names it in code form just before (``last_block = "…"``)."""


def companions(last_block: str) -> list[str]:
    """The maps to measure besides ``last_block`` so that both stand side by side."""
    check_last_block(last_block)
    return [c for c in MEASURED_MAPS if c != last_block]


def beside(last_block: str) -> str | None:
    """The other measured map, which a run under ``last_block`` measures beside its own on the last
    block (``Settings.last_block_also``: one more block, not a second run); None under "excluded",
    which measures no last block."""
    return companions(last_block)[0] if last_block in MEASURED_MAPS else None


def _drop_last(df: pd.DataFrame, columns: tuple[str, ...], last: int) -> pd.DataFrame:
    if df.empty:
        return df
    return df[~df[list(columns)].eq(last).any(axis=1)].reset_index(drop=True)


def without_last_block(pair: TwinMeasurement, how: str = "offdiag") -> TwinMeasurement:
    """``pair`` as the "excluded" convention sees it: every table without the last block, and the
    per-model summary (mean 1 − m² over ``how`` pairs) over the remaining blocks."""
    last = pair.n_layers - 1
    depthwise = _drop_last(pair.depthwise, ("layer_i", "layer_j"), last)
    if depthwise.empty or len(set(depthwise["layer_i"])) < 2:
        raise ValueError(
            f"{pair.model}: without its last block fewer than two measured blocks are left; "
            "the 'excluded' convention needs at least three blocks"
        )
    summary = [
        {"model": pair.model, "weights": w, "K": int(K), "coupling": coupling_summary(g, how=how, k=int(K))}
        for w, g in depthwise.groupby("weights", sort=False)
        for K in sorted(g["K"].unique())
    ]
    token_tables = {}
    if pair.token_layer == last:
        token_tables = {"tokenwise": pair.tokenwise.iloc[:0], "context": pair.context.iloc[:0]}
    return dataclasses.replace(
        pair,
        depthwise=depthwise,
        tiles=_drop_last(pair.tiles, ("layer_i", "layer_j"), last),
        singular_values=_drop_last(pair.singular_values, ("layer",), last),
        summary=pd.DataFrame(summary),
        **token_tables,
    )


def checkpoints_without_last_block(tables, how: str = "offdiag"):
    """A checkpoint sweep's tables (``emergence.CheckpointTables``) as the "excluded" convention
    sees them, from the same measurement: the depth-wise pairs without each model's last
    measured block (a checkpoint sweep measures every block, so that is the model's last) and
    the summary's ``coupling`` recomputed over the rest. A model of two blocks has no pair left
    and is dropped; none left raises a ValueError."""
    d = tables.depthwise
    last = d.groupby("model")[["layer_i", "layer_j"]].transform("max").max(axis=1)
    cut = d[(d["layer_i"] != last) & (d["layer_j"] != last)]
    cut = cut[cut.groupby("model")["layer_i"].transform("nunique") >= 2]
    if cut.empty:
        raise ValueError("without their last block no model has two blocks left ('excluded' needs three)")
    keys = [c for c in ("panel", "model", "revision", "step", "K") if c in cut.columns]
    rows = [
        {**dict(zip(keys, key)), "coupling": coupling_summary(g, how=how, k=int(key[-1]))}
        for key, g in cut.groupby(keys, sort=False)
    ]
    summary = tables.summary.drop(columns="coupling").merge(pd.DataFrame(rows), on=keys, how="inner")
    return dataclasses.replace(
        tables, depthwise=cut.reset_index(drop=True), summary=summary[list(tables.summary.columns)]
    )


def _check_maps(pairs: Mapping[str, TwinMeasurement]) -> None:
    missing = [c for c in MEASURED_MAPS if c not in pairs]
    if missing:
        raise ValueError(
            f"the comparison needs the model measured under {list(MEASURED_MAPS)}; {missing} missing"
        )
    if len({pairs[c].n_layers for c in MEASURED_MAPS}) != 1:
        raise ValueError("the two measurements are of models with different depths")


def last_lines(pairs: Mapping[str, TwinMeasurement], k: int) -> pd.DataFrame:
    """The last block's row and column of the prompt-mean L × L matrix, per measured convention.

    Columns ``weights, convention, line, partner, m, coupling``: ``line`` "row" is the last
    block's Jacobian in block ``partner``'s singular bases (i = L − 1, j = partner), "column" is
    block ``partner``'s Jacobian in the last block's bases (i = partner, j = L − 1).
    """
    _check_maps(pairs)
    frames = []
    for convention in MEASURED_MAPS:
        pair = pairs[convention]
        last = pair.n_layers - 1
        mats = mean_depthwise(pair.depthwise)
        mats = mats[mats["K"] == k]
        row = mats[(mats["layer_i"] == last) & (mats["layer_j"] != last)]
        col = mats[(mats["layer_j"] == last) & (mats["layer_i"] != last)]
        row = row.assign(line="row", partner=row["layer_j"])
        col = col.assign(line="column", partner=col["layer_i"])
        frames.append(pd.concat([row, col]).assign(convention=convention))
    out = pd.concat(frames, ignore_index=True)
    if out.empty:
        raise ValueError(f"no pair with the last block at K = {k}: measure the last block and K = {k}")
    return out[["weights", "convention", "line", "partner", "m", "coupling"]]


def lines_side_by_side(lines: pd.DataFrame) -> pd.DataFrame:
    """:func:`last_lines` wide: one row per (weights, line, partner), 1 − m² under each convention
    and their ``difference`` (final_norm − block)."""
    wide = lines.pivot_table(index=["weights", "line", "partner"], columns="convention", values="coupling")
    wide = wide.reindex(columns=list(MEASURED_MAPS)).reset_index()
    wide.columns.name = None
    wide["difference"] = wide["final_norm"] - wide["block"]
    wide["weights"] = pd.Categorical(wide["weights"], categories=list(WEIGHTS), ordered=True)
    wide = wide.sort_values(["weights", "line", "partner"], ascending=[True, False, True])
    return wide.assign(weights=wide["weights"].astype(str)).reset_index(drop=True)


def _summary_at(pair: TwinMeasurement, k: int) -> dict[str, float]:
    rows = pair.summary[pair.summary["K"] == k]
    return {str(w): float(v) for w, v in zip(rows["weights"], rows["coupling"])}


def convention_table(pairs: Mapping[str, TwinMeasurement], k: int, how: str = "offdiag") -> pd.DataFrame:
    """The per-model coupling (mean 1 − m² over ``how`` block pairs and prompts) at K = ``k``
    under each convention: one row per (weights, convention), with the blocks it averages
    ("excluded" is left out for a model of two blocks: no pair is left)."""
    _check_maps(pairs)
    L = pairs["block"].n_layers
    rows = []
    for convention in LAST_BLOCKS:
        if convention == "excluded" and "excluded" not in pairs and L < 3:
            continue  # two blocks: without the last one there is no pair left
        pair = pairs.get(convention) or without_last_block(pairs["block"], how)
        blocks = f"0–{L - 2}" if convention == "excluded" else f"0–{L - 1}"
        for weights, value in _summary_at(pair, k).items():
            rows.append({"weights": weights, "convention": convention, "blocks": blocks, "coupling": value})
    return pd.DataFrame(rows)


def _top_singular(pair: TwinMeasurement, weights: str) -> float:
    """The mean (over prompts) top singular value of the last block's Jacobian."""
    sv = pair.singular_values
    sv = sv[(sv["weights"] == weights) & (sv["layer"] == pair.n_layers - 1) & (sv["rank"] == 1)]
    return float(sv["value"].mean()) if len(sv) else float("nan")


def convention_summary(
    pairs: Mapping[str, TwinMeasurement], k: int, how: str = "offdiag"
) -> dict[str, float]:
    """The numbers that say how far apart the conventions are, at K = ``k``.

    Per weights (``trained``, ``twin``): the per-model coupling under each convention
    (``<w>_block``, ``<w>_final_norm``, ``<w>_excluded``), the relative change of the authors'
    against the paper's (``<w>_change``: final_norm / block − 1), the largest |Δ(1 − m²)| on the
    last row and column (``<w>_line_diff``), the top singular value of the last block's Jacobian
    under each map (``<w>_s1_block``, ``<w>_s1_final_norm``); and ``rest_diff``, the largest
    |Δ(1 − m²)| between the two maps over the pairs without the last block (0 up to rounding:
    the other blocks are the same maps), and ``excluded_diff``, the same for the "excluded"
    aggregate computed from either measurement.
    """
    table = convention_table(pairs, k, how).set_index(["weights", "convention"])["coupling"]
    wide = lines_side_by_side(last_lines(pairs, k))
    last = pairs["block"].n_layers - 1
    out: dict[str, float] = {}
    for weights, key in zip(WEIGHTS, ("trained", "twin")):
        for convention in LAST_BLOCKS:
            out[f"{key}_{convention}"] = float(table.get((weights, convention), np.nan))
        out[f"{key}_change"] = out[f"{key}_final_norm"] / out[f"{key}_block"] - 1
        out[f"{key}_line_diff"] = float(wide.loc[wide["weights"] == weights, "difference"].abs().max())
        for convention in MEASURED_MAPS:
            out[f"{key}_s1_{convention}"] = _top_singular(pairs[convention], weights)
    rest = [
        mean_depthwise(_drop_last(pairs[c].depthwise, ("layer_i", "layer_j"), last)).set_index(
            ["weights", "K", "layer_i", "layer_j"]
        )["coupling"]
        for c in MEASURED_MAPS
    ]
    out["rest_diff"] = float((rest[0] - rest[1]).abs().max())
    out["excluded_diff"] = float("nan")
    if last >= 2:
        excluded = [_summary_at(without_last_block(pairs[c], how), k) for c in MEASURED_MAPS]
        out["excluded_diff"] = max(abs(excluded[0][w] - excluded[1][w]) for w in excluded[0])
    return out


# --------------------------------------------------------------------------- for status rows and prose
def folds_norm(provenance: Mapping) -> bool | None:
    """Whether a measurement folded a norm into the last block (its provenance's ``last_block``
    entry); None where the provenance does not say (stored before the setting existed)."""
    facts = provenance.get("last_block")
    return None if facts is None else facts.get("folded_norm") is not None


def convention_note(convention: str, own: str | None, others: Mapping[str, str | None]) -> str:
    """A status row's note on the last block: the convention its verdict ``own`` uses, and what
    the verdict is under each other convention in ``others`` (None: not judged there)."""
    parts, same = [f"last block: '{convention}'"], []
    unjudged = [f"'{other}'" for other, verdict in others.items() if verdict is None]
    if unjudged:
        parts.append(f"not judged under {' or '.join(unjudged)}")
    for other, verdict in others.items():
        if verdict is not None and verdict != own:
            parts.append(f"under '{other}' the verdict would be {verdict}")
        elif verdict is not None:
            same.append(f"'{other}'")
    if same:
        parts.append(f"the same under {' and '.join(same)}")
    return "; ".join(parts)


_ELSEWHERE = re.compile(r"under '(?P<convention>[a-z_]+)' the verdict would be (?P<verdict>yes|partly|no)\b")


def verdicts_elsewhere(note: str) -> dict[str, str]:
    """The other conventions under which a status row's verdict differs, as its
    :func:`convention_note` says them: convention -> verdict (empty where none differs)."""
    return {m["convention"]: m["verdict"] for m in _ELSEWHERE.finditer(note or "")}


def _rows_words(which: list[str]) -> str:
    """Rows named in prose: "the depth-wise row", "the depth-wise and tiles rows"."""
    return f"the {' and '.join(which)} {'row' if len(which) == 1 else 'rows'}"


def _quoted(conventions) -> str:
    return " and ".join(f"'{c}'" for c in conventions)


def changed_verdicts(
    own: Mapping[str, str | None], others: Mapping[str, Mapping[str, str | None]], names: Mapping[str, str]
) -> str:
    """What the other conventions do to the rows ``own`` judges (row -> verdict; None: not judged
    here, left out), in sentences: which rows (``names``: row -> words) would get another verdict
    under which convention (``others``: convention -> row -> verdict), or that no verdict judged
    there changes; and which rows were not judged under which convention (a row missing from or
    None in ``others[convention]``), so the sentence says exactly what was compared."""
    rows = [row for row, v in own.items() if v is not None]
    under: dict[tuple[str, str], list[str]] = {}  # (row, verdict) -> the conventions giving it
    unjudged: dict[tuple[str, ...], list[str]] = {}  # the rows not judged -> the conventions
    for convention, verdicts in others.items():
        for row in rows:
            v = verdicts.get(row)
            if v is not None and v != own[row]:
                under.setdefault((row, v), []).append(convention)
        missing = tuple(row for row in rows if verdicts.get(row) is None)
        if missing:
            unjudged.setdefault(missing, []).append(convention)
    alike: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}  # rows that change alike, said once
    for (row, v), conventions in under.items():
        alike.setdefault((v, str(own[row]), tuple(conventions)), []).append(names[row])
    changing = {c for conventions in under.values() for c in conventions}
    unchanged = [c for c in others if c not in changing and any(others[c].get(r) is not None for r in rows)]
    sentences = []
    if alike:
        said = "; ".join(
            f"{_rows_words(which)}, *{was}* here, would be *{v}* under "
            + " and under ".join(f"'{c}'" for c in conventions)
            for (v, was, conventions), which in alike.items()
        )
        sentences.append(said[0].upper() + said[1:] + ": the status table says so in each row's note.")
    if unchanged:
        sentences.append(f"No verdict judged under {_quoted(unchanged)} changes.")
    if unjudged:
        said = "; ".join(
            f"{'every row' if len(missing) == len(rows) else _rows_words([names[r] for r in missing])} under "
            f"{_quoted(conventions)}"
            for missing, conventions in unjudged.items()
        )
        sentences.append(f"Not judged: {said}.")
    return " ".join(sentences) or "No other convention was judged."


def last_lines_chart(pairs: Mapping[str, TwinMeasurement], k: int):
    """The last block's row and column (two panels, titled) of the prompt-mean L × L matrix at K = ``k``
    under both maps, trained and twin: one line per weights and convention."""
    from coupling_utils.analysis import plots

    lines = last_lines(pairs, k)
    lines = lines.assign(series=lines["weights"] + ", " + lines["convention"])
    last = pairs["block"].n_layers - 1
    titles = {
        "row": f"Row {last}: J_{last} in block j's bases",
        "column": f"Column {last}: J_i in block {last}'s bases",
    }
    left, right = (
        plots.layer_profile(
            lines[lines["line"] == line], "coupling", layer="partner", color="series", band=False,
            look=plots.Look(title=titles[line], y_title="1 − m²",
                            x_title="block j" if line == "row" else "block i"),
        )
        for line in ("row", "column")
    )  # fmt: skip
    return left | right
