"""f02 · Coupling and generalisation (``notebooks/f02_generalization.md``): its parameters and
their checks, its measurement plan (:func:`jobs`), the run that collects it (:func:`run`), the
analyses each section shows, its status rows (:func:`claims`) and the values its prose glues
(:func:`glue_values`).

The notebook is story plus calls: ``results = run(params)`` measures (or reads what a sweep
stored) exactly :func:`jobs`; each section then calls its analysis (:func:`paper_fit`,
:func:`training`, :func:`family_section`, :func:`family_fits`, :func:`hub_fit`,
:func:`scale_answer`, :func:`beyond`), shows its tables and charts, and the status cell reports
:func:`claims` and glues :func:`glue_values` in one call. Five modules, as the notebook reads
them: :mod:`.plan` (parameters, rules, plan, run), :mod:`.compare` (the comparisons of predictors
read by their rules: coupling against parameter count per leaderboard task, the best single
predictor), :mod:`.sections` (one analysis per section, with its tables and charts),
:mod:`.within` (the training family: one architecture, only training varies) and :mod:`.story`
(status rows, glued values, assumptions).
"""

from coupling_utils.chapters.f02_generalization.plan import (
    CLAIMS,
    NOTEBOOK,
    RULE_WORDS,
    RULES,
    SHOW,
    SIZES,
    Params,
    Results,
    family_widths,
    jobs,
    member_models,
    prompts,
    prompts_by_part,
    rule_lines,
    run,
    scale_ks,
    scale_prompt_words,
    scale_prompts,
)
from coupling_utils.chapters.f02_generalization.sections import (
    AXIS_RULES,
    HUB_SKIPPED,
    Beyond,
    Family,
    FamilyFits,
    Hub,
    PaperFit,
    ScaleAnswer,
    Training,
    axis_lines,
    beyond,
    choice_words,
    compatible_caption,
    coupling_table,
    curves_chart,
    family_chart,
    family_fits,
    family_section,
    fig1a_chart,
    hub_chart,
    hub_fit,
    join_family,
    members_table,
    paper_fit,
    per_prompt_chart,
    scale_answer,
    scale_section,
    tasks_chart,
    training,
)
from coupling_utils.chapters.f02_generalization.story import (
    Story,
    assumptions,
    claims,
    convention_verdicts,
    glue_values,
)
from coupling_utils.chapters.f02_generalization.within import (
    Within,
    within,
    within_chart,
    within_table,
)

__all__ = [
    "CLAIMS", "NOTEBOOK", "RULE_WORDS", "RULES", "SHOW", "SIZES", "Params", "Results", "member_models",
    "family_widths", "jobs", "prompts_by_part", "prompts", "rule_lines", "run", "scale_ks",
    "scale_prompt_words", "scale_prompts",
    "AXIS_RULES", "HUB_SKIPPED", "Beyond", "Family", "FamilyFits", "Hub", "PaperFit", "ScaleAnswer",
    "Training",
    "axis_lines", "beyond", "choice_words", "compatible_caption", "coupling_table", "curves_chart",
    "family_chart", "family_fits",
    "family_section", "fig1a_chart", "hub_chart", "hub_fit", "join_family", "members_table", "paper_fit",
    "per_prompt_chart", "scale_answer", "scale_section", "tasks_chart", "training", "Story",
    "assumptions", "claims", "convention_verdicts", "glue_values", "Within", "within",
    "within_chart", "within_table",
]  # fmt: skip
