"""f04's figures: each returns ``show()``'s arguments (the chart, its name, caption and alt
text), the texts written from the same numbers as the chart."""

from __future__ import annotations

from typing import Any

from coupling_utils.chapters.f04_vision_transformers.plan import Params, Results


def training_figure(p: Params, r: Results) -> dict[str, Any]:
    """Coupling and accuracy at every checkpoint of the run, one above the other."""
    from coupling_utils.analysis import plots
    from coupling_utils.analysis.layout import position

    curve, shape = r.curve, r.shape
    titles = (f"{r.run_name}: coupling over training", f"{r.run_name}: accuracy over training")
    coupling = plots.training_curve(
        curve,
        "step",
        "coupling",
        look=plots.Look(title=titles[0], y_title=f"coupling (mean 1 − m², K = {p.k})"),
    )
    accuracy = plots.training_curve(
        curve.melt(
            id_vars="step", value_vars=["val_acc", "test_acc"], var_name="split", value_name="accuracy"
        ),
        "step",
        "accuracy",
        color="split",
        look=plots.Look(title=titles[1], y_title="MNIST accuracy"),
    )
    chart = coupling & accuracy
    at = [position(chart, t) for t in titles]
    return dict(
        chart=chart, name="fig-f04-training",
        caption=f"Coupling of {r.token_words} ({at[0]}) and accuracy ({at[1]}) at every checkpoint of one "
                "MNIST ViT; step 0 is the random initialisation.",
        alt=f"Two line charts over training steps on a log scale. Coupling ({at[0]}) goes from "
            f"{shape['init']:.3f} at step 0 to {shape['final']:.3f} at step {int(curve.step.max())}, highest "
            f"({shape['peak']:.3f}) at step {shape['peak_step']}. Accuracy ({at[1]}): validation from "
            f"{curve.val_acc.iloc[0]:.3f} to {curve.val_acc.iloc[-1]:.3f}, test from "
            f"{curve.test_acc.iloc[0]:.3f} to {curve.test_acc.iloc[-1]:.3f}.",
    )  # fmt: skip


def depthwise_steps_figure(p: Params, r: Results) -> dict[str, Any]:
    """The depth-wise coupling matrix at the first and the last checkpoint."""
    from coupling_utils.analysis import plots

    first, last = r.ends
    ends = r.over.depthwise[r.over.depthwise.model.isin([first, last])]
    return dict(
        chart=plots.coupling_heatmap(ends, "layer_j", "layer_i", "m", facet="model",
                                     look=plots.Look(
                                         title="Depth-wise coupling 1 − m², first and last checkpoint",
                                         width=200, columns=2)),
        name="fig-f04-depthwise-steps",
        caption=f"Depth-wise coupling $1 - m_K^2$ between blocks $i$ and $j$ at {first} and {last} (mean "
                "over images; the diagonal is grey).",
        alt=f"Two heatmaps of block-pair coupling, {first} and {last}, blocks 0 to "
            f"{int(ends.layer_i.max())} on both axes.",
    )  # fmt: skip


def twins_figure(p: Params, r: Results) -> dict[str, Any]:
    """Each trained ViT beside its twin and, for the run, its own step 0."""
    from coupling_utils.analysis import plots

    gap = r.gap
    return dict(
        chart=plots.bars(r.bars, "model", "coupling", color="weights",
                         look=plots.Look(title="Trained vs untrained (mean ± s.e. over images)",
                                         y_title=f"coupling (mean 1 − m², K = {p.k})")),
        name="fig-f04-twins",
        caption="Coupling of each trained ViT beside its untrained twin (another seed) and, for the run "
                "trained here, its own step-0 initialisation; error bars: standard error over images.",
        alt=f"Bar chart: {r.run_name} trained {gap.trained:.3f}, random-init twin {gap.twin:.3f}, its "
            f"step 0 {r.step0.coupling.mean():.3f}"
            + ("; plus the hub ViTs measured." if r.hub is not None else "."),
    )  # fmt: skip


_TWIN_PANELS = ("trained", "random init")  # the panels left to right, as the caption names them


def depthwise_twins_figure(p: Params, r: Results) -> dict[str, Any]:
    """The depth-wise coupling matrix of the run, trained and its twin, in the caption's
    order (unsorted, the facet would put "random init" first), the run named as measured."""
    from coupling_utils.analysis import plots
    from coupling_utils.analysis.layout import where

    look = plots.Look(title="Depth-wise coupling 1 − m², trained and random init", width=200, columns=2,
                      order=_TWIN_PANELS)  # fmt: skip
    chart = plots.coupling_heatmap(r.twins.depthwise, "layer_j", "layer_i", "m", facet="weights", look=look)
    trained, twin = (where(chart, panel) for panel in _TWIN_PANELS)
    named = r.named["twins"]
    return dict(
        chart=chart, name="fig-f04-depthwise-twins",
        caption=f"Depth-wise coupling of {named}: {trained} and its untrained twin, {twin}; mean over "
                "images.",
        alt=f"Two heatmaps of block-pair coupling for {named}: {trained} and {twin}.",
    )  # fmt: skip


def family_training_figure(p: Params, r: Results) -> dict[str, Any]:
    """Validation accuracy of every family member during training."""
    from coupling_utils.analysis import plots

    members = r.members
    return dict(
        chart=plots.training_curve(r.curves.dropna(subset=["val_acc"]), "step", "val_acc", color="run",
                                   log_step=False,
                                   look=plots.Look(title="ViT family: validation accuracy during training",
                                                   y_title="validation accuracy")),
        name="fig-f04-family-training",
        caption="Validation accuracy of every family member during training, on one recipe.",
        alt=f"Line chart of {len(members)} runs' validation accuracy over training steps, ending between "
            f"{members.val_acc.min():.3f} and {members.val_acc.max():.3f}.",
    )  # fmt: skip


def family_figure(p: Params, r: Results) -> dict[str, Any]:
    """Test accuracy of each member against its excess coupling and against its raw coupling."""
    from coupling_utils.analysis import plots
    from coupling_utils.analysis.layout import position

    vits = r.vits
    raw = plots.scatter_fit(
        vits,
        "coupling",
        "test_acc",
        label="run",
        look=plots.Look(
            title="Raw coupling",
            x_title=f"coupling (mean 1 − m², K/d = {p.family_k_over_d})",
            y_title="MNIST test accuracy",
            width=280,
        ),
    )
    excess = plots.scatter_fit(
        vits,
        "excess coupling",
        "test_acc",
        label="run",
        look=plots.Look(
            title="In excess of the twin",
            x_title="coupling − twin's coupling",
            y_title="MNIST test accuracy",
            width=280,
        ),
    )
    chart = excess | raw
    at = [position(chart, t) for t in ("In excess of the twin", "Raw coupling")]
    return dict(
        chart=chart, name="fig-f04-family",
        caption="Test accuracy of each family member against its coupling in excess of its own untrained "
                f"twin ({at[0]}, which carries the verdict) and against the raw coupling ({at[1]}).",
        alt=f"Two scatter plots of {len(vits)} ViTs, test accuracy from {vits.test_acc.min():.3f} to "
            f"{vits.test_acc.max():.3f} on y; x is the coupling in excess of the twin ({at[0]}) and the raw "
            f"coupling ({at[1]}).",
    )  # fmt: skip
