"""val_loss.png: validation loss against training time, a line per run, a colour per point
(a sweep with bench.target_loss only; docs/time_to_loss.md).

The picture time-to-loss users draw first: where each point's curve crosses the target line is
its time to loss. The points are each run's evaluations as its record keeps them
(`ttl_evals`: step, train_s, val_loss; the first at step 0, before any step). The x axis is the
run's training clock, evaluations excluded and compilation included (time_to_loss_s takes
`ttl_compile_s` off too, so a curve crosses the target that much later than the figure says).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from nanogpt.publish.plot_parts import NoData, new_figure, tagged_labels

if TYPE_CHECKING:
    from nanogpt.analysis.table import Sweep


def runs_of(record: dict) -> list[list[dict]]:
    """A point's runs, each its list of evaluations ([] without a target or a record)."""
    evals = record.get("ttl_evals") or []
    if evals and isinstance(evals[0], dict):  # one run's record: a list of evaluations
        return [evals]
    return [run for run in evals if run]


def validation_loss(sweep: Sweep) -> Figure:
    """From the sweep (analysis/table.Sweep): its table's rows, each point's record's
    evaluations; no file read."""
    table = sweep.table
    if "ttl_target_loss" not in table or table["ttl_target_loss"].isna().all():
        raise NoData("no point has a target (bench.target_loss)")
    points = [
        (label, runs_of(sweep.point(job)))
        for label, job in zip(tagged_labels(table), table["job_dir"], strict=True)
    ]
    points = [(label, runs) for label, runs in points if runs]
    if not points:
        raise NoData("no point's record has evaluations (ttl_evals)")
    fig = new_figure(8, width=9.0)
    ax = fig.add_subplot()
    for n, (label, runs) in enumerate(points):
        colour = f"C{n % 10}"
        for r, run in enumerate(runs):
            ax.plot(
                [e["train_s"] for e in run],
                [e["val_loss"] for e in run],
                color=colour,
                alpha=0.7,
                linewidth=1.0,
                marker=".",
                label=label if r == 0 else None,  # the point named once
            )
    for target in table["ttl_target_loss"].dropna().unique():
        ax.axhline(float(target), color="black", linestyle="--", linewidth=0.8)
        ax.annotate(f"target {float(target):g}", (0, float(target)), va="bottom", fontsize="small")
    ax.set_xlabel("training time (s), evaluations excluded")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss against training time (a line per run)")
    ax.legend(fontsize="small")
    return fig


PLOTS = {"val_loss.png": validation_loss}  # its face's plots (scenarios/base.Plot)
