"""f02's status rows (:func:`claims`), glued values (:func:`glue_values`) and the assumptions its
sentences make, from every section's results."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from IPython.display import Markdown

from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis import scale
from coupling_utils.analysis.verdicts import Interval, Rule, claim, verdict_word
from coupling_utils.chapters.f02_generalization.compare import (
    carrier_words,
    compare_glue,
    r2_interval,
    size_glue,
    size_note,
    sizes_words,
)
from coupling_utils.chapters.f02_generalization.exercises import solutions_glue
from coupling_utils.chapters.f02_generalization.plan import (
    BEATS_SIZE,
    CLAIMS,
    EXTENSION,
    FAMILY_BEATS_SIZE,
    FIG1A_FIT,
    GENERALISES,
    HUB,
    Params,
    Results,
    scale_prompt_words,
)
from coupling_utils.chapters.f02_generalization.sections import (
    AXIS_RULES,
    HUB_MIN_FIT,
    HUB_SKIPPED,
    Beyond,
    Family,
    FamilyFits,
    Hub,
    PaperFit,
    ScaleAnswer,
    Training,
    choice_words,
    family_fits,
    family_section,
    scale_answer,
    stage_words,
    tpp_words,
)
from coupling_utils.chapters.f02_generalization.within import (
    Within,
    sign_words,
    spearman_interval,
    within_claims,
    within_glue,
)
from coupling_utils.engine.blocks import LAST_BLOCKS


# --------------------------------------------------------------------------- status and glue
@dataclass
class Story:
    """Every section's analysis, which the status rows, the glued values and the assumptions read."""

    paper: PaperFit
    training: Training
    family: Family
    fits: FamilyFits
    hub: Hub | None
    scale: ScaleAnswer
    beyond: Beyond
    # {other map of the last block: {claim: verdict}} (:func:`convention_verdicts`); empty: not judged
    conventions: dict[str, dict[str, str]] = field(default_factory=dict)
    # {other map: the scale question under it}, for the book's number under each map
    other_scale: dict[str, ScaleAnswer] = field(default_factory=dict)
    within: Within | None = None  # the training family (one architecture); None: not judged

    @property
    def hub_coupling(self) -> pd.Series | None:
        """The hub models' fit of the v1 average on our coupling (None: not measured or too few)."""
        return None if self.hub is None else self.hub.coupling


def convention_verdicts(p: Params, results: Results, story: Story) -> Story:
    """``story`` with the verdicts of its measured rows under each other map of the last block
    (``results.others``: the family and the scale reference measured under it), each judged by
    the same rules on the same sections' analyses."""
    verdicts, answers = {}, {}
    for other, measured in results.others.items():
        family = family_section(p, story.training, measured)
        answers[other] = scale_answer(p, measured)
        again = Story(
            story.paper, story.training, family, family_fits(p, family), None, answers[other], story.beyond
        )
        verdicts[other] = {row["claim"]: row["agree"] for row in claims(p, again)}
    return dataclasses.replace(story, conventions=verdicts, other_scale=answers)


MEASURED_APART = {"hub": "the hub models are", "within": "the training family is"}
"""The rows whose models only the chapter's own last block measures (none under the other maps)."""


def _others(p: Params, story: Story) -> dict[str, dict[str, str]]:
    """``{convention: {claim: verdict}}`` for every convention but the chapter's: those judged
    (``story.conventions``) and, empty, those that were not."""
    return {c: story.conventions.get(c, {}) for c in LAST_BLOCKS if c != p.last_block}


def _convention_note(p: Params, story: Story, row: Mapping[str, Any]) -> str:
    """Which last block a row's verdict uses, and its verdict under each other convention (or that
    it was not judged there, and why where only this map measures its models)."""
    if row["kind"] == "replot":
        return "the paper's own points: no last-block convention of this book enters"
    others = {c: v.get(row["claim"]) for c, v in _others(p, story).items()}
    note = lb.convention_note(p.last_block, row["agree"], others)
    apart = next((who for key, who in MEASURED_APART.items() if row["claim"] == CLAIMS[key]), None)
    return f"{note} ({apart} measured under '{p.last_block}' only)" if apart else note


