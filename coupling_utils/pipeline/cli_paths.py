"""The CLI's path options: read as given (relative to the current folder), and refused as bad
input (exit 2, naming the option) before any work when they cannot become what they name.

Used by every ``coupling-book`` command that takes a path (``cli``, ``k_sensitivity``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from coupling_utils.chapters.checks import ParameterError

__all__ = ["path_option", "check_target"]


def path_option(text: str) -> Path:
    """An argparse ``type``: a path, relative to the current folder; an empty one is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty: give a path, or leave the option out")
    return Path(text)


def check_target(path: Path, option: str, kind: str, example: str = "") -> Path:
    """Refuse (bad input) an output ``path`` that cannot become a ``kind`` ("folder" or "file")."""
    if kind == "folder" and path.exists() and not path.is_dir():
        raise ParameterError(f"{option} {path} is a file, not a folder: give a folder (created if missing)")
    if kind == "file" and path.is_dir():
        raise ParameterError(f"{option} {path} is a folder: give the file to write, e.g. {path / example}")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ParameterError(
            f"{option} {path}: {above} is a file, so nothing can be made in it; give another path"
        )
    nearest = path if kind == "folder" and path.is_dir() else above
    if nearest is not None and not os.access(nearest, os.W_OK | os.X_OK):
        raise ParameterError(
            f"{option} {path}: {nearest} cannot be written (permission denied); give a path in a "
            "folder you can write"
        )
    return path
