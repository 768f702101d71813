"""f03's words on the stored search over small local runs (``data/f03_search``): what it trained
and what that cost (CPU and wall time, from its tables), the run it found, and its runs read one
factor at a time, as values of single runs (:func:`search_values`)."""

from __future__ import annotations

from typing import Any

from coupling_utils.chapters.f03_training_emergence.results import Results


def search_values(r: Results) -> dict[str, Any]:
    """Every value the search's paragraphs glue, by name."""
    return {**_search_counts(r), **_search_effects(r)}


def _search_counts(r: Results) -> dict[str, Any]:
    """How many searched runs rise, where they peak, what training cost, which is ours."""
    from IPython.display import Markdown

    table = r.search_table
    return {
        "f03_search_n": len(table),
        "f03_search_yes": int((table["rises progressively"] == "yes").sum()),
        "f03_search_partly": int((table["rises progressively"] == "partly").sum()),
        "f03_search_peak_range": Markdown(
            f"at step {int(table.peak_step.min())} in every run"
            if table.peak_step.nunique() == 1
            else f"between steps {int(table.peak_step.min())} and {int(table.peak_step.max())}"
        ),
        "f03_search_cost": Markdown(_cost_words(r, list(table.config))),
        "f03_search_ours": Markdown(
            f"This chapter's run is the search's **{table.config[table.this_chapter].iloc[0]}**."
            if table.this_chapter.any()
            else "This chapter's run is not one of the searched runs."
        ),
        "f03_search_params": Markdown(f"{int(table.n_params.max()):,}"),
        "f03_search_tokens": float(table.tokens_seen.max() / 1e6),
    }


RUNS_FILE = "`data/f03_search/runs.csv`"
"""Where the search stored each run's training time: ``train_cpu_s`` (CPU-seconds) and ``train_s``
(wall-clock seconds); the machine and its load are in ``provenance.json`` beside it."""


def _machine_words(r: Results, configs: list[str]) -> str:
    """The machine the runs trained on and how busy it was, from the search's provenance: "a machine
    (x86_64, 2 cores) whose 1-minute load average, read as each run's training began and ended, lay
    between 1.0 and 13.8, above its 2 cores at some readings: other work was running at times"."""
    prov = [r.search.provenance[c] for c in configs]
    machines = sorted({", ".join(p["machine"].split(", ")[:2]) for p in prov})
    loads = [pair[0] for p in prov for pair in p.get("loadavg_train", [])]
    words = (
        f"a machine ({'; '.join(machines)})" if len(machines) == 1 else f"machines ({'; '.join(machines)})"
    )
    if not loads:
        return words
    cores = min(int(m.split(", ")[1].split()[0]) for m in machines)
    read = (
        "read as each run's training began and ended"
        if len(prov) > 1
        else "read as its training began and ended"
    )
    span = f"{min(loads):.1f}" if len(loads) == 1 else f"between {min(loads):.1f} and {max(loads):.1f}"
    busy = (
        ""
        if max(loads) <= cores
        else f", above its {cores} cores at every reading: other work was running"
        if min(loads) > cores
        else f", above its {cores} cores at some readings: other work was running at times"
    )
    return f"{words} whose 1-minute load average, {read}, lay {span}{busy}"


def _cost_words(r: Results, configs: list[str]) -> str:
    """What training the runs ``configs`` cost, each figure named: "13 CPU-minutes of training in
    all (`train_cpu_s`, one thread per run) and 54 minutes of wall time (`train_s`) in
    `data/f03_search/runs.csv`, on a machine (…) whose 1-minute load average …"."""
    rows = r.search_table.set_index("config").loc[configs]
    threads = {r.search.provenance[c]["spec"].get("threads") for c in configs}
    per = (
        "one thread per run" if threads == {1} else "threads per run: " + ", ".join(map(str, sorted(threads)))
    )
    return (
        f"{rows.train_cpu_s.sum() / 60:.0f} CPU-minutes of training in all (`train_cpu_s`, {per}) and "
        f"{rows.train_s.sum() / 60:.0f} minutes of wall time (`train_s`) in {RUNS_FILE}, on "
        + _machine_words(r, configs)
    )


