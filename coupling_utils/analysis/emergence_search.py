"""The stored search over small local training runs (``scripts/f03_emergence_search.py``):
reading its tables, and reading them one factor at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from coupling_utils.schemas import Schema, check_table

__all__ = [
    "SEARCH_FOLDER",
    "SEARCH_FACTORS",
    "SEARCH_LAST_BLOCK",
    "Search",
    "load_search",
    "one_factor_effects",
    "plateau_drops",
]

SEARCH_FOLDER = "f03_search"
SEARCH_LAST_BLOCK = "block"
"""The last block's map the stored search measured (``last_block``): the block alone. The search
was stored before the last block became a setting, so its values differ from a chapter's under
another map in the pairs that hold the last block."""


@dataclass
class Search:
    """The stored search over local training runs (``scripts/f03_emergence_search.py``).

    - ``runs``: one row per configuration and K: the spec (d_model, n_layers, steps, lr,
      data_tokens, epochs, ...), its cost (train_s, measure_s), losses (val_loss, plateau_drop)
      and the shape of its coupling curve (``training_curves.growth_summary`` columns, step0);
    - ``curves``: config, step, K, coupling, share_m_above_1;
    - ``losses``: each configuration's per-checkpoint losses;
    - ``provenance``: per configuration, the command, commit, date, machine and versions.
    """

    runs: pd.DataFrame
    curves: pd.DataFrame
    losses: pd.DataFrame
    provenance: dict


def load_search(folder: str | Path | None = None) -> Search:
    """Read the search tables from ``folder`` (default: ``data/f03_search``)."""
    import json

    from coupling_utils.files import data_dir

    folder = Path(folder) if folder is not None else data_dir() / SEARCH_FOLDER
    names = ("runs.csv", "curves.csv", "losses.csv", "provenance.json")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the f03 search tables {missing} are not in {folder}; run "
            "`python scripts/f03_emergence_search.py --out <scratch folder>` to make them"
        )
    tables = [pd.read_csv(folder / n) for n in names[:3]]
    provenance = json.loads((folder / "provenance.json").read_text())
    unexplained = sorted(set(tables[0]["config"]) - set(provenance))
    if unexplained:
        raise ValueError(f"{folder}: configurations {unexplained} have no provenance entry")
    return Search(*tables, provenance)


SEARCH_FACTORS = ("d_model", "n_layers", "steps", "lr", "data_tokens")


def one_factor_effects(
    runs: pd.DataFrame, value: str = "final", *, factors: Sequence[str] = SEARCH_FACTORS
) -> pd.DataFrame:
    """The search read one factor at a time: for each factor, the runs that differ only in it.

    ``runs``: one row per configuration (the search's ``runs`` at one K). For every factor, rows
    are grouped by all the other factors; a group with two or more values of the factor is a
    one-factor comparison. Columns: factor, group (the group's number), level (the factor's
    value), config, ``value``, and change (``value`` at the group's highest level minus at its
    lowest). The search trained one run, with one seed, per setting: a change is the difference
    between two single runs, with no interval, not a measured effect of the factor.
    """
    check_table(runs, Schema("runs", dict.fromkeys((*factors, "config", value), "any")))
    frames, n = [], 0
    for factor in factors:
        others = [f for f in factors if f != factor]
        for _, g in runs.groupby(others, sort=True, dropna=False):
            if g[factor].nunique() < 2:
                continue
            g = g.sort_values(factor)
            change = float(g[value].iloc[-1] - g[value].iloc[0])
            frames.append(
                pd.DataFrame(
                    {
                        "factor": factor,
                        "group": n,
                        "level": g[factor].to_numpy(),
                        "config": g["config"].to_numpy(),
                        value: g[value].to_numpy(),
                        "change": change,
                    }
                )
            )
            n += 1
    columns = ["factor", "group", "level", "config", value, "change"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def plateau_drops(losses: pd.DataFrame, last: float) -> pd.Series:
    """Each searched run's relative drop of validation loss over the last ``last`` of its training
    (``training.val_loss_plateau``), by config: the stored ``plateau_drop`` judged again by today's
    rule (the search stored it from the checkpoint nearest the window's start)."""
    from coupling_utils.models.training import val_loss_plateau

    check_table(losses, Schema("losses", dict.fromkeys(("config", "step", "val_loss"), "any")))
    return pd.Series(
        {c: val_loss_plateau(g, last=last)["relative_drop"] for c, g in losses.groupby("config", sort=False)},
        name="plateau_drop",
    )
