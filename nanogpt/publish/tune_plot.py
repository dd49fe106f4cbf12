"""The search's plot (tune.png): the objective per trial, and the Pareto front.

Left: every probed candidate's first objective by trial number (infeasible ones, pruned or out
of memory, as crosses on the axis), with the leaders' full-protocol figures and the finalists'
pooled ones beside them. Right, with two objectives or more: the probes in the plane of the
first two, the Pareto front joined.
"""

from __future__ import annotations

import io
from pathlib import Path

from nanogpt.publish.plot_parts import new_figure
from nanogpt.record.files import write_atomic

TUNE_PNG = "tune.png"


def write_plot(sweep_dir: Path, summary: dict) -> Path:
    names, directions = summary["objectives"], summary["directions"]
    two = len(names) > 1
    fig = new_figure(8, width=12.0 if two else 8.0)
    axes = fig.subplots(1, 2 if two else 1, squeeze=False)[0]
    ax = axes[0]
    probes = [e for e in summary["probes"] if e["trial"] is not None]
    ok = [e for e in probes if e["values"] is not None and not e["reason"]]
    bad = [e for e in probes if not (e["values"] is not None and not e["reason"])]
    ax.scatter([e["trial"] for e in ok], [e["values"][0] for e in ok], label="probe")
    floor = min((e["values"][0] for e in ok), default=0)
    ax.scatter(
        [e["trial"] for e in bad],
        [floor] * len(bad),
        marker="x",
        c="red",
        label="infeasible (pruned, oom, failed)",
    )
    trial_of = {e["key"]: e["trial"] for e in probes}
    for rung, marker in (("full", "s"), ("repeats", "*")):
        done = [e for e in summary[rung] if e["values"] is not None]
        ax.scatter(
            [trial_of.get(e["key"], -1) for e in done],
            [e["values"][0] for e in done],
            marker=marker,
            s=90,
            label=rung,
            alpha=0.7,
        )
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{names[0]} ({directions[0]})")
    ax.set_title("objective per trial")
    ax.legend(fontsize="small")
    if two:
        ax2 = axes[1]
        points = [e["values"][:2] for e in ok]
        ax2.scatter([p[0] for p in points], [p[1] for p in points], label="probe")
        front = sorted(summary.get("pareto") or [])
        ax2.plot([p[0] for p in front], [p[1] for p in front], "r-o", label="Pareto front")
        ax2.set_xlabel(names[0])
        ax2.set_ylabel(names[1])
        ax2.set_title("Pareto front (probes)")
        ax2.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    path = sweep_dir / TUNE_PNG
    write_atomic(path, buf.getvalue())
    return path