def claims(p: Params, story: Story) -> list[dict[str, Any]]:
    """The status rows, each judged by its rule (pass them to ``pipeline.status.report``); each
    note says which last block its verdict uses and, for the measured rows, the verdict under
    the other maps (``story.conventions``)."""
    rows = [*_paper_claims(p, story.paper), *_family_claims(p, story), *_beyond_claims(p, story)]
    if story.within is not None:
        rows += within_claims(p, story.within)
    fit = story.hub_coupling
    if fit is not None:
        rows.append(
            claim(
                CLAIMS["hub"],
                paper=0.80,
                rule=HUB,
                values={"slope": fit["slope"], "slope_low": fit["slope_ci_low"], "n": fit["n"]},
                ours=f"R² {fit['r2']:.3f}, slope {fit['slope']:.3g}",
                note=f"{int(fit['n'])} models with a v1 score; K = {p.k}",
            )
        )
    return [{**row, "note": f"{row['note']}; {_convention_note(p, story, row)}"} for row in rows]


def _paper_claims(p: Params, paper: PaperFit) -> list[dict[str, Any]]:
    fig_r2, size, r2 = paper.r2, paper.size, paper.by_predictor["r2"]
    fit = paper.by_predictor.loc["coupling"]
    spread = Interval(
        fig_r2, min(fit["r2_ci_low"], fig_r2), max(fit["r2_ci_high"], fig_r2), over=f"{int(fit['n'])} models"
    )
    return [
        claim(
            CLAIMS["fig1a"],
            paper=0.80,
            rule=FIG1A_FIT,
            values={"r2": fig_r2},
            ours=round(fig_r2, 3),
            kind="replot",
            note=f"the paper's digitised points replotted (y = {p.fig1a_y}); not a measurement: the rule "
            "judges whether our digitisation reproduces the paper's printed R², not the fit's uncertainty "
            f"(its {spread.words('.3f')}, is not what this row judges)",
        ),
        claim(
            CLAIMS["size"],
            paper="higher R² than each (values not published)",
            rule=BEATS_SIZE,
            values={"gap": size.gap},
            ours=f"R² {fig_r2:.3f} vs {sizes_words(size, r2)}",
            kind="replot",
            note=f"the paper's digitised coupling; {size_note(size)}",
        ),
    ]


def _family_claims(p: Params, story: Story) -> list[dict[str, Any]]:
    ours, fits = story.family.ours, story.fits
    ex, rho, size = fits.acc.loc["excess"], fits.rho, fits.size
    return [
        claim(
            CLAIMS["family"],
            paper="positive correlation with performance",
            rule=GENERALISES,
            values={"rho": spearman_interval(ex), "n": len(ours)},
            ours=f"Spearman ρ {ex['spearman']:.2f} {spearman_interval(ex).bracketed()}",
            note=f"{len(ours)} models trained here, K/d = {p.k_over_d}; raw coupling ρ "
            f"{rho['raw coupling']:.2f}, "
            f"twins ρ {rho['twin coupling']:.2f}; {story.training.flat_note()}",
        ),
        claim(
            CLAIMS["family_size"],
            paper="higher R² than parameters, depth, width",
            rule=FAMILY_BEATS_SIZE,
            values={"gap": size.gap, "slope": ex["slope"]},
            ours=f"R² {ex['r2']:.3f} (excess) vs {sizes_words(size, fits.acc['r2'])}",
            note=size_note(size),
        ),
    ]


def _beyond_claims(p: Params, story: Story) -> list[dict[str, Any]]:
    v2, v1, s = story.beyond.fit("v2"), story.beyond.fit("v1"), story.scale
    return [
        claim(
            CLAIMS["v2"],
            paper="not studied",
            rule=EXTENSION,
            values={"slope": v2.slope, "slope_low": v2.slope_ci_low},
            ours=f"R² {v2.r2:.3f} over {int(v2.n)} models (v1 average, final snapshot: R² {v1.r2:.3f} over "
            f"{int(v1.n)} models)",
            kind="replot",
            note=f"the paper's digitised coupling against v2; log params R² {v2.size_r2:.3f}",
        ),
        claim(
            CLAIMS["scale"],
            paper="0.89–0.955 (aggregation not published)",
            rule=Rule(yes="n_compatible >= 1"),
            values={"n_compatible": s.n_1a},
            ours=f"{s.n_1a} of {len(s.judged)} candidates; {s.n_1b} fit Fig. 1b's axis",
            note=f"judged on {p.scale_reference} and its twin, {scale_prompt_words(p)}; rule: "
            f"{AXIS_RULES['Fig. 1a'].point_text}",
        ),
    ]


