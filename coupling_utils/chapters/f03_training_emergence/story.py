"""f03 · Emergence during training (``notebooks/f03_training_emergence.md``).

Its parameters and their checks (:class:`Params`), its measurement plan (:func:`jobs`: every
checkpoint of every run, on the held-out windows and on the quiz prompts), the measurements read
back (:func:`run` -> :class:`Results`, whose properties are the condensed numbers the story
reads), the figures it draws (``*_figure``: a chart and its alt text), its status rows judged by
the rules fixed before any number (:data:`RULES`, :func:`claims`), the assumption its prose
makes about the search (:func:`assumptions`) and the values it glues (:func:`glue_values`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from coupling_utils.analysis import emergence
from coupling_utils.analysis.verdicts import Rule, claim
from coupling_utils.chapters.checks import (
    DTYPES,
    HOWS,
    METHODS,
    STEP,
    boolean,
    check_model,
    check_top_k,
    choice,
    integer,
    k_values,
    list_of,
    number,
    text,
)
from coupling_utils.chapters.params import ChapterParams, param
from coupling_utils.files import cache_dir
from coupling_utils.measurement import Options, collect
from coupling_utils.measurement.jobs import Job
from coupling_utils.measurement.loop import Collected

__all__ = [
    "Params",
    "RULES",
    "MAIN",
    "QUIZ",
    "prompts",
    "quiz_prompts",
    "windows",
    "panels",
    "panel_table",
    "checkpoint_settings",
    "checkpoint_runs",
    "runs_table",
    "panel_jobs",
    "jobs",
    "Results",
    "run",
    "loss_figure",
    "coupling_figure",
    "panels_figure",
    "paper_figure",
    "shapes_figure",
    "graphs_figure",
    "heatmaps_figure",
    "trajectories_figure",
    "steps_figure",
    "search_figure",
    "claims",
    "assumptions",
    "glue_values",
]

NOTEBOOK = "f03_training_emergence"
MAIN = "held-out text"  # the main panel: held-out windows of the training corpus
QUIZ = "quiz prompts (out of distribution)"  # the secondary panel


def _k_main_in_k(v: Mapping[str, Any]) -> str | None:
    if v["k_main"] not in v["k"]:
        return f"parameter 'k_main' must be one of k = {v['k']}, got {v['k_main']}"
    return None


def _three_graph_steps(v: Mapping[str, Any]) -> str | None:
    if v["graph_steps"] and len(v["graph_steps"]) != 3:
        return f"parameter 'graph_steps' must list three steps (or none), got {v['graph_steps']!r}"
    return None


@dataclass(frozen=True)
class Params(ChapterParams):
    """The notebook's papermill parameters (defaults: its parameters cell)."""

    NOTEBOOK = NOTEBOOK
    RULES = (_k_main_in_k, _three_graph_steps)

    models: list = param(["embedded:pythia-tiny"], list_of(check_model))
    revisions: list = param([], list_of(text(STEP), min_len=0))
    dtype: str = param("float32", choice(*DTYPES))
    n_windows: int = param(8, integer(min=1))
    window_tokens: int = param(32, integer(min=2))
    n_prompts: int = param(2, integer(min=0))
    include_demo: bool = param(True, boolean)
    max_tokens: int = param(24, integer(min=2))
    k: list = param([2, 4, 16], k_values)
    k_main: int = param(4, check_top_k)
    how: str = param("offdiag", choice(*HOWS))
    early_step: int = param(1, integer(min=1))
    graph_steps: list = param([], list_of(integer(min=0), min_len=0, max_len=3))
    graph_threshold: float = param(0.4, number(min=0.0, max=1.0))
    plateau_fraction: float = param(0.25, number(min=0.05, max=0.95))
    trajectory_tokens: str = param("all", choice("all", "last"))
    skip_first_token: bool = param(True, boolean)
    method: str = param("exact", choice(*METHODS))


# --------------------------------------------------------------------------- the rules, fixed first
RULES = {
    # claim 1: rises progressively, on the shape of the whole curve from early_step on
    "rises": Rule(
        yes="spearman >= 0.7 and ratio >= 1.5 and peak_position >= 2/3",
        partly="spearman >= 0.3 and ratio > 1 and peak_position >= 1/3",
    ),
    # claim 1: nearly monotonic
    "monotone": Rule(
        yes="spearman >= 0.9 and max_drop <= 0.15", partly="spearman >= 0.7 and max_drop <= 0.3"
    ),
    # claim 2: almost no edges early, dense graphs at the end
    "dense": Rule(
        yes="density_early <= 0.2 and density_final >= 0.5 and density_peak_position >= 2/3",
        partly="density_final > density_early and density_peak_position >= 1/3",
    ),
    # claim 3: coupling develops together with linearity (coupling up, LSS down)
    "together": Rule(yes="rho_lss <= -0.5", partly="rho_lss <= -0.2"),
    # claim 3: a trajectory measure that should fall over training
    "falls": Rule(yes="spearman <= -0.7 and ratio <= 0.9", partly="spearman <= -0.3 and ratio < 1"),
    # the run's own condition: validation loss has flattened
    "flat": Rule(yes="relative_drop <= 0.01", partly="relative_drop <= 0.03"),
}


# --------------------------------------------------------------------------- the plan
def prompts(p: Params) -> dict[str, str]:
    """The quiz prompts: ``n_prompts`` of the prompt set, and the demo prompt when asked."""
    from coupling_utils.analysis.data import load_prompts

    table = load_prompts(n=p.n_prompts, include_demo=p.include_demo)
    return dict(zip(table["id"], table["text"]))


def quiz_prompts(p: Params) -> dict[str, str] | None:
    """The quiz panel's prompts, None when there is none (no prompt and no demo asked)."""
    return prompts(p) if p.n_prompts or p.include_demo else None


def windows(p: Params) -> dict[str, str]:
    """The main panel: ``n_windows`` held-out windows of ``window_tokens`` tokens of the corpus."""
    from coupling_utils.analysis.generalization import corpus_prompts

    return corpus_prompts(p.n_windows, p.window_tokens)


def panels(p: Params) -> dict[str, dict[str, str]]:
    """The prompt sets measured at every checkpoint, by panel: held-out text first, then the quiz."""
    out = {MAIN: windows(p)}
    quiz = quiz_prompts(p)
    if quiz is not None:
        out[QUIZ] = quiz
    return out


