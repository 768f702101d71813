"""The zoo's one exception, below every other zoo module so each of them can raise it."""

from __future__ import annotations


class ZooError(LookupError):
    """An embedded model cannot be found, prepared or used (the message says how to fix it)."""
