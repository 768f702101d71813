"""The zoo's exceptions, below every other zoo module so each of them can raise them."""

from __future__ import annotations


class ZooError(LookupError):
    """An embedded model cannot be found, prepared or used (the message says how to fix it)."""


class BuildFailed(RuntimeError):
    """A build was attempted and failed (a failed run, not bad input); the library's error is its
    ``__cause__``, so ``coupling-book --debug`` shows where it came from."""
