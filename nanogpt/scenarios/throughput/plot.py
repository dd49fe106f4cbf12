"""Throughput's PNGs, each drawn from the sweep by publish/plots.py (the table's rows alone, or
its steps and records too)."""

from __future__ import annotations

from collections.abc import Callable

from matplotlib.figure import Figure

from nanogpt.analysis.table import Sweep
from nanogpt.publish import plots
from nanogpt.publish.bottleneck_plot import bottleneck

PLOTS: dict[str, Callable[[Sweep], Figure]] = {
    "throughput.png": plots.of_table(plots.throughput),
    "mfu.png": plots.of_table(plots.mfu),
    "batch_scaling.png": plots.of_table(plots.batch_scaling),
    "step_times.png": plots.step_times,
    "memory_anatomy.png": plots.memory_anatomy,
    "speedup.png": plots.of_table(plots.speedup),
    "pareto.png": plots.of_table(plots.pareto),
    "memory_time.png": plots.of_table(plots.memory_time),
    "bottleneck.png": plots.of_table(bottleneck),
}
