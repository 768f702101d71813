"""Sections of the book's pages made when it is built, from the repository and the executed runs.

The status page's tables (from each executed notebook's status rows), the architecture page's
table (from the adapter table), the bibliography's "Cite this companion" (from
``CITATION.cff``) and the performance page's findings about the matrix-free path (from
``data/benchmarks/matrix_free.csv``, each comparison worded by its numbers): written at build
time, so a page never states what the code, the runs or the benchmarks do not.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from coupling_utils.files import yaml_problem

__all__ = [
    "BookError",
    "BookInputError",
    "book_config",
    "book_yaml",
    "PRINT_DIR",
    "PRINT_MARKER",
    "citation_section",
    "architectures_section",
    "status_rows",
    "status_section",
    "MATRIX_FREE_MARKER",
    "matrix_free_findings",
    "stage_performance_findings",
    "ENGINE_TARGET_MARKER",
    "engine_target_findings",
    "GPU_RUN_MARKER",
    "gpu_run_findings",
]

PRINT_DIR = "print"  # the printable edition: the whole book on one page, out/print/index.html
PRINT_MARKER = "% printable"  # the intro's line that links it
MATRIX_FREE_MARKER = "% matrix-free-findings"  # the performance page's line for its findings
ENGINE_TARGET_MARKER = "% engine-target"  # ... for the all-token path against its target (T/2)
GPU_RUN_MARKER = "% gpu-check-run"  # ... for what the recorded GPU run is
REDUCTION_TARGET = 5.0  # the matrix-free target: at least this many times fewer block passes than d
DEFAULT_STEPS = 45  # block Lanczos's default number of steps (the rows run with the defaults)


class BookError(RuntimeError):
    """The book cannot be built as asked; the message names the problem and the fix."""


class BookInputError(BookError):
    """A build was asked with a bad path or option (bad input: the CLI exits 2, not 1)."""


def book_yaml(path: Path, what: str):
    """The YAML document at ``path`` (None when empty), a file of the book's own (``what`` says
    which, for the fix): the one reader of ``_config.yml`` and ``_toc.yml``. One that is not UTF-8
    YAML is bad input naming the file, where and what the problem is, and the fix."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        where, problem = yaml_problem(exc)
        raise BookInputError(
            f"{path} cannot be read{where} ({type(exc).__name__}: {problem}): {what} must be UTF-8 YAML; "
            f"fix it (`git diff {Path(path).name}` shows what changed), then run the command again"
        ) from None


def book_config(root: Path) -> dict:
    """``_config.yml`` of the book at ``root`` ({} when there is none, or it is empty), read by
    :func:`book_yaml`, for the book build and the lab kit; one that is not a mapping is bad input."""
    path = Path(root) / "_config.yml"
    if not path.is_file():
        return {}
    config = book_yaml(path, "the book's settings")
    if config is not None and not isinstance(config, dict):
        raise BookInputError(
            f"{path} holds a YAML {type(config).__name__}, not a mapping of settings (`title: ...`, "
            "`html: ...`): fix it (`git diff _config.yml` shows what changed), then run the command again"
        )
    return config or {}


def _names(people) -> list[str]:
    """CITATION.cff persons as "Given Family" (or their ``name``)."""
    out = []
    for p in people or []:
        if p.get("name"):
            out.append(str(p["name"]))
        else:
            out.append(" ".join(str(p[k]) for k in ("given-names", "family-names") if p.get(k)))
    return out


def _bibtex(kind: str, key: str, fields: list[tuple[str, str]]) -> str:
    fields = [(k, v) for k, v in fields if v]
    width = max((len(k) for k, _ in fields), default=0)
    body = ",\n".join(f"  {k:<{width}} = {{{v}}}" for k, v in fields)
    return f"```bibtex\n@{kind}{{{key},\n{body}\n}}\n```\n"


