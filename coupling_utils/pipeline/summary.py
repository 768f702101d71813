"""The intro page's bottom line: the reproduction status in one chart and a few generated sentences.

The status rows every finding notebook reports (:func:`coupling_utils.pipeline.status.read_statuses`)
become, at build time, a short summary that the book puts up front on its first page: how many
of the paper's claims this build's runs reproduced, partly reproduced or did not, which ones did
not, and one interactive chart with a square per claim (colour: the verdict; shape: this book's
measurement or a replot of the paper's own points; hover: the claim, the numbers and the rule).
Nothing in it is typed by hand, so it always says what the executed notebooks found.

The intro page (``book/intro.md``) marks the place with the line ``% reproduction-summary``
(a MyST comment, invisible if the page is read unbuilt); :func:`stage_summary` replaces it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from coupling_utils.chapters import NOT_THE_PAPERS, is_own_claim
from coupling_utils.pipeline.costs import NEW_DOWNLOAD
from coupling_utils.pipeline.status import AGREE

__all__ = [
    "MARKER", "CHART_FILE", "VERDICT_COLOURS", "Tally", "tally", "status_alt", "status_caption",
    "status_chart", "bottom_line",
    "measured_models", "what_was_measured", "stage_summary",
]  # fmt: skip

MARKER = "% reproduction-summary"
CHART_FILE = "_generated/reproduction-summary.html"  # next to the page, in the staged book
CHART_NAME = "fig-intro-status"
VERDICT_COLOURS = {"yes": "#009E73", "partly": "#E69F00", "no": "#D55E00"}  # Okabe-Ito
KIND_NAMES = {"measured": "this book's measurement", "replot": "replot of the paper's own points"}
OWN_NAME = "this book's own question (not the paper's claim)"  # a measured row of chapters.own_claim
SHAPES = {KIND_NAMES["measured"]: "square", OWN_NAME: "circle", KIND_NAMES["replot"]: "diamond"}
_CELL = 18  # px per claim


def _chapter(row) -> str:
    title = row.get("title") if isinstance(row.get("title"), str) else ""
    return title or str(row["notebook"])


def _claims(df: pd.DataFrame) -> pd.DataFrame:
    """One row per claim with its chart position: chapters in book order, claims grouped by
    kind (measurements first) and verdict (yes, partly, no) within a chapter."""
    data = df.copy()
    data["kind"] = data["kind"].fillna("measured") if "kind" in data else "measured"
    data["chapter"] = [_chapter(r) for r in data.to_dict("records")]
    data["what"] = data["kind"].map(KIND_NAMES).fillna(data["kind"])
    data.loc[(data["kind"] == "measured") & data["claim"].map(is_own_claim), "what"] = OWN_NAME
    order = {a: i for i, a in enumerate(AGREE)}
    data["_k"] = data["what"].map({w: i for i, w in enumerate(SHAPES)}).fillna(len(SHAPES))
    data["_a"] = data["agree"].map(order)
    data["_n"] = data["notebook"].map({n: i for i, n in enumerate(dict.fromkeys(data["notebook"]))})
    data = data.sort_values(["_n", "_k", "_a"], kind="stable")
    data["slot"] = data.groupby("notebook", sort=False).cumcount() + 1
    for col in ("paper", "ours"):
        data[col] = data[col].map(_text)
    return data.drop(columns=["_k", "_a", "_n"]).reset_index(drop=True)


def _text(value) -> str:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    return f"{float(value):.3g}"


def status_chart(df: pd.DataFrame):
    """One mark per claim: a row per chapter, coloured by verdict, shaped by kind (:data:`SHAPES`).

    ``df`` is :func:`coupling_utils.pipeline.status.read_statuses`'s table (at least ``notebook``,
    ``claim``, ``paper``, ``ours``, ``agree``; ``title``, ``kind`` and ``rule`` when present).
    Hovering a mark shows the chapter, the claim, the paper's and this run's numbers, the
    verdict and its rule. Returns an Altair chart.
    """
    import altair as alt

    if df.empty:
        raise ValueError("no status rows to draw: run the finding notebooks first")
    data = _claims(df)
    if "rule" not in data:
        data["rule"] = ""
    chapters = list(dict.fromkeys(data["chapter"]))
    kinds = [k for k in SHAPES if k in set(data["what"])]
    slots = int(data["slot"].max())
    return (
        alt.Chart(data[["chapter", "slot", "claim", "paper", "ours", "agree", "what", "rule"]])
        .mark_point(filled=True, size=170, opacity=1)
        .encode(
            x=alt.X(
                "slot:O",
                title="claims, one mark each (grouped by verdict)",
                axis=alt.Axis(labels=False, ticks=False, domain=False),
                scale=alt.Scale(domain=list(range(1, slots + 1))),
            ),
            y=alt.Y("chapter:N", title=None, sort=chapters, axis=alt.Axis(labelLimit=320)),
            color=alt.Color(
                "agree:N",
                title="verdict",
                legend=alt.Legend(symbolType="square"),
                scale=alt.Scale(domain=list(AGREE), range=[VERDICT_COLOURS[a] for a in AGREE]),
            ),
            shape=alt.Shape(
                "what:N",
                title="kind",
                scale=alt.Scale(domain=kinds, range=[SHAPES[k] for k in kinds]),
            ),
            tooltip=[
                alt.Tooltip("chapter:N", title="chapter"),
                alt.Tooltip("claim:N", title="claim"),
                alt.Tooltip("paper:N", title="paper"),
                alt.Tooltip("ours:N", title="this run"),
                alt.Tooltip("agree:N", title="verdict"),
                alt.Tooltip("what:N", title="kind"),
                alt.Tooltip("rule:N", title="rule"),
            ],
        )
        .properties(
            width=max(120, _CELL * slots),
            height=max(60, 30 * len(chapters)),
            title="Reproduction status: every claim this build judged",
        )
    )


def _profiles(df: pd.DataFrame) -> str:
    used = sorted({p for p in df.get("profile", pd.Series(dtype=object)) if isinstance(p, str)})
    return ", ".join(f"`{p}`" for p in used) or "unknown"


def _listing(rows: pd.DataFrame, limit: int = 6) -> str:
    items = [f"{r['claim']} ({_chapter(r).split(' · ')[0]})" for r in rows.to_dict("records")]
    shown = "; ".join(items[:limit])
    return shown + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def _depends_on_the_last_block(rows: pd.DataFrame) -> str:
    """The rows whose verdict another convention of the last block would change, as their notes
    say (``last_block.convention_note``): "depth coupling (f01): yes here, partly under 'block'"."""
    from coupling_utils.analysis.last_block import verdicts_elsewhere

    items = []
    for r in rows.to_dict("records"):
        elsewhere = verdicts_elsewhere(_text(r.get("note", "")))
        if elsewhere:
            under = " and ".join(f"{v} under '{c}'" for c, v in elsewhere.items())
            items.append(f"{r['claim']} ({_chapter(r).split(' · ')[0]}): {r['agree']} here, {under}")
    return "; ".join(items)


@dataclass(frozen=True)
class Tally:
    """The counts the bottom line and the status chart's alt text both state: this build's
    measurements of the paper's claims by verdict, the replots of the paper's points, every mark
    drawn, and the measured rows that ask this book's own questions (``own``: a contrast or an
    extension, :func:`coupling_utils.chapters.own_claim`), which are not the paper's claims."""

    yes: int
    partly: int
    no: int
    replots: int
    squares: int
    own: int = 0

    @property
    def judged(self) -> int:
        return self.yes + self.partly + self.no


