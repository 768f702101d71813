"""The project's data with provenance: leaderboard scores, model metadata, the paper's
digitised points and prompts, read from ``data/`` and checked against their schemas.

Every table carries a ``source`` column. Loaders validate required columns, types, units
(scores in 0-100, parameters > 0, ...) and unique keys, and fail with the file and the CSV
line of the first bad row. Model names are resolved to one canonical id in one place
(``data/model_aliases.csv`` + :func:`resolve_model_id`), so ``gpt2``, ``openai-community/gpt2``
and the paper's registry key all join to the same leaderboard row.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from coupling_utils.files import DATA_ENV_VAR, data_dir
from coupling_utils.schemas import Schema as TableSchema
from coupling_utils.schemas import TableError, check_table

ENV_VAR = DATA_ENV_VAR

# the six prompt categories, mirroring the Open LLM Leaderboard v1 tasks, plus the paper's demo prompt
PROMPT_CATEGORIES = (
    "grade_school_math",  # GSM8K
    "science_questions",  # ARC-Challenge
    "commonsense_continuation",  # HellaSwag
    "academic_multiple_choice",  # MMLU
    "truthfulness",  # TruthfulQA
    "pronoun_resolution",  # Winogrande
)
DEMO_CATEGORY = "demo"
DEMO_PROMPT = "What is the capital of France? The capital is"

V1_TASKS = ("arc", "hellaswag", "mmlu", "truthfulqa", "winogrande", "gsm8k")
V2_TASKS = ("ifeval", "bbh", "math_lvl5", "gpqa", "musr", "mmlu_pro")
PRECISIONS = ("float32", "float16", "bfloat16", "8bit", "4bit")


class DataError(TableError):
    """A data file is missing or does not match its schema (the message names file and row)."""


# ----------------------------------------------------------------------------- locating data


def data_path(name: str) -> Path:
    """Path of one data file, with a clear error if it is missing."""
    path = data_dir() / name
    if not path.is_file():
        raise DataError(
            f"{path}: data file not found. Restore it from the repository (git checkout -- data/) "
            f"or set ${ENV_VAR} to a complete copy of data/."
        )
    return path


# ----------------------------------------------------------------------------- schemas


@dataclass(frozen=True)
class Column:
    """One column of a data file: type, whether it may be empty, and its allowed range or values."""

    name: str
    kind: str = "str"  # "str" | "float" | "int" | "bool"
    required: bool = True  # non-empty in every row
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False  # min < value rather than min <= value
    choices: tuple[str, ...] | None = None
    unit: str = ""  # documentation only


@dataclass(frozen=True)
class DataSchema:
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # unique key
    check: Callable[[pd.DataFrame, Path], None] | None = None  # table-level check

    def table(self, name: str | Path) -> TableSchema:
        """The file's columns as a table schema, names only (a file is read as strings; validate types it)."""
        names = [c.name for c in self.columns]
        return TableSchema(str(name), dict.fromkeys(names, "any"), fix=f"expected {names}.")


def _score(name: str, lo: float = 0.0) -> Column:
    return Column(name, "float", min=lo, max=100.0, unit="percent")


def _average_is_mean(tasks: Sequence[str]):
    def check(df: pd.DataFrame, path: Path) -> None:
        mean = df[list(tasks)].mean(axis=1)
        bad = (mean - df["average"]).abs() > 0.011  # published values are rounded to 0.01
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(
                f"{path}: line {i + 2} ({_row_label(df, i)}): average {df['average'].iloc[i]} is not the "
                f"mean of {', '.join(tasks)} ({mean.iloc[i]:.3f}); a score is wrong or in the wrong unit."
            )

    return check


