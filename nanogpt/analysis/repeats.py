"""One record from a point measured several times (bench.repeats), each in a fresh process.

A process hides part of the noise: its allocator state, its compiled code, the clocks it ran
at. Repeats show it. `pool` aggregates the runs' raw parts, part by part: a field as its part
marks it (record/fields.py, POOL: the largest, the total, else the first run's; `by_marks`), and
POOLED names a part's own rule where the marks do not say all; analysis/figures.derive_point then
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
from nanogpt.record.fields import LARGEST, POOL, TOTAL


def pool(records: list[Record]) -> Record:
    """The runs' raw parts aggregated, each by its own rule: the throughput scenario's pool
    (scenarios/throughput/pool.py; figures.derive_point asks the runs' scenario, and derives the
    rest)."""
    pooled = dataclasses.replace(records[0], steps=[])
    for number, record in enumerate(records, 1):
        pooled.steps += [{**row, "repeat": number} for row in record.steps]
    for name in PARTS:
        parts = [getattr(r, name) for r in records]
        setattr(pooled, name, POOLED.get(name, by_marks)(parts))
    return pooled


def by_marks(parts: list):
    """A part pooled field by field as each field's mark says (record/fields.py, POOL): the
    largest of any run's (a peak), the runs' total (a count; null unless every run counted
    it), else the first run's."""
    pooled = dataclasses.replace(parts[0])
    for f in dataclasses.fields(pooled):
        values = [getattr(part, f.name) for part in parts]
        if f.metadata.get(POOL) == LARGEST:
            present = [v for v in values if v]
            setattr(pooled, f.name, max(present) if present else None)
        elif f.metadata.get(POOL) == TOTAL:
            setattr(pooled, f.name, None if None in values else sum(values))
    return pooled


def _timing(parts: list):
    """The count of every run's measured steps and their wall-clock step; contended if any
    was (the steps themselves are the pool's rows, `pool`)."""
    timing = dataclasses.replace(parts[0])
    timing.measured_steps = sum(t.measured_steps or 0 for t in parts)
    timing.measured_s = sum(t.measured_s or 0.0 for t in parts)
    timing.loss_last = parts[-1].loss_last
    walls = [(t.step_ms_wall, t.measured_steps) for t in parts]
    if all(wall and steps for wall, steps in walls):  # the windows' wall time over their steps
        timing.step_ms_wall = sum(w * n for w, n in walls) / sum(n for _, n in walls)
    seen = [
        f"repeat {i + 1} of {len(parts)}: {t.contention}"
        for i, t in enumerate(parts)
        if t.contended
    ]
    if seen:
        timing.contended, timing.contention = True, "; ".join(seen)
    return timing


def _memory(parts: list):
    """The largest peak of any run, each kind of peak on its own, and the allocator's retries
    and OOMs over every run's steps (the fields' marks, by_marks); the largest allocated peak's
    window with it."""
    memory = by_marks(parts)
    # which window the largest allocated peak came from (measured, or warmup's CUDA graphs)
    top = max(parts, key=lambda m: m.mem_peak_allocated_bytes or 0)
    memory.mem_peak_allocated_from = top.mem_peak_allocated_from
    return memory


def _energy(parts: list):
    """Joules over every run's measured steps (null unless every run counted them)."""
    energy = dataclasses.replace(parts[0])
    if all(e.energy_j for e in parts):
        energy.energy_j = sum(e.energy_j for e in parts)
        energy.energy_s = sum(e.energy_s for e in parts)
    else:
        energy.energy_j = None
    return energy


# How a part of a pool is aggregated where its fields' marks do not say all (by_marks: a part not
# named here, the compile part's recompiles in the window among them).
POOLED = {"timing": _timing, "memory": _memory, "energy": _energy}