def _paper_citation(preferred: dict) -> str:
    """The paper, from CITATION.cff's ``preferred-citation``: a sentence and its BibTeX."""
    people = preferred.get("authors") or []
    authors = _names(people)
    title = str(preferred.get("title", "")).strip()
    venue = str(preferred.get("collection-title") or preferred.get("journal") or "").strip()
    year = str(preferred.get("year", "")).strip()
    ids = [str(i.get("value", "")) for i in preferred.get("identifiers") or [] if i.get("value")]
    sentence = f"{', '.join(authors)}. *{title}*." + (f" {venue}." if venue else "")
    sentence += f" {year}." if year and year not in venue else ""
    sentence += "".join(f" {i}." for i in ids)
    bib_authors = " and ".join(
        f"{p['family-names']}, {p['given-names']}" if p.get("family-names") else str(p.get("name", ""))
        for p in people
    )
    key = (str(people[0].get("family-names", "paper")).lower() if people else "paper") + year
    fields = [("title", title), ("author", bib_authors), ("booktitle", venue), ("year", year)]
    fields += [("note", "; ".join(ids))]
    return f"**The paper** (the preferred citation): {sentence}\n\n" + _bibtex("inproceedings", key, fields)


def citation_section(cff: Path, url: str = "") -> str:
    """ "Cite this companion and the paper": sentences and BibTeX entries generated from
    ``CITATION.cff`` (the paper from its ``preferred-citation``, the companion from the rest)."""
    meta = yaml.safe_load(Path(cff).read_text(encoding="utf-8")) or {}
    title = str(meta.get("title", "")).strip()
    if not title:
        raise BookError(f"{cff} has no title: CITATION.cff needs title, authors, version")
    authors = _names(meta.get("authors"))
    version = str(meta.get("version", "")).strip()
    date = str(meta.get("date-released", "")).strip()
    link = url or str(meta.get("repository-code") or meta.get("url") or "").strip()
    year = date[:4] if date[:4].isdigit() else ""
    sentence = f"{' and '.join(authors) or 'The authors'}. *{title}*"
    sentence += f", version {version}" if version else ""
    sentence += f" ({date})" if date else ""
    sentence += f". <{link}>" if link else "."
    fields = [("title", title), ("author", " and ".join(f"{{{a}}}" if " " in a else a for a in authors))]
    fields += [("version", version), ("year", year), ("url", link)]
    preferred = meta.get("preferred-citation") or {}
    paper = (
        "It reproduces {cite:t}`aubry2025coupling`; please cite the paper as well.\n\n"
        + _paper_citation(preferred)
        if preferred
        else ""
    )
    message = str(meta.get("message", "")).strip()
    return (
        "## Cite this companion and the paper\n\n"
        f"Generated from the repository's `CITATION.cff` when the book was built. {message}\n\n"
        f"**This companion**: {sentence}\n\n"
        + _bibtex("software", "coupling_companion", fields)
        + (f"\n{paper}" if paper else "")
    )


def architectures_section() -> str:
    """The supported-architectures table, generated from ``architectures.ARCHITECTURES``."""
    from coupling_utils.engine.architectures import supported_architectures

    df = supported_architectures()
    # where transformers' hidden_states[L] stands relative to the final norm ("" without one)
    df["in_hidden_states"] = df["in_hidden_states"].map({True: "after", False: "before"}).fillna("")
    df = df[
        ["name", "model_types", "examples", "attention", "modality", "token_diagonal", "final_norm"]
        + ["in_hidden_states", "notes"]
    ]
    header = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    rows = "".join(
        "| " + " | ".join(str(v).replace("|", "/") for v in row) + " |\n"
        for row in df.itertuples(index=False)
    )
    return header + rows


def status_rows(executed: Path, notebooks: set[str] | None = None):
    """The executed notebooks' status rows (:func:`~coupling_utils.pipeline.status.read_statuses`),
    only those of ``notebooks`` (file stems) when given; an empty table without executed ones."""
    import pandas as pd

    from coupling_utils.pipeline.status import COLUMNS, read_statuses

    if not executed.is_dir():
        return pd.DataFrame(columns=["notebook", *COLUMNS, "profile", "seconds", "finished"])
    df = read_statuses(executed)
    if notebooks is not None:
        attrs = dict(df.attrs)
        df = df[df["notebook"].isin(notebooks)].reset_index(drop=True)
        df.attrs = attrs
    return df


def status_section(executed: Path, notebooks: set[str] | None = None) -> str:
    """The reproduction-status tables, generated from the executed notebooks' status outputs.

    Only ``notebooks`` (file stems) are reported when given: the ones the book includes.
    """
    from coupling_utils.pipeline.status import status_markdown

    return status_markdown(status_rows(executed, notebooks))


def _error(x: float) -> str:
    return "below 10⁻⁵" if x < 1e-5 else f"{x:.2g}"