def panel_table(p: Params) -> pd.DataFrame:
    """One row per measured prompt: panel, prompt id, and the text's first 90 characters."""
    return pd.DataFrame(
        [
            {"panel": panel, "prompt": pid, "text": t[:90] + ("…" if len(t) > 90 else "")}
            for panel, texts in panels(p).items()
            for pid, t in texts.items()
        ]
    )


def checkpoint_settings(p: Params, panel: str) -> emergence.SweepSettings:
    """What is measured at every checkpoint on ``panel`` (windows are cut to ``window_tokens``,
    quiz prompts to ``max_tokens``)."""
    return emergence.SweepSettings(
        k=p.k,
        how=p.how,
        dtype=p.dtype,
        method=p.method,
        trajectory_tokens=p.trajectory_tokens,
        max_tokens=p.window_tokens if panel == MAIN else p.max_tokens,
    )


def checkpoint_runs(p: Params) -> list[emergence.Checkpoints]:
    """Each run's checkpoints (``run_checkpoints``: a local run's own list, or ``revisions``)."""
    return [emergence.run_checkpoints(m, p.revisions) for m in p.models]


def runs_table(runs: list[emergence.Checkpoints]) -> pd.DataFrame:
    """One row per run: its checkpoints, the first and the last, and whether losses were recorded."""
    return pd.DataFrame(
        [
            {
                "model": r.model,
                "checkpoints": len(r.revisions),
                "first": r.revisions[0],
                "last": r.revisions[-1],
                "losses recorded": r.losses is not None,
            }
            for r in runs
        ]
    )


def panel_jobs(p: Params, runs: list[emergence.Checkpoints] | None = None) -> dict[str, list[Job]]:
    """Per panel: every run's checkpoints on its prompts, at the K that fit the run's width
    (``emergence.runs_jobs``), stored under the cache's ``f03/<method>``."""
    runs = checkpoint_runs(p) if runs is None else runs
    out = cache_dir("f03", p.method)
    return {
        panel: emergence.runs_jobs(runs, texts, checkpoint_settings(p, panel), out=out)
        for panel, texts in panels(p).items()
    }


