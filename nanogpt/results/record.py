"""The record of one sweep point: what was asked, what was measured, and what follows from it.

One typed record, `Record`, made of small dataclasses, each filled by one part of the code:

  Asked     the point as the user asked for it (its overrides and the spec's main choices)
  Setup     the model on its device: parameter and FLOP counts, tokens per step, the estimate
  Timing    the step clock: first step, measured-step statistics, per-rank medians, losses
  Memory    the allocator peaks, NVML, the process's peak RSS (and how it was read)
  Energy    joules over the measured steps (NVML or RAPL), power limit, clocks, throttling
  Rates     the derived figures: tokens/s, achieved FLOP/s, MFU, HFU, mfu_achievable
            (computed in one function, results/derive.py), with their peak and its source
  Profile   torch.profiler's trace and top ops, when asked for
  Diagnosis the bottleneck verdict, its hint and the figures behind them (results/bottleneck.py)
  MaxBatch  the largest batch that fits, when asked for

Every field name is unique across the parts, so result.json, summary.csv, the W&B summary and the
notebook all read one flat namespace: `Record.to_dict()` flattens the parts, `from_dict` splits a
flat dict back. Units are in the names (_ms, _s, _bytes, _tflops, tokens_per_s); docs/record.md
documents each. Provenance travels with the figures: `clock` (which clock timed the steps),
`flops_formula`, `peak_source` and `calibration` (where a peak came from).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nanogpt.results.bottleneck import Diagnosis
from nanogpt.results.identity import measured_config, point_id
from nanogpt.spec import RunSpec

# The table's columns, in order: the scalar fields (and one list) of a record. Nested values
# (env, mem_estimate, calibration, profile_top_ops, max_batch_search, step_ms_per_rank) stay in
# result.json only.
RESULT_COLUMNS = (
    "status",
    "error",
    "overrides",
    "model",
    "n_params",
    "n_params_flops",
    "dtype",
    "compile",
    "compile_mode",
    "attention",
    "activation_checkpointing",
    "fp8",
    "fp8_converted",  # how many Linears run in float8 (fp8_layers in result.json says which)
    "loss",
    "loss_chunk",
    "dist_strategy",
    "reshard_after_forward",
    "optimizer",
    "optimizer_impl",
    "optimizer_impl_used",
    "batch_size",
    "block_size",
    "grad_accum",
    "tokens_per_step",
    "device",
    "device_name",
    "world_size",
    "slurm_job_id",  # where the point ran: its SLURM job (array task) and node, when it did
    "slurm_node",
    "co_running",  # a list: the points that ran beside it (hydra/launcher=parallel)
    "warmup_steps",
    "warmup_steps_run",
    "warmup_s_run",
    "measured_steps",
    "measured_s",
    "stopped_by_budget",
    "steady",  # False: the window was too short, or its step time drifted (steady_note: why)
    "steady_note",
    "drift_pct",
    "diagnostics_active",  # a list: what else ran during the measured steps
    "clock",
    "compile_s",
    "inductor_cache",
    "first_step_ms",
    "step_ms_median",
    "step_ms_mean",
    "step_ms_p10",
    "step_ms_p90",
    "step_ms_std",
    "step_ms_cv",
    "step_ms_ci_low",  # the 95 % interval of step_ms_median (results/stats.py)
    "step_ms_ci_high",
    "repeats",
    "step_ms_median_per_repeat",  # a list: each repeat's median (bench.repeats)
    "step_ms_median_per_rank",  # a list, one median per rank (step_ms_* are the slowest rank's)
    "data_ms_median",
    "step_ms_wall",
    "scaler_skipped_steps",
    "tokens_per_s",
    "tokens_per_s_wall",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "flops_per_token",
    "flops_per_token_counted",
    "flops_per_token_hw",
    "achieved_tflops",
    "peak_tflops",
    "peak_source",
    "peak_dtype",
    "mfu",
    "hfu",
    "achievable_tflops",
    "mfu_achievable",
    "mfu_flag",
    "mem_peak_allocated_bytes",
    "mem_peak_reserved_bytes",
    "mem_nvml_used_bytes",
    "mem_peak_rss_bytes",
    "mem_estimate_bytes",
    "energy_j",
    "energy_error_pct",
    "energy_updates",
    "energy_update_ms",
    "energy_ranks",
    "j_per_step",
    "j_per_token",
    "tokens_per_kwh",
    "tokens_per_kwh_ci_low",
    "tokens_per_kwh_ci_high",
    "power_mean_w",
    "power_limit_w",
    "power_over_limit",
    "sm_clock_mean_mhz",
    "sm_clock_first_mhz",
    "sm_clock_last_mhz",
    "temperature_max_c",
    "clock_event_reasons",  # a list: the NVML clock-event (throttle) reasons seen
    "energy_source",
    "loss_first",
    "loss_last",
    *(f.name for f in dataclasses.fields(Diagnosis)),  # the bottleneck verdict and its figures
    "max_batch_size",
    "wall_s",
    "finished_at",
    "job_dir",
)

STATS = ("median", "mean", "p10", "p90", "std", "cv")  # step_ms_<stat>, measure/timing.py


@dataclass
class Asked:
    """The point as asked: its Hydra overrides and the spec's main choices, as plain values."""

    overrides: list[str] = field(default_factory=list)
    overrides_str: str = "defaults"
    model: str | None = None
    model_chosen_by: str | None = None  # model=auto: which model the device got, and why
    dtype: str | None = None
    compile: bool | None = None
    compile_mode: str | None = None
    attention: str | None = None
    activation_checkpointing: bool | None = None
    fp8: str | None = None  # torchao float8 recipe, or none
    loss: str | None = None  # full | chunked
    loss_chunk: int | None = None  # tokens per chunk (loss=chunked only)
    dist_strategy: str | None = None  # ddp | fsdp2 (with more than one rank)
    reshard_after_forward: bool | None = None  # fsdp2 only
    optimizer: str | None = None
    optimizer_impl: str | None = None
    batch_size: int | None = None
    block_size: int | None = None
    grad_accum: int | None = None
    warmup_steps: int | None = None
    job_dir: str | None = None
    point_id: str | None = None  # the point's identity: a digest of measured_config
    measured_config: dict | None = None  # the resolved keys it measures (results/identity.py)

    @classmethod
    def of(cls, spec: RunSpec, overrides: list[str], job_dir: str) -> Asked:
        perf = spec.perf
        measured = measured_config(spec)
        return cls(
            overrides=list(overrides),
            overrides_str=" ".join(overrides) or "defaults",
            model=spec.model.name,
            model_chosen_by=spec.model.chosen_by,
            dtype=perf.dtype.value,
            compile=perf.compile,
            compile_mode=perf.compile_mode,
            attention=perf.attention.value,
            activation_checkpointing=perf.activation_checkpointing,
            fp8=perf.fp8.value,
            loss=perf.loss.value,
            loss_chunk=perf.loss_chunk if perf.loss.value == "chunked" else None,
            dist_strategy=spec.dist.strategy.value,
            reshard_after_forward=(
                spec.dist.reshard_after_forward if spec.dist.strategy.value == "fsdp2" else None
            ),
            optimizer=spec.optimizer.name,
            optimizer_impl=spec.optimizer.impl.value,
            batch_size=perf.batch_size,
            block_size=spec.model.block_size,
            grad_accum=perf.grad_accum,
            warmup_steps=spec.bench.warmup_steps,
            job_dir=job_dir,
            point_id=point_id(measured),
            measured_config=measured,
        )


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
    flops_formula: str | None = None
    tokens_per_step: int | None = None  # all ranks
    model_wrapping: str | None = None  # e.g. compile(ddp(model)): what wraps what
    fp8_converted: int | None = None  # Linears swapped for torchao's Float8Linear
    fp8_layers: dict | None = None  # {"converted": [names], "kept": [{layer, reason}]}
    optimizer_impl_used: str | None = None  # fused | foreach | for_loop: what actually steps
    host_sync_in_step: bool | None = None  # GradScaler with a non-fused optimizer reads the host
    inductor_cache: str | None = None  # cold | warm, with compile
    mem_estimate_bytes: int | None = None
    mem_estimate: dict | None = None  # the estimate by component
    # Where the point ran (launch/placement.py): null when not under SLURM / not beside others
    slurm_job_id: str | None = None  # "ARRAYJOB_TASK" (scancel/squeue take it) or the job id
    slurm_node: str | None = None
    slurm_restarts: int | None = None  # times SLURM requeued the job before this run
    cpu_set: list | None = None  # the cores the point was pinned to (hydra/launcher=parallel)
    gpu_set: str | None = None  # CUDA_VISIBLE_DEVICES the launcher gave it
    co_running: list | None = None  # overrides of the points that ran beside it ([]: none)


