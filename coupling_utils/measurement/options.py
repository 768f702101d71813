"""How measurements run, as one object: loading, failures, stale results, progress.

:class:`Options` travels from a notebook or the CLI through a chapter's ``run`` to
:func:`coupling_utils.measurement.loop.collect`, instead of the same five keyword arguments
passed down by every function on the way. Nothing in it changes a measured number, so it is
never part of a stored result's key: what is measured is a job's
:class:`~coupling_utils.measurement.Settings` and load arguments (model, revision, weights,
dtype).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Options", "ON_ERROR", "HELD_BYTES"]

ON_ERROR = ("record", "raise")
HELD_BYTES = 256 << 20
"""The most bytes of finished layers a measurement holds in memory before writing them."""


@dataclass(frozen=True)
class Options:
    """How the measurement loop runs its jobs.

    ``load(ref, **load_kwargs)``: loads a model reference (None: ``load_model``);
    ``on_error``: "record" (a failed job is recorded with its reason and the others still run)
    or "raise" (the first failure propagates); ``reuse_stale``: reuse stored results made by
    other code (then marked stale in their provenance) instead of measuring again; ``compute``:
    False only reads what is stored (nothing is loaded or measured); ``progress``: a progress
    bar over the jobs; ``checkpoint_seconds``: how often a measurement writes its finished layers
    and prompts to disk, the files a resumed run starts from (0: after every layer and prompt).
    Between writes they are held in memory, and written early when they reach :data:`HELD_BYTES`
    or an error or Ctrl-C stops the run (finished prompts also at its end): a run killed outright
    loses at most this many seconds of work, and a small model's layers and prompts, which take
    milliseconds, do not each pay for their own files.
    """

    load: Callable[..., Any] | None = None
    on_error: str = "record"
    reuse_stale: bool = False
    compute: bool = True
    progress: bool = False
    checkpoint_seconds: float = 10.0

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")
        seconds = self.checkpoint_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
            raise ValueError(
                "checkpoint_seconds must be a number of seconds, 0 or more (0: write every layer), "
                f"got {seconds!r}"
            )

    def but(self, **changes: Any) -> Options:
        """A copy with ``changes`` (e.g. ``options.but(on_error="raise")``)."""
        return dataclasses.replace(self, **changes)
