"""Measuring any models into tidy tables: what ``coupling-book measure`` does.

For models the book never heard of (hub ids, ``save_pretrained`` directories, ``.gguf`` files,
``embedded:`` names), at any revisions: one :class:`~coupling_utils.measurement.Job` per
(model, revision) (:func:`coupling_utils.measurement.plan`), run in this process or as a sweep
(``executor="local"`` or ``"slurm"``, :mod:`coupling_utils.pipeline.sweep`), stored under
``OUT/store/`` (resumable: a rerun measures only what is missing), then written as tidy CSV
tables in ``OUT/``:

- ``summary.csv``: one row per (model, revision, last block's map, K): the coupling number (mean
  ``1 − m_K²`` over block pairs, ``how``, and over the measured ``tokens``; provenance.json's
  ``summary.definition`` says it in words), its spread over prompts, how many blocks it was
  drawn from (``n_blocks_measured``) and the model's size;
- ``depthwise.csv``, ``singular_values.csv``, ``prompts.csv``, ``timings.csv`` (and
  ``tokenwise``/``context``/``tiles`` when measured): :func:`~coupling_utils.measurement.measure`'s
  tables with ``model`` and ``revision`` columns first, and ``last_block`` after them in those
  whose rows are about blocks (the map of the last block the row's numbers hold; with
  ``--last-block-also`` those tables hold both maps, measured in one run: every row without
  the last block is the same under both);
- ``failures.csv``: the models that could not be measured, with the reason;
- ``provenance.json``: the settings, how the models were asked to be loaded (``--dtype``,
  ``--revision``; each measurement's provenance says the dtype it got), the prompts,
  each model's identity as the store keys it (a local model's files' hash, a hub model's commit,
  an embedded model's recipe), each measurement's provenance (model commit, code fingerprint,
  versions) and the command.

What it is given (prompts, models, options) is checked in
:mod:`coupling_utils.pipeline.measure_inputs`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from coupling_utils.chapters.checks import with_check
from coupling_utils.files import cache_dir
from coupling_utils.measurement import (
    MEASURE_METHODS,
    TABLES,
    Job,
    Loads,
    Options,
    Settings,
    collect,
    coupling_summary,
    plan,
)
from coupling_utils.measurement.tables import BLOCK_COLUMNS, SUMMARY_HOWS
from coupling_utils.models.identity import model_identity
from coupling_utils.pipeline.measure_inputs import (
    DEFAULT_K,
    MeasureError,
    check_model_reference,
    check_options_fit,
    check_token_ids,
    read_prompts,
)
from coupling_utils.pipeline.sweep import Resources

__all__ = [
    "MeasureError",
    "MeasureReport",
    "MeasureRun",
    "measure_many",
    "measure_dry_run",
    "measurement_settings",
    "read_prompts",
    "METHODS",
    "HOWS",
    "DEFAULT_K",
]

METHODS = MEASURE_METHODS
HOWS = SUMMARY_HOWS


@dataclass
class MeasureReport:
    """What :func:`measure_many` wrote (``tables``: name -> path) and what is missing or pending."""

    out: Path
    tables: dict[str, Path] = field(default_factory=dict)
    failures: pd.DataFrame = field(default_factory=pd.DataFrame)
    pending: list[str] = field(default_factory=list)
    n_jobs: int = 0
    notes: list[str] = field(default_factory=list)
    n_stored: int = 0  # of the jobs done, those read from the store (measured by an earlier run)

    @property
    def complete(self) -> bool:
        return self.failures.empty and not self.pending

    @property
    def bad_input(self) -> bool:
        """Whether every model that could not be measured was refused as bad input (an option
        its loaded model does not fit, :func:`~coupling_utils.pipeline.measure_inputs.check_options_fit`):
        the command exits 2, not 1."""
        return not self.failures.empty and bool((self.failures["error"] == "MeasureError").all())

    def text(self) -> str:
        n_now = self.n_jobs - len(self.failures) - len(self.pending) - self.n_stored
        lines = [
            f"{n_now} of {self.n_jobs} measured now and {self.n_stored} read from the store (measured "
            f"by an earlier run), tables in {self.out}"
            if self.n_stored
            else f"{n_now} of {self.n_jobs} measured into {self.out}"
        ]
        lines += [f"  {name}: {path}" for name, path in self.tables.items()]
        for row in self.failures.itertuples(index=False):
            lines.append(f"  missing {row.job}: {row.error}: {row.message}")
        lines += [
            f"  not finished yet: {name} (rerun this command when its job has ended)" for name in self.pending
        ]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def _reference(model: str) -> str:
    """A local path as an absolute one (so that cluster jobs find it); anything else unchanged."""
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else model


def measurement_settings(
    k: Sequence[int] = DEFAULT_K,
    tokens: str = "last",
    method: str = "exact",
    max_tokens: int | None = None,
    layers: Sequence[int] | None = None,
    last_block: str = "block",
    last_block_also: str | None = None,
) -> Settings:
    """The :class:`Settings` of a ``coupling-book measure`` run; a bad one is a MeasureError.

    ``layers``: block indices, 0-based, negative from the end (as measure() reads them); at least
    two, since coupling compares blocks (a model whose blocks they name resolve to one is
    measured, and the report says why it has no coupling). ``last_block_also``: the last block
    measured once more, in the same run, under the other of "block" and "final_norm"."""
    named = None if layers is None else [layers] if isinstance(layers, int) else list(layers)
    if named is not None and len(set(named)) < 2:
        raise MeasureError(
            f"--layers {' '.join(map(str, named))} names one block, and coupling compares blocks: name "
            "at least two (e.g. --layers 0 1; negative counts from the end), or leave --layers out"
        )
    if last_block_also is not None and (last_block_also == last_block or last_block == "excluded"):
        raise MeasureError(_also_refusal(last_block, last_block_also))
    try:
        chosen = dict(tokens=tokens, layers=layers, method=method, max_tokens=max_tokens)
        return Settings(k=tuple(k), last_block=last_block, last_block_also=last_block_also, **chosen)
    except (TypeError, ValueError) as exc:
        raise MeasureError(f"bad measurement settings: {exc}") from exc


def _also_refusal(last_block: str, also: str) -> str:
    """Why ``--last-block-also`` cannot go with ``--last-block`` as given, and what to pass."""
    from coupling_utils.analysis.last_block import beside

    if last_block == "excluded":
        return (
            f"--last-block-also {also} measures the last block once more, and --last-block excluded leaves "
            f"it out; pass --last-block {beside(also)} --last-block-also {also}, or drop --last-block-also"
        )
    return (
        f"--last-block-also {also} names the map --last-block already measures; it measures the last "
        f"block once more under the other map: pass --last-block-also {beside(last_block)}, or drop it"
    )


@dataclass(frozen=True)
class MeasureRun:
    """One ``coupling-book measure`` run, checked when made (a bad one is a MeasureError).

    ``models`` (each named once) measured on ``prompts`` (``{id: prompt}`` or a list) with
    ``settings`` (:func:`measurement_settings`), loaded as ``loads`` says (:class:`Loads`: the
    revisions of every model and the dtype; each model as it is, no random init), stored under
    ``out/store`` and tabled in ``out``; ``how``: which block pairs the summary averages;
    ``resources``: None (in this process, one model after the other) or where the jobs run
    (:class:`~coupling_utils.pipeline.sweep.Resources`); ``prompts_file``: where ``prompts``
    were read (named when one is refused).
    """

    models: Sequence[str]
    prompts: Mapping[str, Any] | Sequence[Any]
    settings: Settings
    out: Path
    loads: Loads = Loads()
    how: str = "offdiag"
    resources: Resources | None = None
    prompts_file: str | Path | None = None

    def __post_init__(self):
        models = [self.models] if isinstance(self.models, str) else list(self.models)
        if not models:
            raise MeasureError("name at least one model")
        if len(set(models)) != len(models):
            raise MeasureError(f"a model is named twice: {models}")
        if self.how not in HOWS:
            raise MeasureError(f"how must be one of {HOWS}, got {self.how!r}")
        _check_loads(self.loads)
        for model in models:
            check_model_reference(model, self.loads.revisions or ())
        if not len(self.prompts):
            raise MeasureError("no prompts to measure on; give a prompts file with --prompts")
        if isinstance(self.prompts, Mapping):
            for model in models:
                for revision in self.loads.revisions or [None]:
                    check_token_ids(self.prompts, model, revision, self.prompts_file)
        object.__setattr__(self, "models", tuple(models))
        object.__setattr__(self, "out", _out_folder(self.out, create=False))

    def references(self) -> dict[str, str]:
        """``{model: reference}``: a local path made absolute, so that cluster jobs find it."""
        return {m: _reference(m) for m in self.models}

    def jobs(self) -> list[Job]:
        """One job per (model, revision), stored under ``out/store``; each checks the options
        against its loaded model before measuring
        (:func:`~coupling_utils.pipeline.measure_inputs.check_options_fit`)."""
        parts = {"measure": self.settings}
        planned = plan(self.references(), self.prompts, parts, loads=self.loads, root=self.out / "store")
        return with_check(planned, check_options_fit, settings=self.settings)


def _check_loads(loads: Loads) -> None:
    """How measure loads each model: as it is (no random init), at named revisions if any."""
    if loads.weights is not None:
        raise MeasureError(
            "measure loads each model as it is (no random init), got weights "
            f"{list(loads.weights)}; leave weights out of loads"
        )
    if loads.revisions is not None and not list(loads.revisions):
        raise MeasureError("revisions is empty; name at least one (--revision R), or leave it out")
    if any(not str(r).strip() for r in loads.revisions or []):
        raise MeasureError(
            f"--revision {list(loads.revisions)}: a revision is empty; name each one (e.g. "
            "--revision step1000), or leave --revision out for the model as it is"
        )


def measure_many(run: MeasureRun) -> MeasureReport:
    """Measure ``run``'s models and write tidy tables to ``run.out``.

    In this process (``run.resources`` None) a model that fails is recorded and the others still
    run; with resources, one job per (model, revision) goes through
    :func:`coupling_utils.pipeline.sweep_submit.submit` (SLURM returns at once, and the tables hold what
    has finished: rerun the same command later to complete them). What this machine cannot run
    (``--executor slurm`` without sbatch, with something left to measure) is refused before
    anything is created; with everything stored, the tables are written here.
    """
    jobs = run.jobs()
    stored = set()  # the jobs stored before this run (with resources; in this process, Result.loaded says)
    if run.resources is not None:
        before = collect(jobs, Options(compute=False))
        stored = {r.job.key for r in before.ok}
        if before.missing:
            run.resources.check_here()
    cache_dir()  # a cache that cannot be made is refused before --out is created
    out = _out_folder(run.out)  # created once the input is known to be good
    pending: list[str] = []
    if run.resources is None:
        done = collect(jobs, Options(progress=sys.stderr.isatty()), desc="models")
        stored = {r.job.key for r in done.ok if not r.loaded}
        _stop_without_room(done, out)
    else:
        from coupling_utils.pipeline.sweep_submit import submit

        states = submit(_sweep(jobs, run), run.resources)
        pending = [s.task.name for s in states if s.state in ("running", "pending")]
        done = collect(jobs, Options(compute=False))
    report = MeasureReport(out, n_jobs=len(jobs), pending=pending, n_stored=len(stored))
    _write_tables(done, report, run)
    return report


def _stop_without_room(done, out: Path) -> None:
    """A job that stopped on a full disk or quota (storing its measurement) stops the run: the
    others and the tables would stop on it too, so it is one :class:`~coupling_utils.files.DiskFull`
    naming the cache (where the store writes), not a model "missing"."""
    from coupling_utils.files import NO_ROOM, DiskFull, cache_dir

    said = {os.strerror(code): code for code in NO_ROOM}
    for r in done.results:
        code = next((c for text, c in said.items() if text in (r.message or "")), None)
        if r.error is not None and (r.error == "DiskFull" or code is not None):
            raise DiskFull.said(r.message or "") or DiskFull(cache_dir(), code or errno.ENOSPC, out)


def measure_dry_run(run: MeasureRun) -> str:
    """What :func:`measure_many` of ``run`` would do, as text (the models and revisions, which are
    stored already, the settings, the output folder; with resources, what would be submitted, and
    for SLURM the batch script); nothing is loaded, measured, submitted or written."""
    jobs = run.jobs()
    done = collect(jobs, Options(compute=False))  # reads what is stored, loads nothing
    settings = run.settings
    chosen = {
        n: getattr(settings, n)
        for n in ("k", "tokens", "method", "layers", "max_tokens", "last_block", "last_block_also")
    }
    chosen.update(k=list(settings.k), layers=list(settings.layers or []) or "all", dtype=run.loads.dtype)
    if settings.last_block_also is None:
        del chosen["last_block_also"]
    lines = [
        f"dry run: nothing is measured, submitted or written; {len(done.missing)} of {len(jobs)} "
        f"(model, revision) pair(s) to measure, on {len(run.prompts)} prompt(s), into {run.out}",
        "  settings: " + ", ".join(f"{name}={value}" for name, value in chosen.items()),
    ]
    lines += [f"  {'stored' if r.ok else 'would measure'}  {r.job.describe()}" for r in done.results]
    if run.resources is not None and done.missing:
        from coupling_utils.pipeline.sweep_submit import submit

        lines.append(f"with --executor {run.resources.executor}:")
        submit(_sweep(jobs, run), run.resources, dry_run=True, echo=lines.append)
    return "\n".join(lines)


def _sweep(jobs, run: MeasureRun):
    """The jobs as a sweep in ``out/sweep`` (recorded when submitted)."""
    from coupling_utils.pipeline.sweep import group_tasks, record_sweep

    info = {
        "notebook": "measure",
        "profile": "cli",
        "overrides": {},
        "models": list(run.models),
        "revisions": list(run.loads.revisions or []),
        "settings": run.settings.to_dict(runtime=False),
    }
    return record_sweep(run.out / "sweep", group_tasks(jobs), info, write=False)


OUTPUT_TABLES = ("summary", "failures", *TABLES)
"""The CSV tables ``measure`` writes into ``--out`` (each ``<name>.csv``), replaced as one set."""


def _out_folder(out: str | Path, *, create: bool = True) -> Path:
    """``--out``, created (``create``); an empty path, a file there, or a folder that cannot be
    written, is bad input."""
    if not str(out).strip():
        raise MeasureError("--out is empty; name the output folder, e.g. --out results/ (it is created)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MeasureError(f"--out {out} is a file, not a folder; name a folder (it is created if missing)")
    if not create:
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MeasureError(
            f"cannot create the --out folder {out} ({exc.strerror}); name a folder you can write"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise MeasureError(
            f"cannot write into the --out folder {out} (permission denied); name a folder you can write"
        )
    foreign = _foreign_outputs(out)
    if foreign:
        raise MeasureError(
            f"--out {out} holds {', '.join(foreign)}, which this run would replace and no earlier "
            "`coupling-book measure` wrote there (its provenance.json does not list them); name another "
            "--out, or move them away first"
        )
    return out


def _foreign_outputs(out: Path) -> list[str]:
    """The files in ``out`` named as this command's outputs that an earlier ``measure`` did not
    write there (not listed in its provenance.json): a prompts file, someone's summary.csv. The
    table set is replaced as a whole, so they would be overwritten or removed."""
    present = [f"{name}.csv" for name in OUTPUT_TABLES if (out / f"{name}.csv").exists()]
    record = out / "provenance.json"
    if not present and not record.exists():
        return []
    try:
        said = json.loads(record.read_text(encoding="utf-8")) if record.exists() else None
    except (OSError, ValueError):
        said = None
    ours = isinstance(said, dict) and str(said.get("what", "")).startswith("coupling-book measure")
    written = {f"{name}.csv" for name in (said.get("tables") or [])} if ours else set()
    return [f for f in present if f not in written] + (
        [] if ours or not record.exists() else ["provenance.json"]
    )


def _ids_as_lists(df: pd.DataFrame) -> pd.DataFrame:
    """List-valued cells (``input_ids``, token strings) as JSON lists, ``[1, 5, 9]``, however the
    table was read (a fresh list or a stored numpy array), so a CSV round-trips with ``json.loads``."""
    import numpy as np

    def listed(v):
        return isinstance(v, (list, tuple, np.ndarray))

    for col in df.columns:
        if df[col].dtype == object and df[col].map(listed).any():
            as_json = df[col].map(lambda v: json.dumps(np.asarray(v).tolist()) if listed(v) else v)
            df = df.assign(**{col: as_json})
    return df


def _replace_tables(out: Path, texts: dict[str, str], provenance: dict) -> dict[str, Path]:
    """Replace the tables in ``out`` as one set: all are written into a temporary folder first;
    then the old provenance goes, every old table is replaced or removed, and the new provenance
    comes last, so a provenance always describes exactly the tables beside it."""
    from coupling_utils.files import naming_the_folder

    with naming_the_folder(out):
        return _replace_tables_in(out, texts, provenance)


def _replace_tables_in(out: Path, texts: dict[str, str], provenance: dict) -> dict[str, Path]:
    tmp = Path(tempfile.mkdtemp(prefix=".tables.", suffix=".tmp", dir=out))
    try:
        for name, text in {**texts, "provenance": json.dumps(provenance, indent=2, default=str)}.items():
            (tmp / f"{name}.{'json' if name == 'provenance' else 'csv'}").write_text(text, encoding="utf-8")
        (out / "provenance.json").unlink(missing_ok=True)
        for name in sorted(set(OUTPUT_TABLES) - set(texts)):
            (out / f"{name}.csv").unlink(missing_ok=True)
        for name in texts:
            os.replace(tmp / f"{name}.csv", out / f"{name}.csv")
        os.replace(tmp / "provenance.json", out / "provenance.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**{name: out / f"{name}.csv" for name in texts}, "provenance": out / "provenance.json"}


def _size(r, key):
    v = r.model.get(key)
    return None if v is None else int(v)


def _summary_rows(done, how: str, last_block: str, report: MeasureReport | None) -> list[dict]:
    """One row per (model, revision, K), of the last block under ``last_block``; a model measured
    at fewer than two blocks has none, and the report (if given) says so (its depth-wise table is
    empty: coupling compares blocks)."""
    rows = []
    for r in done.ok:
        m = r.measurements["measure"]
        if m.depthwise.empty and report is not None:
            blocks = (m.provenance.get("settings") or {}).get("layers")
            report.notes.append(
                f"{r.job.describe()}: no coupling, so no rows in summary.csv and depthwise.csv (not "
                f"written when no model has any): it was measured at block(s) {blocks} only, and coupling "
                "compares two or more; name two or more different blocks with --layers (negative "
                "indices count from the end), or leave --layers out"
            )
        for K in sorted(m.depthwise["K"].unique()) if not m.depthwise.empty else []:
            per = coupling_summary(m.depthwise, how=how, k=int(K), per_prompt=True)
            rows.append(
                {
                    "model": r.job.labels["model"],
                    "revision": r.job.revision or "main",
                    "last_block": last_block,
                    "K": int(K),
                    "how": how,
                    "tokens": _tokens_said((m.provenance.get("settings") or {}).get("tokens", "last")),
                    "n_blocks_measured": len(set(m.depthwise["layer_i"]) | set(m.depthwise["layer_j"])),
                    "coupling": float(per.mean()),
                    "coupling_sd": float(per.std(ddof=1)) if len(per) > 1 else float("nan"),
                    "n_prompts": int(len(per)),
                    "n_layers": _size(r, "n_layers"),
                    "d_model": _size(r, "d_model"),
                    "n_params": _size(r, "n_params"),
                }
            )
    return rows


def _tokens_said(tokens) -> str:
    """A run's ``tokens`` setting as a summary cell: "last", "all", or the positions ("0 3 5")."""
    return tokens if isinstance(tokens, str) else " ".join(str(int(t)) for t in tokens)