@dataclass
class Timing:
    """The step clock. step_ms_* are over measured steps only (the slowest rank's per step)."""

    clock: str | None = None  # cuda-events | perf_counter | perf_counter+mps-sync
    first_step_ms: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    warmup_steps_run: int | None = None  # steps before the measured ones (first included)
    warmup_s_run: float | None = None  # their wall time after the first step
    measured_steps: int | None = None
    measured_s: float | None = None  # wall time of the measured phase, window reads included
    stopped_by_budget: bool | None = None
    steady: bool | None = None  # results/derive.steadiness
    steady_note: str | None = None
    drift_pct: float | None = None  # last third's median step vs the first third's, in %
    drift_ci_low: float | None = None  # its 95 % interval (stats.speedup of the thirds)
    drift_ci_high: float | None = None
    diagnostics_active: list | None = None  # what ran beside the measured steps ([]: nothing)
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
    ci_method: str | None = None
    repeats: int | None = None  # measurements of the point, each in a fresh process
    step_ms_median_per_repeat: list | None = None
    step_ms_measured: list | None = None  # the steps behind step_ms_*: a list per repeat
    step_ms_per_rank: list | None = None
    step_ms_median_per_rank: list | None = None
    data_ms_median: float | None = None
    step_ms_wall: float | None = None  # windows' first start to last end / steps: pauses count

    def set_stats(self, stats: dict) -> None:
        """step_ms_<stat> from results/stats.summarize's dict."""
        for name in STATS:
            setattr(self, f"step_ms_{name}", stats[name])


