"""Reproduction status: each notebook reports which of the paper's claims it reproduced.

Every finding notebook ends its Results with :func:`report`, a short table of rows
``claim | paper | ours | agree | rule | kind | note`` (``agree`` is "yes", "partly" or "no",
reached by the ``rule`` written next to the claim: see
:func:`coupling_utils.analysis.verdicts.claim`; ``kind`` tells this book's measurements from
replots of the paper's own points). The table is
shown on the page and also stored in the executed notebook as machine-readable JSON (in the
output's metadata under :data:`METADATA_KEY`, which renderers ignore), so the book's
reproduction-status page can be generated from the
notebooks' outputs (:func:`read_statuses`, then :func:`status_markdown`) instead of being typed by
hand, and always says what the last run actually measured, and under which profile.
"""

from __future__ import annotations

import html
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from coupling_utils.analysis.verdicts import KINDS
from coupling_utils.files import read_json

__all__ = [
    "METADATA_KEY",
    "COLUMNS",
    "AGREE",
    "StatusError",
    "status_table",
    "report",
    "read_notebook_status",
    "read_assumptions",
    "read_statuses",
    "status_markdown",
]

METADATA_KEY = "coupling_status"
"""Key of the status in an executed notebook's output metadata.

Its value: ``{"notebook": str, "rows": [row, ...]}``.

Metadata rather than a MIME type of its own: Jupyter Book warns about (and, building with
warnings as errors, fails on) output MIME types it cannot render."""

COLUMNS = ("claim", "paper", "ours", "agree", "rule", "kind", "note")
AGREE = ("yes", "partly", "no")
_REQUIRED = ("claim", "paper", "ours", "agree")


class StatusError(ValueError):
    """A status row is malformed; the message names the row, the field and the fix."""


def _value(value: Any, where: str) -> str | float | int | bool:
    """A JSON-safe cell: strings stay, numbers (numpy/torch scalars too) become float/int.

    NaN becomes text.
    """
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()  # numpy / torch scalar (a 1-element tensor too)
        except (ValueError, RuntimeError):
            raise StatusError(f"{where} must be a single number or a text, got an array") from None
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else str(value)  # JSON has no NaN / inf
    if isinstance(value, str):
        return value
    raise StatusError(f"{where} must be a number or a text, got {type(value).__name__}: {value!r}")


def _check_row_keys(row: Any, where: str) -> None:
    if not isinstance(row, Mapping):
        raise StatusError(f"{where} must be a dict with keys {', '.join(COLUMNS)}, got {type(row).__name__}")
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown:
        raise StatusError(f"{where} has unknown key(s) {unknown}; the keys are {', '.join(COLUMNS)}")
    missing = [k for k in _REQUIRED if k not in row]
    if missing:
        raise StatusError(
            f"{where} lacks {missing}; every row needs {', '.join(_REQUIRED)} "
            "(rule, kind and note are optional)"
        )