def glue_values(p: Params, story: Story, status: pd.DataFrame) -> dict[str, Any]:
    """Every value the prose glues, by name (``status``: what ``report`` returned for
    :func:`claims`, whose verdicts the prose quotes)."""
    verdict, b = dict(zip(status.claim, status.agree)), story.beyond
    return {
        **_paper_glue(story.paper),
        **_training_glue(p, story.training),
        **_family_ks_glue(p, story.training, story.family),
        **_fits_glue(story.family, story.fits),
        **_width_glue(story.family, story.fits),
        **_scale_glue(p, story.scale),
        **choice_words(story.scale, scale_prompt_words(p)),
        **_beyond_glue(story.beyond),
        **solutions_glue(p, story.paper, story.family, story.beyond),
        **compare_glue(story.fits.lead, story.fits.acc, b.tasks, b.fit("v2"), b.fit("v1"), b.ranks),
        **_verdict_glue(story, verdict),
        **_convention_glue(p, story, verdict),
        **within_glue(story.within),
    }


CONVENTION_ROWS = {
    "family": "family",
    "family_size": "family-versus-size",
    "scale": "scale",
    "within": "training-family",
    "hub": "hub-models",
}
"""The measured rows, whose verdicts depend on the last block, in words."""


def _other_runs(last_block: str) -> str:
    """How the family and the scale reference get the other map(s) of the last block (``lb.beside``)."""
    other = lb.beside(last_block)
    if other is not None:
        return (
            f'the same runs measure the last block once more, with `last_block = "{other}"` (every other '
            "block is the same map under both)"
        )
    return 'runs of their own measure the last block under each map, `"block"` and `"final_norm"`'


def _convention_glue(p: Params, story: Story, verdict: Mapping[str, str]) -> dict[str, Any]:
    """The chapter's last block, the verdicts it changes, and the book's scale number under it
    and under the first other map."""
    own = {key: verdict.get(CLAIMS[key]) for key in CONVENTION_ROWS}  # None: no such row in this run
    others = {c: {key: v.get(CLAIMS[key]) for key in CONVENTION_ROWS} for c, v in _others(p, story).items()}
    other = next(iter(story.other_scale), None)
    book = story.other_scale[other].book if other is not None else None
    return {
        "f02_last_block": Markdown(f'`last_block = "{p.last_block}"`'),
        "f02_last_block_words": lb.CONVENTION_WORDS[p.last_block],
        "f02_convention_sentence": Markdown(lb.changed_verdicts(own, others, CONVENTION_ROWS)),
        "f02_other_block": Markdown(f'`last_block = "{other}"`' if other else "no other map"),
        "f02_other_runs": Markdown(_other_runs(p.last_block)),
        "f02_scale_other_trained": float(book.trained) if book is not None else float("nan"),
        "f02_scale_other_twin": float(book.twin) if book is not None else float("nan"),
    }


def _paper_glue(paper: PaperFit) -> dict[str, Any]:
    fits = paper.by_predictor
    return {
        "f02_fig1a_r2": float(fits.loc["coupling", "r2"]),
        "f02_fig1a_n": int(fits.loc["coupling", "n"]),
        **size_glue("fig1a", paper.size, fits["r2"]),
    }


def _training_glue(p: Params, t: Training) -> dict[str, Any]:
    stage, members, n_flat = t.stage, t.members, t.n_flat
    return {
        "f02_n_members": len(stage),
        "f02_n_flat": n_flat,
        "f02_tail": p.tail,
        "f02_worst_tail_share": float(stage["tail_share"].max()),
        "f02_worst_tail_drop": float(stage["tail_drop"].max()),
        "f02_worst_tail_rel": float(stage["tail_drop_rel"].max()),
        "f02_best_tail_rel": float(stage["tail_drop_rel"].min()),
        "f02_loss_low": float(members["val_loss"].min()),
        "f02_loss_high": float(members["val_loss"].max()),
        "f02_tpp": float(members["tokens per parameter"].median()),
        **tpp_words(members["tokens per parameter"]),
        "f02_stage_sentence": Markdown(stage_words(stage, n_flat)),
    }


