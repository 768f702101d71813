"""f04 · Vision Transformers (``notebooks/f04_vision_transformers.md``): its parameters and their
checks, its measurement plan (:func:`jobs`: the run over its checkpoints, the run and its twin,
the hub ViTs and their twins, the family and its twins), :func:`run` (what the story shows,
from the collected jobs alone), its verdict rules and claims, its figures and the values its
prose glues.

Four modules, as the notebook reads them: :mod:`.plan` (parameters, rules, plan, run and
:class:`Results`), :mod:`.exercises` (the exercise variants the plan measures and their glued
answers), :mod:`.story` (status rows, assumptions, glued values) and :mod:`.figures` (each
figure with its name, caption and alt text).
"""

from coupling_utils.chapters.f04_vision_transformers.figures import (
    depthwise_steps_figure,
    depthwise_twins_figure,
    family_figure,
    family_training_figure,
    training_figure,
    twins_figure,
)
from coupling_utils.chapters.f04_vision_transformers.plan import (
    ABOVE_TWIN,
    EMERGES,
    FAMILY,
    HUB_ABOVE_TWIN,
    NOTEBOOK,
    PREDICTORS,
    RULES,
    STUDIES,
    NotMeasured,
    Params,
    Results,
    checkpoints,
    family_runs,
    jobs,
    run,
    run_dir,
    run_name,
    vit_setup,
)
from coupling_utils.chapters.f04_vision_transformers.story import (
    ASSUMPTIONS,
    assumption,
    claims,
    family_values,
    glue_values,
    twin_values,
)

__all__ = [
    "NOTEBOOK", "Params", "EMERGES", "ABOVE_TWIN", "HUB_ABOVE_TWIN", "FAMILY", "RULES", "STUDIES",
    "PREDICTORS", "vit_setup", "run_name", "run_dir", "checkpoints", "family_runs", "jobs",
    "NotMeasured", "Results", "run", "twin_values", "family_values", "claims", "ASSUMPTIONS",
    "assumption", "glue_values", "training_figure", "depthwise_steps_figure", "twins_figure",
    "depthwise_twins_figure", "family_training_figure", "family_figure",
]  # fmt: skip
