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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Options", "ON_ERROR"]

ON_ERROR = ("record", "raise")


@dataclass(frozen=True)
class Options:
    """How the measurement loop runs its jobs.

    ``load(ref, **load_kwargs)``: loads a model reference (None: ``load_model``);
    ``on_error``: "record" (a failed job is recorded with its reason and the others still run)
    or "raise" (the first failure propagates); ``reuse_stale``: reuse stored results made by
    other code (then marked stale in their provenance) instead of measuring again; ``compute``:
    False only reads what is stored (nothing is loaded or measured); ``progress``: a progress
    bar over the jobs.
    """

    load: Callable[..., Any] | None = None
    on_error: str = "record"
    reuse_stale: bool = False
    compute: bool = True
    progress: bool = False

    def __post_init__(self):
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {self.on_error!r}")

    def but(self, **changes: Any) -> Options:
        """A copy with ``changes`` (e.g. ``options.but(on_error="raise")``)."""
        return dataclasses.replace(self, **changes)
