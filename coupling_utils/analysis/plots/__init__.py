"""Altair chart builders for the book, each named after what it draws.

Every builder takes a tidy long DataFrame (one row per plotted value; see
:mod:`coupling_utils.analysis.coupling_metric` for turning matrices and tiles into such tables),
the names of the columns it draws, and a :class:`Look` (titles, panel size, facet columns and
order: the same names in every builder), and returns an Altair chart. Charts are plain Vega-Lite
specs: ``coupling_utils.analysis.display.show`` makes them live views in the built book, with a
static SVG/PNG for print and for Jupyter. Colour schemes are colour-blind safe: Okabe–Ito for
categories, viridis for magnitudes.

    from coupling_utils.analysis.plots import Look, coupling_heatmap
    coupling_heatmap(df, "layer_j", "layer_i", "m", facet="weights",
                     look=Look(title="Depth-wise coupling", width=200, columns=2))

So that a figure reads at a glance, every builder follows the same conventions:

- axis, legend, facet and tooltip titles are human names (:func:`title_of` looks a column up in
  :data:`TITLES`), never raw column names; ``Look(x_title=..., y_title=...)`` overrides them;
- every mark has a tooltip naming what it is (layers i and j, K and the value; model, step,
  accuracy);
- scatters pan and zoom, scatters side by side highlight the same point together, and point
  labels never overlap (:mod:`.scatter`);
- heatmaps of a coupling matrix draw the diagonal (a block with itself, m = 0) in grey, outside
  the colour scale, so that the scale spans the off-diagonal values, the finding itself;
- facet headers show the values only (``trained``, ``random init``), not the column name.

Coupling values ``m`` (lower = more coupled) are drawn as ``1 − m²`` by default (higher = more
coupled, about 0 = unrelated), as in the authors' figures; pass ``show="m"`` to draw ``m``.

The builders live in modules named after what they draw: :mod:`.heatmaps` (tile grid, coupling
matrices), :mod:`.graphs` (the circle figures), :mod:`.curves` (over training),
:mod:`.sensitivity` (against a setting), :mod:`.means` (per layer, per category),
:mod:`.scatter` (fits and labels), :mod:`.trajectories` (PCA paths);
:mod:`.look` holds what they share.
"""

from __future__ import annotations

from coupling_utils.analysis.plots.curves import training_curve
from coupling_utils.analysis.plots.graphs import layer_coupling_graph
from coupling_utils.analysis.plots.heatmaps import DIAGONAL_COLOUR, SHOWS, coupling_heatmap, tile_grid
from coupling_utils.analysis.plots.look import OKABE_ITO, TITLES, Look, title_of
from coupling_utils.analysis.plots.means import bars, layer_profile
from coupling_utils.analysis.plots.scatter import LABEL_PLACES, place_labels, scatter_fit
from coupling_utils.analysis.plots.sensitivity import sensitivity_curve
from coupling_utils.analysis.plots.trajectories import trajectory_pca_chart

__all__ = [
    "OKABE_ITO",
    "TITLES",
    "SHOWS",
    "DIAGONAL_COLOUR",
    "LABEL_PLACES",
    "Look",
    "title_of",
    "tile_grid",
    "coupling_heatmap",
    "training_curve",
    "sensitivity_curve",
    "scatter_fit",
    "layer_coupling_graph",
    "trajectory_pca_chart",
    "layer_profile",
    "bars",
    "place_labels",
]
