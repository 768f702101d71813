"""f03's run (:func:`run`: the plan collected, per panel one sweep of every run) and what it
reads back (:class:`Results`, whose properties are the condensed numbers the story reads)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from coupling_utils.analysis import emergence
from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis.last_block import checkpoints_without_last_block
from coupling_utils.analysis.model_names import checkpoints_words, of_result
from coupling_utils.analysis.straightness import straightness
from coupling_utils.analysis.verdicts import Interval, Rule
from coupling_utils.chapters.f03_training_emergence.plan import (
    MAIN,
    PAPER_EARLY_STEP,
    RULES,
    TOGETHER_PARTS,
    Params,
    checkpoint_runs,
    checkpoint_settings,
    panel_jobs,
)
from coupling_utils.engine.blocks import LAST_BLOCKS
from coupling_utils.measurement import Options, collect
from coupling_utils.measurement.loop import Collected


def run(p: Params, options: Options | None = None) -> Results:
    """Collect :func:`jobs` (``options``: how they run; default: failures recorded) and the
    chapter's :class:`Results`: per panel, one ``emergence.runs_sweep`` of every run (runs, K
    and checkpoints that could not be measured are in its failures)."""
    runs = checkpoint_runs(p)
    planned = panel_jobs(p, runs)
    options = options or Options()
    done = iter(collect([j for js in planned.values() for j in js], options, desc="checkpoints").results)
    sweeps, named, beside = {}, {}, {}
    also = lb.beside(p.last_block)
    for panel, js in planned.items():
        part = Collected([next(done) for _ in js])
        settings = checkpoint_settings(p, panel)
        sweeps[panel] = emergence.runs_sweep(part, runs, settings, panel=panel, on_error=options.on_error)
        if also is not None:  # the same runs' last block under the other map
            beside[panel] = emergence.runs_sweep(
                part.under(also), runs, settings, panel=panel, on_error=options.on_error
            )
        named = named or _named(part, runs)  # the main panel's: every checkpoint it measured
    return Results(p, runs, sweeps, named, beside)


def _named(done: Collected, runs: list) -> dict[str, str]:
    """Each run named as measured (:func:`~coupling_utils.analysis.model_names.checkpoints_words`
    of the checkpoints measured, in step order), by model; a run with none measured is left out."""
    out = {}
    for run in runs:
        mine = sorted((r for r in done.ok if r.job.labels.get("model") == run.model),
                      key=lambda r: emergence.step_of(r.job.revision))  # fmt: skip
        if mine:
            out[run.model] = checkpoints_words([of_result(r) for r in mine])
    return out


# --------------------------------------------------------------------------- the measurements, condensed
def _cat(sweeps: Mapping[str, emergence.CheckpointTables], name: str) -> pd.DataFrame:
    return pd.concat([getattr(s, name) for s in sweeps.values()], ignore_index=True)


def together_intervals(per_window: pd.DataFrame, n_resamples: int = 500) -> dict:
    """Claim 3's values from ``per_window`` (one row per window and checkpoint: ``prompt``, ``step``,
    ``coupling``, ``lss``): Spearman's ρ of the mean coupling with the step (``coupling_step``), of
    the mean line-shape score with the step (``lss_step``) and of the two with each other
    (``rho_lss``), each with a 95% interval over the windows (all three from the same resampled
    windows). A value that cannot be computed (a constant curve) is NaN, which no rule passes."""
    from scipy.stats import rankdata

    from coupling_utils.analysis.stats import bootstrap_intervals, resampled_means, rowwise_pearson

    wide = per_window.pivot_table(index="prompt", columns="step", values=["coupling", "lss"], dropna=False)
    steps = wide["coupling"].columns.to_numpy()

    def values(columns: dict) -> dict[str, np.ndarray]:  # every resample at once
        # each checkpoint's mean over the windows, added left to right as the pivoted table's rows
        coupling, lss = (
            np.stack([resampled_means(columns[(name, s)], "left_to_right") for s in steps], axis=-1)
            for name in ("coupling", "lss")
        )
        order = np.broadcast_to(rankdata(steps), coupling.shape)
        ranked_coupling, ranked_lss = rankdata(coupling, axis=-1), rankdata(lss, axis=-1)
        return {  # Spearman's ρ: the Pearson r of the ranks (ties averaged); NaN for a constant curve
            "coupling_step": rowwise_pearson(ranked_coupling, order),
            "lss_step": rowwise_pearson(ranked_lss, order),
            "rho_lss": rowwise_pearson(ranked_coupling, ranked_lss),
        }

    names = ("coupling_step", "lss_step", "rho_lss")
    if wide.isna().to_numpy().any():  # a window missing at some checkpoint: nothing to resample
        means = {c: np.nanmean(wide[c].to_numpy(dtype=float))[None, None] for c in wide.columns}
        est = {k: float(v[0]) for k, v in values(means).items()}
        over = "windows not at every checkpoint"
        return {k: Interval(est[k], -np.inf, np.inf, over=over) for k in names}
    out = bootstrap_intervals(wide, values, "window", n_resamples=n_resamples, vectorized=True)
    return {k: out.get(k, math.nan) for k in names}


@dataclass(frozen=True)
class Results:
    """What the story reads from one run: the runs' checkpoints (``runs``) and, per panel, their
    :class:`~coupling_utils.analysis.emergence.CheckpointTables` (``sweeps``); the properties condense them
    (each computed once)."""

    params: Params
    runs: list
    sweeps: dict
    named: dict = dataclasses.field(default_factory=dict)  # model -> named as measured (:func:`_named`)
    beside: dict = dataclasses.field(default_factory=dict)  # sweeps with the last block's other map

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
        steps, models = s.step.nunique(), s.model.nunique()
        return (f"{steps} checkpoint{'' if steps == 1 else 's'} measured for {models} model"
                f"{'' if models == 1 else 's'}; none missing")  # fmt: skip

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
    def from_paper_early(self) -> pd.Series | None:
        """The headline curve's shape from ``PAPER_EARLY_STEP`` on, as Fig. 1b's (None: too few)."""
        m = self.main
        curve = m[(m.panel == MAIN) & (m.model == self.showcase) & (m.step >= PAPER_EARLY_STEP)]
        if curve.step.nunique() < 2:
            return None
        return emergence.growth_summary(curve, "coupling", early_step=PAPER_EARLY_STEP).iloc[0]

    @functools.cached_property
    def per_prompt(self) -> pd.DataFrame:
        """The headline curve per held-out window: step, prompt, coupling (K = :attr:`k_main`)."""
        from coupling_utils.measurement import coupling_summary

        d = self.depthwise
        d = d[(d.panel == MAIN) & (d.model == self.showcase)]
        rows = [
            pd.DataFrame({"step": step, "coupling": per}).rename_axis("prompt").reset_index()
            for step, g in d.groupby("step", sort=True)
            for per in [coupling_summary(g, how=self.params.how, k=self.k_main, per_prompt=True)]
        ]
        return pd.concat(rows, ignore_index=True)

    @functools.cached_property
    def rise_values(self) -> dict:
        """The headline curve's shape (:attr:`first`) with 95% intervals over the held-out windows
        (bootstrap: windows resampled, their mean curve's descriptors recomputed)."""
        from coupling_utils.analysis.training_curves import growth_shape_intervals

        names = sorted(RULES["rises"].names | RULES["monotone"].names)
        return self.first.to_dict() | growth_shape_intervals(
            self.per_prompt.rename(columns={"prompt": "window"}),
            "coupling",
            names,
            early_step=self.params.early_step,
            n_resamples=500,
            unit="window",
        )

    @functools.cached_property
    def step0(self):
        """Coupling of the headline curve at its first checkpoint (:attr:`first_step`)."""
        m = self.main
        return m[(m.panel == MAIN) & (m.model == self.showcase)].sort_values("step").coupling.iloc[0]

    @property
    def first_step(self) -> int:
        """The headline curve's first checkpoint: 0 (the random initialisation) for a local run,
        the first of ``revisions`` for a hub model (Pythia's first public one is step 1)."""
        m = self.main
        return int(m[(m.panel == MAIN) & (m.model == self.showcase)].step.min())

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
        return emergence.growth_summary(
            self.paper, "normalized_coupling", by="model_id", early_step=PAPER_EARLY_STEP
        )

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

    @functools.cached_property
    def dense_judged(self) -> dict:
        """:attr:`dense_values` with 95% intervals over the held-out windows (windows resampled,
        the mean matrices and their graphs recomputed at every checkpoint)."""
        from coupling_utils.analysis.stats import bootstrap_intervals

        h = self.held[self.held.step >= self.params.early_step]
        h = h[h.layer_i != h.layer_j]
        a, b = np.minimum(h.layer_i, h.layer_j), np.maximum(h.layer_i, h.layer_j)
        per = h.assign(a=a, b=b).groupby(["prompt", "step", "a", "b"]).coupling.mean()
        wide = per.unstack(["step", "a", "b"])
        steps = wide.columns.get_level_values("step").to_numpy()
        order = np.unique(steps)

        def values(sample: pd.DataFrame) -> dict[str, float]:
            edges = sample.to_numpy().mean(axis=0) > self.params.graph_threshold
            density = np.array([edges[steps == st].mean() for st in order])
            peak = int(order[int(density.argmax())])
            return {
                "density_early": float(density[0]),
                "density_final": float(density[-1]),
                "density_peak_position": emergence.log_position(peak, order[0], order[-1]),
            }

        if wide.isna().to_numpy().any():  # a window missing at some checkpoint: nothing to resample
            over = "windows not measured at every checkpoint"
            return self.dense_values | {
                k: Interval(v, -np.inf, np.inf, over=over) for k, v in self.dense_values.items()
            }
        return self.dense_values | bootstrap_intervals(wide, values, "window", n_resamples=500)

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

    @functools.cached_property
    def straight(self) -> dict:
        """The book's straightness rule's values (:mod:`coupling_utils.analysis.straightness`) for
        the showcase run's last checkpoint against its first (the random initialisation, step 0),
        on held-out text: the same rule f05 applies to a trained model and its twin."""
        t = self.trajectories
        t = t[(t.panel == MAIN) & (t.model == self.showcase)]
        first, last = int(t.step.min()), int(t.step.max())
        both = t[t.step.isin([first, last])]
        table = pd.DataFrame({"model": both.step.map({first: "first", last: "last"}),
                              "prompt": both.prompt, "lss": both.lss})  # fmt: skip
        norms = self.step_norms
        n_steps = int(norms[(norms.model == self.showcase)].layer.nunique())
        d = int(self.summary[self.summary.model == self.showcase].d_model.iloc[0])
        out = straightness(table, model="last", twin="first", n_steps=n_steps, d=d, unit="window")
        return {**out, "first_step": first, "last_step": last, "n_steps": n_steps}

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
    def exp_judged(self) -> dict | None:
        """:attr:`exp_row` with 95% intervals over the held-out windows (``shape_intervals``)."""
        if self.exp_row is None:
            return None
        return self._trajectory_judged("expodistance_log_linear_r2", sorted(RULES["falls"].names))

    @functools.cached_property
    def other_reconstructions(self) -> dict[str, dict]:
        """The trajectory measures beside the one the expodistance rule reads, by quantity: the other
        reconstruction (``expodistance_ratio_cv``, its final / early with an interval) and the fitted
        growth per block (``growth_log_linear_r2``, its final / early and its last value with
        intervals); those not measured at every checkpoint are left out."""
        rows_of = self.traj_growth[self.traj_growth.model == self.showcase].set_index("quantity")
        wanted = {"expodistance_ratio_cv": ["ratio"], "growth_log_linear_r2": ["ratio", "final"]}
        return {q: self._trajectory_judged(q, names) for q, names in wanted.items() if q in rows_of.index}

    def _trajectory_judged(self, q: str, names: list[str]) -> dict:
        """The showcase run's :attr:`traj_growth` row of ``q``, with 95% intervals of ``names`` over
        the held-out windows (``growth_shape_intervals``)."""
        from coupling_utils.analysis.training_curves import growth_shape_intervals

        t = self.trajectories.rename(columns={"prompt": "window"})
        t = t[(t.panel == MAIN) & (t.model == self.showcase)]
        per = t.groupby(["window", "step"])[q].mean().reset_index()
        row = self.traj_growth[self.traj_growth.model == self.showcase].set_index("quantity").loc[q]
        judged = growth_shape_intervals(
            per, q, names, early_step=self.params.early_step, n_resamples=500, unit="window"
        )
        return row.to_dict() | judged

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

    @functools.cached_property
    def together_values(self) -> dict:
        """Claim 3's values (:func:`together_intervals`) on the showcase run's held-out windows,
        over the checkpoints from ``early_step`` on."""
        t = self.trajectories
        t = t[(t.panel == MAIN) & (t.model == self.showcase)]
        lss = t.groupby(["prompt", "step"]).lss.mean().rename("lss").reset_index()
        both = self.per_prompt.merge(lss, on=["prompt", "step"])
        return together_intervals(both[both.step >= self.params.early_step])

    @property
    def together_failed(self) -> list[str]:
        """The parts of claim 3 (keys of ``TOGETHER_PARTS``) whose condition does not hold over
        the whole of its interval: why "together" is not a yes ([] when it is)."""
        return [
            part
            for part, expr in TOGETHER_PARTS.items()
            if Rule(yes=expr).judge(self.together_values) != "yes"
        ]

    # ----------------------------------------------------------------- the last block
    @property
    def coupling_verdicts(self) -> dict[str, str]:
        """The verdicts of the rows that read coupling (rise, monotony, graphs, with linearity)."""
        return {
            "rises": RULES["rises"].judge(self.rise_values),
            "monotone": RULES["monotone"].judge(self.rise_values),
            "dense": RULES["dense"].judge(self.dense_judged),
            "together": RULES["together"].judge(self.together_values),
        }

    @functools.cached_property
    def other_conventions(self) -> dict[str, dict[str, str | None]]:
        """:attr:`coupling_verdicts` under each other convention of the last block, all from this
        very measurement: "excluded" from its tables without the last block, the other map from
        :attr:`beside` (None where it was not measured: under "excluded", which measures no last
        block)."""
        out = {}
        for other in (c for c in LAST_BLOCKS if c != self.params.last_block):
            verdicts = dict.fromkeys(self.coupling_verdicts)
            if other == lb.beside(self.params.last_block) and self.beside:
                cut = Results(
                    dataclasses.replace(self.params, last_block=other), self.runs, self.beside, self.named
                )
                verdicts = cut.coupling_verdicts
            elif other == "excluded":
                try:
                    sweeps = {
                        panel: checkpoints_without_last_block(t, self.params.how)
                        for panel, t in self.sweeps.items()
                    }
                except ValueError:  # two blocks: nothing left to judge
                    sweeps = None
                if sweeps is not None:
                    cut = Results(
                        dataclasses.replace(self.params, last_block=other), self.runs, sweeps, self.named
                    )
                    verdicts = cut.coupling_verdicts
            out[other] = verdicts
        return out

    # ----------------------------------------------------------------- the search
    @functools.cached_property
    def search(self) -> emergence.Search:
        """The stored search over local runs (``data/f03_search``)."""
        return emergence.load_search()

    @functools.cached_property
    def search_table(self) -> pd.DataFrame:
        """The search's runs at K = d/16, judged "rises progressively", this chapter's run marked, and
        their plateau drop judged again from the stored losses (``plateau_fraction``)."""
        from coupling_utils.analysis.emergence_search import plateau_drops

        runs, drops = self.search.runs, plateau_drops(self.search.losses, self.params.plateau_fraction)
        table = emergence.judge_rows(
            runs[runs["K"] * 16 == runs.d_model], RULES["rises"], column="rises progressively"
        )
        ours_spec = next((r.spec for r in self.runs if r.model == self.showcase), None)
        return table.assign(
            this_chapter=[self.search.provenance[c]["spec"] == ours_spec for c in table.config],
            train_cpu_min=table.train_cpu_s / 60,
            plateau_drop=table.config.map(drops),
        )

    @functools.cached_property
    def effects(self) -> pd.DataFrame:
        """The search read one factor at a time, on the final coupling."""
        return emergence.one_factor_effects(self.search_table, "final")
