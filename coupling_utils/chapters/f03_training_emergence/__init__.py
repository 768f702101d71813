"""f03 · Emergence during training (``notebooks/f03_training_emergence.md``); the chapter lives in
:mod:`.story` while it is split into modules (the next commit)."""

from coupling_utils.chapters.f03_training_emergence.story import *  # noqa: F403
from coupling_utils.chapters.f03_training_emergence.story import (  # noqa: F401
    FACTOR_NAMES,
    NOTEBOOK,
    SEARCH_COLUMNS,
    TRAJECTORY_PANELS,
    __all__,
)
