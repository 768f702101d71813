"""Measuring a model: :func:`measure` turns a model and prompts into tidy, resumable tables.

Named ``measurement`` rather than ``measure`` so that the subpackage never shadows the
function ``coupling_utils.measure``. Its parts: :mod:`.settings` (what is computed, validated
once), :mod:`.inputs` (model facts, prompts), :mod:`.store` (the folder, markers, resuming),
:mod:`.compute` (per-layer Jacobians and spectra), :mod:`.assemble` (a prompt's tables from
its layers), :mod:`.tables` (columns, the result, the per-model summary), :mod:`.core`
(``measure()`` itself), :mod:`.jobs` (many models or revisions: the job list), :mod:`.options`
(how jobs run) and :mod:`.loop` (running and collecting the jobs into labelled tables).
"""

from coupling_utils.measurement.core import measure, measure_with
from coupling_utils.measurement.jobs import Extra, Job, Loads, plan, relabel
from coupling_utils.measurement.loop import Collected, Result, collect, run
from coupling_utils.measurement.options import Options
from coupling_utils.measurement.settings import MEASURE_METHODS, Settings
from coupling_utils.measurement.tables import TABLES, Measurement, coupling_summary

__all__ = [
    "measure",
    "measure_with",
    "Measurement",
    "coupling_summary",
    "Settings",
    "TABLES",
    "MEASURE_METHODS",
    "Job",
    "Extra",
    "Loads",
    "plan",
    "relabel",
    "Options",
    "run",
    "collect",
    "Result",
    "Collected",
]