def _aliases_check(df: pd.DataFrame, path: Path) -> None:
    folded = df["alias"].str.casefold()
    dup = folded.duplicated(keep=False)
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(
            f"{path}: line {i + 2}: alias {df['alias'].iloc[i]!r} is listed more than once "
            "(names match case-insensitively); keep one row per alias."
        )
    chained = df["model_id"].str.casefold().isin(set(folded))
    if chained.any():
        i = int(np.flatnonzero(chained.to_numpy())[0])
        raise DataError(
            f"{path}: line {i + 2}: target {df['model_id'].iloc[i]!r} is itself an alias; "
            "point every alias directly at a canonical model id."
        )
    self_ref = folded == df["model_id"].str.casefold()
    if self_ref.any():
        i = int(np.flatnonzero(self_ref.to_numpy())[0])
        raise DataError(
            f"{path}: line {i + 2}: alias {df['alias'].iloc[i]!r} maps to itself; remove the row."
        )


def _metadata_check(df: pd.DataFrame, path: Path) -> None:
    both = df["n_heads"].notna() & df["n_kv_heads"].notna()
    bad = both & ((df["n_heads"].fillna(1) % df["n_kv_heads"].fillna(1)) != 0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"{path}: line {i + 2} ({_row_label(df, i)}): n_heads {df['n_heads'].iloc[i]} is not a multiple "
            f"of n_kv_heads {df['n_kv_heads'].iloc[i]}."
        )
    no_src = df["params_b"].notna() & (df["params_source"].fillna("").str.strip() == "")
    if no_src.any():
        i = int(np.flatnonzero(no_src.to_numpy())[0])
        raise DataError(f"{path}: line {i + 2} ({_row_label(df, i)}): params_b has no params_source.")


_V1_COLUMNS = (
    Column("model_id"),
    Column("leaderboard_id"),
    Column("precision", choices=PRECISIONS),
    *(_score(t) for t in V1_TASKS),
    _score("average"),
    Column("model_sha", required=False),
    Column("submitted", required=False),
    Column("source"),
)