def recipe_cost_words(r: Results, spec: dict) -> str | None:
    """What training the searched run with this very ``spec`` cost (None when none has it): "the
    search trained this recipe (w64-l4-s4096) in 265 CPU-seconds (`train_cpu_s`, one thread) and 960 s
    of wall time (`train_s`) in `data/f03_search/runs.csv`, on a machine (…) whose …"."""
    table = r.search_table
    same = [c for c in table.config if r.search.provenance[c]["spec"] == spec]
    if not same:
        return None
    row, threads = table.set_index("config").loc[same[0]], spec.get("threads")
    return (
        f"the search trained this recipe ({same[0]}) in {row.train_cpu_s:.0f} CPU-seconds (`train_cpu_s`, "
        f"{'one thread' if threads == 1 else f'{threads} threads'}) and {row.train_s:.0f} s of wall time "
        f"(`train_s`) in {RUNS_FILE}, on {_machine_words(r, same[:1])}"
    )


FACTOR_NAMES = {
    "d_model": "width",
    "n_layers": "depth (blocks)",
    "steps": "training steps",
    "lr": "learning rate",
    "data_tokens": "training tokens available",
}


def _level(value: float) -> str:
    """A factor's setting for readers: whole numbers in full with thousands separators (163,840),
    others as short as they go (0.003)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _search_found(r: Results) -> str:
    """The smallest run that rises progressively, or the one that comes closest."""
    table = r.search_table
    order = {"yes": 0, "partly": 1, "no": 2}
    ranked = table.assign(_o=table["rises progressively"].map(order)).sort_values(["_o", "train_cpu_s"])
    best = ranked.iloc[0]
    if best["rises progressively"] == "yes":
        return (
            f"The smallest run in which coupling rises progressively is **{best.config}** (width "
            f"{int(best.d_model)}, {int(best.n_layers)} blocks, {int(best.steps)} steps, "
            f"{best.train_cpu_s / 60:.1f} CPU-minutes of training)."
        )
    closest = table.sort_values(["peak_position", "spearman"], ascending=False).iloc[0]
    return (
        f"**No run in the search rises progressively.** The one whose peak comes latest is "
        f"{closest.config}: peak at step {int(closest.peak_step)} (position {closest.peak_position:.2f}), "
        f"ρ = {closest.spearman:.2f}, final / early {closest.ratio:.2f}."
    )


def _search_effects(r: Results) -> dict[str, Any]:
    """The search read one factor at a time, the run found, and what the runs of different length
    ended at: the values alone, since the search trained one run, with one seed, per setting (no
    interval, so no word says which way a factor moves coupling)."""
    from IPython.display import Markdown

    effects, lines = r.effects, []
    for (factor, _), grp in effects.groupby(["factor", "group"], sort=False):
        settings = " → ".join(_level(lv) for lv in grp.level)
        finals = " → ".join(f"{v:.3f}" for v in grp.final)
        lines.append(
            f"- {FACTOR_NAMES[factor]} {settings} ({', '.join(grp.config)}): final coupling {finals}."
        )
    return {
        "f03_search_effects": Markdown(
            "\n".join(lines) if lines else "- (no two runs differ in one factor only)"
        ),
        "f03_search_found": Markdown(_search_found(r)),
        "f03_search_length": Markdown(_search_length(effects)),
    }


def _search_length(effects) -> str:
    """Completes "In this search, ...": the final coupling of the runs that differ in length only,
    as values (one run and one seed each: no interval, so not an effect of training length)."""
    steps_fx = effects[effects.factor == "steps"]
    if steps_fx.empty:
        return "no two runs differ in length only"
    runs = steps_fx[steps_fx.group == steps_fx.group.iloc[0]]
    return (
        f"the runs that differ in length only ({' → '.join(_level(v) for v in runs.level)} steps) ended "
        f"at a final coupling of {' → '.join(f'{v:.3f}' for v in runs.final)}: one run and one seed "
        "each, with no interval, so these values are not a measured effect of training length"
    )