def _kinds(df: pd.DataFrame) -> pd.Series:
    return df["kind"].fillna("measured") if "kind" in df else pd.Series("measured", index=df.index)


def _own(df: pd.DataFrame) -> pd.Series:
    """Which rows are this book's own measured questions, not the paper's claims."""
    return (_kinds(df) == "measured") & df["claim"].map(is_own_claim).astype(bool)


def tally(df: pd.DataFrame) -> Tally:
    """The :class:`Tally` of the status rows ``df`` (one computation, so prose and chart agree)."""
    kinds, own = _kinds(df), _own(df)
    counts = df[(kinds == "measured") & ~own]["agree"].value_counts()
    return Tally(
        *(int(counts.get(a, 0)) for a in AGREE), int((kinds == "replot").sum()), len(df), int(own.sum())
    )


def _marks(n: int, shape: str, what: str) -> str:
    return f"{n} {shape}{'' if n == 1 else 's'} for {what}"


def status_alt(t: Tally) -> str:
    """The status chart's alt text, from the same counts as the bottom line, naming each mark's shape
    as the chart draws it (:data:`SHAPES`)."""
    parts = [_marks(t.judged, "square", f"this book's measurements of the paper's claims ({t.yes} yes, "
                                        f"{t.partly} partly, {t.no} no)")]  # fmt: skip
    if t.own:
        parts.append(_marks(t.own, "circle", "this book's own questions, not the paper's claims"))
    if t.replots:
        parts.append(_marks(t.replots, "diamond", "replots of the paper's own points"))
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"A row of marks per chapter, one per claim, {t.squares} in all: {listed}."


