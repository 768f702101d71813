"""Concept diagrams drawn when the book is built, from small computations that run then.

:func:`coupling_diagram` is what coupling of top singular vectors means: a matrix ``J1`` seen in
three singular bases (its own, that of a noisy copy ``J2`` and that of an unrelated matrix
``J3``), each drawn as the paper's K×K tile ``|U_{j,K}^T J1 V_{j,K}|`` with the metric ``m_K``
computed by :func:`coupling_utils.engine.metric.coupling`. :func:`stage_diagrams` writes the
chart beside the notation page and replaces its :data:`MARKER` line with a numbered figure.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["MARKER", "DIAGRAM_FILE", "DIAGRAM_NAME", "coupling_diagram", "stage_diagrams"]

MARKER = "% concept-diagram"
DIAGRAM_FILE = "_generated/coupling-diagram.html"  # next to the page, in the staged book
DIAGRAM_NAME = "fig-notation-coupling"
OWN, COPY, OTHER = "J1 (its own)", "J2 (J1 + noise)", "J3 (unrelated)"  # the bases, in column order
SIZE, K, NOISE, SEED = 24, 6, 0.1, 0  # J1 is SIZE×SIZE; J2 = J1 + noise of NOISE·‖J1‖ (Frobenius)


def coupling_diagram() -> tuple[object, pd.DataFrame]:
    """(chart, metric table): the tiles of ``J1`` in three bases and ``m_K`` for each basis."""
    import torch

    from coupling_utils.analysis import plots
    from coupling_utils.engine.metric import coupling, coupling_tile

    g = torch.Generator().manual_seed(SEED)
    j1 = torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64)
    noise = torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64)
    bases = {
        OWN: j1,
        COPY: j1 + NOISE * j1.norm() * noise / noise.norm(),
        OTHER: torch.randn(SIZE, SIZE, generator=g, dtype=torch.float64),
    }
    rows, metrics = [], []
    for name, other in bases.items():
        tile = coupling_tile(j1, other, K).numpy()
        rows += [
            {"layer_i": "J1", "layer_j": name, "row": r, "col": c, "value": float(tile[r, c])}
            for r in range(K)
            for c in range(K)
        ]
        metrics.append({"basis": name, "m_K": coupling(j1, other, K)})
    look = plots.Look(title=f"J1 in three singular bases (K = {K}, d = {SIZE})")
    return plots.tile_grid(pd.DataFrame(rows), look=look), pd.DataFrame(metrics)


def stage_diagrams(page: Path) -> bool:
    """Replace the :data:`MARKER` line of a staged page with the coupling diagram as a numbered
    figure (its chart written to :data:`DIAGRAM_FILE` beside the page). False without a marker."""
    from coupling_utils.analysis import layout
    from coupling_utils.analysis.display import chart_bundle
    from coupling_utils.pipeline.teaching import replace_marker

    if MARKER not in page.read_text(encoding="utf-8").splitlines():
        return False
    chart, metrics = coupling_diagram()
    m = dict(zip(metrics.basis, metrics.m_K, strict=True))
    where = {name: layout.position(chart, f"J1, {name}") for name in (OWN, COPY, OTHER)}
    caption = (
        f"What coupling means, computed when this book was built: a random {SIZE}×{SIZE} matrix "
        f"$J_1$ seen in the leading {K} singular vectors of itself, of a copy with {NOISE:.0%} noise "
        f"and of an unrelated random matrix. Each tile is $|U_{{j,K}}^\\top J_1 V_{{j,K}}|$ over its "
        f"largest entry. In the basis of {OWN} ({where[OWN]}) the tile is diagonal ($m_K$ = "
        f"{m[OWN]:.1e}); in that of {COPY} ({where[COPY]}) it stays nearly so ($m_K$ = {m[COPY]:.2f}); "
        f"in that of {OTHER} ({where[OTHER]}) it has no diagonal ($m_K$ = {m[OTHER]:.2f})."
    )
    alt = (
        f"Three {K} by {K} heatmaps in a row. Own basis: only the diagonal is bright. Noisy copy: "
        "a bright diagonal with faint off-diagonal cells. Unrelated matrix: bright cells scattered "
        "with no diagonal."
    )
    bundle, _ = chart_bundle(chart, caption=caption, alt=alt, name=DIAGRAM_NAME)
    target = page.parent / DIAGRAM_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(bundle["text/html"], encoding="utf-8")
    figure = f"```{{chart-figure}} {DIAGRAM_FILE}\n:name: {DIAGRAM_NAME}\n\n{caption}\n```"
    return replace_marker(page, MARKER, figure)