def _family_ks_glue(p: Params, t: Training, f: Family) -> dict[str, Any]:
    members = t.members
    by_width = {int(d): f.ks[r] for r, d in zip(members["run"], members["d_model"])}
    return {
        "f02_k_over_d": p.k_over_d,
        "f02_family_ks": Markdown(", ".join(f"{K} at d = {d}" for d, K in sorted(by_width.items()))),
    }


def _fits_glue(f: Family, fits: FamilyFits) -> dict[str, Any]:
    ours, acc, rho = f.ours, fits.acc, fits.rho
    above = ours["excess"] > 0
    clear = ours["excess"] > 2 * ours["excess_se"]
    return {
        "f02_family_n": len(ours),
        "f02_excess_rho": rho["excess"],
        "f02_excess_rho_interval": spearman_interval(acc.loc["excess"]).words(".2f"),
        "f02_excess_r2": float(acc.loc["excess", "r2"]),
        "f02_raw_rho": rho["raw coupling"],
        "f02_twin_rho": rho["twin coupling"],
        **size_glue("family", fits.size, acc["r2"]),
        "f02_sign_carrier": Markdown(
            _sign_carrier(spearman_interval(acc.loc["twin coupling"]), rho["excess"])
        ),
        "f02_near_zero": Markdown(_near_zero(ours)),
        "f02_above_twin": Markdown(
            "Every trained member is more coupled than its twin"
            if above.all()
            else f"{int(above.sum())} of {len(ours)} trained members are more coupled than their twins "
            f"({int(clear.sum())} by more than two standard errors)"
        ),
    }


def _sign_carrier(twin: Interval, excess: float) -> str:
    """Whether the twins alone (no training) order the members as the excess does, read with the
    twins' ρ interval over members (``twin``) against the excess's ρ estimate: the twins are said to
    set the order only where their whole interval has the excess's sign and their estimate is at
    least half the excess's."""
    if np.isnan(twin.estimate):
        return "The twins alone give no ρ: their coupling does not vary over these members"
    said = f"The twins alone, which no training touched, give ρ = {twin.estimate:.2f} ({twin.words('.2f')})"
    if not (twin.low > 0 or twin.high < 0):
        return (
            f"{said} against the excess's {excess:.2f}: the twins' interval includes 0, so these members "
            "do not show whether the twins' coupling, which only size sets, orders them; the training family "
            "below holds the architecture fixed"
        )
    if np.sign(twin.estimate) == np.sign(excess) and abs(twin.estimate) >= 0.5 * abs(excess):
        return (
            f"{said} against the excess's {excess:.2f}: the members' order by accuracy is close to their "
            "order by the twins' coupling, which only size sets. So this family cannot say what training "
            "added; the training family below holds the architecture fixed"
        )
    if np.sign(twin.estimate) != np.sign(excess):
        return (
            f"{said}, of the opposite sign to the excess's {excess:.2f}: the excess's order is not the twins'"
        )
    return f"{said}, an estimate under half the excess's {excess:.2f} (no interval compares the two)"


def _near_zero(ours: pd.DataFrame) -> str:
    """How many members' excess is within two standard errors of 0, in all and by width."""
    near = (ours["excess"].abs() <= 2 * ours["excess_se"]).groupby(ours["d_model"]).agg(["sum", "size"])
    parts = "; ".join(f"{int(r['sum'])} of {int(r['size'])} at d = {d}" for d, r in near.iterrows())
    n = int(near["sum"].sum())
    if n == 0:
        return f"No member's excess is within two standard errors of 0 ({parts})."
    return (
        f"{n} of {len(ours)} members have an excess within two standard errors of 0 ({parts}): for "
        "those, training moved coupling no further than the prompts do."
    )