def status_caption(df: pd.DataFrame) -> str:
    """The status chart's caption, naming the shapes the chart draws for ``df``'s rows (:data:`SHAPES`)."""
    words = {
        KIND_NAMES["measured"]: "squares are this book's measurements of the paper's claims",
        OWN_NAME: "circles this book's own questions, not the paper's claims",
        KIND_NAMES["replot"]: "diamonds replots of the paper's own points",
    }
    drawn = set(_claims(df)["what"])
    shapes = [words[w] for w in SHAPES if w in drawn]
    return (
        "The reproduction status of this build, one mark per claim: green reproduced, orange partly, red "
        f"not; {', '.join(shapes)}. Hover a mark for the claim, the numbers and the rule."
    )


def _judged(rule: str) -> str:
    """The values a status row's rule judged, with their intervals ("; judged on excess = -0.26
    [-0.29, -0.24; 95% over 2 prompts]"), from its ``rule`` column ("" where it names none)."""
    text = _text(rule)
    if "(judged on " not in text:
        return ""
    # Rows of runs before d4a1313 end their values with "; a yes needs ...", a note rules no
    # longer carry; read_statuses reads whichever executed notebooks the folder holds, so a book
    # built over older runs still meets it, and the bottom line gives the values alone.
    judged = text.split("(judged on ", 1)[1].split("; a yes needs", 1)[0]
    return "; judged on " + (judged[:-1] if judged.endswith(")") else judged)


def _own_words(rows: pd.DataFrame) -> str:
    """The bottom line's clause on this book's own questions (measured rows that are not the paper's
    claims), each with its verdict: "; 1 more row asks … (contrast: more coupled …: minilm (f01), no)"."""
    if rows.empty:
        return ""
    items = []
    for r in rows.to_dict("records"):
        label, _, text = str(r["claim"]).partition(f" {NOT_THE_PAPERS}: ")
        items.append(f"{label.lower()}: {text} ({_chapter(r).split(' · ')[0]}), {r['agree']}")
    said = (
        "1 more row asks this book's own question, not the paper's claim, and is not counted"
        if len(rows) == 1
        else f"{len(rows)} more rows ask this book's own questions, not the paper's claims, and are not "
        "counted"
    )
    return f"; {said} among them ({'; '.join(items)})"


def bottom_line(df: pd.DataFrame) -> str:
    """The generated sentences of the summary (MyST markdown): counts by verdict of this
    build's measured claims, the replots apart, the profiles the runs used, and the claims that
    were not (or only partly) reproduced."""
    if df.empty:
        return (
            "**Bottom line.** No executed notebook has reported a reproduction status yet: run "
            "`coupling-book run --profile default` and rebuild the book.\n"
        )
    own, t = df[_own(df)], tally(df)
    measured = df[(_kinds(df) == "measured") & ~_own(df)]  # the paper's claims, as this book measured them
    lines = [
        f"**Bottom line.** This build's runs (profile {_profiles(df)}; {{numref}}`Fig. %s <{CHART_NAME}>`) "
        f"judged {t.judged} of the paper's "
        f"claims on this book's own measurements: {t.yes} reproduced (yes), "
        f"{t.partly} partly and {t.no} not (no)"
        + _own_words(own)
        + (
            f"; {t.replots} more {'row redraws' if t.replots == 1 else 'rows redraw'} the paper's "
            "own digitised points, which checks how this book reads the paper, not the finding"
            if t.replots
            else ""
        )
        + "."
    ]
    no, partly = measured[measured["agree"] == "no"], measured[measured["agree"] == "partly"]
    if len(partly):
        lines.append(f"Partly: {_listing(partly)}.")
    depends = _depends_on_the_last_block(measured)
    if depends:
        lines.append(f"These verdicts depend on what the last block is: {depends}.")
    lines.append(
        "Each verdict comes from a rule stated in its chapter before the result; {doc}`status` "
        "lists every rule with the numbers it judged. A run at the `smoke` profile checks the "
        "code, not the paper."
    )
    reasons = [f"- **{r['claim']}** ({_chapter(r).split(' · ')[0]}): this run measured {_text(r['ours'])}"
               f"{_judged(r['rule'])}." for r in no.to_dict("records")]  # fmt: skip
    if reasons:
        lines.append("\n\nNot reproduced, each with what this run measured:\n\n" + "\n".join(reasons))
    return " ".join(lines) + "\n"


def measured_models(executed: Path) -> dict[str, list[str]]:
    """``{model reference: [notebooks]}`` of the executed notebooks' model parameters (every
    parameter named ``model``/``models``/``*_model(s)`` or ``family``/``*_family``), from their
    ``runs.json``."""
    import json

    manifest = Path(executed) / "runs.json"
    try:
        runs = json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else {}
    except (OSError, ValueError):
        return {}
    found: dict[str, list[str]] = {}
    for notebook, run in sorted(runs.items()):
        if not isinstance(run, dict) or run.get("status") != "ok":
            continue
        for name, value in (run.get("parameters") or {}).items():
            if not (name in ("model", "models", "family") or name.endswith(("_model", "_models", "_family"))):
                continue
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and ref:
                    found.setdefault(ref, []).append(notebook.split("_")[0])
    return found