def summary_definition(how: str, tokens) -> str:
    """What summary.csv's ``coupling`` is, in words, for a run's ``how`` and ``tokens``."""
    pairs = {
        "offdiag": "every ordered pair of different measured blocks",
        "adjacent": "the pairs of consecutive measured blocks (both orders)",
    }[how]
    at = {"last": "the last token of each prompt", "all": "every token position"}.get(
        _tokens_said(tokens), f"the token positions {_tokens_said(tokens)}"
    )
    return (
        f"mean over prompts of each prompt's mean of 1 - m_K^2 over {pairs} and over {at} "
        "(n_blocks_measured: how many blocks the pairs are drawn from; n_layers: the model's depth)"
    )


def _maps(settings: Settings) -> list[str]:
    """The maps of the last block the run measured: its own, then ``last_block_also``'s."""
    return [settings.last_block] + ([settings.last_block_also] if settings.last_block_also else [])


def _write_tables(done, report: MeasureReport, run: MeasureRun) -> None:
    out, how, settings, prompts = report.out, run.how, run.settings, run.prompts
    lead = ["model", "revision", "last_block"]
    maps = _maps(settings)
    each = [done] + [done.under(lb) for lb in maps[1:]]

    def tidy(df: pd.DataFrame, last_block: str) -> pd.DataFrame:
        if "revision" not in df.columns:
            df = df.assign(revision="main")
        if any(c in df.columns for c in BLOCK_COLUMNS):  # rows about blocks: say the last block's map
            df = df.assign(last_block=last_block)
        first = [c for c in lead if c in df.columns]
        return _ids_as_lists(df[[*first, *[c for c in df.columns if c not in first]]])

    frames = {}
    for name in TABLES:
        parts = [tidy(df, lb) for c, lb in zip(each, maps) if not (df := c.table(name, "measure")).empty]
        if parts and "last_block" not in parts[0].columns:  # not about blocks: the same under each map
            parts = parts[:1]
        if parts:
            frames[name] = pd.concat(parts, ignore_index=True)
    rows = [
        row for i, c in enumerate(each) for row in _summary_rows(c, how, maps[i], report if i == 0 else None)
    ]
    if rows:
        frames = {"summary": pd.DataFrame(rows), **frames}
    failures = done.failures
    report.failures = failures[failures["error"] != "NotMeasured"] if not failures.empty else failures
    if not report.failures.empty:
        frames["failures"] = report.failures.drop(columns=["key"], errors="ignore")
    provenance = {
        "what": "coupling-book measure: block-coupling measurements of these models (measure())",
        "command": " ".join(sys.argv) if sys.argv and sys.argv[0].endswith("coupling-book") else None,
        "models": run.references(),
        "settings": {
            **settings.to_dict(runtime=False),
            "last_block": settings.last_block,
            "last_block_also": settings.last_block_also,
        },
        "load": {
            "dtype": run.loads.dtype,
            "revisions": list(run.loads.revisions or []) or None,
            "note": "as asked (--dtype, --revision); what each model ran in: measurements.<model>",
        },
        "identities": {r.job.describe(): model_identity(r.job.model, r.job.revision) for r in done.ok},
        "summary": {"how": how, "definition": summary_definition(how, settings.tokens)},
        "prompts": {pid: (p if isinstance(p, str) else f"<{int(p.shape[-1])} token ids>") for pid, p in
                    (prompts.items() if isinstance(prompts, Mapping) else enumerate(prompts))},
        "measurements": {
            r.job.describe(): r.measurements["measure"].provenance for r in done.ok
        },
        "store": str(out / "store"),
        "tables": sorted(frames),
    }  # fmt: skip
    texts = {name: df.to_csv(index=False) for name, df in frames.items()}
    report.tables.update(_replace_tables(out, texts, provenance))
