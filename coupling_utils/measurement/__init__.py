"""Measuring a model: :func:`measure` turns a model and prompts into tidy, resumable tables.

Named ``measurement`` rather than ``measure`` so that the subpackage never shadows the
function ``coupling_utils.measure``.
"""

from coupling_utils.measurement.core import (
    MEASURE_METHODS,
    TABLES,
    Measurement,
    coupling_summary,
    measure,
)

__all__ = ["measure", "Measurement", "coupling_summary", "TABLES", "MEASURE_METHODS"]