def _default_rows(t):
    """The exact row, the default Lanczos rows for adjacent pairs (by K) and the first for all pairs."""
    default = t[(t.solver == "lanczos") & (t.steps == DEFAULT_STEPS)]
    adjacent = default[default.scope == "adjacent pairs"].sort_values("K")
    every = default[default.scope == "all layer pairs"].sort_values("K")
    return t[t.method == "exact"], adjacent, every


def _default_sentences(first, whole, d: int) -> list[str]:
    k, whole_bound = int(first.K), d / whole.tile_passes  # the tiles' lower bound, every layer pair
    full = (
        "nothing can for the full matrix at this size.**"
        if whole_bound < REDUCTION_TARGET
        else f"reaches {whole.passes_reduction:.1f}× for the full matrix.**"
    )
    return [
        f"- **Block Lanczos {'meets' if first.meets_target else 'misses'} the matrix-free target for "
        f"adjacent pairs at $K = {k}$, and " + full,
        f"With its defaults (blocks of $\\lceil K/10 \\rceil$ vectors, {DEFAULT_STEPS} steps: "
        f"{first.solver_passes:.0f} solver passes at $K = {k}$) plus the {first.tile_passes:.0f} "
        f"adjacent-pair tile passes, the run in the table used {first.block_passes_per_layer:.0f} passes "
        f"per layer, {first.passes_reduction:.1f}× fewer than $d = {d}$, with adjacent-pair coupling "
        f"values at most {_error(first.max_abs_coupling_error)} from exact; over all layer pairs the "
        f"error was {_error(whole.max_abs_coupling_error)}.",
    ]


def _other_solvers(t, first) -> list[str]:
    out = []
    lanczos = t[t.solver == "lanczos"]
    for _, r in lanczos[(lanczos.steps != DEFAULT_STEPS) & lanczos.K.eq(first.K)].iterrows():
        cheaper = r.block_passes_per_layer < first.block_passes_per_layer
        worse = r.max_abs_coupling_error > first.max_abs_coupling_error
        out.append(
            f"Blocks of {r.block:.0f} vectors and {r.steps:.0f} steps are "
            f"{'cheaper' if cheaper else 'no cheaper'} but {'less' if worse else 'as'} accurate on these "
            f"spectra: {r.solver_passes:.0f} solver passes, {r.block_passes_per_layer:.0f} per layer "
            f"({r.passes_reduction:.1f}× fewer), {_error(r.max_abs_coupling_error)} from exact."
        )
    for _, r in t[t.solver == "subspace"].iterrows():
        out.append(
            f"Subspace iteration ($p = {r.oversample:.0f}$, $q = {r.n_iter:.0f}$) takes "
            f"{r.solver_passes:.0f} solver passes ({r.scope}) for an error of "
            f"{_error(r.max_abs_coupling_error)}."
        )
    return out


def _full_matrix_and_time(exact, adjacent, whole, d: int) -> list[str]:
    first, rest, bound = adjacent.iloc[0], adjacent.iloc[1:], d / whole.tile_passes
    out = [
        f"For the full matrix the tiles alone take $(L-1)K$ = {whole.tile_passes:.0f} passes at "
        f"$K = {first.K:.0f}$, a lower bound (each tile needs $K$ products with independent vectors), "
        + (f"so no solver can reach {REDUCTION_TARGET:.0f}× here" if bound < REDUCTION_TARGET else
           f"which leaves room for {bound:.1f}×")
        + f": the default row reaches {whole.passes_reduction:.1f}× ({whole.block_passes_per_layer:.0f} "
        "passes)."
    ]  # fmt: skip
    if not rest.empty:
        out.append(
            f"At $K$ = {' and '.join(f'${K:.0f}$' for K in rest.K)} the defaults' largest error is "
            f"{_error(rest.max_abs_coupling_error.max())}, but the solver "
            f"({' and '.join(f'{x:.0f}' for x in rest.solver_passes)} passes) and the $2K$ tile passes "
            f"leave {' and '.join(f'{x:.2f}×' for x in rest.passes_reduction)}."
        )
    why = (
        "Fewer passes are less time on this CPU too: "
        if first.seconds < exact.seconds.iloc[0]
        else "Fewer passes are not less time on this CPU: Lanczos runs its steps one after the other, "
        "each a forward-mode pass of a few vectors through the block over all T tokens, while the "
        "exact method batches its d products (for the last token, on that token alone), so "
    )
    out.append(
        why + f"the {first.block_passes_per_layer:.0f}-pass row took {first.seconds:.1f} s against "
        f"{exact.seconds.iloc[0]:.1f} s for the exact method (one run each, {first.machine})."
    )
    return out


