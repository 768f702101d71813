"""f03's parameters and their checks (:class:`Params`), the rules fixed before any number
(:data:`RULES`), the prompts of its two panels and its measurement plan (:func:`jobs`: every
checkpoint of every run, on the held-out windows and on the quiz prompts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from coupling_utils.analysis import emergence
from coupling_utils.analysis import last_block as lb
from coupling_utils.analysis.verdicts import Rule
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
from coupling_utils.engine.blocks import LAST_BLOCKS
from coupling_utils.files import cache_dir
from coupling_utils.measurement.jobs import Job

NOTEBOOK = "f03_training_emergence"
MAIN = "Shakespeare windows"  # the main panel: windows of the corpus's validation plays (held out
# from the training of a run trained here; words.windows_words says which)
QUIZ = "quiz prompts"  # the secondary panel (out of distribution for a model trained only on Shakespeare)
PAPER_EARLY_STEP = 128  # the paper's early checkpoint: Fig. 1b's ratio is taken from step 128


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
    k: list = param([2, 4, 8, 16], k_values)
    k_main: int = param(8, check_top_k)
    how: str = param("offdiag", choice(*HOWS))
    early_step: int = param(1, integer(min=1))
    graph_steps: list = param([], list_of(integer(min=0), min_len=0, max_len=3))
    graph_threshold: float = param(0.4, number(min=0.0, max=1.0))
    plateau_fraction: float = param(0.25, number(min=0.05, max=0.95))
    trajectory_tokens: str = param("all", choice("all", "last"))
    skip_first_token: bool = param(True, boolean)
    method: str = param("exact", choice(*METHODS))
    last_block: str = param("final_norm", choice(*LAST_BLOCKS))


# --------------------------------------------------------------------------- the rules, fixed first
TOGETHER_PARTS = {
    "coupling rises with the step": "coupling_step >= 0.3",
    "the line-shape score falls with the step (straighter trajectories)": "lss_step <= -0.3",
    "coupling and the line-shape score move oppositely across checkpoints": "rho_lss <= -0.3",
}
"""The parts of claim 3's "together" rule, by what each says: a condition on a Spearman ρ over
the checkpoints from ``early_step`` on, of coupling with the step, of the line-shape score with
the step, and of the two with each other (:data:`RULES`' "together" joins them)."""
_RISES_WITH, _STRAIGHTER, _MOVED = TOGETHER_PARTS.values()

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
    # claim 3: coupling develops together with linearity: every part of TOGETHER_PARTS, over its
    # interval; partly where coupling rises and one of the linearity parts holds on the estimates
    "together": Rule(
        yes=" and ".join(TOGETHER_PARTS.values()),
        partly=f"{_RISES_WITH} and ({_STRAIGHTER} or {_MOVED})",
    ),
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
        last_block=p.last_block,
        last_block_also=lb.beside(p.last_block),  # the last block once more, under the other map
    )


def checkpoint_runs(p: Params, *, prepare: bool = True) -> list[emergence.Checkpoints]:
    """Each run's checkpoints (``run_checkpoints``: ``revisions``, or all an embedded run's recipe
    saves, or all a local run's folder holds), with an embedded run's losses and spec once it is
    prepared; ``prepare=False``: a plan, which trains nothing."""
    return [emergence.run_checkpoints(m, p.revisions, prepare=prepare) for m in p.models]


def runs_table(runs: list[emergence.Checkpoints]) -> pd.DataFrame:
    """One row per run: its checkpoints, the first and the last, and whether losses were recorded
    ("yes" or "no")."""
    return pd.DataFrame(
        [
            {
                "model": r.model,
                "checkpoints": len(r.revisions),
                "first": r.revisions[0],
                "last": r.revisions[-1],
                "losses recorded": "no" if r.losses is None else "yes",
            }
            for r in runs
        ]
    )


def panel_jobs(p: Params, runs: list[emergence.Checkpoints] | None = None) -> dict[str, list[Job]]:
    """Per panel: every run's checkpoints on its prompts, at the K that fit the run's width
    (``emergence.runs_jobs``), stored under the cache's ``f03/<method>``. Without ``runs``, the
    runs are planned (:func:`checkpoint_runs` with ``prepare=False``): nothing is trained to plan."""
    runs = checkpoint_runs(p, prepare=False) if runs is None else runs
    out = cache_dir("f03", p.method)
    return {
        panel: emergence.runs_jobs(runs, texts, checkpoint_settings(p, panel), out=out)
        for panel, texts in panels(p).items()
    }


def jobs(p: Params) -> list[Job]:
    """The measurement plan: :func:`panel_jobs` of both panels, the held-out windows first."""
    return [job for panel in panel_jobs(p).values() for job in panel]
