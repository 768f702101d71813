"""f02's analyses, one per section of the notebook, with the tables and charts each shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import leaderboards, plots, scale
from coupling_utils.analysis.data import fig1a_table, join_scores
from coupling_utils.analysis.generalization import FamilyCoupling, learning_curves, training_stage
from coupling_utils.analysis.predictors import predictor_comparison, predictor_lead
from coupling_utils.analysis.prose_list import listed
from coupling_utils.chapters.f02_generalization.compare import (
    AgainstSize,
    against_size,
    task_ranks,
    task_side,
)
from coupling_utils.chapters.f02_generalization.plan import (
    FAMILY_PREDICTORS,
    FLAT,
    MIN_TAIL_POINTS,
    PAPER_PREDICTORS,
    SIZES,
    Params,
    Results,
    scale_prompt_words,
)
from coupling_utils.engine.metric import k_for_width


# --------------------------------------------------------------------------- (a) the paper's points
@dataclass
class PaperFit:
    """The replotted Fig. 1a: its points, every predictor's fit and coupling against the size
    measures (``size``: its lead over the best of them in each resample, and each alone)."""

    points: pd.DataFrame
    fits: pd.DataFrame
    size: AgainstSize

    @property
    def by_predictor(self) -> pd.DataFrame:
        return self.fits.set_index("predictor")

    @property
    def r2(self) -> float:
        return float(self.by_predictor.loc["coupling", "r2"])


def paper_fit(p: Params) -> PaperFit:
    """Each predictor of the digitised Fig. 1a score (``fig1a_y``), on the same 28 models."""
    fig = fig1a_table()
    fits = predictor_comparison(fig, p.fig1a_y, PAPER_PREDICTORS, p.boot)
    sizes = {name: PAPER_PREDICTORS[name] for name in SIZES}
    size = against_size(fig, p.fig1a_y, ("coupling", "coupling"), sizes, p.boot, "models", "coupling")
    return PaperFit(fig, fits, size)


def fig1a_chart(p: Params, paper: PaperFit):
    """Fig. 1a replotted from the digitised points, with its least-squares line."""
    return plots.scatter_fit(
        paper.points,
        "coupling",
        p.fig1a_y,
        label="label",
        look=plots.Look(
            title="Fig. 1a replotted (digitised points)",
            x_title="coupling (the paper's per-model number)",
            y_title=f"leaderboard v1 ({p.fig1a_y})",
        ),
    )


# --------------------------------------------------------------------------- (b) the family
@dataclass
class Training:
    """The family's members with their held-out scores, how flat each learning curve ends, and
    the curves themselves."""

    members: pd.DataFrame
    stage: pd.DataFrame
    curves: pd.DataFrame

    @property
    def n_flat(self) -> int:
        return int(self.stage["flat"].sum())

    @property
    def n_judged(self) -> int:
        """The curves long enough for the flat rule (``judged``: ``MIN_TAIL_POINTS`` evaluations in
        the last stretch); the others are too short to judge."""
        return int(self.stage["judged"].sum())

    def flat_note(self) -> str:
        """The status notes' count: "1 of 6 learning curves flat, 1 too short to judge"."""
        short = len(self.stage) - self.n_judged
        return f"{self.n_flat} of {self.n_judged} learning curves flat" + (
            f", {short} too short to judge" if short else ""
        )


def training(p: Params, which: str = "family") -> Training:
    """The members of the family ``which`` names ("family" or "training_family";
    ``zoo.family_table``, with tokens per parameter), each member's training stage
    (:func:`training_stage` over the last ``tail``, judged by :data:`FLAT`) and curves."""
    from coupling_utils.models import zoo

    members = zoo.family_table(getattr(p, which), progress=False)
    members["tokens per parameter"] = members["tokens"] / members["n_params"]
    stage = training_stage(members, tail=p.tail)
    curves = learning_curves(members)
    stage["judged"] = stage["tail_points"].fillna(0) >= MIN_TAIL_POINTS
    passes = [FLAT.judge({"tail_drop_rel": v}) == "yes" for v in stage["tail_drop_rel"]]
    stage["flat"] = stage["judged"] & pd.Series(passes, index=stage.index, dtype=bool)
    return Training(members, stage, curves)