def _width_glue(f: Family, fits: FamilyFits) -> dict[str, Any]:
    by_width = f.ours.groupby("d_model").agg(
        ex_lo=("excess", "min"),
        ex_hi=("excess", "max"),
        acc_lo=("val_acc", "min"),
        acc_hi=("val_acc", "max"),
        n=("excess", "size"),
    )
    split = (
        len(by_width) == 2
        and (
            by_width.ex_hi.iloc[1] < by_width.ex_lo.iloc[0] or by_width.ex_hi.iloc[0] < by_width.ex_lo.iloc[1]
        )
        and (
            by_width.acc_hi.iloc[0] < by_width.acc_lo.iloc[1]
            or by_width.acc_hi.iloc[1] < by_width.acc_lo.iloc[0]
        )
    )
    return {
        "f02_width_split": Markdown(
            "By width: "
            + "; ".join(
                f"at d = {d} the one member's excess is {r.ex_lo:.3f} and its accuracy {r.acc_lo:.3f}"
                if r.n == 1
                else f"at d = {d} the excess spans {r.ex_lo:.3f} to {r.ex_hi:.3f} and accuracy "
                f"{r.acc_lo:.3f} to {r.acc_hi:.3f}"
                for d, r in by_width.iterrows()
            )
            + ". "
            + (
                "The two widths do not overlap in either, so the family's correlation is a comparison of "
                "the two widths: "
                "it cannot tell coupling from width."
                if split
                else "The widths overlap, so the correlation is not only a comparison of the two widths."
            )
        ),
        "f02_sign_word": Markdown(
            sign_words(
                fits.rho["excess"],
                float(fits.acc.loc["excess", "spearman_ci_low"]),
                float(fits.acc.loc["excess", "spearman_ci_high"]),
                "negative, the opposite of the paper's direction",
                n=len(f.ours),
            )
        ),
    }


def _scale_glue(p: Params, s: ScaleAnswer) -> dict[str, Any]:
    book, miss, n_1a, n_1b, n_miss = s.book, s.miss, s.n_1a, s.n_1b, s.n_miss
    return {
        "f02_scale_ks": Markdown(", ".join(map(str, p.scale_k))),
        "f02_scale_reference": Markdown(p.scale_reference.removeprefix("embedded:")),
        "f02_scale_n": len(s.judged),
        "f02_scale_n_1a": n_1a,
        "f02_scale_n_1b": n_1b,
        "f02_scale_n_1a_scale": n_miss,
        "f02_scale_1a_example": Markdown(
            f"{_candidates(n_miss)} put{'s' if n_miss == 1 else ''} the trained model on Fig. 1a's scale "
            f"but do{'es' if n_miss == 1 else ''} not separate it from its twin; the one that comes "
            f"closest ({scale.candidate_label(miss)}, {miss.denominator} denominator, {miss.form}) "
            f"gives {miss.trained:.3f} for the trained model and {miss.twin:.3f} for the twin"
            if miss is not None
            else "no candidate puts the trained model on Fig. 1a's scale"
        ),
        "f02_scale_book_trained": float(book.trained) if book is not None else float("nan"),
        "f02_scale_book_twin": float(book.twin) if book is not None else float("nan"),
        "f02_scale_book_k": int(max(p.scale_k)),
        "f02_scale_prompts": Markdown(scale_prompt_words(p)),
        "f02_scale_book_1b": Markdown(
            (
                "is compatible with Fig. 1b's axis"
                if book["Fig. 1b"] == "yes"
                else "is not compatible with Fig. 1b's axis"
            )
            + (" and with Fig. 1a's" if book["Fig. 1a"] == "yes" else " and not with Fig. 1a's")
        )
        if book is not None
        else Markdown("was not computed in this run"),
        "f02_scale_1a_sentence": Markdown(
            "The candidates that reach Fig. 1a's scale do not tell a trained model from a random one, so "
            "that axis "
            "is not reproduced by any aggregation we could find"
            if n_1a == 0
            else f"{_candidates(n_1a)} reach{'es' if n_1a == 1 else ''} Fig. 1a's scale and "
            f"separate{'s' if n_1a == 1 else ''} the trained model from its twin (the "
            "`scale_compatible` table): that axis could be one of them"
        ),
        "f02_scale_conclusion": Markdown(
            f"Of the {len(s.judged)} candidates, {_compatible(n_1a)} with Fig. 1a's axis and "
            f"{_compatible(n_1b)} with Fig. 1b's."
        ),
    }