def _described(ref: str) -> str:
    """A model reference as measured: an embedded model's zoo description, else the reference."""
    from coupling_utils.models.zoo import REGISTRY

    entry = REGISTRY.get(ref.removeprefix("embedded:")) if ref.startswith("embedded:") else None
    if entry is None:
        return f"`{ref}`"
    return f"`{ref}`: {entry.description.split('. ')[0].rstrip('.')}"


def _paper_cost(costs_csv: Path | None) -> str:
    """What the paper profile would take, from the cost model's table (data/benchmarks/profile_costs.csv)."""
    if costs_csv is None or not Path(costs_csv).is_file():
        return "the `paper` profile (its predicted cost is on {doc}`performance`)"
    costs = pd.read_csv(costs_csv)
    paper = costs[costs["profile"] == "paper"]
    if paper.empty:
        return "the `paper` profile (its predicted cost is on {doc}`performance`)"
    tflop, memory = float(paper["TFLOP"].sum()), float(paper["GPU memory (GB)"].max())
    if NEW_DOWNLOAD in paper:  # a checkpoint two chapters use (f01's and f02's 28 models) counted once
        once = float(paper[NEW_DOWNLOAD].sum())
        download = f"{once:,.0f} GB of downloads (each model and checkpoint counted once)"
    else:
        download = (f"{float(paper['download (GB)'].sum()):,.0f} GB of downloads summed over the chapters "
                    "(a model several chapters use counted in each)")  # fmt: skip
    return (
        f"the `paper` profile: about {tflop:,.0f} TFLOP over {len(paper)} chapters, up to {memory:.3g} GB "
        f"of GPU memory and {download}, as the cost model predicts ({{doc}}`performance`)"
    )


def what_was_measured(executed: Path, costs_csv: Path | None = None) -> str:
    """The first screen's statement of what this build measured (MyST markdown): the models the
    executed notebooks ran on, named as measured, and that the paper's own models were not."""
    models = measured_models(executed)
    if not models:
        return ""
    hub = [m for m in models if not m.startswith("embedded:")]
    lines = [
        "**What was measured.** "
        + (
            "Only models built or shipped for this book, on a CPU; none of the paper's own models. "
            if not hub
            else f"{len(hub)} hub model(s) besides the book's own. "
        )
        + "The models of this build:",
        "",
        *[f"- {_described(m)} ({', '.join(dict.fromkeys(nbs))})" for m, nbs in models.items()],
        "",
        "The paper measured 28 pretrained LLMs of 0.1–14 B parameters and Pythia checkpoints from the "
        "Hugging Face hub, and vision transformers it does not identify, on GPUs. Measuring models of "
        "that size takes " + _paper_cost(costs_csv) + "; "
        "the machines this book is built on have neither a GPU nor access to the hub, so where a "
        "chapter sets its numbers beside the paper's, it compares small models with large ones.",
        "",
    ]
    return "\n".join(lines)


def stage_summary(
    page: Path, df: pd.DataFrame, executed: Path | None = None, costs: Path | None = None
) -> bool:
    """Replace the :data:`MARKER` line of a staged page with the bottom line and the chart.

    The chart's HTML (from :func:`coupling_utils.analysis.display.chart_bundle`) is written to
    :data:`CHART_FILE` next to the page and shown by the ``chart-figure`` directive of the
    book's Sphinx extension as a numbered figure. Returns False (the page unchanged) when the
    page has no marker.
    """
    from coupling_utils.analysis.display import chart_bundle

    text = page.read_text(encoding="utf-8")
    if MARKER not in text.splitlines():
        return False
    parts = [what_was_measured(executed, costs) if executed is not None else "", bottom_line(df)]
    if not df.empty:
        caption = status_caption(df)
        alt_text = status_alt(tally(df))
        bundle, _ = chart_bundle(status_chart(df), caption=caption, alt=alt_text, name=CHART_NAME)
        target = page.parent / CHART_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(bundle["text/html"], encoding="utf-8")
        parts.append(f"\n```{{chart-figure}} {CHART_FILE}\n:name: {CHART_NAME}\n\n{caption}\n```\n")
    lines = text.splitlines()
    at = lines.index(MARKER)
    new = [*lines[:at], *"\n".join(parts).splitlines(), *lines[at + 1 :]]
    page.write_text("\n".join(new) + "\n", encoding="utf-8")
    return True
