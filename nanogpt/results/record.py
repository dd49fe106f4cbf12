"""The record of one sweep point: what was asked, what was measured, and what follows from it.

One typed record, `Record`, made of small dataclasses, each filled by one part of the code:

  Asked     the point as the user asked for it (its overrides and the spec's main choices;
            results/asked.py)
  Setup     the model on its device: parameter and FLOP counts, tokens per step, the estimate
  Timing    the step clock: first step, measured-step statistics, per-rank medians, losses
  Memory    the allocator peaks, NVML, the process's peak RSS (and how it was read)
  Energy    joules over the measured steps (NVML or RAPL), the power limit
  Clocks    the device's SM clock, temperature and clock-event (throttle) reasons (NVML)
  Rates     the derived figures: tokens/s, achieved FLOP/s, MFU, HFU, mfu_achievable
            (computed in one function, results/derive.py), with their peak and its source
  Profile   torch.profiler's trace and top ops, when asked for
  Diagnosis the bottleneck verdict, its hint and the figures behind them (results/bottleneck.py)
  OptimizerPart  the parameters by role, what stepped each, the state it keeps, its share of a
            step (results/optimizer_part.py)
  CompilePart  what torch.compile did: graph breaks, graphs, recompiles, compile time, CUDA-graph
            skips, from torch's own counters (results/compile_part.py)
  MaxBatch  the largest batch that fits, when asked for
  TimeToLoss  time to a target validation loss, when one is set (results/time_to_loss_part.py)

Every field name is unique across the parts, so result.json, summary.csv and the notebook all read
one flat namespace: `Record.to_dict()` flattens the parts, `from_dict` splits a flat dict back.
The schema writes its own columns: summary.csv's are every field not marked `json_only()`
(`columns()`), in the record's order, so a field added to a part is a column with no other edit.
The W&B summary namespaces the same names by part (results/summary_keys.py:
"timing/step_ms_median").
Units are in the names (_ms, _s, _bytes, _tflops, tokens_per_s); docs/record.md documents each.
Provenance travels with the figures: `step_timer` (which timer timed the steps),
`flops_formula`, `peak_source` and `calibration` (where a peak came from).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nanogpt.results.asked import Asked
from nanogpt.results.bottleneck import Diagnosis
from nanogpt.results.compile_part import CompilePart
from nanogpt.results.fields import JSON_ONLY, STEPS, json_only
from nanogpt.results.optimizer_part import OptimizerPart
from nanogpt.results.time_to_loss_part import TimeToLoss

STATS = ("median", "mean", "p10", "p90", "std", "cv")  # step_ms_<stat>, measure/timing.py


@dataclass
class Setup:
    """The model on its device, known before the first step."""

    device: str | None = None
    device_name: str | None = None
    world_size: int | None = None
    n_params: int | None = None  # all parameters, the tied embedding once
    n_params_flops: int | None = None  # N of the FLOPs formula (no position embedding)
    flops_per_token: int | None = None  # the formula (measure/flops.py)
    flops_per_token_counted: float | None = None  # FlopCounterMode on the meta device
    flops_per_token_hw: int | None = None  # the formula plus activation-checkpointing recompute
    flops_formula: str | None = json_only()
    flops_source: str | None = None  # where flops_per_token came from (a user model: its hook,
    #                                  counted on meta, or 6N; docs/models.md)
    tokens_per_step: int | None = None  # all ranks
    model_wrapping: str | None = json_only()  # e.g. compile(ddp(model)): what wraps what
    fp8_converted: int | None = None  # Linears swapped for torchao's Float8Linear
    fp8_layers: dict | None = json_only()  # {"converted": [names], "kept": [{layer, reason}]}
    optimizer_impl_used: str | None = None  # fused | foreach | for_loop: what actually steps
    host_sync_in_step: bool | None = None  # GradScaler with a non-fused optimizer reads the host
    inductor_cache: str | None = None  # cold | warm, with compile
    mem_estimate_bytes: int | None = None
    mem_estimate: dict | None = json_only()  # the estimate by component
    # Where the point ran (point/placement.py): null when not under SLURM / not beside others
    slurm_job_id: str | None = None  # "ARRAYJOB_TASK" (scancel/squeue take it) or the job id
    slurm_node: str | None = None
    slurm_restarts: int | None = None  # times SLURM requeued the job before this run
    cpu_set: list | None = json_only()  # the cores the point was pinned to (launcher=parallel)
    gpu_set: str | None = json_only()  # CUDA_VISIBLE_DEVICES the launcher gave it
    co_running: list | None = None  # overrides of the points that ran beside it ([]: none)


@dataclass
class Timing:
    """The step clock. step_ms_* are over measured steps only (the slowest rank's per step)."""

    step_timer: str | None = None  # cuda-events | perf_counter | perf_counter+mps-sync
    first_step_ms: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    warmup_steps_run: int | None = None  # steps before the measured ones (first included)
    warmup_s_run: float | None = None  # their wall time after the first step
    measured_steps: int | None = None
    measured_s: float | None = None  # wall time of the measured phase, window reads included
    stopped_by_budget: bool | None = None
    steady: bool | None = None  # results/derive.steadiness
    unsteady_reasons: list | None = None  # codes: "short" (window), "drift" (step time moved)
    steady_note: str | None = None  # the same in words, with the figures
    drift_pct: float | None = None  # last third's median step vs the first third's, in %
    drift_ci_low: float | None = None  # its 95 % interval (stats.speedup of the thirds)
    drift_ci_high: float | None = None
    diagnostics_active: list | None = None  # what ran beside the measured steps ([]: nothing)
    # What else used the device in the measured window (measure/contention.py, bench.exclusive)
    contended: bool | None = None  # null: not probed (contention says why)
    contention: str | None = None  # what was seen, in words
    contention_window_s: float | None = json_only()
    own_cpu_s: float | None = json_only()  # the point's CPU time in the window (all ranks)
    others_cpu_s: float | None = json_only()  # CPU: other processes' CPU time in the window
    others_gpu_processes: list | None = json_only()  # CUDA: pids of other compute processes (NVML)
    scaler_skipped_steps: int | None = None  # fp16: measured steps the GradScaler skipped
    scaler_settled: bool | None = None  # fp16: warmup ended with a step it did not skip
    step_ms_median: float | None = None
    step_ms_mean: float | None = None
    step_ms_p10: float | None = None
    step_ms_p90: float | None = None
    step_ms_std: float | None = None
    step_ms_cv: float | None = None
    step_ms_ci_low: float | None = None  # 95 % interval of the median (results/stats.py)
    step_ms_ci_high: float | None = None
    ci_method: str | None = json_only()
    repeats: int | None = None  # measurements of the point, each in a fresh process
    step_ms_median_per_repeat: list | None = None
    step_ms_measured: list | None = json_only()  # the steps behind step_ms_*: a list per repeat
    step_ms_per_rank: list | None = json_only()
    step_ms_median_per_rank: list | None = None  # step_ms_* are the slowest rank's per step
    data_ms_median: float | None = None
    step_ms_wall: float | None = None  # windows' first start to last end / steps: pauses count

    def set_stats(self, stats: dict) -> None:
        """step_ms_<stat> from results/stats.summarize's dict."""
        for name in STATS:
            setattr(self, f"step_ms_{name}", stats[name])


@dataclass
class Memory:
    mem_peak_allocated_bytes: int | None = None  # CUDA caching allocator
    # "measured", or "warmup" under CUDA graphs when warmup's peak (the graphs' pool) is larger
    mem_peak_allocated_from: str | None = None
    mem_peak_reserved_bytes: int | None = None
    mem_nvml_used_bytes: int | None = None  # the driver's view, all processes, largest sample
    mem_nvml_device: str | None = json_only()  # the NVML device read (by UUID), or why none
    mem_peak_rss_bytes: int | None = None  # the measuring process
    mem_peak_rss_method: str | None = json_only()  # vmhwm | ru_maxrss
    memory_snapshot: str | None = json_only()  # file name, written on a CUDA OOM when asked
    # The peaks above are the measured steps' (measure/memory.py, MemoryProbe.split); warmup's,
    # first-step compilation and autotuning included, apart:
    mem_warmup_peak_allocated_bytes: int | None = None
    mem_warmup_peak_reserved_bytes: int | None = json_only()
    mem_warmup_peak_rss_bytes: int | None = None


@dataclass
class Energy:
    """Over the measured steps, on the measuring device (rank 0's under data parallelism)."""

    energy_source: str | None = None  # the counter, or "none: why"
    energy_j: float | None = None  # null when unknown (no counter, or it did not advance)
    energy_s: float | None = None  # the wall time the energy was counted over
    energy_updates: int | None = None  # how often the counter advanced in it
    energy_update_ms: float | None = None  # the counter's median update period
    energy_error_pct: float | None = None  # bound from the update edges' timing (counters.py)
    energy_ranks: int | None = None  # ranks whose work the counter covers (RAPL: the host's)
    power_limit_w: float | None = None  # the enforced board power limit (NVML)


@dataclass
class Clocks:
    """The device's clocks over the measured steps (NVML, sampled at each measured window)."""

    sm_clock_mean_mhz: float | None = None
    sm_clock_first_mhz: float | None = None  # the first window's sample ...
    sm_clock_last_mhz: float | None = None  # ... and the last's: the clock's drift
    temperature_max_c: float | None = None
    clock_event_reasons: list | None = None  # e.g. ["sw_power_cap", "hw_thermal_slowdown"]


@dataclass
class Rates:
    """Derived figures, each computed once in results/derive.py."""

    tokens_per_s: float | None = None
    tokens_per_s_ci_low: float | None = None  # from the step time's interval
    tokens_per_s_ci_high: float | None = None
    tokens_per_s_wall: float | None = None  # tokens_per_step / step_ms_wall: host pauses count
    achieved_tflops: float | None = None  # per device
    peak_tflops: float | None = None
    peak_source: str | None = None  # override | datasheet | cpu-estimate | calibrated | unknown
    peak_dtype: str | None = None  # the math mode of the peak (bf16 with fp8: torchtitan's rule)
    mfu: float | None = None
    hfu: float | None = None
    achievable_tflops: float | None = None  # the calibrated matmul peak, when known
    mfu_achievable: float | None = None
    mfu_flag: bool | None = None  # mfu_achievable > 1: the FLOP count or the timing is wrong
    calibration: dict | None = json_only()  # the calibration's provenance
    ceilings: dict | None = json_only()  # what it was divided by: derive.Ceilings, plain
    compile_s: float | None = None  # first step minus median step, with compile
    j_per_step: float | None = None  # energy_j / measured steps
    j_per_token: float | None = None  # per device: energy_j / tokens this device trained
    tokens_per_kwh: float | None = None
    tokens_per_kwh_ci_low: float | None = None  # from energy_error_pct
    tokens_per_kwh_ci_high: float | None = None
    power_mean_w: float | None = None  # energy_j / energy_s
    power_over_limit: bool | None = None  # mean power > the enforced limit + 5 %: not trusted
    peak_memory_bytes: int | None = None  # what the point needs: max(warmup, measured) peak
    peak_memory_from: str | None = None  # which: "cuda measured", "cuda warmup", "rss ..."


@dataclass
class Profile:
    profile_trace: str | None = json_only()
    profile_top_ops: list | None = json_only()
    profile_top_ops_cuda: list | None = json_only()


@dataclass
class MaxBatch:
    max_batch_size: int | None = None
    max_batch_search: dict | None = json_only()


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


@dataclass
class Record:
    status: str = "running"  # ok | oom | diverged | error | interrupted (nanogpt/faults.py)
    error: str | None = None  # "Type: first line of the message" of a failed point
    asked: Asked = field(default_factory=Asked)  # point/worker.py
    setup: Setup = field(default_factory=Setup)  # measure/loop.py, from here to profile
    timing: Timing = field(default_factory=Timing)
    memory: Memory = field(default_factory=Memory)
    energy: Energy = field(default_factory=Energy)  # measure/energy.py
    clocks: Clocks = field(default_factory=Clocks)  # measure/energy.py (the same NVML samples)
    rates: Rates = field(default_factory=Rates)  # results/derive.py, called by the loop
    profile: Profile = field(default_factory=Profile)
    diagnosis: Diagnosis = field(default_factory=Diagnosis)  # measure/diagnose.py, judged there
    optimizer: OptimizerPart = field(default_factory=OptimizerPart)  # measure/setup.py
    compile: CompilePart = field(default_factory=CompilePart)  # measure/compile_health.py
    max_batch: MaxBatch = field(default_factory=MaxBatch)  # measure/maxbatch.py, in a child
    time_to_loss: TimeToLoss = field(default_factory=TimeToLoss)  # measure/to_target.py
    env: dict | None = json_only()  # versions, devices, host, git commit (hardware/env.py)
    wall_s: float | None = None  # the job process's clock around the whole point
    finished_at: str | None = None
    # steps.csv's rows: in no summary (to_dict leaves them out unless asked)
    steps: list[dict] = field(default_factory=list, metadata={STEPS: True})

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
