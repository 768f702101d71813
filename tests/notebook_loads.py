"""Counting the models a notebook kernel loads (a test helper).

:func:`counting_kernel` writes an IPython profile whose startup file wraps
``coupling_utils.models.loading.load_model`` (the one loader every notebook, analysis and the
measurement loop go through) and ``transformers.PreTrainedModel.from_pretrained``, each call
appended as one JSON line to a file. With ``IPYTHONDIR`` pointing at the profile, every kernel
papermill starts counts its loads; :func:`loads` reads them back.
"""

from __future__ import annotations

import json
from pathlib import Path

STARTUP = """\
import json as _json
import os as _os

def _record(kind, name):
    with open(_os.environ["COUPLING_TEST_LOADS"], "a") as f:
        f.write(_json.dumps([kind, str(name)]) + "\\n")

from coupling_utils.models import loading as _loading
_load_model = _loading.load_model

def _counting_load_model(*args, **kwargs):
    _record("load_model", args[0] if args else kwargs.get("name_or_path"))
    return _load_model(*args, **kwargs)

_loading.load_model = _counting_load_model

from transformers import PreTrainedModel as _PTM
_from_pretrained = _PTM.from_pretrained.__func__

def _counting_from_pretrained(cls, *args, **kwargs):
    _record("from_pretrained", args[0] if args else kwargs.get("pretrained_model_name_or_path"))
    return _from_pretrained(cls, *args, **kwargs)

_PTM.from_pretrained = classmethod(_counting_from_pretrained)
"""


def counting_kernel(folder: Path) -> dict[str, str]:
    """Write the counting IPython profile under ``folder``; return the environment to set."""
    startup = folder / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-count-loads.py").write_text(STARTUP)
    return {"IPYTHONDIR": str(folder / "ipython"), "COUPLING_TEST_LOADS": str(folder / "loads.jsonl")}


def loads(env: dict[str, str]) -> list[list[str]]:
    """The loads recorded so far: ``[kind, model]`` pairs."""
    path = Path(env["COUPLING_TEST_LOADS"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