SCHEMAS: dict[str, DataSchema] = {
    "model_aliases.csv": DataSchema(
        (Column("alias"), Column("model_id"), Column("kind"), Column("note", required=False)),
        key=("alias",),
        check=_aliases_check,
    ),
    "open_llm_leaderboard_v1.csv": DataSchema(
        _V1_COLUMNS, key=("model_id",), check=_average_is_mean(V1_TASKS)
    ),
    "open_llm_leaderboard_v1_other_precision.csv": DataSchema(
        _V1_COLUMNS, key=("model_id", "precision"), check=_average_is_mean(V1_TASKS)
    ),
    "open_llm_leaderboard_v2.csv": DataSchema(
        (
            Column("model_id"),
            Column("leaderboard_id"),
            Column("precision", choices=PRECISIONS),
            *(_score(t) for t in V2_TASKS),
            _score("average"),
            Column("chat_template", "bool"),
            Column("model_sha", required=False),
            Column("submitted", required=False),
            Column("source"),
        ),
        key=("model_id",),
        check=_average_is_mean(V2_TASKS),
    ),
    "model_metadata.csv": DataSchema(
        (
            Column("model_id"),
            Column("family"),
            Column(
                "params_b",
                "float",
                required=False,
                min=0.0,
                min_exclusive=True,
                max=10_000.0,
                unit="billions",
            ),
            Column("params_source", required=False),
            Column("n_layers", "int", required=False, min=1, max=1000),
            Column("d_model", "int", required=False, min=1, max=100_000),
            Column("n_heads", "int", required=False, min=1, max=1000),
            Column("n_kv_heads", "int", required=False, min=1, max=1000),
            Column("source", required=False),
        ),
        key=("model_id",),
        check=_metadata_check,
    ),
    "paper_fig1a_digitized.csv": DataSchema(
        (
            Column("label"),
            Column("model_id"),
            Column("coupling", "float", min=0.0, max=1.0),
            Column("coupling_err", "float", min=0.0, max=0.1),
            _score("score"),
            Column("score_err", "float", min=0.0, max=10.0),
            Column("flag", required=False),
            Column("source"),
        ),
        key=("label",),
    ),
    "paper_fig1b_digitized.csv": DataSchema(
        (
            Column("model_id"),
            Column("step", "int", min=0, max=10_000_000),
            Column("normalized_coupling", "float", min=0.0, max=1.0),
            Column("normalized_coupling_err", "float", min=0.0, max=0.1),
            Column("source"),
        ),
        key=("model_id", "step"),
    ),
    "prompts.csv": DataSchema(
        (
            Column("id"),
            Column("category", choices=(*PROMPT_CATEGORIES, DEMO_CATEGORY)),
            Column("text"),
            Column("source"),
        ),
        key=("id",),
    ),
    # read by coupling_utils.models.loading.gated_repos (the loader says which repos need a login)
    "gated_repos.csv": DataSchema(
        (Column("model_id"), Column("gated", "bool"), Column("access", required=False), Column("source")),
        key=("model_id",),
    ),
    # written by coupling-book k-sensitivity, read by coupling_utils.analysis.k_policy (the method page)
    "k_sensitivity.csv": DataSchema(
        (
            Column("model"),
            Column("revision", required=False),
            Column("d_model", "int", min=1, max=100_000),
            Column("input", choices=("prompts", "images")),
            Column("prompt"),
            Column("k_over_d", "float", min=0.0, max=1.0, min_exclusive=True),
            Column("K", "int", min=1, max=100_000),
            Column("coupling_trained", "float", min=-1.0, max=1.0),
            Column("coupling_twin", "float", min=-1.0, max=1.0),
            Column("excess", "float", min=-2.0, max=2.0),
            Column("last_block", choices=("block", "final_norm", "excluded")),
            Column("init_seed", "int", min=0),
            Column("source"),
        ),
        key=("model", "prompt", "k_over_d"),
    ),
    # read by coupling_utils.pipeline.costs: the configuration fields a run's cost depends on
    "model_configs.csv": DataSchema(
        (
            Column("model_id"),
            Column("model_type"),
            Column("n_layers", "int", min=1, max=1000),
            Column("d_model", "int", min=1, max=100_000),
            Column("n_heads", "int", min=1, max=1000),
            Column("n_kv_heads", "int", min=1, max=1000),
            Column("intermediate_size", "int", min=1, max=1_000_000),
            Column("vocab_size", "int", min=0, max=10_000_000),
            Column("tie_word_embeddings", "bool"),
            Column("extra"),
            Column("torch_dtype", choices=("float32", "float16", "bfloat16")),
            Column("source"),
        ),
        key=("model_id",),
    ),
}


def _row_label(df: pd.DataFrame, i: int) -> str:
    for col in ("model_id", "alias", "id", "label"):
        if col in df.columns:
            return f"{col}={df[col].iloc[i]!r}"
    return f"row {i}"


def _refuse(bad: pd.Series, df: pd.DataFrame, path: Path, says) -> None:
    """Raise DataError at the first row where ``bad`` holds: ``says(i)`` is what is wrong there."""
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{path}: line {i + 2} ({_row_label(df, i)}): {says(i)}")


def _text_values(col, raw: pd.Series, empty: pd.Series, df: pd.DataFrame, path: Path) -> pd.Series:
    if col.choices is not None:
        bad = ~empty & ~raw.isin(col.choices)
        _refuse(bad, df, path, lambda i: f"{col.name}={raw.iloc[i]!r} is not one of {list(col.choices)}.")
    return raw.where(~empty, None).astype("object")


def _bool_values(col, raw: pd.Series, empty: pd.Series, df: pd.DataFrame, path: Path) -> pd.Series:
    lowered = raw.astype("string").str.strip().str.lower()
    bad = ~empty & ~lowered.isin(["true", "false"])
    _refuse(bad, df, path, lambda i: f"{col.name}={raw.iloc[i]!r} is not true or false.")
    return lowered.map({"true": True, "false": False}).astype("boolean")


