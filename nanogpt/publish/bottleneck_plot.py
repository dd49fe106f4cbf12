"""bottleneck.png: where each point's step goes, from its diagnosis (analysis/bottleneck.py).

Two stacked horizontal bars a point: on the left the step's wall time split into device,
communication, data and host shares (they sum to 100 %), with the verdict written after the bar;
on the right the device time split by kind (matmul, attention, elementwise/norm, optimizer,
communication, other). A point without a diagnosis (off, failed, not ok) is named, barless.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from nanogpt.analysis.bottleneck import KINDS
from nanogpt.publish.plot_parts import NoData, new_figure, tagged_labels

STEP_PARTS = (
    ("diag_step_device_frac", "device"),
    ("diag_step_comm_frac", "communication"),
    ("diag_step_data_frac", "data"),
    ("diag_step_host_frac", "host"),
)
KIND_PARTS = tuple((f"diag_device_time_{kind}_frac", kind) for kind in KINDS)


def _stack(ax, table: pd.DataFrame, parts, rows: list[int]) -> None:
    """One stacked bar per row, in percent, a segment per part (missing figures: no bar)."""
    left = [0.0] * len(table)
    for column, name in parts:
        widths = (pd.to_numeric(table[column], errors="coerce") * 100).fillna(0.0).to_list()
        ax.barh(rows, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]


def bottleneck(table: pd.DataFrame) -> Figure:
    if "bottleneck" not in table or table["bottleneck"].isna().all():
        raise NoData("no point has a diagnosis (bench.diagnose=false, or none finished ok)")
    fig = new_figure(len(table), width=12.0)
    step_ax, kind_ax = fig.subplots(1, 2, sharey=True)
    rows = list(range(len(table)))[::-1]  # first point on top
    _stack(step_ax, table, STEP_PARTS, rows)
    _stack(kind_ax, table, KIND_PARTS, rows)
    for row, verdict in zip(rows, table["bottleneck"], strict=True):
        if isinstance(verdict, str):
            step_ax.annotate(f" {verdict}", (100, row), va="center", fontsize="small")
    step_ax.set_yticks(rows, tagged_labels(table))
    step_ax.set_xlim(0, 135)  # room for the verdict after the bar
    step_ax.set_xlabel("% of the step's wall time")
    step_ax.set_title("Where the step goes")
    kind_ax.set_xlabel("% of device time (CPU: operator time)")
    kind_ax.set_title("Device time by kind")
    for ax in (step_ax, kind_ax):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=3, fontsize="small")
    return fig