def matrix_free_findings(table) -> str:
    """The performance page's bullet on the matrix-free benchmark (``table``: its CSV, block Lanczos,
    subspace iteration and the exact method on the embedded SmolLM2, last token, every block)."""
    from coupling_utils.chapters.f01_depth_and_tokens.story import MATRIX_FREE_BENCHMARK
    from coupling_utils.schemas import check_table

    t = check_table(table, MATRIX_FREE_BENCHMARK)
    exact, adjacent, every = _default_rows(t)
    if exact.empty or adjacent.empty or every.empty:
        return (
            "- The stored matrix-free benchmark lacks the exact row or the default Lanczos rows: "
            "`python bench/bench_jacobians.py --cases matrix_free --out data/benchmarks` measures them."
        )
    d = int(exact.block_passes_per_layer.iloc[0])
    first, whole = adjacent.iloc[0], every.iloc[0]
    text = [
        *_default_sentences(first, whole, d),
        *_other_solvers(t, first),
        *_full_matrix_and_time(exact, adjacent, whole, d),
    ]
    return text[0] + "\n  " + "\n  ".join(text[1:]) + "\n"


def _engine_sentence(rows, T: int) -> str:
    """Why the all-token path misses its target at ``T``: the FLOPs, the bound, the rates."""
    at = rows[rows["T"] == T].set_index("method")
    path, ref = at.loc["all_tokens: Jacobians, spectra, coupling"], at.loc["reference (1 token)"]
    sweep, tiles = at.loc["all_tokens: Jacobians"], at.loc["all_tokens: coupling tiles and metric"]
    spectra = at.loc["all_tokens: spectra (top 50, every token)"].seconds
    at_gemm = T * ref.seconds / ((sweep.flops + tiles.flops) / ref.gemm_flops_per_s + spectra)
    text = (
        f"**At T = {T} the all-token path misses its target**: {path.speedup:.1f}× faster than "
        f"T runs of the reference, against the target T/2 = {path.target:.0f}. The FLOPs say why: the exact "
        f"tiles of all T² pairs ($2T^2 \\cdot 50 d^2$ and more) take {tiles.flops / 1e12:.2f} TFLOP, "
        f"{tiles.flops / sweep.flops:.1f}× the sweep's {sweep.flops / 1e12:.2f} TFLOP, so at the reference's "
        f"FLOP rate the sweep and the tiles alone, with the spectra free, would be {path.flop_bound:.1f}× "
        "faster (`flop_bound`), below the target. "
    )
    if path.speedup > path.flop_bound:
        text += (
            f"The measured {path.speedup:.1f}× exceeds that figure because the tiles ran at a higher FLOP "
            f"rate than the reference ({tiles.gemm_fraction:.2f} of the matrix product's rate against "
            f"{ref.gemm_fraction:.2f}): it is the bound at the reference's rate, not a ceiling. "
        )
    return text + (
        f"Even with the sweep and the tiles at the full rate of the matrix product timed in the same run "
        f"and the spectra's measured {spectra:.1f} s, the path would be {at_gemm:.0f}× faster, "
        + (f"still short of {path.target:.0f}." if at_gemm < path.target else f"above {path.target:.0f}.")
    )


def engine_target_findings(table) -> str:
    """The performance page's paragraph on the all-token path against its target (T/2), from
    ``bench/bench_engine.py``'s CSV (the SmolLM2-sized block): where it is met, and where it is not,
    the measured ratio, the target and the FLOP bound, with why the bound is not a ceiling."""
    block = table[table.case.str.startswith("block: SmolLM2")]
    path = block[block.method == "all_tokens: Jacobians, spectra, coupling"].sort_values("T")
    if path.empty:
        return (
            "The stored engine benchmark has no all-token rows: `python bench/bench_engine.py` measures them."
        )
    met = path[path.speedup >= path.target]
    text = (
        f"The all-token path (Jacobians, top-50 spectra and token-wise coupling) met the target T/2 at "
        f"T = {', '.join(str(int(t)) for t in met['T'])} ({', '.join(f'{x:.1f}×' for x in met.speedup)}). "
        if not met.empty
        else "The all-token path met the target T/2 at no T measured. "
    )
    missed = path[path.speedup < path.target]
    text += " ".join(_engine_sentence(block, int(T)) for T in missed["T"])
    machine, date = str(block.machine.iloc[0]), str(block.date_utc.iloc[0])
    return text + f" (One run of `{block.command.iloc[0]}`, {machine}, {date} UTC.)\n"