def _number_values(col, raw: pd.Series, empty: pd.Series, df: pd.DataFrame, path: Path) -> pd.Series:
    num = pd.to_numeric(raw.where(~empty, None), errors="coerce")
    bad = ~empty & (num.isna() | ~np.isfinite(num.astype(float)))
    _refuse(bad, df, path, lambda i: f"{col.name}={raw.iloc[i]!r} is not a finite number.")
    if col.kind == "int":
        frac = ~empty & (num.fillna(0) % 1 != 0)
        _refuse(frac, df, path, lambda i: f"{col.name}={raw.iloc[i]!r} is not a whole number.")
    lo_bad = pd.Series(False, index=df.index)
    if col.min is not None:
        lo_bad = ~empty & ((num <= col.min) if col.min_exclusive else (num < col.min))
    hi_bad = ~empty & (num > col.max) if col.max is not None else pd.Series(False, index=df.index)
    lo = "(" if col.min_exclusive else "["
    unit = f" {col.unit}" if col.unit else ""
    span = f"{lo}{col.min}, {col.max}]{unit}"
    _refuse(
        lo_bad | hi_bad, df, path,
        lambda i: f"{col.name}={raw.iloc[i]} is outside {span}; check the value and its unit.",
    )  # fmt: skip
    return num.round().astype("Int64") if col.kind == "int" else num.astype(float)


def validate(df: pd.DataFrame, schema: DataSchema, path: Path) -> pd.DataFrame:
    """Check ``df`` (as read, all strings) against ``schema`` and return it typed.

    Raises :class:`DataError` naming ``path`` and the CSV line (header = line 1) of the first
    bad value: a missing column, an empty required cell, a value of the wrong type or unit, a
    duplicated key.
    """
    check_table(df, schema.table(path), error=DataError)
    out = df.copy()
    typed = {"str": _text_values, "bool": _bool_values}
    for col in schema.columns:
        raw = df[col.name]
        empty = raw.isna() | (raw.astype("string").str.strip() == "")
        if col.required:
            _refuse(empty, df, path, lambda i, c=col: f"column {c.name!r} is empty; every row needs a value.")
        out[col.name] = typed.get(col.kind, _number_values)(col, raw, empty, df, path)
    dup = out.duplicated(list(schema.key), keep="first")
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        key = ", ".join(f"{k}={out[k].iloc[i]!r}" for k in schema.key)
        raise DataError(f"{path}: line {i + 2}: duplicate key ({key}); each key may appear once.")
    if schema.check is not None:
        schema.check(out, path)
    return out


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int, size: int, name: str) -> pd.DataFrame:
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""], comment=None)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable CSV file ({exc}).") from exc
    return validate(raw, SCHEMAS[name], Path(path))


def read_table(name: str) -> pd.DataFrame:
    """Read and validate one file of ``data/`` by name (a fresh copy each call)."""
    if name not in SCHEMAS:
        raise DataError(f"No schema for {name!r}; known data files: {sorted(SCHEMAS)}.")
    path = data_path(name)
    stat = path.stat()
    return _read_cached(str(path), stat.st_mtime_ns, stat.st_size, name).copy()


# ----------------------------------------------------------------------------- model ids


def load_aliases() -> pd.DataFrame:
    """``model_aliases.csv``: alias -> canonical model id, with the kind of alias and a note."""
    return read_table("model_aliases.csv")


def _alias_map() -> dict[str, str]:
    table = load_aliases()
    return dict(zip(table["alias"].str.casefold(), table["model_id"]))


def resolve_model_id(name: str) -> str:
    """The canonical model id for ``name`` (hub rename, paper registry key, figure label,
    pre-2023 Pythia name, or the id itself). Matching ignores case; unknown names are
    returned unchanged (stripped), so a new model joins by its own id.
    """
    if not isinstance(name, str) or not name.strip():
        raise DataError(f"A model id must be a non-empty string, got {name!r}.")
    name = name.strip()
    return _alias_map().get(name.casefold(), name)


# ----------------------------------------------------------------------------- tables


