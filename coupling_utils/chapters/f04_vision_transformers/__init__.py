"""f04 · Vision Transformers (``notebooks/f04_vision_transformers.md``); the chapter lives in
:mod:`.plan` while it is split into modules (the next commit)."""

from coupling_utils.chapters.f04_vision_transformers.plan import *  # noqa: F403
from coupling_utils.chapters.f04_vision_transformers.plan import (  # noqa: F401
    ASSUMPTIONS,
    NOTEBOOK,
    PREDICTORS,
    RULES,
    __all__,
    family_values,
    run_dir,
    twin_values,
)
