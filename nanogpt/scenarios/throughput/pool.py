"""Throughput's face at the analysis layer: a point's runs pooled part by part (each part's own
rule, analysis/repeats.py), every figure derived from the pool as from one run
(analysis/figures.throughput_figures), and its comparison in the table: speedups against the
baseline (analysis/compare.add_speedups)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanogpt.analysis import figures, repeats
from nanogpt.record import Record

if TYPE_CHECKING:
    from nanogpt.analysis.table import Sweep


def pool(records: list[Record]) -> Record:
    return repeats.pool(records)


def derive(record: Record, runs: list[Record], floor_s: float) -> Record:
    return figures.throughput_figures(record, runs, floor_s)


def compare(sweep: Sweep, base: int | None, alpha: float | None) -> None:
    """Speedups (and their intervals) of every row against the baseline's (`alpha` is another
    scenario's)."""
    from nanogpt.analysis.compare import add_speedups  # pandas: the table's process, not a run's

    del alpha
    add_speedups(sweep.table, sweep.series(), base)