def _listed(rows, what: str) -> str:
    return ", ".join(rows[what].astype(str)) or "none"


def _commits(table) -> str:
    """The commits the rows of ``table`` record (``bench/_common.commit``), or that they record none."""
    recorded = table["commit"].dropna().astype(str) if "commit" in table else table.iloc[:0, 0]
    if recorded.empty:
        return " (the rows record no commit)"
    names = ", ".join(sorted(set(recorded)))
    some = "" if len(recorded) == len(table) else f"; {len(table) - len(recorded)} rows record none"
    return f", commit{'s' if recorded.nunique() > 1 else ''} {names}{some}"


def gpu_run_findings(table) -> str:
    """The performance page's paragraph on the recorded GPU run (``bench/gpu_check.py``'s CSV):
    the GPU, the dates, the code's versions, which rows ran, failed or were skipped (a failed row's
    seconds are its time until it failed), and which of its numbers are predictions."""
    ok = table.status.astype(str).eq("ok")
    skipped = table.status.astype(str).str.startswith("skipped")
    failed = table[~ok & ~skipped]
    days = sorted({d[:10] for d in table.date_utc.astype(str)})
    times = sorted({d[11:] for d in table.date_utc.astype(str)})
    versions = ", ".join(
        f"{k} {table[k].iloc[0]}" for k in ("coupling_utils", "torch", "transformers") if k in table
    )
    commit = _commits(table)
    notebooks = table[table.step == "paper profile"]
    text = (
        f"**The recorded GPU run**: {', '.join(sorted(set(table.device.astype(str))))}, "
        f"{' and '.join(days)} (started at {' and '.join(times)} UTC), with {versions}{commit}. At the "
        f"`paper` profile (stand-in hub) {_listed(notebooks[notebooks.status.astype(str).eq('ok')], 'name')} "
        "ran; "
    )
    text += (
        "; ".join(
            f"{r.name} **failed** (`{str(r.status).strip()}`), and its {r.seconds:.1f} s are the time until "
            "it failed, not a run's time"
            for r in failed.itertuples()
        )
        or "none failed"
    ) + ". "
    for r in table[skipped].itertuples():
        text += (
            f"The engine's {str(r.dtype).replace('bit', '-bit')} rows were **not measured** ({r.status}). "
        )
    if "measure_seconds_predicted" in table:
        text += (
            "`measure_seconds_predicted` is a prediction (one block's measured seconds times the "
            "model's number of blocks), not a measured run; so is the GPU time of the cost table above."
        )
    return text + "\n"


def stage_performance_findings(page: Path, benchmarks: Path) -> bool:
    """Replace the performance page's findings markers of a staged page with its findings from the
    stored benchmarks (:data:`MATRIX_FREE_MARKER`: :func:`matrix_free_findings` of
    ``matrix_free.csv``; :data:`ENGINE_TARGET_MARKER`: :func:`engine_target_findings` of
    ``engine.csv``; :data:`GPU_RUN_MARKER`: :func:`gpu_run_findings` of ``gpu_check.csv``); a
    missing file says how to make it. False when the page has none of the markers."""
    import pandas as pd

    from coupling_utils.pipeline.teaching import replace_marker

    makers = {
        MATRIX_FREE_MARKER: (
            "matrix_free.csv",
            matrix_free_findings,
            "python bench/bench_jacobians.py --cases matrix_free",
        ),
        ENGINE_TARGET_MARKER: ("engine.csv", engine_target_findings, "python bench/bench_engine.py"),
        GPU_RUN_MARKER: ("gpu_check.csv", gpu_run_findings, "python bench/gpu_check.py (on a CUDA machine)"),
    }
    lines = page.read_text(encoding="utf-8").splitlines()
    staged = False
    for marker, (name, findings, command) in makers.items():
        if marker not in lines:
            continue
        csv = Path(benchmarks) / name
        bullet = "- " if marker == MATRIX_FREE_MARKER else ""  # the matrix-free findings are a list item
        text = findings(pd.read_csv(csv)) if csv.is_file() else f"{bullet}No `{name}` is stored: `{command}`."
        staged = replace_marker(page, marker, text) or staged
    return staged
