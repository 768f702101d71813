"""One module per finding: each chapter owns its parameters, its measurement plan and its claims.

A chapter module (``coupling_utils.chapters.f01_depth_and_tokens`` for the notebook
``notebooks/f01_depth_and_tokens.md``) declares

- ``Params``: the notebook's papermill parameters as one checked object
  (:class:`~coupling_utils.chapters.params.ChapterParams`);
- ``jobs(params)``: the measurement plan, the list of
  :class:`~coupling_utils.measurement.Job` objects the notebook measures. The notebook, the
  sweep (``coupling-book sweep``) and the cost model read this one list, so they cannot
  disagree.

The pipeline layer iterates the chapters through :func:`chapter`; it holds no per-chapter code.
To add a chapter: write ``notebooks/fNN_name.md`` and ``chapters/fNN_name.py`` with these
names, and add the name to :data:`NAMES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from coupling_utils.chapters.checks import ParameterError
from coupling_utils.chapters.params import ChapterParams

__all__ = [
    "NAMES", "NOT_THE_PAPERS", "chapter", "own_claim", "is_own_claim", "check_parameters", "build_quietly",
    "ChapterParams", "ParameterError",
]  # fmt: skip

NAMES = (
    "f00_coupling_metric",
    "f01_depth_and_tokens",
    "f02_generalization",
    "f03_training_emergence",
    "f04_vision_transformers",
    "f05_token_trajectories",
)

NOT_THE_PAPERS = "(this book's, not the paper's claim)"
"""What a status row's claim says when the row asks this book's own question (a contrast the book
measures beside the paper's models, an extension of the paper's analysis): the intro's tally
(``pipeline.summary.tally``) counts such rows apart from the paper's claims."""


def own_claim(label: str, text: str) -> str:
    """A status row's claim for this book's own question: ``"Contrast (this book's, not the
    paper's claim): text"`` (``label``: "Contrast", "Extension")."""
    return f"{label} {NOT_THE_PAPERS}: {text}"


def is_own_claim(claim: str) -> bool:
    """Whether a status row's claim is this book's own question (:func:`own_claim`), not the paper's."""
    return NOT_THE_PAPERS in str(claim)


def chapter(name: str) -> ModuleType:
    """The chapter module of notebook ``name`` (its stem, e.g. ``"f01_depth_and_tokens"``)."""
    if name not in NAMES:
        raise ParameterError(f"no chapter {name!r}; chapters: {', '.join(NAMES)}")
    return importlib.import_module(f"coupling_utils.chapters.{name}")


def check_parameters(name: str, values: Mapping[str, Any]) -> ChapterParams:
    """Chapter ``name``'s parameters from ``values`` (a dict or a notebook's ``globals()``),
    checked: the one call a notebook's second cell and ``coupling-book run`` make."""
    return chapter(name).Params.checked(values)


def build_quietly(name: str, params: ChapterParams) -> None:
    """Build the embedded models chapter ``name``'s plan loads (``jobs(params)``) without progress
    bars, so that a notebook run in a fresh cache shows its results, not training bars (loading
    would build them with bars on first use). Built ones are only found; nothing is returned
    (the notebook's cell shows no value). One that cannot be built is tried once: the measurement
    does not build it again (:func:`~coupling_utils.models.zoo.no_retry`) but reports it, once,
    where the chapter lists the models it could not measure."""
    from coupling_utils.models import zoo

    module = chapter(name)
    models = [str(job.model) for job in module.jobs(params)] if hasattr(module, "jobs") else []
    for model in dict.fromkeys(m for m in models if m.startswith(zoo.PREFIX)):
        try:
            zoo.no_retry(model, False)  # this run tries each build again, once
            zoo.prepare(model, progress=False)  # a family member builds its family once
        except zoo.ZooError:  # bad input (an unknown name): the measurement reports it
            continue
        except Exception:  # noqa: BLE001 - reported by the measurement, in the chapter's words
            zoo.no_retry(model)