def tpp_words(tpp: pd.Series) -> dict[str, Markdown]:
    """Tokens per parameter in words that follow the members' values: "about" one number only
    when every member is within 10% of the median, else their range."""
    lo, hi, med = float(tpp.min()), float(tpp.max()), float(tpp.median())
    # at least the four significant digits the members table shows (display._cell_text), more only
    # where four do not tell the lowest from the highest ("2 to 2" says nothing)
    digits = next((g for g in range(4, 8) if f"{lo:.{g}g}" != f"{hi:.{g}g}"), 8)
    if 0.9 * med <= lo and hi <= 1.1 * med:
        return {
            "f02_tpp_sentence": Markdown(
                f"Every member saw about {med:.3g} tokens per parameter ({lo:.{digits}g} to {hi:.{digits}g})"
            ),
            "f02_tpp_trained": Markdown("Trained to about the same number of tokens per parameter"),
        }
    return {
        "f02_tpp_sentence": Markdown(
            f"The members saw {lo:.3g} to {hi:.3g} tokens per parameter (median {med:.3g}), not one "
            "common number"
        ),
        "f02_tpp_trained": Markdown(f"Trained to {lo:.3g} to {hi:.3g} tokens per parameter"),
    }


def stage_words(stage: pd.DataFrame, n_flat: int) -> str:
    """How many of the family's learning curves are flat at their end, and which way the others
    were still moving (``tail_drop_rel`` > 0: the held-out loss still fell); a curve too short to
    judge (``judged`` False) is counted apart. The prose names the rule before it ("by the flat rule
    stated above, ..."), so the sentence does not name it again."""
    judged = stage["judged"].astype(bool)
    n, short = int(judged.sum()), int((~judged).sum())
    too_short = f" ({short} too short to judge)" if short else ""
    if n == 0:
        return "no member's curve is long enough to judge"
    if n_flat == n:
        return (
            f"every curve long enough to judge is flat at its end{too_short}"
            if short
            else ("every member's curve is flat at its end")
        )
    moving = stage.loc[judged & ~stage["flat"].astype(bool), "tail_drop_rel"]
    how = "still descending" if (moving > 0).all() else "rising" if (moving < 0).all() else "still moving"
    verb = "is flat at its" if n_flat == 1 else "are flat at their"
    return (
        f"{n_flat} of {n} curves {verb} end{too_short}: the others were {how}, so the "
        "comparison below is partly one of how far training got"
    )


def members_table(t: Training) -> pd.DataFrame:
    """The members table the chapter shows."""
    columns = [
        "run",
        "n_params",
        "n_layers",
        "d_model",
        "steps",
        "tokens",
        "tokens per parameter",
        "seed",
        "val_loss",
        "val_acc",
    ]
    table = t.members[columns].round(4)
    # unrounded, so the table shows four significant digits of the exact value, as tpp_words does
    # (rounded to four decimals first, 2.00352 showed as 2.003 beside the prose's 2.004)
    return table.assign(**{"tokens per parameter": t.members["tokens per parameter"]})


def curves_chart(t: Training):
    """Held-out loss of every member against the tokens it has seen."""
    return plots.training_curve(
        t.curves,
        "tokens",
        "val_loss",
        color="run",
        log_step=False,
        look=plots.Look(title="Held-out loss over training", y_title="val_loss"),
    )


@dataclass
class Family:
    """The family's coupling joined with its members: ``ours`` (members measured with their twins,
    with ``log10 params``), the members ``left_out`` (with why), each member's ``K``, and the
    measurement itself (its ``per_prompt`` table)."""

    ours: pd.DataFrame
    left_out: list[str]
    ks: dict[str, int]
    measured: FamilyCoupling


