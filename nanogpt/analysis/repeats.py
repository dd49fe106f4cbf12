"""One record from a point measured several times (bench.repeats), each in a fresh process.

A process hides part of the noise: its allocator state, its compiled code, the clocks it ran
at. Repeats show it. `pool` aggregates the runs' raw parts, part by part (POOLED names the
rule of each part that is not simply the first run's); analysis/figures.derive_point then
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
from nanogpt.scenarios.time_to_loss import part as ttl_part
from nanogpt.scenarios.time_to_loss import pool as ttl_pool


def pool(records: list[Record]) -> Record:
    """The runs' raw parts aggregated (figures.derive_point derives the rest)."""
    first = records[0]
    if ttl_part.measured(first):  # runs to a target: no step series
        return ttl_pool.pool(records)
    pooled = dataclasses.replace(first, steps=[])
    for number, record in enumerate(records, 1):
        pooled.steps += [{**row, "repeat": number} for row in record.steps]
    for name in PARTS:
        rule = POOLED.get(name)
        parts = [getattr(r, name) for r in records]
        setattr(pooled, name, rule(parts) if rule else dataclasses.replace(parts[0]))
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


def _compile(parts: list):
    """The first repeat's compile part (each repeat compiles the same model alike; the first
    with the coldest cache), with the recompiles inside every repeat's measured steps summed."""
    part = dataclasses.replace(parts[0])
    in_window = [p.recompiles_in_window for p in parts]
    if None not in in_window:
        part.recompiles_in_window = sum(in_window)
    return part


def _memory(parts: list):
    """The largest peak of any run, each kind of peak on its own."""
    memory = dataclasses.replace(parts[0])
    for field in (
        "mem_peak_allocated_bytes",
        "mem_peak_reserved_bytes",
        "mem_nvml_used_bytes",
        "mem_peak_rss_bytes",
        "mem_warmup_peak_allocated_bytes",
        "mem_warmup_peak_reserved_bytes",
        "mem_warmup_peak_rss_bytes",
    ):
        values = [getattr(m, field) for m in parts if getattr(m, field)]
        setattr(memory, field, max(values) if values else None)
    # which window the largest allocated peak came from (measured, or warmup's CUDA graphs)
    top = max(parts, key=lambda m: m.mem_peak_allocated_bytes or 0)
    memory.mem_peak_allocated_from = top.mem_peak_allocated_from
    for field in ("mem_alloc_retries", "mem_ooms"):  # the allocator's, over every run's steps
        counts = [getattr(m, field) for m in parts]
        setattr(memory, field, None if None in counts else sum(counts))
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


# How each part of a pool is aggregated; a part not named here is the first run's.
POOLED = {"timing": _timing, "memory": _memory, "energy": _energy, "compile": _compile}
