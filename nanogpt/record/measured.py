"""The measured parts of the record (results/record/): what the measuring process fills, part by
part. Setup is known before the first step; Timing, Memory, Energy and Clocks are read around
the measured steps; Rates are derived from them (analysis/derive.py, one function a figure);
Profile and MaxBatch only when asked for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nanogpt.record.fields import LARGEST, TOTAL, json_only, marked, pool_by_marks

STATS = ("median", "mean", "p10", "p90", "std", "cv")  # step_ms_<stat>, probes/timing.py


@dataclass
class Setup:
    """The model on its device, known before the first step."""

    device: str | None = None
    device_name: str | None = marked(headline=94)
    world_size: int | None = None
    n_params: int | None = marked(headline=92)  # all parameters, the tied embedding once
    n_params_flops: int | None = None  # N of the FLOPs formula (no position embedding)
    flops_per_token: int | None = None  # the formula (train/flops.py)
    flops_per_token_counted: float | None = None  # FlopCounterMode on the meta device
    flops_per_token_hw: int | None = None  # the formula plus activation-checkpointing recompute
    flops_formula: str | None = json_only()
    flops_source: str | None = None  # where flops_per_token came from (a user model: its hook,
    #                                  counted on meta, or 6N; docs/models.md)
    tokens_per_step: int | None = marked(headline=93)  # all ranks
    model_wrapping: str | None = json_only()  # e.g. compile(ddp(model)): what wraps what
    fp8_converted: int | None = None  # Linears swapped for torchao's Float8Linear
    fp8_layers: dict | None = json_only()  # {"converted": [names], "kept": [{layer, reason}]}
    optimizer_impl_used: str | None = None  # fused | foreach | for_loop: what actually steps
    # host syncs in one step (CUDA: torch's sync debug mode, probes/observe.host_syncs); null
    # elsewhere, host_sync_note says why
    host_sync_in_step: int | None = None
    host_sync_note: str | None = None
    # A user's model's first step, observed on its meta copy (probes/observe.py): the dtype its
    # matmuls ran in (MFU's peak is that dtype's), their calls by dtype, whether it called SDPA,
    # and what was asked of it that acted on nothing
    matmul_dtype: str | None = None
    matmul_dtypes: dict | None = json_only()
    sdpa_called: bool | None = None
    observed_note: str | None = None
    model_blocks: str | None = None  # a user's model: its blocks found, e.g. "layers: 2 x Block"
    inductor_cache: str | None = None  # cold | warm, with compile
    mem_estimate_bytes: int | None = None
    mem_estimate: dict | None = json_only()  # the estimate by component
    # Where the point ran (runner/placement.py): null when not under SLURM / not beside others
    slurm_job_id: str | None = None  # "ARRAYJOB_TASK" (scancel/squeue take it) or the job id
    slurm_node: str | None = None
    slurm_restarts: int | None = None  # times SLURM requeued the job before this run
    nodes: int | None = None  # SLURM: the nodes the point's ranks ran on
    rank_nodes: list | None = json_only()  # SLURM: each rank's node (SLURMD_NODENAME), by rank
    dist_timeout_s: float | None = None  # more than one rank: a collective's timeout
    cpu_set: list | None = json_only()  # the cores the point was pinned to (launcher=parallel)
    gpu_set: str | None = json_only()  # CUDA_VISIBLE_DEVICES the launcher gave it
    co_running: list | None = None  # overrides of the points that ran beside it ([]: none)


@dataclass
class Timing:
    """The step clock. step_ms_* are over measured steps only (the slowest rank's per step):
    statistics of the run's steps, which are the record's steps (Record.steps, steps.csv)."""

    step_timer: str | None = None  # cuda-events | perf_counter | perf_counter+mps-sync
    first_step_ms: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    warmup_steps_run: int | None = None  # steps before the measured ones (first included)
    warmup_s_run: float | None = None  # their wall time after the first step
    measured_steps: int | None = None
    measured_s: float | None = None  # wall time of the measured phase, window reads included
    stopped_by_budget: bool | None = None
    # derive.steadiness, run by run (analysis/figures.py)
    steady: bool | None = marked(headline=32)
    unsteady_reasons: list | None = None  # codes: "short" (window), "drift" (step time moved)
    steady_note: str | None = None  # the same in words, with the figures
    drift_pct: float | None = None  # last third's median step vs the first third's, in %
    drift_ci_low: float | None = None  # its 95 % interval (stats.speedup of the thirds)
    drift_ci_high: float | None = None
    diagnostics_active: list | None = None  # what ran beside the measured steps ([]: nothing)
    # What else used the device in the measured window (probes/contention.py, bench.exclusive)
    contended: bool | None = marked(headline=33)  # null: not probed (contention says why)
    contention: str | None = None  # what was seen, in words
    contention_window_s: float | None = json_only()
    own_cpu_s: float | None = json_only()  # the point's CPU time in the window (all ranks)
    others_cpu_s: float | None = json_only()  # CPU: other processes' CPU time in the window
    others_gpu_processes: list | None = json_only()  # CUDA: pids of other compute processes (NVML)
    scaler_skipped_steps: int | None = None  # fp16: measured steps the GradScaler skipped
    scaler_settled: bool | None = None  # fp16: warmup ended with a step it did not skip
    step_ms_median: float | None = marked(headline=30, shown=(20, "step_ms", "number"))
    step_ms_mean: float | None = None
    step_ms_p10: float | None = None
    step_ms_p90: float | None = None
    step_ms_std: float | None = None
    step_ms_cv: float | None = marked(headline=31, shown=(30, "cv", "percent"))
    step_ms_ci_low: float | None = None  # 95 % interval of the median (analysis/stats.py)
    step_ms_ci_high: float | None = None
    ci_method: str | None = json_only()
    # measurements of the point, each in a fresh process
    repeats: int | None = marked(headline=90)
    step_ms_median_per_repeat: list | None = None
    step_ms_per_rank: list | None = json_only()
    step_ms_median_per_rank: list | None = None  # step_ms_* are the slowest rank's per step
    data_ms_median: float | None = None
    step_ms_wall: float | None = None  # windows' first start to last end / steps: pauses count

    def set_stats(self, stats: dict) -> None:
        """step_ms_<stat> from analysis/stats.summarize's dict."""
        for name in STATS:
            setattr(self, f"step_ms_{name}", stats[name])

    @staticmethod
    def pool_runs(parts: list[Timing]) -> Timing:
        """A point's runs (bench.repeats): the count of every run's measured steps and their
        wall-clock step; contended if any was; the last run's last loss. The statistics are
        derived again over the pool's steps (analysis/figures.derive_point)."""
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


@dataclass
class Memory:
    mem_peak_allocated_bytes: int | None = marked(  # the CUDA caching allocator's
        shown=(70, "cuda_MiB", "mebibytes"), pool=LARGEST, peak=("cuda", "measured")
    )
    # "measured", or "measured+graph pool" under CUDA graphs: the replays' peak plus the graphs'
    # pool's bytes that are no live tensor (probes/memory.py graph_aware_peak)
    mem_peak_allocated_from: str | None = None
    # CUDA graphs' private pool, reserved (the allocator's snapshot), after the measured steps
    mem_graph_pool_bytes: int | None = json_only(pool=LARGEST)
    mem_peak_reserved_bytes: int | None = marked(pool=LARGEST)
    # the driver's view, all processes, largest sample
    mem_nvml_used_bytes: int | None = marked(pool=LARGEST)
    mem_nvml_device: str | None = json_only()  # the NVML device read (by UUID), or why none
    mem_peak_rss_bytes: int | None = marked(  # the measuring process's
        shown=(60, "rss_MiB", "mebibytes"), pool=LARGEST, peak=("rss", "measured")
    )
    mem_peak_rss_method: str | None = json_only()  # vmhwm | ru_maxrss
    # The measured steps' peak RSS above the RSS they started at (vmhwm only): what a step holds
    # at once beyond what stays, a CPU's view of its activations; tells apart points whose
    # processes start a few MiB apart. Exact where freed blocks leave the process (glibc keeps
    # them below its mmap threshold, which it raises as they are freed, unless
    # MALLOC_MMAP_THRESHOLD_ fixes it: docs/measurement.md)
    mem_step_rss_bytes: int | None = marked(pool=LARGEST)
    memory_snapshot: str | None = json_only()  # file name, written on a CUDA OOM when asked
    # The peaks above are the measured steps' (probes/memory.py, MemoryProbe.split); warmup's,
    # first-step compilation and autotuning included, apart:
    mem_warmup_peak_allocated_bytes: int | None = marked(pool=LARGEST, peak=("cuda", "warmup"))
    mem_warmup_peak_reserved_bytes: int | None = json_only(pool=LARGEST)
    mem_warmup_peak_rss_bytes: int | None = marked(pool=LARGEST, peak=("rss", "warmup"))
    # The CUDA caching allocator's trouble in the measured steps (torch.cuda.memory_stats):
    # cudaMallocs retried after freeing the cache
    mem_alloc_retries: int | None = marked(pool=TOTAL)
    mem_ooms: int | None = marked(pool=TOTAL)  # allocations that failed even then
    mem_alloc_note: str | None = json_only()  # why the two are null (no CUDA allocator)

    @staticmethod
    def pool_runs(parts: list[Memory]) -> Memory:
        """The largest peak of any run, each kind of peak on its own, and the allocator's
        retries and OOMs over every run's steps (the fields' marks); the largest allocated
        peak's window with it."""
        memory = pool_by_marks(parts)
        # which window the largest allocated peak came from (measured, or warmup's CUDA graphs)
        top = max(parts, key=lambda m: m.mem_peak_allocated_bytes or 0)
        memory.mem_peak_allocated_from = top.mem_peak_allocated_from
        return memory


@dataclass
class Energy:
    """Over the measured steps, on the measuring device (rank 0's under data parallelism)."""

    energy_source: str | None = None  # the counter, or "none: why"
    energy_j: float | None = None  # null when unknown (no counter, or it did not advance)
    energy_s: float | None = None  # the wall time the energy was counted over
    energy_updates: int | None = None  # how often the counter advanced in it
    energy_update_ms: float | None = None  # the counter's median update period
    energy_error_pct: float | None = (
        None  # bound from the update edges' timing (probes/counters.py)
    )
    energy_ranks: int | None = None  # ranks whose work the counter covers (RAPL: the host's)
    power_limit_w: float | None = None  # the enforced board power limit (NVML)

    @staticmethod
    def pool_runs(parts: list[Energy]) -> Energy:
        """Joules over every run's measured steps (null unless every run counted them)."""
        energy = dataclasses.replace(parts[0])
        if all(e.energy_j for e in parts):
            energy.energy_j = sum(e.energy_j for e in parts)
            energy.energy_s = sum(e.energy_s for e in parts)
        else:
            energy.energy_j = None
        return energy


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
    """Derived figures, each computed once in analysis/derive.py."""

    tokens_per_s: float | None = marked(headline=20, shown=(40, "tok/s", "number"))
    tokens_per_s_ci_low: float | None = marked(headline=21)  # from the step time's interval
    tokens_per_s_ci_high: float | None = marked(headline=22)
    tokens_per_s_wall: float | None = None  # tokens_per_step / step_ms_wall: host pauses count
    achieved_tflops: float | None = None  # per device
    peak_tflops: float | None = None
    peak_source: str | None = None  # override | datasheet | cpu-estimate | calibrated | unknown
    peak_dtype: str | None = None  # the math mode of the peak
    mfu: float | None = marked(headline=40, shown=(50, "MFU", "percent"))
    hfu: float | None = None
    mfu_note: str | None = None  # why mfu and hfu are null where they are (perf.fp8)
    achievable_tflops: float | None = None  # the calibrated matmul peak, when known
    mfu_achievable: float | None = None
    mfu_flag: bool | None = None  # mfu_achievable > 1: the FLOP count or the timing is wrong
    calibration: dict | None = json_only()  # the calibration's provenance
    ceilings: dict | None = json_only()  # what it was divided by: derive.Ceilings, plain
    compile_s: float | None = None  # first step minus median step, with compile
    j_per_step: float | None = None  # energy_j / measured steps
    j_per_token: float | None = None  # per device: energy_j / tokens this device trained
    tokens_per_kwh: float | None = marked(headline=81)
    tokens_per_kwh_ci_low: float | None = None  # from energy_error_pct
    tokens_per_kwh_ci_high: float | None = None
    power_mean_w: float | None = None  # energy_j / energy_s
    power_over_limit: bool | None = None  # mean power > the enforced limit + 5 %: not trusted
    # what the point needs: max(warmup, measured) peak
    peak_memory_bytes: int | None = marked(headline=41)
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