def _status_row(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One checked status row (see :func:`status_table`); ``where`` names it in errors."""
    _check_row_keys(row, where)
    claim = row["claim"]
    if not isinstance(claim, str) or not claim.strip():
        raise StatusError(f"{where}: 'claim' must be a non-empty text, got {claim!r}")
    agree = row["agree"]
    if not isinstance(agree, str) or agree.strip().lower() not in AGREE:
        raise StatusError(f"{where} ({claim!r}): 'agree' must be one of {list(AGREE)}, got {agree!r}")
    texts = {}
    for key in ("rule", "note"):
        text = row.get(key, "")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise StatusError(f"{where} ({claim!r}): {key!r} must be a text, got {type(text).__name__}")
        texts[key] = text.strip()
    kind = row.get("kind") or "measured"
    if kind not in KINDS:
        raise StatusError(f"{where} ({claim!r}): 'kind' must be one of {list(KINDS)}, got {kind!r}")
    return {
        "claim": claim.strip(),
        "paper": _value(row["paper"], f"{where} ({claim!r}): 'paper'"),
        "ours": _value(row["ours"], f"{where} ({claim!r}): 'ours'"),
        "agree": agree.strip().lower(),
        "rule": texts["rule"],
        "kind": kind,
        "note": texts["note"],
    }


def status_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Validate status rows and return them as a DataFrame with columns :data:`COLUMNS`.

    Each row is a mapping with ``claim`` (text), ``paper`` (the paper's number or statement),
    ``ours`` (what this run measured), ``agree`` ("yes" | "partly" | "no"), and optionally
    ``rule`` (the rule that gave the verdict, as text), ``kind`` ("measured", the default, or
    "replot") and ``note``. Raises :class:`StatusError` naming the row and field otherwise.
    """
    if isinstance(rows, (Mapping, str, bytes)):
        raise StatusError("rows must be a list of dicts (one per claim), not a single mapping or text")
    table = [_status_row(row, f"status row {i}") for i, row in enumerate(rows)]
    if not table:
        raise StatusError("no status rows: report at least one claim with what this run found")
    return pd.DataFrame(table, columns=list(COLUMNS))


def _fmt(value: Any) -> str:
    """A cell as text: numbers to 3 significant digits (``0.801``, ``617``, ``1e-10``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.3g}"
    return str(value)


def _html(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="status-{html.escape(c)}">{html.escape(_fmt(r[c]))}</td>' for c in COLUMNS)
        + "</tr>"
        for r in df.to_dict("records")
    )
    return f'<table class="coupling-status"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _plain(df: pd.DataFrame) -> str:
    return df.assign(**{c: df[c].map(_fmt) for c in ("paper", "ours")}).to_string(index=False)


def report(notebook: str, rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Show a notebook's reproduction status and store it, machine-readable, in its output.

    ``notebook`` names the notebook (``"f02_generalization"`` or ``"f02"``). The table is
    displayed (HTML, with the rows as JSON in the output metadata for :func:`read_statuses`) and
    glued as ``<notebook>_status`` for pages that want to embed it. Returns the validated
    DataFrame; end the cell with ``;`` (or assign it) so it is not displayed twice.
    """
    from IPython.display import display

    if not isinstance(notebook, str) or not notebook.strip():
        raise StatusError(
            f"report(notebook=...) must name the notebook, e.g. 'f02_generalization', got {notebook!r}"
        )
    notebook = notebook.strip()
    df = status_table(rows)
    payload = {"notebook": notebook, "rows": df.to_dict("records")}
    json.dumps(payload, allow_nan=False)  # stays valid JSON in the .ipynb
    display({"text/html": _html(df), "text/plain": _plain(df)}, metadata={METADATA_KEY: payload}, raw=True)
    try:
        from myst_nb import glue
    except ImportError:  # outside the book's environment the table is still shown
        pass
    else:
        glue(f"{notebook}_status", df, display=False)
    return df


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StatusError(f"cannot read executed notebook {path}: {exc}") from None


def _title(nb: dict, default: str) -> str:
    """The notebook's first level-1 heading (``# f02 · Coupling and generalisation``)."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            source = cell.get("source", "")
            for line in (source if isinstance(source, str) else "".join(source)).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return default


def read_notebook_status(path: str | Path) -> pd.DataFrame:
    """The status rows an executed notebook (``.ipynb``) reported (empty if it reported none)."""
    return _rows(_read(Path(path)))


def _rows(nb: dict) -> pd.DataFrame:
    rows = []
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            payload = (output.get("metadata") or {}).get(METADATA_KEY)
            if payload:
                if isinstance(payload, str):  # some writers store JSON MIME data as text
                    payload = json.loads(payload)
                rows.extend(status_table(payload["rows"]).to_dict("records"))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_assumptions(path: str | Path) -> pd.DataFrame:
    """What the prose of an executed notebook assumes (``key, holds, text``), in page order.

    Written by :func:`coupling_utils.analysis.verdicts.assume`; empty if the notebook made none.
    """
    from coupling_utils.analysis.verdicts import ASSUMPTION_KEY

    rows = []
    for cell in _read(Path(path)).get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            record = (output.get("metadata") or {}).get(ASSUMPTION_KEY)
            if record:
                rows.append({"key": record["key"], "holds": bool(record["holds"]), "text": record["text"]})
    return pd.DataFrame(rows, columns=["key", "holds", "text"])


def _executed(executed_dir: Path) -> list[Path]:
    """Executed notebooks in book order; failed (``.failed.ipynb``) and in-flight (hidden) copies left out."""
    return sorted(
        p
        for p in executed_dir.glob("*.ipynb")
        if not p.name.startswith(".") and not p.name.endswith(".failed.ipynb")
    )


def read_statuses(executed_dir: str | Path) -> pd.DataFrame:
    """All status rows reported by the executed notebooks in ``executed_dir``, in notebook order.

    Columns: ``notebook`` (file stem), ``title`` (its first heading), :data:`COLUMNS`, and from
    the runner's ``runs.json``
    (when present) ``profile``, ``seconds``, ``finished`` and ``code`` (the fingerprint of the code
    behind its numbers, :func:`coupling_utils.provenance.code_fingerprint`) of the run that produced each
    notebook. ``df.attrs`` holds ``runs`` (the manifest), ``without_status`` (executed notebooks
    that reported nothing), ``failed`` (notebooks whose last run failed) and ``contradicted``
    (``(notebook, assumption)`` pairs of typed prose the run does not support).
    """
    executed_dir = Path(executed_dir)
    if not executed_dir.is_dir():
        raise StatusError(
            f"no executed notebooks at {executed_dir}: run `coupling-book run --profile <profile>` first"
        )
    manifest = executed_dir / "runs.json"
    runs = read_json(manifest, "record of notebook runs") or {}
    frames, without, contradicted = [], [], []
    for path in _executed(executed_dir):
        nb = _read(path)
        contradicted += [(path.stem, r.text) for r in read_assumptions(path).itertuples() if not r.holds]
        rows = _rows(nb)
        if rows.empty:
            without.append(path.stem)
            continue
        run = runs.get(path.stem, {})
        if run.get("status", "ok") != "ok":  # the last run failed: this copy is from an earlier run
            run = {}
        frames.append(
            rows.assign(
                notebook=path.stem,
                title=_title(nb, path.stem),
                profile=run.get("profile"),
                seconds=run.get("seconds"),
                finished=run.get("finished"),
                code=run.get("code"),
            )
        )
    columns = ["notebook", "title", *COLUMNS, "profile", "seconds", "finished", "code"]
    df = pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    df.attrs["runs"] = runs
    df.attrs["without_status"] = without
    df.attrs["contradicted"] = contradicted
    df.attrs["failed"] = sorted(name for name, run in runs.items() if run.get("status") == "failed")
    return df


def _cell(value: Any) -> str:
    """A markdown table cell: pipes escaped, one line."""
    return " ".join(_fmt(value).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _run_line(group: pd.DataFrame, profile: str | None) -> str:
    first = group.iloc[0]
    used = first.get("profile") if isinstance(first.get("profile"), str) else None
    parts = [f"profile `{used or profile or 'unknown'}`"]
    if isinstance(first.get("finished"), str):
        parts.append(f"run finished {first['finished']}")
    seconds = first.get("seconds")
    if isinstance(seconds, numbers.Real) and not (isinstance(seconds, float) and math.isnan(seconds)):
        parts.append(f"{float(seconds):.0f} s")
    if isinstance(first.get("code"), str):
        parts.append(f"code fingerprint `{first['code']}`")
    return "Produced by the run with " + ", ".join(parts) + "."


def _overview(df: pd.DataFrame, kinds: pd.Series, profile: str | None) -> list[str]:
    """The overview table: per notebook, its profile, its measurements of the paper's claims by
    verdict, the measured rows that ask this book's own questions (a contrast, an extension:
    :func:`coupling_utils.chapters.own_claim`), counted apart as the bottom line counts them, and
    its replots."""
    from coupling_utils.chapters import is_own_claim

    overview = []
    for name, group in df.groupby("notebook", sort=False):
        measured = group[kinds[group.index] == "measured"]
        own = measured["claim"].map(is_own_claim)
        counts = measured[~own]["agree"].value_counts()
        used = (
            group["profile"].iloc[0]
            if "profile" in group and isinstance(group["profile"].iloc[0], str)
            else profile
        )
        title = group["title"].iloc[0] if "title" in group else name
        overview.append(
            [
                f"{{ref}}`{title} <status-{name}>`",
                used or "",
                *(int(counts.get(a, 0)) for a in AGREE),
                int(own.sum()),
                int((kinds[group.index] == "replot").sum()),
            ]
        )
    heads = ["notebook", "profile", *(f"paper's claims: {a}" for a in AGREE), "own questions", "replots"]
    return _table(heads, overview)


def _sections(df: pd.DataFrame, kinds: pd.Series, profile: str | None) -> list[str]:
    """One section per notebook: its run, its measured claims with their rules, then its replots."""
    shown = [c for c in COLUMNS if c != "kind"]
    lines: list[str] = []
    for name, group in df.groupby("notebook", sort=False):
        title = group["title"].iloc[0] if "title" in group else name
        lines += ["", f"(status-{name})=", f"## {title}", "", _run_line(group, profile), ""]
        measured = group[kinds[group.index] == "measured"]
        replots = group[kinds[group.index] == "replot"]
        if not measured.empty:
            lines += _table(shown, measured[shown].values.tolist())
        if not replots.empty:
            lines += [
                "",
                "Replots of the paper's own (digitised) points: they check that this book reads the "
                "paper's figures as the paper does, not that the finding reproduces.",
                "",
            ]
            lines += _table(shown, replots[shown].values.tolist())
    return lines


def _notes(df: pd.DataFrame) -> list[str]:
    """What the tables cannot show: failed last runs, contradicted sentences, runs without status."""
    attrs = df.attrs if hasattr(df, "attrs") else {}
    failed, without = attrs.get("failed", []), attrs.get("without_status", [])
    contradicted = attrs.get("contradicted", [])
    lines: list[str] = []
    shown = set(df["notebook"]) if "notebook" in df else set()
    gone = [n for n in failed if n not in shown]
    stale = [n for n in failed if n in shown]
    if gone:
        lines += [
            "",
            "The last run of " + ", ".join(f"`{n}`" for n in gone) + " failed; "
            "its claims are not in the tables above.",
        ]
    if stale:
        lines += [
            "",
            "The last run of " + ", ".join(f"`{n}`" for n in stale) + " failed; "
            "its table above comes from an earlier successful run.",
        ]
    if contradicted:
        lines += ["", "```{warning}", "The text of these chapters assumes what their last run does not show:"]
        lines += [""]
        lines += [f"- `{name}`: that {text}" for name, text in contradicted]
        lines += ["```"]
    if without:
        lines += ["", "Executed but reported no status: " + ", ".join(f"`{n}`" for n in without) + "."]
    return lines


def status_markdown(df: pd.DataFrame, profile: str | None = None) -> str:
    """The reproduction-status page body (MyST markdown) from :func:`read_statuses`'s table.

    An overview table (per notebook, its measurements of the paper's claims that agree / partly /
    do not, its rows that ask this book's own questions, and how many replots of the paper's own
    points it shows), then one section per notebook:
    the profile and time of the run that produced it, its measured claims with the rule each
    verdict was reached by, and, apart, its replots (``profile`` is the fallback when ``df`` has
    no run information).
    """
    if df.empty:
        lines = [
            "No executed notebook has reported a reproduction status yet: run "
            f"`coupling-book run --profile {profile or 'default'}` and rebuild the book."
        ]
    else:
        kinds = df["kind"].fillna("measured") if "kind" in df else pd.Series("measured", index=df.index)
        lines = _overview(df, kinds, profile) + _sections(df, kinds, profile)
    return "\n".join(lines + _notes(df)) + "\n"