def family_section(p: Params, t: Training, results: Results) -> Family:
    """The members with their coupling, their twin's and the excess (members without both are
    left out, with the reason)."""
    return join_family(p, t, results.family)


def join_family(p: Params, t: Training, measured: FamilyCoupling) -> Family:
    """The members of ``t`` joined with their ``measured`` coupling, their twin's and the excess."""
    members = t.members
    family_k = {run: k_for_width(int(d), p.k_over_d) for run, d in zip(members["run"], members["d_model"])}
    summary = measured.summary
    ours = members.merge(
        summary.drop(columns=["n_layers", "d_model", "n_params"]), left_on="run", right_on="model"
    )
    gone = ours[ours.coupling.isna() | ours.twin_coupling.isna()]
    left_out = [
        f"left out {run}: {note or twin_note}"
        for run, note, twin_note in gone[["run", "note", "twin_note"]].itertuples(index=False)
    ]
    ours = ours.dropna(subset=["coupling", "twin_coupling"]).reset_index(drop=True)
    ours["log10 params"] = np.log10(ours["n_params"])
    return Family(ours, left_out, family_k, measured)


def coupling_table(f: Family) -> pd.DataFrame:
    """The family_coupling table the chapter shows."""
    columns = [
        "run",
        "d_model",
        "n_layers",
        "K",
        "coupling",
        "twin_coupling",
        "excess",
        "excess_se",
        "val_loss",
        "val_acc",
    ]
    return f.ours[columns].round(4)


def family_chart(p: Params, f: Family):
    """Held-out accuracy against the excess over the twin (left) and against raw coupling (right)."""
    return plots.scatter_fit(
        f.ours,
        "excess",
        "val_acc",
        label="run",
        look=plots.Look(
            title="Excess over the twin vs accuracy",
            x_title="excess coupling (trained − twin)",
            y_title="held-out accuracy",
            width=280,
        ),
    ) | plots.scatter_fit(
        f.ours,
        "coupling",
        "val_acc",
        label="run",
        look=plots.Look(
            title="Raw coupling vs accuracy",
            x_title=f"raw coupling (mean 1 − m², {p.how})",
            y_title="held-out accuracy",
            width=280,
        ),
    )


def per_prompt_chart(f: Family):
    """Each member's and twin's coupling, mean ± s.e. over the prompts."""
    return plots.bars(
        f.measured.per_prompt,
        "model",
        "coupling",
        color="weights",
        look=plots.Look(
            title="Coupling per member (mean ± s.e. over prompts)",
            x_title="member",
            y_title="coupling (mean 1 − m²)",
        ),
    )


@dataclass
class FamilyFits:
    """Every predictor of held-out accuracy and loss in the family (``fits``); for accuracy
    (``acc``, by predictor) the excess against the size measures (``size``: its lead over the best
    of them in each resample, and each alone), Spearman's ``rho`` of the three couplings, and how
    surely the predictor with the highest R² is the best of all (``lead``:
    :func:`predictor_lead`, bootstrap over members)."""

    fits: pd.DataFrame
    acc: pd.DataFrame
    size: AgainstSize
    rho: dict[str, float]
    lead: dict[str, Any]

    @property
    def best(self) -> str:
        """The predictor with the highest R² of accuracy (best only if the rule says so)."""
        return str(self.lead["best"])


def family_fits(p: Params, f: Family) -> FamilyFits:
    """The same comparison of predictors as for the paper's points, for accuracy and loss."""
    fits = pd.concat(
        [predictor_comparison(f.ours, y, FAMILY_PREDICTORS, p.boot) for y in ("val_acc", "val_loss")],
        ignore_index=True,
    )
    acc = fits[fits.y == "val_acc"].set_index("predictor")
    sizes = {name: FAMILY_PREDICTORS[name] for name in SIZES}
    size = against_size(f.ours, "val_acc", ("excess", "excess"), sizes, p.boot, "members", "the excess")
    rho = {name: float(acc.loc[name, "spearman"]) for name in ("excess", "raw coupling", "twin coupling")}
    lead = predictor_lead(f.ours, "val_acc", FAMILY_PREDICTORS, p.boot)
    return FamilyFits(fits, acc, size, rho, lead)


