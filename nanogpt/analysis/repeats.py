"""One record from a point measured several times (bench.repeats), each in a fresh process.

A process hides part of the noise: its allocator state, its compiled code, the clocks it ran
at. Repeats show it. `pool` aggregates the runs' raw parts, part by part, each by its own
rule (record/fields.pool_part): a field as its part marks it (POOL: the largest, the total, else
the first run's), or the part's `pool_runs` where the marks do not say all (Timing, Memory,
Energy: record/measured.py); analysis/figures.derive_point then
derives every figure of the pool as it does one run's: the step statistics over all the
steps, the point's step as the median of the runs' medians with a hierarchical bootstrap
interval (analysis/stats.py), steadiness run by run, and the rates with the ceilings the runs
stored (rates.ceilings: the peak, the calibration, matmul_emulated, as the measuring child
resolved them).

The pool's steps are every run's rows, numbered by run (`repeat`): the measured steps behind its
statistics (Record.step_series, a list per run). Timing keeps their count and the windows' wall
time over them; a point is `contended` if any run was. Peaks of memory are
the largest of any run; energy is summed over all measured steps; recompiles and the CUDA
allocator's retries and OOMs inside the measured steps are summed. The rest (the model's
figures, the first step, the profile, the diagnosis, the optimizer's roles) is the first run's.
"""

from __future__ import annotations

import dataclasses

from nanogpt.record import PARTS, Record
from nanogpt.record.fields import pool_part


def pool(records: list[Record]) -> Record:
    """The runs' raw parts aggregated, each by its own rule: the throughput scenario's pool
    (scenarios/throughput/pool.py; figures.derive_point asks the runs' scenario, and derives the
    rest)."""
    pooled = dataclasses.replace(records[0], steps=[])
    for number, record in enumerate(records, 1):
        pooled.steps += [{**row, "repeat": number} for row in record.steps]
    for name in PARTS:
        parts = [getattr(r, name) for r in records]
        setattr(pooled, name, pool_part(parts))
    return pooled
