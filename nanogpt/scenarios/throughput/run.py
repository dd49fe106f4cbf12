"""Throughput's run: the measured loop's phases (scenarios/loop.run_phases: warmup, the measured
windows, the memory peaks, then the diagnosis and the profiler), which fill the record's setup,
optimizer, timing, memory, energy, clocks, compile, rates, profile and diagnosis."""

from __future__ import annotations

from nanogpt.config.spec import RunSpec
from nanogpt.record import Record
from nanogpt.scenarios import loop
from nanogpt.scenarios.base import Measuring
from nanogpt.train.trainer import Trainer


def measure(spec: RunSpec, trainer: Trainer, record: Record, *, context: Measuring) -> None:
    c = context
    loop.run_phases(
        spec, trainer, c.ceilings, record, c.log, c.sinks, c.out_dir, c.history, c.start
    )