def _candidates(n: int) -> str:
    """``n`` candidate(s), in words: "1 candidate", "3 candidates"."""
    return f"{n} candidate" + ("" if n == 1 else "s")


def _compatible(n: int) -> str:
    """How many candidates are compatible, as the sentence says it: "none is", "1 is", "3 are"."""
    return "none is compatible" if n == 0 else f"{n} {'is' if n == 1 else 'are'} compatible"


def _beyond_glue(b: Beyond) -> dict[str, Any]:
    v2, v1 = b.fit("v2"), b.fit("v1")
    return {
        "f02_v2_r2": float(v2.r2),
        "f02_v2_r2_interval": r2_interval(v2).words(".3f"),
        "f02_v2_size_r2": float(v2.size_r2),
        "f02_v2_n": int(v2.n),
        "f02_v1_r2": float(v1.r2),
        "f02_v1_n": int(v1.n),
        "f02_v1_carrier_sentence": Markdown(carrier_words(b.drop_one[b.drop_one.version == "v1"])),
    }


def _verdict_glue(story: Story, verdict: Mapping[str, str]) -> dict[str, Any]:
    fit = story.hub_coupling
    out = {  # each verdict word tagged with its claim, so the book checks it against the status table
        f"f02_verdict_{name}": verdict_word({"claim": CLAIMS[key], "agree": verdict[CLAIMS[key]]})
        for name, key in (
            ("fig1a", "fig1a"),
            ("size", "size"),
            ("family", "family"),
            ("family_size", "family_size"),
            ("v2", "v2"),
            ("scale", "scale"),
            ("within", "within"),
        )
        if CLAIMS[key] in verdict
    }
    if story.hub is None:
        said = f"**Not reproduced here.** {HUB_SKIPPED}"
    elif fit is None:
        said = (
            f"**Not reproduced here.** {story.hub.n_measured} hub model(s) measured, too few with a v1 "
            f"average to fit (at least {HUB_MIN_FIT} are needed): the status table has no hub row."
        )
    else:
        said = (
            f"**The hub models** ({_word(CLAIMS['hub'], verdict)}): our coupling of {int(fit['n'])} hub "
            f"models with a v1 score explains R² = {fit['r2']:.3f} of the leaderboard average."
        )
    out["f02_hub_sentence"] = Markdown(said)
    return out


def _word(claim_text: str, verdict: Mapping[str, str]) -> str:
    """A status row's verdict as the prose shows it (:func:`verdict_word`), as Markdown text."""
    return verdict_word({"claim": claim_text, "agree": verdict[claim_text]}).data


def assumptions(story: Story) -> list[tuple[str, bool, str]]:
    """``(key, holds, text)`` of every sentence that assumes something of this run's numbers
    (for ``verdicts.assume``)."""
    s = story.scale
    book, judged = s.book, s.judged
    tokens = judged[judged.view == "tokens"]
    return [
        (
            "f02-trace-blind",
            s.n_1a == 0,
            "no candidate both reaches Fig. 1a's scale and separates the trained model from its twin",
        ),
        (
            "f02-book-choice-separates",
            book is not None and book["trained"] - book["twin"] > 0.03,
            "this book's number separates the trained model from its twin by more than 0.03",
        ),
        (
            "f02-book-choice-on-1b",
            book is not None and bool(book["Fig. 1b on scale"]),
            "this book's number lies on Fig. 1b's scale (the scale section's closing paragraph)",
        ),
        (
            "f02-within-one-twin",
            story.within is None or float(np.ptp(story.within.family.ours["twin_coupling"])) < 1e-9,
            "every member of the training family has the same twin (one config, one init seed)",
        ),
        (
            "f02-twins-tokenwise",
            bool((tokens.twin > tokens.trained).mean() > 0.9),
            "in (nearly) every token-wise candidate the twin is more coupled than the trained model",
        ),
    ]
