"""f01 · Coupling across depth and tokens (``notebooks/f01_depth_and_tokens.md``).

Its parameters and their checks (:class:`Params`), its measurement plan (:func:`jobs`: each
model beside its random-init twin), the measurements read back (:func:`run` -> :class:`Results`,
whose properties are the condensed numbers the story reads), the figures it draws, its status
rows judged by the rules fixed before any number (:data:`RULES`, :func:`claims`), the
assumptions its prose makes about a run (:func:`assumptions`) and the values it glues
(:func:`glue_values`). Two modules, as the notebook reads them: :mod:`.plan` (parameters,
rules, plan, run) and :mod:`.story` (figures, status rows, glued values, assumptions), whose
"What matched" sentences that interpret a number :mod:`.findings` words.
"""

from coupling_utils.chapters.f01_depth_and_tokens.findings import named_model
from coupling_utils.chapters.f01_depth_and_tokens.plan import (
    DRAWN_TILE_K,
    ENCODER,
    NOTEBOOK,
    PAPER_AXIS,
    RULES,
    Params,
    Results,
    jobs,
    models,
    prompt_table,
    prompts,
    run,
    twin_settings,
)
from coupling_utils.chapters.f01_depth_and_tokens.story import (
    ENCODER_NOTE,
    ROW_NAMES,
    assumptions,
    claims,
    context_chart,
    depth_chart,
    distance_chart,
    glue_values,
    last_block_chart,
    per_model_chart,
    tile_chart,
    token_chart,
)

__all__ = [
    "NOTEBOOK", "ENCODER", "PAPER_AXIS", "DRAWN_TILE_K", "ENCODER_NOTE", "ROW_NAMES", "Params", "RULES",
    "Results",
    "prompt_table", "prompts", "models", "twin_settings", "jobs", "run", "tile_chart", "depth_chart",
    "distance_chart", "per_model_chart", "token_chart", "context_chart", "last_block_chart", "claims",
    "assumptions", "glue_values", "named_model",
]  # fmt: skip