def jobs(p: Params) -> list[Job]:
    """The measurement plan: :func:`panel_jobs` of both panels, the held-out windows first."""
    return [job for panel in panel_jobs(p).values() for job in panel]


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (``options``: how they run; default: failures recorded) and the
    chapter's :class:`Results`: per panel, one ``emergence.runs_sweep`` of every run (runs, K
    and checkpoints that could not be measured are in its failures)."""
    runs = checkpoint_runs(p)
    planned = panel_jobs(p, runs)
    options = options or Options()
    done = iter(collect([j for js in planned.values() for j in js], options, desc="checkpoints").results)
    sweeps = {}
    for panel, js in planned.items():
        part = Collected([next(done) for _ in js])
        sweeps[panel] = emergence.runs_sweep(
            part, runs, checkpoint_settings(p, panel), panel=panel, on_error=options.on_error
        )
    return Results(p, runs, sweeps)


# --------------------------------------------------------------------------- the measurements, condensed
def _cat(sweeps: Mapping[str, emergence.CheckpointTables], name: str) -> pd.DataFrame:
    return pd.concat([getattr(s, name) for s in sweeps.values()], ignore_index=True)


@dataclass(frozen=True)
class Results:
    """What the story reads from one run: the runs' checkpoints (``runs``) and, per panel, their
    :class:`~coupling_utils.analysis.emergence.CheckpointTables` (``sweeps``); the properties condense them
    (each computed once)."""

    params: Params
    runs: list
    sweeps: dict

    # ----------------------------------------------------------------- the tables of both panels
    @functools.cached_property
    def summary(self) -> pd.DataFrame:
        """One row per (model, revision, step, K) and panel: coupling, trajectory means, width."""
        return _cat(self.sweeps, "summary")

    @functools.cached_property
    def depthwise(self) -> pd.DataFrame:
        return _cat(self.sweeps, "depthwise")

    @functools.cached_property
    def _trajectory_tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        traj, step_norms = _cat(self.sweeps, "trajectories"), _cat(self.sweeps, "step_norms")
        if self.params.skip_first_token:
            traj, step_norms = traj[traj.token > 0], step_norms[step_norms.token > 0]
        return traj, step_norms

    @property
    def trajectories(self) -> pd.DataFrame:
        """Per token: line-shape score, expodistances, growth (position 0 left out when asked)."""
        return self._trajectory_tables[0]

    @property
    def step_norms(self) -> pd.DataFrame:
        """Per token and block: the residual step size (position 0 left out when asked)."""
        return self._trajectory_tables[1]

    @functools.cached_property
    def failures(self) -> pd.DataFrame:
        """What could not be measured, and why (panel, model, revision, error, message, ...)."""
        return _cat(self.sweeps, "failures")

    @property
    def missing(self) -> pd.DataFrame:
        """:attr:`failures` as the page lists them, messages cut to 160 characters."""
        missing = self.failures.reindex(columns=["panel", "model", "revision", "error", "message"])
        return missing.assign(message=missing["message"].astype(str).str.slice(0, 160))

    @property
    def measured_line(self) -> str:
        s = self.summary
        return f"{s.step.nunique()} checkpoints measured for {s.model.nunique()} model(s); none missing"

    @property
    def showcase(self) -> str:
        """The headline run: the first of ``models`` that could be measured."""
        return self.summary.model.iloc[0]

    @functools.cached_property
    def _k_main(self) -> tuple[int, str]:
        return emergence.main_k(self.summary, self.params.k_main, self.showcase)

    @property
    def k_main(self) -> int:
        """The K of the headline numbers: ``k_main``, or the largest measured K below it."""
        return self._k_main[0]

    @property
    def k_note(self) -> str:
        """Why :attr:`k_main` is not the asked one ("" when it is)."""
        return self._k_main[1]

    # ----------------------------------------------------------------- losses
    @functools.cached_property
    def losses(self) -> pd.DataFrame | None:
        """Every local run's per-checkpoint losses (a ``model`` column); None for hub runs."""
        if not any(r.losses is not None for r in self.runs):
            return None
        return pd.concat(
            [r.losses.assign(model=r.model) for r in self.runs if r.losses is not None], ignore_index=True
        )

    @functools.cached_property
    def plateau(self) -> dict | None:
        """How much the showcase run's validation loss fell over the last ``plateau_fraction``."""
        from coupling_utils.models.training import val_loss_plateau

        if self.losses is None:
            return None
        return val_loss_plateau(
            self.losses[self.losses.model == self.showcase], last=self.params.plateau_fraction
        )

    # ----------------------------------------------------------------- coupling over training
    @functools.cached_property
    def main(self) -> pd.DataFrame:
        """The summary at the headline K, both panels."""
        return self.summary[self.summary["K"] == self.k_main]

    @functools.cached_property
    def growth(self) -> pd.DataFrame:
        """The coupling curve's shape per panel and model, judged "rises progressively"."""
        g = emergence.growth_summary(
            self.main, "coupling", by=["panel", "model"], early_step=self.params.early_step
        )
        return emergence.judge_rows(g, RULES["rises"], column="rises progressively")

    @functools.cached_property
    def first(self) -> pd.Series:
        """The headline curve's shape: held-out text, the showcase run."""
        return self.growth.set_index(["panel", "model"]).loc[(MAIN, self.showcase)]

    @functools.cached_property
    def step0(self):
        """Coupling of the headline curve at its first checkpoint (step 0: the initialisation)."""
        m = self.main
        return m[(m.panel == MAIN) & (m.model == self.showcase)].sort_values("step").coupling.iloc[0]

    @functools.cached_property
    def levels(self) -> pd.DataFrame:
        """The level of 1 − m² against K/d per model (held-out text, ``k_levels``)."""
        s, d = self.summary, self.depthwise
        return emergence.k_levels(s[s.panel == MAIN], d[d.panel == MAIN], by="model")

    @functools.cached_property
    def big(self) -> pd.Series:
        """The showcase run's row of :attr:`levels` at its largest K."""
        return self.levels[self.levels.model == self.showcase].sort_values("K").iloc[-1]

    # ----------------------------------------------------------------- the paper's points
    @functools.cached_property
    def paper(self) -> pd.DataFrame:
        """The paper's Fig. 1b, digitised."""
        from coupling_utils.analysis.data import load_paper_points

        return load_paper_points("1b")

    @functools.cached_property
    def paper_growth(self) -> pd.DataFrame:
        return emergence.growth_summary(self.paper, "normalized_coupling", by="model_id", early_step=128)

    # ----------------------------------------------------------------- graphs
    @functools.cached_property
    def held(self) -> pd.DataFrame:
        """The showcase run's depth-wise table on held-out text at the headline K."""
        d = self.depthwise
        return d[(d.panel == MAIN) & (d.model == self.showcase) & (d["K"] == self.k_main)]

    @functools.cached_property
    def _graph_steps(self) -> tuple[list[int], str]:
        return emergence.graph_checkpoints(sorted(self.held.step.unique()), self.params.graph_steps)

    @property
    def chosen(self) -> list[int]:
        """The three checkpoints of the graphs."""
        return self._graph_steps[0]

    @property
    def graph_note(self) -> str:
        """Which asked graph steps were not measured, and what replaced them ("" if none)."""
        return self._graph_steps[1]

    @functools.cached_property
    def all_matrices(self) -> pd.DataFrame:
        return emergence.mean_matrices(self.held, by="step")

    @functools.cached_property
    def density(self) -> pd.DataFrame:
        """Edges of the layer graph at every checkpoint (``graph_threshold``)."""
        return emergence.edge_counts(self.all_matrices, self.params.graph_threshold, by="step")

    @property
    def matrices(self) -> pd.DataFrame:
        """The mean matrices at the graphs' checkpoints."""
        return self.all_matrices[self.all_matrices.step.isin(self.chosen)]

    @functools.cached_property
    def _dense(self) -> tuple[pd.DataFrame, int, dict]:
        dense = self.density[self.density.step >= self.params.early_step].reset_index(drop=True)
        d_peak = int(dense.step.iloc[int(dense.density.to_numpy().argmax())])
        values = {
            "density_early": float(dense.density.iloc[0]),
            "density_final": float(dense.density.iloc[-1]),
            "density_peak_position": emergence.log_position(d_peak, dense.step.iloc[0], dense.step.iloc[-1]),
        }
        return dense, d_peak, values

    @property
    def dense_values(self) -> dict:
        """Edge density early, final, and where the densest graph lies (the rule's values)."""
        return self._dense[2]

    @property
    def d_peak(self) -> int:
        """The step of the densest graph from ``early_step`` on."""
        return self._dense[1]

    # ----------------------------------------------------------------- trajectories
    @functools.cached_property
    def tsum(self) -> pd.DataFrame:
        """Trajectory measures per (model, step) on held-out text: mean over tokens, then prompts."""
        t = self.trajectories
        cols = ["lss", "expodistance_ratio_cv", "expodistance_log_linear_r2", "growth_log_linear_r2"]
        return (
            t[t.panel == MAIN]
            .groupby(["model", "step", "prompt"])[cols]
            .mean()
            .groupby(["model", "step"])
            .mean()
        )

    @functools.cached_property
    def traj_growth(self) -> pd.DataFrame:
        """The shape of each trajectory measure (those defined at every checkpoint), judged "falls"."""
        tsum = self.tsum
        quantities = [q for q in tsum.columns if tsum[q].notna().all()]
        growth = pd.concat(
            [
                emergence.growth_summary(
                    tsum.reset_index(), q, by="model", early_step=self.params.early_step
                ).assign(quantity=q)
                for q in quantities
            ],
            ignore_index=True,
        )
        return emergence.judge_rows(growth, RULES["falls"], column="falls")

    @property
    def lss_row(self) -> pd.Series:
        return self.traj_growth[self.traj_growth.model == self.showcase].set_index("quantity").loc["lss"]

    @property
    def exp_row(self) -> pd.Series | None:
        """The expodistance row (None for a model too shallow to have one)."""
        rows_of = self.traj_growth[self.traj_growth.model == self.showcase].set_index("quantity")
        q = "expodistance_log_linear_r2"
        return rows_of.loc[q] if q in rows_of.index else None

    @functools.cached_property
    def together_in(self) -> pd.DataFrame:
        """Per checkpoint from ``early_step`` on: coupling, trajectory measures, validation loss."""
        m, show = self.main, self.showcase
        together_in = m[(m.panel == MAIN) & (m.model == show)][["step", "coupling"]].merge(
            self.tsum.loc[show].reset_index(), on="step"
        )
        if self.losses is not None:
            own = self.losses[self.losses.model == show][["step", "val_loss"]]
            together_in = together_in.merge(own, on="step", how="left")
        return together_in[together_in.step >= self.params.early_step]

    @functools.cached_property
    def together(self) -> pd.DataFrame:
        """Spearman's ρ of coupling with each trajectory measure and the validation loss."""
        from coupling_utils.analysis import stats

        t = self.together_in
        together = pd.concat(
            [
                stats.rank_correlation(t, "coupling", q)
                for q in t.columns
                if q not in ("step", "coupling") and t[q].notna().all()
            ],
            ignore_index=True,
        )
        return together[together.method == "spearman"].reset_index(drop=True)

    @property
    def rho_lss(self) -> float:
        return float(self.together.set_index("y").statistic.get("lss", float("nan")))

    # ----------------------------------------------------------------- the search
    @functools.cached_property
    def search(self) -> emergence.Search:
        """The stored search over local runs (``data/f03_search``)."""
        return emergence.load_search()

    @functools.cached_property
    def search_table(self) -> pd.DataFrame:
        """The search's runs at K = d/16, judged "rises progressively", this chapter's run marked."""
        runs = self.search.runs
        table = emergence.judge_rows(
            runs[runs["K"] * 16 == runs.d_model], RULES["rises"], column="rises progressively"
        )
        ours_spec = next((r.spec for r in self.runs if r.model == self.showcase), None)
        return table.assign(
            this_chapter=[self.search.provenance[c]["spec"] == ours_spec for c in table.config],
            train_cpu_min=table.train_cpu_s / 60,
        )

    @functools.cached_property
    def effects(self) -> pd.DataFrame:
        """The search read one factor at a time, on the final coupling."""
        return emergence.one_factor_effects(self.search_table, "final")


