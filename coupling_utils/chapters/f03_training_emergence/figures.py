"""f03's figures (``*_figure``): each a chart of :class:`Results` and, where the page shows
one, its alt text written from the same numbers."""

from __future__ import annotations

import pandas as pd

from coupling_utils.analysis import emergence
from coupling_utils.chapters.f03_training_emergence.plan import MAIN
from coupling_utils.chapters.f03_training_emergence.results import Results


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
        look=plots.Look(title="Loss per checkpoint", y_title="cross-entropy (nats per token)"),
    )
    alt = (
        f"Line chart: validation loss goes from {val0:.2f} nats per token at step 0 to "
        f"{plateau['best_loss']:.2f} at the end (unigram level {unigram:.2f}); over the last "
        f"{p.plateau_fraction:.0%} of training it falls by {plateau['relative_drop']:.1%}."
    )
    return chart, alt


def coupling_figure(r: Results):
    """Coupling over training on the main panel (:data:`MAIN`), one line per model and K, and its alt text."""
    from coupling_utils.analysis import plots
    from coupling_utils.analysis.display import plain

    first, k = r.first, r.k_main
    curve = r.summary[r.summary.panel == MAIN].assign(
        series=lambda d: _run_name(d["model"]) + ", K = " + d["K"].astype(str)
    )
    chart = plots.training_curve(
        curve,
        "step",
        "coupling",
        color="series",
        look=plots.Look(
            title=f"Depth-wise coupling of the last token over training ({MAIN})",
            y_title=f"mean 1 − m_K² over {'all' if r.params.how == 'offdiag' else 'adjacent'} layer pairs",
        ),
    )
    alt = (
        f"Line chart of coupling against training step, one line per K ({plain(sorted(curve.K.unique()))}). "
        f"At K = {k} it starts at {r.step0:.3f}, peaks at {first.peak:.3f} at step {int(first.peak_step)} "
        f"and ends at {first.final:.3f} at step {int(first.final_step)}."
    )
    return chart, alt


def panels_figure(r: Results):
    """The headline K's coupling on the main panel against the quiz prompts, and its alt text."""
    from coupling_utils.analysis import plots

    both = r.main.assign(series=lambda d: _run_name(d["model"]) + ", " + d["panel"])
    chart = plots.training_curve(
        both,
        "step",
        "coupling",
        color="series",
        look=plots.Look(
            title=f"{MAIN.capitalize()} against quiz prompts (K = {r.k_main})",
            y_title="mean 1 − m_K² over layer pairs",
        ),
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
        look=plots.Look(title="The paper's Fig. 1b (digitised)", y_title="normalised coupling (paper)"),
    )


def shapes_figure(r: Results):
    """Each curve (ours on the main panel, the paper's) divided by its final value against the
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
        look=plots.Look(title=f"{r.showcase}: coupled layer pairs (K = {r.k_main})"),
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
        look=plots.Look(title=f"Depth-wise coupling 1 − m² of the last token (K = {r.k_main})", width=160),
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
                tlong[tlong.quantity == q],
                "step",
                "value",
                color="series",
                look=plots.Look(title=title, y_title=y),
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
        look=plots.Look(
            title="‖x^l − x^(l−1)‖ per block (mean ± s.e. over tokens)", y_title="step size (log scale)"
        ),
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
        look=plots.Look(
            title="Coupling over training in every searched run (K = d/16)",
            y_title="mean 1 − m_K² over layer pairs",
        ),
    )
    alt = (
        f"One line of coupling against step per searched run ({len(table)} runs); the peaks lie between "
        f"steps {int(table.peak_step.min())} and {int(table.peak_step.max())}, the final values between "
        f"{table.final.min():.3f} and {table.final.max():.3f}."
    )
    return chart, alt
