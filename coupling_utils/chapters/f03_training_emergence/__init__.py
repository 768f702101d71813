"""f03 · Emergence during training (``notebooks/f03_training_emergence.md``).

Its parameters and their checks (:class:`Params`), its measurement plan (:func:`jobs`: every
checkpoint of every run, on the held-out windows and on the quiz prompts), the measurements read
back (:func:`run` -> :class:`Results`, whose properties are the condensed numbers the story
reads), the figures it draws (``*_figure``: a chart and its alt text), its status rows judged by
the rules fixed before any number (:data:`RULES`, :func:`claims`) and the values it glues
(:func:`glue_values`).

Four modules, as the notebook reads them: :mod:`.plan` (parameters, rules, panels, plan),
:mod:`.results` (the run and the numbers it condenses), :mod:`.figures` (the charts with their
alt texts) and :mod:`.story` (status rows, glued values), which reads its words from
:mod:`.words`, the stored search's from :mod:`.search` and the worked solutions' from
:mod:`.exercises`.
"""

from coupling_utils.chapters.f03_training_emergence.figures import (
    SEARCH_COLUMNS,
    TRAJECTORY_PANELS,
    coupling_figure,
    graphs_figure,
    heatmaps_figure,
    loss_figure,
    panels_figure,
    paper_figure,
    search_figure,
    shapes_figure,
    steps_figure,
    trajectories_figure,
)
from coupling_utils.chapters.f03_training_emergence.plan import (
    MAIN,
    NOTEBOOK,
    QUIZ,
    RULES,
    TOGETHER_PARTS,
    Params,
    checkpoint_runs,
    checkpoint_settings,
    jobs,
    panel_jobs,
    panel_table,
    panels,
    prompts,
    quiz_prompts,
    runs_table,
    windows,
)
from coupling_utils.chapters.f03_training_emergence.results import Results, run
from coupling_utils.chapters.f03_training_emergence.search import FACTOR_NAMES
from coupling_utils.chapters.f03_training_emergence.story import claims, glue_values

__all__ = [
    "NOTEBOOK", "Params", "RULES", "TOGETHER_PARTS", "MAIN", "QUIZ", "prompts", "quiz_prompts", "windows",
    "panels",
    "panel_table", "checkpoint_settings", "checkpoint_runs", "runs_table", "panel_jobs", "jobs",
    "Results", "run", "loss_figure", "coupling_figure", "panels_figure", "paper_figure",
    "shapes_figure", "graphs_figure", "heatmaps_figure", "trajectories_figure", "steps_figure",
    "search_figure", "SEARCH_COLUMNS", "TRAJECTORY_PANELS", "claims", "glue_values",
    "FACTOR_NAMES",
]  # fmt: skip
