"""The record of one sweep point: what was asked, what was measured, and what follows from it.

One typed record, `Record`, made of small dataclasses, each filled by one part of the code.
This package is the record's whole schema, one module a part where a part has a room of its own
(the measured parts together in record/measured.py), so that a field is added in one place:

  Asked     the point as the user asked for it (its overrides and the spec's main choices;
            record/asked.py)
  Setup     the model on its device: parameter and FLOP counts, tokens per step, the estimate
            (this part and the six below it: record/measured.py)
  Timing    the step clock: first step, measured-step statistics, per-rank medians, losses
  Memory    the allocator peaks, NVML, the process's peak RSS (and how it was read)
  Energy    joules over the measured steps (NVML or RAPL), the power limit
  Clocks    the device's SM clock, temperature and clock-event (throttle) reasons (NVML)
  Rates     the derived figures: tokens/s, achieved FLOP/s, MFU, HFU, mfu_achievable
            (computed in one function, analysis/derive.py), with their peak and its source
  Profile   torch.profiler's trace and top ops, when asked for
  Diagnosis the bottleneck verdict, its hint and the figures behind them (results/record/
            record/diagnosis.py; the rules that judge them: analysis/bottleneck.py)
  OptimizerPart  the parameters by role, what stepped each, the state it keeps, its share of a
            step (record/optimizer.py)
  CompilePart  what torch.compile did: graph breaks, graphs, recompiles, compile time, CUDA-graph
            skips, from torch's own counters (record/compile.py)
  MaxBatch  the largest batch that fits, when asked for
  TimeToLoss  time to a target validation loss, when one is set (its scenario's folder:
              scenarios/time_to_loss/part.py)

Every field name is unique across the parts, so the table and the notebook read one flat
namespace: `Record.to_dict()` flattens the parts, `from_dict` splits a flat dict back; result.json
keeps them nested by part (analysis/store.py). The schema writes its own columns: summary.parquet
has every field not marked `json_only()` (`columns()`), in the record's order, so a field added
to a part is a column there with no other edit; summary.csv keeps a headline (analysis/tidy.py).
The W&B summary namespaces the same names by part (record/summary_keys.py:
"timing/step_ms_median").
Units are in the names (_ms, _s, _bytes, _tflops, tokens_per_s); docs/record.md documents each.
Provenance travels with the figures: `step_timer` (which timer timed the steps),
`flops_formula`, `peak_source` and `calibration` (where a peak came from).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nanogpt.record.asked import Asked
from nanogpt.record.compile import CompilePart
from nanogpt.record.diagnosis import Diagnosis
from nanogpt.record.fields import JSON_ONLY, STEPS, json_only, marked
from nanogpt.record.measured import (
    STATS,
    Clocks,
    Energy,
    MaxBatch,
    Memory,
    Profile,
    Rates,
    Setup,
    Timing,
)
from nanogpt.record.optimizer import OptimizerPart
from nanogpt.scenarios.time_to_loss.part import TimeToLoss  # imported here first

__all__ = [
    "STATS",
    "Asked",
    "Clocks",
    "CompilePart",
    "Diagnosis",
    "Energy",
    "MaxBatch",
    "Memory",
    "OptimizerPart",
    "Profile",
    "Rates",
    "Record",
    "Setup",
    "TimeToLoss",
    "Timing",
    "columns",
    "flat_fields",
    "flat_values",
]


PARTS = {
    "asked": Asked,
    "setup": Setup,
    "timing": Timing,
    "memory": Memory,
    "energy": Energy,
    "clocks": Clocks,
    "rates": Rates,
    "profile": Profile,
    "diagnosis": Diagnosis,
    "optimizer": OptimizerPart,
    "compile": CompilePart,
    "max_batch": MaxBatch,
    "time_to_loss": TimeToLoss,
}


# A step's row (Record.steps, steps.csv's columns): its number, its phase (warmup | measure |
# profile | diagnose), rank 0's own step_ms and data_ms, the loss at a window's end, the run it
# belongs to in a pool (repeat), and on a measured row step_ms_job: the job's step time, the
# slowest rank's under torchrun (train/distributed.slowest_per_step), which the statistics use.
STEP_COLUMNS = ("step", "phase", "step_ms", "data_ms", "loss", "repeat", "step_ms_job")
STEP_MS_JOB = "step_ms_job"
MEASURE = "measure"  # the phase of a measured step


@dataclass
class Record:
    # ok | oom | diverged | error | interrupted (nanogpt/record/faults.py)
    status: str = marked("running", headline=10, shown=(10, "status", "text"))
    # "Type: first line of the message" of a failed point
    error: str | None = marked(headline=95)
    asked: Asked = field(default_factory=Asked)  # runner/worker.py
    setup: Setup = field(default_factory=Setup)  # scenarios/loop.py, from here to profile
    timing: Timing = field(default_factory=Timing)
    memory: Memory = field(default_factory=Memory)
    energy: Energy = field(default_factory=Energy)  # probes/energy.py
    clocks: Clocks = field(default_factory=Clocks)  # probes/energy.py (the same NVML samples)
    rates: Rates = field(
        default_factory=Rates
    )  # analysis/figures.derive_point (ceilings: the loop)
    profile: Profile = field(default_factory=Profile)
    diagnosis: Diagnosis = field(default_factory=Diagnosis)  # probes/diagnose.py, judged there
    optimizer: OptimizerPart = field(default_factory=OptimizerPart)  # probes/setup.py
    compile: CompilePart = field(default_factory=CompilePart)  # probes/compile_health.py
    max_batch: MaxBatch = field(default_factory=MaxBatch)  # probes/max_batch.py, in a child
    time_to_loss: TimeToLoss = field(default_factory=TimeToLoss)  # scenarios/time_to_loss/
    env: dict | None = json_only()  # versions, devices, host, git commit (hardware/env.py)
    wall_s: float | None = None  # the job process's clock around the whole point
    finished_at: str | None = None
    # The run's steps, the one store of them (steps.csv on disk): a row a step (STEP_COLUMNS),
    # the measured rows with the time the statistics use (step_series); in no summary
    # (to_dict leaves them out unless asked)
    steps: list[dict] = field(default_factory=list, metadata={STEPS: True})

    def step_series(self) -> list[list[float]]:
        """The measured steps' times the statistics use (`step_ms_job` of the `measure` rows),
        a list per run in run order (`repeat`: a pool's runs numbered; a run's own rows have
        none). Rows read back from steps.csv hold text: read as numbers here."""
        series: dict[int, list[float]] = {}
        for row in self.steps:
            ms = row.get(STEP_MS_JOB)
            if row.get("phase") == MEASURE and ms not in (None, ""):
                series.setdefault(int(row.get("repeat") or 1), []).append(float(ms))
        return [series[number] for number in sorted(series)]

    def to_dict(self, steps: bool = False) -> dict[str, Any]:
        """The flat record: the table's columns first (`columns()`), then the json-only fields."""
        flat = {name: value for name, _, value in flat_values(self)}
        ordered = {col: flat.pop(col) for col in columns()}
        ordered.update(flat)
        if steps:
            ordered["steps"] = self.steps
        return ordered

    @classmethod
    def from_dict(cls, flat: dict[str, Any]) -> Record:
        """Inverse of to_dict; keys it does not know are ignored."""
        parts = {
            name: part(**{f.name: flat[f.name] for f in dataclasses.fields(part) if f.name in flat})
            for name, part in PARTS.items()
        }
        top = [f.name for f in dataclasses.fields(cls) if f.name not in PARTS]
        return cls(**parts, **{key: flat[key] for key in top if key in flat})


TOP = "point"  # the part name of the record's own fields (status, error, wall_s, ...)


def flat_fields() -> list[tuple[str, str, dataclasses.Field]]:
    """(name, part, field) of every flat field, in the record's order: its own fields where
    they stand, each part's fields in place of the part. steps.csv's rows are no field here."""
    out = []
    for top in dataclasses.fields(Record):
        if top.name in PARTS:
            out += [(f.name, top.name, f) for f in dataclasses.fields(PARTS[top.name])]
        elif not top.metadata.get(STEPS):
            out.append((top.name, TOP, top))
    return out


def flat_values(record: Record):
    """(name, part, value) of every flat field of `record`, in flat_fields' order."""
    for name, part, _ in flat_fields():
        owner = record if part == TOP else getattr(record, part)
        value = getattr(owner, name)
        yield name, part, dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def columns() -> tuple[str, ...]:
    """summary.csv's columns, in order: every flat field of the record not marked json_only.
    A field added to a part is a column with no other edit; mark it json_only() to keep it in
    result.json only (a dict, a per-step list, text the table repeats)."""
    return tuple(name for name, _, f in flat_fields() if not f.metadata.get(JSON_ONLY))