# --------------------------------------------------------------------------- (c) the hub models
@dataclass
class Hub:
    """The hub models measured here: the measurement (its lines, one per model), the models left
    out, and (with at least 3 v1 averages) the models joined with their scores and the paper's
    coupling (``table``) and every predictor of the v1 average (``fits``); both None otherwise."""

    measured: FamilyCoupling
    missing: pd.DataFrame
    table: pd.DataFrame | None
    fits: pd.DataFrame | None

    @property
    def n_measured(self) -> int:
        return len(self.measured.summary) - len(self.missing)

    @property
    def coupling(self) -> pd.Series | None:
        """The fit of the v1 average on our coupling (None without one)."""
        return None if self.fits is None else self.fits.set_index("predictor").loc["coupling"]


HUB_SKIPPED = (
    "Skipped in this run: it lists no hub models. The paper profile measures the paper's Fig. 1a models "
    "from the hub on a GPU (coupling-book run f02 --profile paper); the laptop profile measures the "
    "smallest of them on a CPU (coupling-book run f02 --profile laptop)."
)
"""What the hub section says in a run without ``hub_models`` (plain words: it is printed)."""
HUB_MIN_FIT = 3  # the fewest hub models with a v1 average that :func:`hub_fit` fits


def hub_fit(p: Params, results: Results, paper: PaperFit) -> Hub | None:
    """Our coupling of the hub models against their leaderboard v1 average and the paper's
    coupling (None without ``hub_models``)."""
    if results.hub is None:
        return None
    summary = results.hub.summary
    missing = summary[summary.coupling.isna()]
    hub = join_scores(summary.dropna(subset=["coupling"]), model_col="model", metadata=False, warn=False)
    hub = hub.merge(
        paper.points[["model_id", "label", "coupling", "log10_params", "n_layers", "d_model"]].rename(
            columns={"coupling": "paper_coupling"}
        ),
        on="model_id",
        how="left",
        suffixes=("", "_paper"),
    )
    if hub["average"].notna().sum() < HUB_MIN_FIT:
        return Hub(results.hub, missing, None, None)
    fits = predictor_comparison(hub, "average", PAPER_PREDICTORS, p.boot)
    return Hub(results.hub, missing, hub, fits)


def hub_chart(hub: Hub):
    """Our coupling against the v1 average (left) and against the paper's coupling (right)."""
    return plots.scatter_fit(
        hub.table.dropna(subset=["average"]),
        "coupling",
        "average",
        label="model_id",
        look=plots.Look(title="Hub models: our coupling", y_title="leaderboard v1 average", width=280),
    ) | plots.scatter_fit(
        hub.table.dropna(subset=["paper_coupling"]),
        "paper_coupling",
        "coupling",
        label="label",
        look=plots.Look(
            title="Our coupling vs the paper's",
            x_title="the paper's coupling (digitised)",
            y_title="our coupling",
            width=280,
        ),
    )


# --------------------------------------------------------------------------- the scale question
AXIS_RULES = scale.axis_rules()
"""When a candidate is compatible with each figure's axis (``scale.axis_rule``)."""


def axis_lines(p: Params) -> str:
    """Each figure's axis rule, one line each, as it reads the candidates' values: one number per
    model and candidate, measured on :func:`~.plan.scale_prompt_words`, with no interval (what the
    scale section prints)."""
    rules = [
        f"{name} ({scale.AXES[name][0]}–{scale.AXES[name][1]}): {rule.point_text}"
        for name, rule in AXIS_RULES.items()
    ]
    said = f"trained and twin: one number each per candidate, measured {scale_prompt_words(p)}, no interval"
    return "\n".join([*rules, said])