@dataclass
class Memory:
    mem_peak_allocated_bytes: int | None = None  # CUDA caching allocator
    mem_peak_reserved_bytes: int | None = None
    mem_nvml_used_bytes: int | None = None  # the driver's view, all processes, largest sample
    mem_nvml_device: str | None = None  # the NVML device read (by UUID), or why none
    mem_peak_rss_bytes: int | None = None  # the measuring process
    mem_peak_rss_method: str | None = None  # vmhwm | ru_maxrss
    memory_snapshot: str | None = None  # file name, written on a CUDA OOM when asked


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
    sm_clock_mean_mhz: float | None = None  # sampled at each measured window
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
    calibration: dict | None = None  # the calibration's provenance
    compile_s: float | None = None  # first step minus median step, with compile
    j_per_step: float | None = None  # energy_j / measured steps
    j_per_token: float | None = None  # per device: energy_j / tokens this device trained
    tokens_per_kwh: float | None = None
    tokens_per_kwh_ci_low: float | None = None  # from energy_error_pct
    tokens_per_kwh_ci_high: float | None = None
    power_mean_w: float | None = None  # energy_j / energy_s
    power_over_limit: bool | None = None  # mean power > the enforced limit + 5 %: not trusted


@dataclass
class Profile:
    profile_trace: str | None = None
    profile_top_ops: list | None = None
    profile_top_ops_cuda: list | None = None


@dataclass
class MaxBatch:
    max_batch_size: int | None = None
    max_batch_search: dict | None = None


PARTS = {
    "asked": Asked,
    "setup": Setup,
    "timing": Timing,
    "memory": Memory,
    "energy": Energy,
    "rates": Rates,
    "profile": Profile,
    "diagnosis": Diagnosis,
    "max_batch": MaxBatch,
}


@dataclass
class Record:
    status: str = "running"  # ok | oom | diverged | error | interrupted (nanogpt/faults.py)
    error: str | None = None  # "Type: first line of the message" of a failed point
    asked: Asked = field(default_factory=Asked)  # launch/worker.py
    setup: Setup = field(default_factory=Setup)  # measure/loop.py, from here to profile
    timing: Timing = field(default_factory=Timing)
    memory: Memory = field(default_factory=Memory)
    energy: Energy = field(default_factory=Energy)  # measure/energy.py
    rates: Rates = field(default_factory=Rates)  # results/derive.py, called by the loop
    profile: Profile = field(default_factory=Profile)
    diagnosis: Diagnosis = field(default_factory=Diagnosis)  # measure/diagnose.py, judged there
    max_batch: MaxBatch = field(default_factory=MaxBatch)  # measure/maxbatch.py, in a child
    env: dict | None = None  # versions, devices, host, git commit (hardware/env.py)
    wall_s: float | None = None  # the job process's clock around the whole point
    finished_at: str | None = None
    steps: list[dict] = field(default_factory=list)  # steps.csv rows; not in result.json

    def to_dict(self, steps: bool = False) -> dict[str, Any]:
        """The flat record: the table's columns first, then the nested extras."""
        flat: dict[str, Any] = {"status": self.status, "error": self.error}
        for name in PARTS:
            flat.update(dataclasses.asdict(getattr(self, name)))
        flat.update(env=self.env, wall_s=self.wall_s, finished_at=self.finished_at)
        ordered = {col: flat.pop(col) for col in RESULT_COLUMNS}
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
        top = ("status", "error", "env", "wall_s", "finished_at", "steps")
        return cls(**parts, **{key: flat[key] for key in top if key in flat})