# --------------------------------------------------------------------------- figures
def _run_name(model: pd.Series) -> pd.Series:
    return model.str.replace("embedded:", "")


def loss_figure(r: Results):
    """Training and validation loss per checkpoint with the unigram level, and its alt text
    (None, None for runs without loss records)."""
    from coupling_utils.analysis import plots

    p, losses, plateau = r.params, r.losses, r.plateau
    if losses is None:
        return None, None
    long = losses.melt(
        id_vars=["model", "step"],
        value_vars=["train_loss", "val_loss", "unigram_entropy"],
        var_name="quantity",
        value_name="nats",
    )
    long["series"] = (
        _run_name(long["model"])
        + ", "
        + long["quantity"].map(
            {"train_loss": "training loss", "val_loss": "validation loss", "unigram_entropy": "unigram level"}
        )
    )
    own = losses[losses.model == r.showcase].sort_values("step")
    val0, unigram = float(own.val_loss.iloc[0]), float(own.unigram_entropy.iloc[0])
    chart = plots.training_curve(
        long,
        "step",
        "nats",
        color="series",
        title="Loss per checkpoint",
        y_title="cross-entropy (nats per token)",
    )
    alt = (
        f"Line chart: validation loss goes from {val0:.2f} nats per token at step 0 to "
        f"{plateau['best_loss']:.2f} at the end (unigram level {unigram:.2f}); over the last "
        f"{p.plateau_fraction:.0%} of training it falls by {plateau['relative_drop']:.1%}."
    )
    return chart, alt


def coupling_figure(r: Results):
    """Coupling over training on held-out text, one line per model and K, and its alt text."""
    from coupling_utils.analysis import plots

    first, k = r.first, r.k_main
    curve = r.summary[r.summary.panel == MAIN].assign(
        series=lambda d: _run_name(d["model"]) + ", K = " + d["K"].astype(str)
    )
    chart = plots.training_curve(
        curve,
        "step",
        "coupling",
        color="series",
        title="Depth-wise coupling of the last token over training (held-out text)",
        y_title=f"mean 1 − m_K² over {'all' if r.params.how == 'offdiag' else 'adjacent'} layer pairs",
    )
    alt = (
        f"Line chart of coupling against training step, one line per K in {sorted(curve.K.unique())}. At "
        f"K = {k} it starts at {r.step0:.3f}, peaks at {first.peak:.3f} at step {int(first.peak_step)} and "
        f"ends at {first.final:.3f} at step {int(first.final_step)}."
    )
    return chart, alt


def panels_figure(r: Results):
    """The headline K's coupling on held-out text against the quiz prompts, and its alt text."""
    from coupling_utils.analysis import plots

    both = r.main.assign(series=lambda d: _run_name(d["model"]) + ", " + d["panel"])
    chart = plots.training_curve(
        both,
        "step",
        "coupling",
        color="series",
        title=f"Held-out text against quiz prompts (K = {r.k_main})",
        y_title="mean 1 − m_K² over layer pairs",
    )
    alt = (
        "Coupling against training step, one line per prompt set: "
        + "; ".join(
            f"{g.panel}: peak {g.peak:.3f} at step {int(g.peak_step)}, final {g.final:.3f}"
            for g in r.growth[r.growth.model == r.showcase].itertuples()
        )
        + "."
    )
    return chart, alt


def paper_figure(r: Results):
    """The paper's Fig. 1b redrawn from its digitised points."""
    from coupling_utils.analysis import plots

    return plots.training_curve(
        r.paper,
        "step",
        "normalized_coupling",
        color="model_id",
        title="The paper's Fig. 1b (digitised)",
        y_title="normalised coupling (paper)",
    )