def load_leaderboard(version: str = "v1", *, other_precisions: bool = False) -> pd.DataFrame:
    """Open LLM Leaderboard scores, one row per model (percent; v2 scores are normalised).

    ``version="v1"``: ARC, HellaSwag, MMLU, TruthfulQA, Winogrande, GSM8K and their average
    (final snapshot 2024-07-07). ``version="v2"``: IFEval, BBH, MATH Lvl 5, GPQA, MuSR,
    MMLU-PRO. ``other_precisions=True`` (v1 only) returns the rows evaluated at the other
    precisions instead (several per model).
    """
    if version == "v1":
        return read_table(
            "open_llm_leaderboard_v1_other_precision.csv"
            if other_precisions
            else "open_llm_leaderboard_v1.csv"
        )
    if version == "v2":
        if other_precisions:
            raise DataError("Only the v1 leaderboard has other-precision rows in data/.")
        return read_table("open_llm_leaderboard_v2.csv")
    raise DataError(f"Unknown leaderboard version {version!r}; use 'v1' or 'v2'.")


def load_metadata() -> pd.DataFrame:
    """Model metadata: family, params_b (billions), n_layers, d_model, n_heads, n_kv_heads, sources."""
    return read_table("model_metadata.csv")


def load_paper_points(figure: str = "1a") -> pd.DataFrame:
    """The paper's published points, digitised from its figures, with reading uncertainties.

    ``"1a"``: coupling vs Open LLM Leaderboard v1 average for 28 models (``coupling``,
    ``score`` and their ``*_err``). ``"1b"``: normalised coupling of Pythia-6.9B/12B against
    training step.
    """
    name = {"1a": "paper_fig1a_digitized.csv", "1b": "paper_fig1b_digitized.csv"}.get(str(figure).lower())
    if name is None:
        raise DataError(f"Unknown figure {figure!r}; digitised points exist for '1a' and '1b'.")
    return read_table(name)


def load_prompts(
    category: str | Sequence[str] | None = None, n: int | None = None, include_demo: bool = True
) -> pd.DataFrame:
    """The project's prompt set: columns ``id, category, text, source``.

    ``category``: one category or a list (see ``PROMPT_CATEGORIES``; ``"demo"`` is the paper's
    demo prompt); None = all six. ``n``: at most ``n`` prompts, taken round-robin across the
    chosen categories so each is represented (``n=0``: none of them, only the demo prompt).
    ``include_demo``: put the paper's demo prompt first (on top of the ``n``).
    """
    table = read_table("prompts.csv")
    known = (*PROMPT_CATEGORIES, DEMO_CATEGORY)
    if category is None:
        cats = list(PROMPT_CATEGORIES)
    else:
        cats = [category] if isinstance(category, str) else list(category)
        unknown = [c for c in cats if c not in known]
        if unknown:
            raise DataError(f"Unknown prompt category {unknown}; choose from {list(known)}.")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
        raise DataError(f"n must be a non-negative integer or None, got {n!r}.")
    want_demo = include_demo or DEMO_CATEGORY in cats
    cats = [c for c in cats if c != DEMO_CATEGORY]
    groups = [table[table["category"] == c].reset_index(drop=True) for c in cats]
    picked: list[pd.Series] = []
    depth = max((len(g) for g in groups), default=0)
    for j in range(depth):  # round-robin: first of each category, then second of each, ...
        for g in groups:
            if j < len(g):
                picked.append(g.iloc[j])
    if n is not None:
        picked = picked[: int(n)]
    rows = ([table[table["category"] == DEMO_CATEGORY].iloc[0]] if want_demo else []) + picked
    if not rows:
        raise DataError("no prompt selected: ask for n >= 1 prompts or include the demo prompt.")
    return pd.DataFrame(rows, columns=table.columns).reset_index(drop=True)


# ----------------------------------------------------------------------------- task datasets (optional)


def _join(out: pd.DataFrame, other: pd.DataFrame, what: str, probe: str, flag: str) -> pd.DataFrame:
    """``out`` left-joined with ``other`` on ``model_id``; ``flag`` marks rows whose ``probe`` is set."""
    clash = [c for c in other.columns if c != "model_id" and c in out.columns]
    if clash:
        raise DataError(f"join_scores: columns {clash} exist in the table and in {what}; rename them first.")
    out = out.merge(other, on="model_id", how="left", validate="many_to_one")
    out[flag] = out[probe].notna()
    return out


