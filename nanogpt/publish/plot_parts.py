"""What every plot of a sweep shares: the figure on the Agg canvas, the point labels, and the
exception a plot raises when it has nothing to draw."""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nanogpt.analysis.labels import point_labels


class NoData(Exception):
    """Raised by a plot that has nothing to draw; the message says why."""


def tagged_labels(table: pd.DataFrame) -> list[str]:
    """Point labels, with the status appended to the points that are not ok."""
    names = [label or "defaults" for label in point_labels(table)]
    return [
        name if status == "ok" else f"{name} [{status}]"
        for name, status in zip(names, table["status"], strict=True)
    ]


def new_figure(n_rows: int, width: float = 8.0) -> Figure:
    fig = Figure(figsize=(width, max(3.0, 0.4 * n_rows + 1.5)), layout="constrained")
    FigureCanvasAgg(fig)
    return fig