def shapes_figure(r: Results):
    """Each curve (ours on held-out text, the paper's) divided by its final value against the
    fraction of training, and its alt text."""
    import altair as alt

    from coupling_utils.analysis import plots

    main = r.main
    ours = emergence.relative_curve(main[main.panel == MAIN], "coupling", by="model").assign(
        run=lambda d: "ours: " + _run_name(d["model"])
    )
    theirs = emergence.relative_curve(
        r.paper.rename(columns={"normalized_coupling": "coupling"}), "coupling", by="model_id"
    ).assign(run=lambda d: "paper: " + d["model_id"])
    both = pd.concat([ours, theirs], ignore_index=True)[["run", "step", "training_fraction", "relative"]]
    chart = (
        alt.Chart(both)
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "training_fraction:Q", scale=alt.Scale(type="log"), title="fraction of training (log scale)"
            ),
            y=alt.Y("relative:Q", title="coupling / its final value"),
            color=alt.Color("run:N", scale=alt.Scale(range=plots.OKABE_ITO), title=None),
            tooltip=["run", "step", alt.Tooltip("relative:Q", format=".3f")],
        )
        .properties(width=420, height=260, title="Shapes: each curve divided by its final value")
    )
    text = (
        "Log-x line chart of each curve divided by its final value: "
        + "; ".join(
            f"{run}: from {g.relative.iloc[0]:.2f} to 1, highest {g.relative.max():.2f}"
            for run, g in both.groupby("run", sort=False)
        )
        + "."
    )
    return chart, text


def graphs_figure(r: Results):
    """The layer-coupling graphs at the three chosen checkpoints, and their alt text."""
    from coupling_utils.analysis import plots

    p, density = r.params, r.density
    chart = plots.layer_coupling_graph(
        r.matrices,
        p.graph_threshold,
        value="coupling",
        show="raw",
        facet="step",
        title=f"{r.showcase}: coupled layer pairs (K = {r.k_main})",
    )
    alt = (
        "Circle graphs of the layers at steps "
        + ", ".join(
            f"{int(g.step)} ({g.edges} of {g.pairs} pairs with an edge)"
            for g in density[density.step.isin(r.chosen)].itertuples()
        )
        + f", threshold {p.graph_threshold}."
    )
    return chart, alt


def heatmaps_figure(r: Results):
    """The depth-wise coupling matrices behind the graphs."""
    from coupling_utils.analysis import plots

    return plots.coupling_heatmap(
        r.matrices,
        "layer_j",
        "layer_i",
        "coupling",
        show="raw",
        facet="step",
        size=160,
        title=f"Depth-wise coupling 1 − m² of the last token (K = {r.k_main})",
    )


TRAJECTORY_PANELS = [
    ("lss", "Line-shape score (1 = straight)", "line-shape score"),
    ("expodistance_log_linear_r2", "Expodistance (reconstruction): 1 − R² of log step vs layer", "1 − R²"),
    ("growth_log_linear_r2", "Per-layer growth factor of the steps", "growth factor"),
]


def trajectories_figure(r: Results):
    """Line-shape score, expodistance and growth factor over training, stacked (those measured)."""
    import altair as alt

    from coupling_utils.analysis import plots

    tlong = (
        r.tsum.reset_index().melt(id_vars=["model", "step"], var_name="quantity", value_name="value").dropna()
    )
    tlong["series"] = _run_name(tlong["model"])
    return alt.vconcat(
        *[
            plots.training_curve(
                tlong[tlong.quantity == q], "step", "value", color="series", title=title, y_title=y
            ).properties(height=160)
            for q, title, y in TRAJECTORY_PANELS
            if (tlong.quantity == q).any()
        ]
    )


def steps_figure(r: Results):
    """Residual step size per block at the graphs' checkpoints (log scale)."""
    from coupling_utils.analysis import plots

    s = r.step_norms
    sn = s[(s.panel == MAIN) & (s.model == r.showcase) & s.step.isin(r.chosen)]
    return plots.layer_profile(
        sn.assign(step=sn.step.map(lambda x: f"step {x:>6}")),
        "step_norm",
        color="step",
        log_y=True,
        title="‖x^l − x^(l−1)‖ per block (mean ± s.e. over tokens)",
        y_title="step size (log scale)",
    )


SEARCH_COLUMNS = [
    "config",
    "this_chapter",
    "d_model",
    "n_layers",
    "steps",
    "lr",
    "epochs",
    "val_loss",
    "plateau_drop",
    "step0",
    "early",
    "peak_step",
    "peak",
    "peak_position",
    "final",
    "ratio",
    "spearman",
    "final_vs_peak",
    "rises progressively",
    "train_cpu_min",
]


def search_figure(r: Results):
    """The coupling curve of every searched run at K = d/16, and its alt text."""
    from coupling_utils.analysis import plots

    table, curves = r.search_table, r.search.curves
    chart = plots.training_curve(
        curves[curves["K"] * 16 == curves.d_model],
        "step",
        "coupling",
        color="config",
        title="Coupling over training in every searched run (K = d/16)",
        y_title="mean 1 − m_K² over layer pairs",
    )
    alt = (
        f"One line of coupling against step per searched run ({len(table)} runs); the peaks lie between "
        f"steps {int(table.peak_step.min())} and {int(table.peak_step.max())}, the final values between "
        f"{table.final.min():.3f} and {table.final.max():.3f}."
    )
    return chart, alt


# --------------------------------------------------------------------------- claims
def _coupling_rows(r: Results) -> list[dict]:
    """Claim 1 on our run and on the paper's own digitised curves."""
    p, first, pg, k = r.params, r.first, r.paper_growth, r.k_main
    return [
        claim(
            "coupling rises progressively over training (shape of the curve)",
            paper=f"≈{pg.ratio.mean():.1f}× from step 128 to 143000 (Fig. 1b)",
            rule=RULES["rises"],
            values=first.to_dict(),
            ours=f"{first.ratio:.2f}× (ρ = {first.spearman:.2f}, peak at step {int(first.peak_step)}, "
            f"position {first.peak_position:.2f})",
            note=f"{r.showcase}, held-out text, steps {int(first.early_step)}→{int(first.final_step)}, "
            f"K = {k}, "
            f"{p.how} mean of 1 − m²",
        ),
        claim(
            "the paper's own Fig. 1b curves rise progressively (digitised points)",
            paper="Fig. 1b",
            rule=RULES["rises"],
            values=pg.set_index("model_id").min().to_dict(),
            ours=f"ratio {pg.ratio.min():.2f}, ρ ≥ {pg.spearman.min():.2f}, "
            f"peak position ≥ {pg.peak_position.min():.2f}",
            note="the weaker of the two models on each descriptor",
            kind="replot",
        ),
        claim(
            "the rise is nearly monotonic",
            paper="nearly monotonic for both models",
            rule=RULES["monotone"],
            values=first.to_dict(),
            ours=f"ρ = {first.spearman:.2f}, largest fall {first.max_drop:.0%} of the range",
            note=f"rises between {first.rises:.0%} of consecutive checkpoints",
        ),
    ]


