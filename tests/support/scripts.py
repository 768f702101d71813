"""Load one of the repository's scripts (``bench/``, ``scripts/``) as a module, so that tests can call
its functions: the scripts are run from a shell, not imported from a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (from the repository root, e.g. ``"bench/bench_book.py"``), executed
    as a fresh module; its folder goes on ``sys.path`` first, as when it is run, so that its
    neighbours (``bench/_common.py``) import."""
    path = ROOT / relative
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # registered as an import would (a dataclass looks its module up)
    spec.loader.exec_module(module)
    return module