@dataclass
class ScaleAnswer:
    """The scale question judged: every candidate (``judged``), those ``compatible`` with each
    axis, this book's number at the largest K (``book``), the counts of compatible candidates,
    and the candidate that comes closest to Fig. 1a without separating trained from twin;
    ``named``: the reference's trained weights named as measured (:func:`_reference_words`)."""

    measured: scale.ScaleMeasurement
    judged: pd.DataFrame
    compatible: pd.DataFrame
    book: pd.Series | None
    n_1a: int
    n_1b: int
    miss: pd.Series | None
    n_miss: int
    named: str = ""


def _reference_words(p: Params, named: pd.DataFrame) -> str:
    """``scale_reference``'s trained weights as :func:`~.plan.named` lists them (model_names'
    words: ``embedded:smollm2-135m, dequantised from a Q4_1 GGUF file (...), in float32``); the
    reference itself where that table does not hold it."""
    ref = p.scale_reference
    models = named["model"].astype(str) if "model" in named else pd.Series(dtype=str)
    mine = [m for m in models if (m == ref or m.startswith(f"{ref},")) and "with random weights" not in m]
    return mine[0] if mine else ref


def scale_answer(p: Params, results: Results) -> ScaleAnswer:
    """Every candidate of ``scale_reference`` and its twin judged by :data:`AXIS_RULES`."""
    judged = scale.judge(results.scale.values, p.scale_reference)
    compatible = scale.compatible(judged)
    book = scale.book_choice(judged, max(p.scale_k))
    n_1a, n_1b = int((judged["Fig. 1a"] == "yes").sum()), int((judged["Fig. 1b"] == "yes").sum())
    miss = scale.closest_miss(judged, "Fig. 1a")
    n_miss = int((judged["Fig. 1a on scale"] & (judged["Fig. 1a"] != "yes")).sum())
    named = _reference_words(p, results.named)
    return ScaleAnswer(results.scale, judged, compatible, book, n_1a, n_1b, miss, n_miss, named)


def compatible_caption(s: ScaleAnswer) -> str:
    """The ``scale_compatible`` table's caption: what ``trained`` and ``twin`` are, and over which
    models ``trained range`` and ``twin range`` (``scale.judge``) run: every model of the scale
    question measured at the candidate's K, counted per K, with the K/d they span."""
    at = s.measured.values[["model", "K"]].drop_duplicates()
    widths = s.measured.models.drop_duplicates("model").set_index("model")["d_model"]
    ratio = at["K"] / at["model"].map(widths).astype(float)
    by_n: dict[int, list[int]] = {}  # how many models -> the K measured on that many
    for K, n in at.groupby("K")["model"].nunique().items():
        by_n.setdefault(int(n), []).append(int(K))
    counts = ", ".join(
        f"{n}{' models' if i == 0 else ''} at K = {listed(ks)}" for i, (n, ks) in enumerate(by_n.items())
    )
    return (
        "Candidates compatible with each figure's axis (by the rule above). trained, twin: the reference "
        f"model's values; trained range, twin range: the lowest and highest value of that candidate over "
        f"every model of the scale question measured at its K, trained weights and twins apart ({counts}; "
        f"K/d {ratio.min():.2g} to {ratio.max():.2g}), not a spread of the reference model"
    )


def scale_section(p: Params, s: ScaleAnswer):
    """Every candidate for the reference model (filled) and its twin (hollow)."""
    return scale.scale_chart(
        s.judged,
        reference=p.scale_reference,  # the book's reference: "embedded:" says it is the book's own copy
        title="Every candidate per-model number: trained vs twin",
    )