def claims(r: Results) -> list[dict]:
    """The status rows, each judged by its rule in :data:`RULES`: the rise (ours, the paper's
    curves), its monotony, the graphs, linearity, and expodistance when measured. Pass them to
    ``pipeline.status.report``."""
    p, dense, lss, exp = r.params, r.dense_values, r.lss_row, r.exp_row
    rows = _coupling_rows(r) + [
        claim(
            "almost no coupling early, dense at the end (layer graphs)",
            paper="step 1: almost none; step 143000: dense (Fig. 1c–e)",
            rule=RULES["dense"],
            values=dense,
            ours=f"edge density {dense['density_early']:.2f} → {dense['density_final']:.2f}, "
            f"highest at step {r.d_peak}",
            note=f"threshold 1 − m² > {p.graph_threshold}, K = {r.k_main}, "
            f"every checkpoint from step {p.early_step}",
        ),
        claim(
            "coupling develops together with trajectory linearity",
            paper="coupling emerges with increased linearity",
            rule=RULES["together"],
            values={"rho_lss": r.rho_lss},
            ours=f"ρ(coupling, LSS) = {r.rho_lss:.2f}",
            note=f"over the {len(r.together_in)} checkpoints from step {p.early_step} on; "
            "negative = more coupling, "
            "straighter",
        ),
        claim(
            "trajectories become more linear (line-shape score falls)",
            paper="increased linearity during training",
            rule=RULES["falls"],
            values=lss.to_dict(),
            ours=f"LSS {lss.early:.3f} → {lss.final:.3f} (ρ = {lss.spearman:.2f})",
            note="mean over tokens and held-out windows",
        ),
    ]
    if exp is not None:
        rows.append(
            claim(
                "layer-wise exponential growth develops (expodistance falls; our reconstruction)",
                paper="layer-wise exponential growth develops (formula not published)",
                rule=RULES["falls"],
                values=exp.to_dict(),
                ours=f"1 − R² {exp.early:.3f} → {exp.final:.3f} (ρ = {exp.spearman:.2f})",
                note="log-linear fit of step sizes over all blocks",
            )
        )
    return rows


def assumptions(r: Results) -> list[tuple[str, bool, str]]:
    """What the prose on the search assumes: ``(key, holds, text)`` for ``analysis.verdicts.assume``."""
    steps_fx = r.effects[r.effects.factor == "steps"]
    return [
        (
            "f03_longer_lowers",
            not steps_fx.empty and steps_fx.direction.iloc[0] == "lower",
            "training longer lowered the final coupling in the search",
        )
    ]


# --------------------------------------------------------------------------- glued values
def _plateau_values(r: Results) -> dict[str, Any]:
    """The plateau sentence (and the numbers in it) for a run with loss records."""
    from IPython.display import Markdown

    p, plateau = r.params, r.plateau
    if plateau is None:
        return {
            "f03_plateau_sentence": Markdown(
                "These are hub checkpoints without loss records here (see the "
                "Pythia paper for their losses), so the plateau condition is not "
                "checked."
            )
        }
    flat = RULES["flat"].judge(plateau)
    return {
        "f03_val_loss": plateau["best_loss"],
        "f03_plateau_drop": plateau["relative_drop"],
        "f03_plateau_from": plateau["from_step"],
        "f03_plateau_sentence": Markdown(
            f"Over the last {p.plateau_fraction:.0%} of training (steps {plateau['from_step']} to "
            f"{plateau['to_step']}) the validation loss fell from {plateau['from_loss']:.3f} to "
            f"{plateau['best_loss']:.3f} nats per token, a relative drop of {plateau['relative_drop']:.1%}: "
            + {
                "yes": "by the rule above, it has **flattened**.",
                "partly": "by the rule above it has **nearly flattened** (between the two thresholds).",
                "no": "by the rule above it has **not flattened**: this run was stopped mid-descent.",
            }[flat]
        ),
    }


def _coupling_values(r: Results) -> dict[str, Any]:
    """The headline curve's shape and its verdict."""
    from IPython.display import Markdown

    first = r.first
    out: dict[str, Any] = {}
    for name in ("ratio", "spearman", "peak", "early", "final", "peak_position", "final_vs_peak"):
        out[f"f03_{name}"] = float(first[name])
    for name in ("early_step", "final_step", "peak_step"):
        out[f"f03_{name}"] = int(first[name])
    out["f03_k"] = r.k_main
    out["f03_step0"] = float(r.step0)
    out["f03_rises_verdict"] = Markdown(f"**{first['rises progressively']}**")
    out["f03_shape_sentence"] = Markdown(
        "The curve ends at its top: coupling is highest at the last checkpoint."
        if first.final_vs_peak >= 0.99
        else f"The curve does not end at its top: the final value is {first.final_vs_peak:.0%} of the peak."
    )
    return out


def _wide_sentence(r: Results) -> str:
    """The widest searched run at its largest K, beside this run's largest K at the same K/d."""
    big, curves = r.big, r.search.curves
    wide = curves[curves.d_model == curves.d_model.max()]
    wide = wide[(wide["K"] == wide.K.max()) & (wide.config == wide.config.iloc[0])].sort_values("step")
    w_K, w_d = int(wide.K.iloc[0]), int(wide.d_model.iloc[0])
    w_low = float(wide.coupling.min())
    sentence = (
        f"In the search below, the widest run ({wide.config.iloc[0]}, width {w_d}) at K = {w_K} "
        f"(K/d = {w_K / w_d:.2f}) starts at {wide.coupling.iloc[0]:.3f} at step 0 with "
        f"{wide.share_m_above_1.iloc[0]:.0%} of its layer pairs at m > 1, its lowest point is {w_low:.3f} "
        f"({'below' if w_low < 0 else 'above'} zero), and at its worst checkpoint "
        f"{wide.share_m_above_1.max():.0%} of the pairs have m > 1."
    )
    if np.isfinite(big.d_model) and int(big.d_model) != w_d and np.isclose(big.K_over_d, w_K / w_d):
        sentence += (
            f" At the same K/d this run's K = {int(big.K)} (width {int(big.d_model)}) starts at "
            f"{big.first:.3f}, {'higher' if big.first > wide.coupling.iloc[0] else 'lower'}: the level of "
            "unrelated blocks depends on K and the width, not on their ratio alone."
        )
    return sentence