def join_scores(
    df: pd.DataFrame,
    *,
    model_col: str = "model",
    leaderboard: str | None = "v1",
    metadata: bool = True,
    warn: bool = True,
) -> pd.DataFrame:
    """Join measured results (one or more rows per model) with leaderboard scores and metadata.

    Model names in ``df[model_col]`` are resolved with :func:`resolve_model_id` into a
    ``model_id`` column. Nothing is dropped: rows without a leaderboard row or metadata keep
    NaN there, ``has_score`` / ``has_metadata`` flag them, ``result.attrs["unmatched"]`` lists
    the unmatched canonical ids, and a warning names them. Leaderboard columns keep their
    names (``arc`` ... ``average``) with ``score_precision`` and ``score_source``; metadata
    adds ``family, params_b, n_layers, d_model, n_heads, n_kv_heads, metadata_source``.
    """
    fix = "pass model_col= the column holding model names."
    check_table(df, TableSchema("join_scores: the table", {model_col: "any"}, fix=fix), error=DataError)
    if model_col != "model_id" and "model_id" in df.columns:
        raise DataError(
            "join_scores: the table already has a 'model_id' column; pass model_col='model_id' or rename it."
        )
    out = df.copy()
    out["model_id"] = out[model_col].map(resolve_model_id)
    unmatched_scores: list[str] = []
    unmatched_meta: list[str] = []
    if leaderboard is not None:
        lb = load_leaderboard(leaderboard)
        lb = lb.drop(columns=["model_sha", "submitted"]).rename(
            columns={"precision": "score_precision", "source": "score_source"}
        )
        out = _join(out, lb, f"the {leaderboard} leaderboard", "average", "has_score")
        unmatched_scores = sorted(set(out.loc[~out["has_score"], "model_id"]))
    if metadata:
        meta = load_metadata().drop(columns=["params_source"]).rename(columns={"source": "metadata_source"})
        out = _join(out, meta, "the metadata", "family", "has_metadata")
        unmatched_meta = sorted(set(out.loc[~out["has_metadata"], "model_id"]))
    out.attrs["unmatched_scores"] = unmatched_scores
    out.attrs["unmatched_metadata"] = unmatched_meta
    out.attrs["unmatched"] = sorted(set(unmatched_scores) | set(unmatched_meta))
    if warn and out.attrs["unmatched"]:
        parts = []
        if unmatched_scores:
            parts.append(f"no {leaderboard} leaderboard row for {unmatched_scores}")
        if unmatched_meta:
            parts.append(f"no metadata for {unmatched_meta}")
        warnings.warn(
            "join_scores: " + "; ".join(parts) + " (rows kept with NaN; see result.attrs['unmatched']).",
            stacklevel=2,
        )
    return out


def fig1a_table(*, leaderboard: str | None = "v1") -> pd.DataFrame:
    """The 28 digitised Fig. 1(a) points joined with metadata (and leaderboard scores).

    Adds ``log10_params`` for the parameter-count comparison. gpt2-medium and phi-1 have no
    v1 row (kept, flagged by ``has_score``); the warning is suppressed because that is known.
    """
    table = join_scores(load_paper_points("1a"), model_col="model_id", leaderboard=leaderboard, warn=False)
    table["log10_params"] = np.log10(table["params_b"] * 1e9)
    return table


__all__ = [
    "DataError",
    "data_dir",
    "data_path",
    "read_table",
    "validate",
    "SCHEMAS",
    "load_aliases",
    "resolve_model_id",
    "load_leaderboard",
    "load_metadata",
    "load_paper_points",
    "load_prompts",
    "join_scores",
    "fig1a_table",
    "PROMPT_CATEGORIES",
    "DEMO_PROMPT",
    "V1_TASKS",
    "V2_TASKS",
]