def choice_words(s: ScaleAnswer, prompts: str = "") -> dict[str, str]:
    """The words of "The book's choice", each from this run's candidates: whether the book's number
    separates trained from twin (by the axis rule's gap for Fig. 1b: a third of its width), what
    the candidates on Fig. 1a's scale do, and how the token-wise candidates' twins compare, counted
    on the scale question's prompts (``prompts``: :func:`scale_prompt_words`), with no interval."""
    lo, hi = scale.AXES["Fig. 1b"]
    book = s.book
    separates = book is not None and float(book.trained - book.twin) >= (hi - lo) / 3
    tokens = s.judged[s.judged["view"] == "tokens"].dropna(subset=["trained", "twin"])
    above = int((tokens["twin"] > tokens["trained"]).sum())
    if tokens.empty:
        tokenwise = "This run computed no token-wise candidate"
    elif above == len(tokens):
        gap = float((tokens["twin"] - tokens["trained"]).min())
        tokenwise = (
            f"Token-wise candidates are no alternative here: in all {len(tokens)} of them the twin's value "
            f"is above the trained model's, counted {prompts} with no interval (the smallest gap is "
            f"{gap:.4f}; f01 measures the token-wise view over prompts)"
        )
    else:
        tokenwise = (
            f"In {above} of the {len(tokens)} token-wise candidates the twin's value is above the trained "
            f"model's, counted {prompts} with no interval; the table above judges each of them"
        )
    return {
        "f02_scale_separates": (
            "it separates the trained reference model from its twin by at least a third of Fig. 1b's "
            "range" if separates
            else "it does not separate the trained reference model from its twin by a third of Fig. 1b's "
            "range, the rule above"
        ),
        "f02_scale_trace_clause": (
            "where no candidate on Fig. 1a's scale does (the closest is quoted above)" if s.n_1a == 0
            else f"as {s.n_1a} candidate(s) compatible with Fig. 1a's axis also do (the table above)"
        ),
        "f02_scale_tokenwise": tokenwise,
    }  # fmt: skip


# --------------------------------------------------------------------------- beyond the paper
@dataclass
class Beyond:
    """The paper's coupling against each leaderboard task (``task_fits``, v1 and v2, with the
    predictor each counts for by the task rule in ``side``), against the mean of all tasks but
    one (``drop_one``, v1 then v2), and the tasks it predicts best and worst by the task-ranking
    rule (``ranks``: ``compare.task_ranks`` by version)."""

    task_fits: pd.DataFrame
    drop_one: pd.DataFrame
    ranks: dict[str, dict[str, Any]]

    def fit(self, version: str) -> pd.Series:
        """The fit of leaderboard ``version``'s average."""
        return self.task_fits.set_index(["version", "task"]).loc[(version, "average")]

    @property
    def tasks(self) -> pd.DataFrame:
        """The fits of single tasks (no averages)."""
        return self.task_fits[self.task_fits.task != "average"]


def beyond(p: Params) -> Beyond:
    """Each task's fit on the paper's coupling, and each leave-one-task-out average's."""
    task_fits = pd.concat(
        [leaderboards.task_fits(v, boot=p.boot) for v in ("v1", "v2")],
        ignore_index=True,
    )
    sides = [task_side(row) for _, row in task_fits.iterrows()]  # by plan.TASK_VS_SIZE
    task_fits.insert(task_fits.columns.get_loc("gap_ci_high") + 1, "side", sides)
    left_out_v2 = leaderboards.drop_one("v2", boot=p.boot)
    left_out_v1 = leaderboards.drop_one("v1", boot=p.boot)
    ranks = {v: task_ranks(v, p.boot) for v in ("v1", "v2")}
    return Beyond(task_fits, pd.concat([left_out_v1, left_out_v2], ignore_index=True), ranks)


def tasks_chart(b: Beyond):
    """R² of each leaderboard task on the paper's coupling, beside log parameter count."""
    df = b.task_fits.melt(
        id_vars=["version", "name"], value_vars=["r2", "size_r2"], var_name="predictor", value_name="R²"
    ).replace({"predictor": {"r2": "coupling (paper's)", "size_r2": "log10 params"}})
    df["task"] = df["version"] + " " + df["name"]
    return plots.bars(
        df,
        "task",
        "R²",
        color="predictor",
        look=plots.Look(
            title="R² of each leaderboard task",
            x_title="leaderboard and task",
            y_title="R² over the Fig. 1a models",
        ),
    )