def _level_values(r: Results) -> dict[str, Any]:
    """The level of 1 − m² at the largest K, against the width."""
    from IPython.display import Markdown

    big = r.big
    return {
        "f03_kbig": int(big.K),
        "f03_kbig_ratio": float(big.K_over_d),
        "f03_kbig_first": float(big.first),
        "f03_kbig_share_first": float(big.share_first),
        "f03_kbig_lowest": float(big.lowest),
        "f03_d_model": int(big.d_model) if np.isfinite(big.d_model) else 0,
        "f03_k_main_ratio": r.k_main / float(big.d_model),
        "f03_k_wide_sentence": Markdown(_wide_sentence(r)),
    }


def _graph_values(r: Results) -> dict[str, Any]:
    """The paper's digitised curves' shape, and the layer graphs' edge density."""
    pg, dense = r.paper_growth, r.density[r.density.step >= r.params.early_step]
    return {
        "f03_paper_ratio": float(pg.ratio.mean()),
        "f03_paper_spearman": float(pg.spearman.mean()),
        "f03_paper_peak_position": float(pg.peak_position.min()),
        "f03_density_early": r.dense_values["density_early"],
        "f03_density_final": r.dense_values["density_final"],
        "f03_density_peak_step": r.d_peak,
        "f03_density_peak": float(dense.density.max()),
    }


def _trajectory_values(r: Results) -> dict[str, Any]:
    """The line-shape score, the expodistance sentence, and ρ(coupling, LSS)."""
    from IPython.display import Markdown

    lss, exp = r.lss_row, r.exp_row
    return {
        "f03_lss_early": float(lss.early),
        "f03_lss_final": float(lss.final),
        "f03_lss_spearman": float(lss.spearman),
        "f03_expo_sentence": Markdown(
            "the expodistance reconstruction is not available (it needs at least three blocks)"
            if exp is None
            else f"the expodistance reconstruction from {exp.early:.3f} to {exp.final:.3f} "
            f"(ρ {exp.spearman:.2f})"
        ),
        "f03_rho_lss": r.rho_lss,
    }


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
        "f03_search_train_minutes": float(table.train_cpu_s.sum() / 60),
        "f03_search_ours": Markdown(
            f"This chapter's run is the search's **{table.config[table.this_chapter].iloc[0]}**."
            if table.this_chapter.any()
            else "This chapter's run is not one of the searched runs."
        ),
        "f03_search_params": Markdown(f"{int(table.n_params.max()):,}"),
        "f03_search_tokens": float(table.tokens_seen.max() / 1e6),
    }


FACTOR_NAMES = {
    "d_model": "width",
    "n_layers": "depth (blocks)",
    "steps": "training steps",
    "lr": "learning rate",
    "data_tokens": "training tokens available",
}


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
    """The search read one factor at a time, the run found, and what training longer did."""
    from IPython.display import Markdown

    effects, lines = r.effects, []
    for (factor, _), grp in effects.groupby(["factor", "group"], sort=False):
        settings = " → ".join(f"{lv:g}" for lv in grp.level)
        finals = " → ".join(f"{v:.3f}" for v in grp.final)
        lines.append(
            f"- {FACTOR_NAMES[factor]} {settings} ({', '.join(grp.config)}): final coupling {finals}, "
            f"{grp.direction.iloc[0]} with more {FACTOR_NAMES[factor].split(' (')[0]}."
        )
    steps_fx = effects[effects.factor == "steps"]
    return {
        "f03_search_effects": Markdown(
            "\n".join(lines) if lines else "- (no two runs differ in one factor only)"
        ),
        "f03_search_found": Markdown(_search_found(r)),
        "f03_search_length": Markdown(
            "no two runs differ in length only"
            if steps_fx.empty
            else f"training longer made the final coupling **{steps_fx.direction.iloc[0]}** "
            f"({' → '.join(f'{v:.3f}' for v in steps_fx[steps_fx.group == steps_fx.group.iloc[0]].final)})"
        ),
    }


def _matched_rise(r: Results) -> list[str]:
    """The bullets on the rise and its monotony."""
    first, pg, k = r.first, r.paper_growth, r.k_main
    rise_v = RULES["rises"].judge(
        first.to_dict()
    )  # the verdicts of the status table, by the same rules and values
    where = (
        "at the end"
        if first.peak_position >= 0.99
        else f"at step {int(first.peak_step)}, position {first.peak_position:.2f} on the log-step axis, "
        f"{first.peak / first.final:.1f}× its final value"
    )
    return [
        f"**Progressive rise: {rise_v}.** Coupling on held-out text (K = {k}) goes from {first.early:.3f} "
        f"at step {int(first.early_step)} to {first.final:.3f} at step {int(first.final_step)} "
        f"(ratio {first.ratio:.2f}; "
        f"Pythia: about {pg.ratio.mean():.1f}), with its highest point {where}; ρ with the step "
        f"{first.spearman:.2f} against {pg.spearman.mean():.2f} for Pythia. Relative to the random "
        f"initialisation ({r.step0:.3f}) the final value is {first.final / r.step0:.1f}×.",
        f"**Nearly monotonic: {RULES['monotone'].judge(first.to_dict())}.** "
        "The largest fall between consecutive "
        f"checkpoints is {first.max_drop:.0%} of the curve's range (Pythia's digitised curves: "
        f"{pg.max_drop.max():.0%} at most).",
    ]


