"""A list written into a sentence: "A", "A and B", "A, B and C" (no serial comma), the one join
the book's prose, its error messages and the CLI's use for a list of things."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["listed"]


def listed(items: Iterable[object]) -> str:
    """``items`` as prose: "A", "A and B", "A, B and C". Each item is written with ``str`` (as an
    f-string writes it), so numbers may be passed as they are. Raises ValueError for no items
    (a sentence would be left with a hole: say "none" or leave the sentence out) and TypeError
    for a lone string (its letters would be listed: pass a list of strings)."""
    if isinstance(items, str):
        raise TypeError(f"listed() takes a list of items, got the string {items!r}: pass [{items!r}]")
    words = [str(item) for item in items]
    if not words:
        raise ValueError(
            "listed() got no items: there is nothing to list; say 'none' or leave the sentence out"
        )
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
