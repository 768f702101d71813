"""What every chart builder shares: the :class:`Look` (titles, panel size, panel layout), the
human names of columns (:data:`TITLES`), the colour palette and the encodings built from them.

A builder's data arguments say what it draws; its ``look`` says how the figure is titled and
laid out, with the same names in every builder.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings

import altair as alt
import pandas as pd

from coupling_utils.schemas import Schema, check_table

__all__ = ["OKABE_ITO", "TITLES", "Look", "title_of"]

#: Okabe & Ito's colour-blind safe categorical palette (black last).
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
_BIG = 60_000  # rows beyond which a figure gets heavy (one element per mark)
# Pan/zoom selections need their own names: Altair merges identical unnamed ones across views.
_ZOOMS = itertools.count(1)

#: Human names of the columns the book's tables use: titles of axes, legends and tooltips.
TITLES = {
    "layer": "layer",
    "layer_i": "layer i",
    "layer_j": "layer j",
    "token": "token",
    "token_i": "token i",
    "token_j": "token j",
    "position": "position",
    "row": "row",
    "col": "column",
    "K": "K",
    "k_over_d": "K/d",
    "k": "K",
    "m": "m_K",
    "m_K": "m_K",
    "1 − m²": "1 − m²",
    "1 − m_K²": "1 − m_K²",  # one pair's value (f00's tables); without it the "_" would read as a space
    "coupling": "coupling (mean 1 − m²)",
    "paper_coupling": "the paper's coupling",
    "normalized_coupling": "normalised coupling",
    "relative": "coupling / its final value",
    "training_fraction": "fraction of training",
    "step": "training step",
    "model": "model",
    "model_id": "model",
    "run": "run",
    "label": "model",
    "series": "series",
    "quantity": "quantity",
    "state": "weights",
    "weights": "weights",
    "panel": "panel",
    "case": "case",
    "prompt": "prompt",
    "val_acc": "held-out accuracy",
    "val_loss": "held-out loss (nats/token)",
    "test_acc": "test accuracy",
    "average": "leaderboard average",
    "score": "leaderboard score",
    "nats": "cross-entropy (nats/token)",
    "n_params": "parameters",
    "step_norm": "step size ‖xˡ − xˡ⁻¹‖",
    "lss": "line-shape score",
    "expodistance": "expodistance",
    "expodistance_ratio_cv": "expodistance (CV of step ratios)",
    "expodistance_log_linear_r2": "expodistance (1 − R² of log step size vs layer)",
    "growth_log_linear_r2": "growth factor of the steps per layer",
    "reconstruction": "reconstruction",
    "cosine": "cosine",
    "distance": "distance |i − j|",
    "pc1": "PC1",
    "pc2": "PC2",
    "pc3": "PC3",
    "strength": "1 − m²",
    "value": "value",
}


def title_of(column: str | None) -> str | None:
    """The human name of a column (:data:`TITLES`); other names come back with spaces for ``_``."""
    if column is None:
        return None
    return TITLES.get(column, str(column).replace("_", " "))


def _title(text: str) -> str:
    """A title given by the caller: a known column name becomes its human name, text stays."""
    return TITLES.get(text, text)


def _positive(name: str, value) -> None:
    if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"Look.{name} must be a positive whole number of pixels or panels, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Look:
    """How a chart is presented, apart from what it draws: one set of names for every builder.

    ``title`` and ``subtitle`` head the figure (a subtitle alone becomes the title); ``x_title``
    and ``y_title`` replace the axes' human column names; ``width`` and ``height`` are one
    panel's size in pixels (a square panel takes ``width`` for both unless ``height`` is given);
    ``columns`` is how many panels of a faceted chart go in a row; ``order`` lists the facet
    values in reading order (values not listed follow, ascending). None everywhere means the
    builder's own default.
    """

    title: str | None = None
    subtitle: str | None = None
    x_title: str | None = None
    y_title: str | None = None
    width: int | None = None
    height: int | None = None
    columns: int | None = None
    order: tuple | None = None

    def __post_init__(self) -> None:
        for name in ("width", "height", "columns"):
            _positive(name, getattr(self, name))
        if self.order is not None:
            if isinstance(self.order, (str, bytes)) or not hasattr(self.order, "__iter__"):
                raise ValueError(f"Look.order must be a list of facet values, got {self.order!r}")
            object.__setattr__(self, "order", tuple(self.order))

    def size(self, width: int, height: int | None = None) -> tuple[int, int]:
        """One panel's (width, height): this look's, else the builder's ``width`` × ``height``
        (``height`` None: a square panel, as high as it is wide)."""
        w = self.width or width
        if height is None:
            return w, self.height or w
        return w, self.height or height

    def titled(self, chart):
        """The chart with this look's title and subtitle (when there is one)."""
        title, subtitle = self.title, self.subtitle
        if not title:  # a subtitle alone becomes the title (Vega drops a subtitle without one)
            return chart.properties(title=subtitle) if subtitle else chart
        return chart.properties(title=alt.TitleParams(title, subtitle=subtitle) if subtitle else title)

    def facet_sort(self):
        """The ``sort`` of a facet: ascending, or :attr:`order` first."""
        return list(self.order) if self.order is not None else alt.Undefined


# --------------------------------------------------------------------------- shared encodings
def _need(df: pd.DataFrame, *cols: str | None) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    check_table(df, Schema("DataFrame", dict.fromkeys((c for c in cols if c is not None), "any")))
    if df.empty:
        raise ValueError("nothing to plot: the DataFrame is empty")


def _warn_size(df: pd.DataFrame, what: str) -> None:
    if len(df) > _BIG:
        warnings.warn(
            f"{what}: {len(df)} rows make a heavy figure; use a smaller K, fewer layers or fewer tokens",
            stacklevel=3,
        )


def _tip(field: str, kind: str, fmt: str | None = None, title: str | None = None) -> alt.Tooltip:
    """A tooltip entry titled with the column's human name."""
    kw = {"format": fmt} if fmt else {}
    return alt.Tooltip(f"{field}:{kind}", title=title or title_of(field), **kw)


def _categorical(field: str, title: str | None = None) -> alt.Color:
    return alt.Color(f"{field}:N", title=title or title_of(field), scale=alt.Scale(range=OKABE_ITO))


def _facet_header() -> alt.Header:
    return alt.Header(labelFontSize=12, labelFontWeight="bold")


def _param_name(prefix: str, field: str) -> str:
    """A Vega signal name for a selection on ``field`` (letters, digits and _ only)."""
    return f"{prefix}_" + re.sub(r"\W", "_", field)


def _zoom() -> alt.Parameter:
    """A pan/zoom selection with a name of its own (each view zooms on its own)."""
    return alt.selection_interval(bind="scales", name=f"zoom_{next(_ZOOMS)}")