def _matched(r: Results) -> str:
    """What matched and what did not, one bullet per claim (and the quiz panel's)."""
    first, dense, lss, exp, rho = r.first, r.dense_values, r.lss_row, r.exp_row, r.rho_lss
    bullets = _matched_rise(r)
    bullets.append(
        f"**Almost none early, dense at the end: {RULES['dense'].judge(dense)}.** The layer graph's edge "
        f"density goes {dense['density_early']:.2f} → {dense['density_final']:.2f} and is highest at "
        f"step {r.d_peak} (threshold {r.params.graph_threshold})."
    )
    bullets.append(
        f"**Together with linearity: {RULES['together'].judge({'rho_lss': rho})}** (ρ(coupling, LSS) = "
        f"{rho:.2f}); **straighter trajectories: {RULES['falls'].judge(lss.to_dict())}** (LSS "
        f"{lss.early:.3f} → {lss.final:.3f}, ρ with the step {lss.spearman:.2f})"
        + (
            "."
            if exp is None
            else f"; **exponential growth: {RULES['falls'].judge(exp.to_dict())}** "
            f"(expodistance {exp.early:.3f} "
            f"→ {exp.final:.3f}, ρ {exp.spearman:.2f}; with only {r.held.layer_i.nunique()} steps per "
            "trajectory a log-linear fit says little)."
        )
    )
    if quiz_prompts(r.params) is not None:
        q = r.growth[r.growth.panel != MAIN]
        if not q.empty:
            qrow = q[q.model == r.showcase].iloc[0]
            bullets.append(
                f"**Out of distribution.** On the quiz prompts the curve peaks at step "
                f"{int(qrow.peak_step)} (held-out text: {int(first.peak_step)}) and ends at "
                f"{qrow.final_vs_peak:.0%} of its peak (held-out: {first.final_vs_peak:.0%}); its verdict "
                f"by the same rule is {qrow['rises progressively']}."
            )
    return "\n".join(f"- {b}" for b in bullets)


def _exercise_k(r: Results) -> dict[str, Any]:
    """Numbers for the worked solutions on K and on the early step."""
    from IPython.display import Markdown

    p, s = r.params, r.summary
    held_summary = s[(s.panel == MAIN) & (s.model == r.showcase)]
    by_k = emergence.growth_summary(held_summary, "coupling", by="K", early_step=p.early_step).set_index("K")
    kb = int(by_k.index.max())
    out = {
        "f03_ex_kbig": kb,
        "f03_ex_kbig_peak": float(by_k.loc[kb, "peak"]),
        "f03_ex_kbig_peak_step": int(by_k.loc[kb, "peak_step"]),
        "f03_ex_kmain_peak_step": int(by_k.loc[r.k_main, "peak_step"]),
        "f03_ex_kbig_step0": float(r.levels.set_index(["model", "K"]).loc[(r.showcase, kb), "first"]),
    }
    late = [x for x in sorted(held_summary.step.unique()) if x >= 128]
    if len(late) >= 2:
        g128 = emergence.growth_summary(
            held_summary[held_summary["K"] == r.k_main], "coupling", early_step=128
        ).iloc[0]
        out["f03_ex_128"] = Markdown(
            f"from step {int(g128.early_step)} the ratio final / early is {g128.ratio:.2f} "
            f"(ρ = {g128.spearman:.2f}) and the verdict is "
            f"**{RULES['rises'].judge(g128.to_dict())}**"
        )
    else:
        out["f03_ex_128"] = Markdown("this run has too few checkpoints after step 128 to say")
    return out


def _exercise_pairs(r: Results) -> dict[str, Any]:
    """Numbers for the worked solutions on adjacent pairs, the loss and the graphs' threshold."""
    from IPython.display import Markdown

    p, d = r.params, r.depthwise
    adjacent = emergence.checkpoint_summary(d[(d.panel == MAIN) & (d.model == r.showcase)], how="adjacent")
    g_adj = emergence.growth_summary(
        adjacent[adjacent["K"] == r.k_main], "coupling", early_step=p.early_step
    ).iloc[0]
    thresholds = [0.2, p.graph_threshold, 0.6]
    dens = pd.concat(
        [emergence.edge_counts(r.all_matrices, t, by="step").assign(threshold=t) for t in thresholds]
    )
    dens = dens[dens.step >= p.early_step]
    densest = (
        dens.sort_values(["threshold", "density", "step"], ascending=[True, False, True])
        .groupby("threshold")
        .head(1)
    )
    return {
        "f03_ex_adj_peak_step": int(g_adj.peak_step),
        "f03_ex_adj_ratio": float(g_adj.ratio),
        "f03_ex_rho_val": float(r.together.set_index("y").statistic.get("val_loss", float("nan"))),
        "f03_ex_thresholds": Markdown(
            "; ".join(
                f"threshold {t.threshold:g}: densest at step {int(t.step)} ({t.density:.2f}), "
                f"final {dens[dens.threshold == t.threshold].density.iloc[-1]:.2f}"
                for t in densest.itertuples()
            )
        ),
    }


def _exercise_lr(r: Results) -> dict[str, Any]:
    """Numbers for the worked solution on the learning rate, from the search."""
    from IPython.display import Markdown

    table = r.search_table
    lr_runs = table[table.lr != table.lr.max()]
    base_lr = table[
        (table.lr == table.lr.max()) & table.config.isin(lr_runs.config.str.replace(r"-lr.*", "", regex=True))
    ]
    return {
        "f03_ex_lr": Markdown(
            "the search has no run at another learning rate"
            if lr_runs.empty
            else "; ".join(
                f"{x.config} (lr {x.lr:g}) peaks at step {int(x.peak_step)} and ends at {x.final:.3f}"
                for x in lr_runs.itertuples()
            )
        ),
        "f03_ex_lr_base": Markdown(
            "; ".join(
                f"{x.config} (lr {x.lr:g}) peaks at step {int(x.peak_step)} and ends at {x.final:.3f}"
                for x in base_lr.itertuples()
            )
            or "—"
        ),
    }


def glue_values(r: Results) -> dict[str, Any]:
    """Every value the prose glues, by name: the rules' texts, the plateau, the curve and its
    verdict, the levels against K/d, the paper's curves, the graphs, the trajectories, the
    search, what matched, and the numbers of the worked solutions."""
    from IPython.display import Markdown

    return {
        **{f"f03_rule_{name}": rule.text for name, rule in RULES.items()},
        **_plateau_values(r),
        **_coupling_values(r),
        **_level_values(r),
        **_graph_values(r),
        **_trajectory_values(r),
        **_search_counts(r),
        **_search_effects(r),
        "f03_matched": Markdown(_matched(r)),
        **_exercise_k(r),
        **_exercise_pairs(r),
        **_exercise_lr(r),
    }
