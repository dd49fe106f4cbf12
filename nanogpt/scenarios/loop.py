"""The measured loop: build the point's trainer, warm up, time the measured steps.

The loop is written so that measuring does not change what is measured:
- no host sync inside the measured steps: CUDA events are read once per log window, and the loss
  is summed on the device and read once per window (a `.item()` per step would stall the GPU);
- warmup (the first step carries compilation and allocator growth) lasts until the protocol's
  step and time floors are met and fp16's loss scale has settled (nanogpt/config/protocol.py), and
  never enters a statistic;
- the measured window lasts at least bench.measure_steps and bench.measure_s (a GPU's clocks
  settle in seconds), and a time budget stops it once enough steps are in. The budget is the
  point's, from the end of its first (compiling) step: warmup spends it first, and the profiled
  steps that follow the measured ones (diagnosis, profile) are set aside from it;
- diagnostics stay out of the measured steps: the profiler runs after them (Kineto can leave
  CUPTI attached to the steps that follow it), the allocator history for an OOM snapshot is
  recorded during warmup only, and whatever did run beside them is listed in the record
  (`diagnostics_active`).

`measure(...)` takes plain values (the spec, the device, the ceilings MFU divides by, the sinks)
and returns a Record with what it measured: Setup, Timing, Memory, Rates, Profile and the steps
(each measured row with the job's step time, step_ms_job, from which the statistics follow).
Whatever goes wrong, the record keeps what was measured up to then, with a status
(nanogpt/record/faults.py). It knows nothing of Hydra, calibration files or W&B: a sink is anything
with `window(stats)`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from nanogpt.analysis import derive, stats
from nanogpt.config.protocol import CUDA_GRAPH_MODES, SCALE_SETTLE_STEPS, warmup_steps
from nanogpt.config.spec import Fp8, RunSpec
from nanogpt.hardware.devices import synchronize
from nanogpt.probes import memory, observe
from nanogpt.probes.compile_health import CompileProbe
from nanogpt.probes.contention import ContentionProbe
from nanogpt.probes.diagnose import run_diagnosis
from nanogpt.probes.energy import EnergyProbe
from nanogpt.probes.profiler import profile_steps
from nanogpt.probes.setup import (
    count_optimizer_state,
    count_unknown_state,
    describe_optimizer,
    describe_setup,
)
from nanogpt.probes.startup import StartClock, load_artifacts
from nanogpt.probes.timing import StepTimer
from nanogpt.probes.window import StepLog, Window
from nanogpt.record import MEASURE, STEP_MS_JOB, Record, Setup
from nanogpt.record.asked import Asked
from nanogpt.record.faults import classify, describe
from nanogpt.scenarios import base as scenarios
from nanogpt.scenarios.progress import Progress
from nanogpt.train.distributed import World, slowest_per_step
from nanogpt.train.trainer import Trainer, build_trainer


def measure(
    spec: RunSpec,
    device: torch.device,
    world: World,
    ceilings: derive.Ceilings,
    out_dir: Path,
    sinks: list,
) -> Record:
    """Run one point and return its record; on failure, what was measured plus a status."""
    # What was asked goes in first: the derivation reads it (the worker adds overrides, job dir).
    asked = Asked.of(spec, [], None)
    record = Record(asked=asked, setup=Setup(device=str(device), world_size=world.size))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # cuda:N: its stream, allocator and kernels, not GPU 0's
    start = StartClock()  # the time to first step: the process's age now, then each part
    log = StepLog()
    trainer = None
    # Allocation history (with stack traces) for the snapshot saved on OOM; it slows allocation
    # down a little, so it is on only when asked for.
    record_history = spec.bench.memory_snapshot and device.type == "cuda"
    try:
        if record_history:
            # Python stacks only: C++ ones ("all") cost far more per allocation. Off again
            # before the measured steps (run_phases): it slows every allocation.
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)
        # perf.compile_cache=artifacts: the saved caches loaded first (runner/compile_cache.py)
        load_artifacts(os.environ)
        trainer = build_trainer(spec, device, world)
        start.built()
        # the parts its scenario measures: throughput's phases (run_phases, below), or a time
        # to a target loss instead of the throughput window (docs/time_to_loss.md)
        context = scenarios.Measuring(ceilings, log, sinks, out_dir, record_history, start)
        scenarios.of_spec(spec).run.measure(spec, trainer, record, context=context)
        record.status = "ok"
    except BaseException as exc:  # noqa: B036 - a failed point is a result; Ctrl-C is recorded
        record.status, record.error = classify(exc), describe(exc)
        _keep_measured_steps(record, log)
        if record.status == "oom" and record_history:
            record.memory.memory_snapshot = memory.save_snapshot(out_dir)
    finally:
        record.steps = log.rows
        if record_history:
            torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
        del trainer  # the model, optimizer, batches and compiled graph go with it
        memory.release(device)
    return record


def _keep_measured_steps(record: Record, log: StepLog) -> None:
    """After a failure, the timing of the measured steps that completed (this rank's clock)."""
    step_ms = log.measured("step_ms")
    record.timing.measured_steps = len(step_ms)
    if step_ms:
        record.timing.set_stats(stats.summarize(step_ms))


def run_phases(
    spec, trainer, ceilings, record: Record, log, sinks, out_dir, history, start=None
) -> None:
    """The throughput scenario's run (scenarios/throughput/run.py)."""
    bench, device = spec.bench, trainer.device
    record.setup = describe_setup(spec, trainer)
    record.optimizer = describe_optimizer(spec, trainer, record.setup.mem_estimate)
    probe = memory.MemoryProbe(device, cuda_graphs=_graph_mode(spec) in CUDA_GRAPH_MODES)
    probe.start()
    compiles = CompileProbe(spec.perf.compile)  # torch's own counters, from before the 1st step
    compiles.start()
    energy = EnergyProbe(device)
    warmup = warmup_steps(bench.warmup_steps, _graph_mode(spec), device.type == "cuda")
    timed = bench.warmup_s > 0 or bench.measure_s > 0  # then the step count is not known
    bar = Progress(None if timed else warmup + bench.measure_steps, trainer.world.is_main)
    fp8 = spec.perf.fp8 is not Fp8.none  # no MFU a window either (derive.FP8_NO_MFU)

    def emit(window: Window) -> dict:
        if window.phase == "measure":
            energy.sample()  # before close() syncs: the clocks of a device still at work
        figures = window.close()
        figures.update(derive.window_rates(record.setup, figures["step_ms"], ceilings, fp8))
        figures.update(probe.sample())
        bar.window(figures)
        for sink in sinks:
            sink.window(figures)
        return figures

    try:
        _warmup(spec, trainer, record, log, bar, emit, warmup, start or StartClock())
        probe.split()  # warmup's peaks apart: mem_peak_* are the measured steps' own
        if history:  # the snapshot keeps what warmup recorded; measured steps run without it
            torch.cuda.memory._record_memory_history(enabled=None)
        record.timing.diagnostics_active = _diagnostics(energy, sinks)
        contention = ContentionProbe(device, spec.bench.exclusive.value, trainer.world)
        contention.start()
        energy.start()
        compiles.window_start()
        _measured_steps(spec, trainer, record, log, bar, emit)
        probe.window_end()  # the allocator's retries and OOMs in the measured steps
        compiles.window_end()
        record.compile = compiles.result()  # before the profiled steps: theirs are not counted
        record.compile.compiled_blocks = trainer.compiled_blocks
        record.energy = energy.stop()  # the last window's close synced the device
        record.clocks = energy.clocks()
        for key, value in contention.stop().items():
            setattr(record.timing, key, value)
        contention.enforce()  # bench.exclusive=fail: the point fails, its figures kept
        if bench.profile:  # after the measured steps: the profiler cannot touch them
            _profile(spec, trainer, record, log, out_dir)
    finally:
        energy.halt()  # a failure mid-window leaves no thread polling
        bar.close()
        for key, value in probe.result().items():
            setattr(record.memory, key, value)
    _collect(trainer, ceilings, record, log)
    count_optimizer_state(spec, trainer, record.optimizer)  # the state the steps created
    # After the measured steps and their memory peaks: the profiled steps enter no statistic.
    run_diagnosis(spec, trainer, record, log, ceilings.matmul_emulated)
    record.setup.host_sync_in_step, record.setup.host_sync_note = observe.host_syncs(
        trainer, spec.bench.diagnose
    )


def _graph_mode(spec: RunSpec) -> str | None:
    return spec.perf.compile_mode if spec.perf.compile else None


def _diagnostics(energy: EnergyProbe, sinks: list) -> list[str]:
    """What runs beside the measured steps. None of it inside a step: the sampler is a thread
    that polls a counter every few ms, a sink is called between windows."""
    active = ["energy-sampler"] if energy.sampling else []
    return active + [type(sink).__name__ for sink in sinks]


def _warmup(
    spec, trainer: Trainer, record: Record, log, bar, emit, steps: int, start: StartClock
) -> None:
    """The first step, then windows of steps until `steps` are done, bench.warmup_s has passed
    since the first, and (fp16) a whole window ran without a skipped step, for at most
    SCALE_SETTLE_STEPS more. Windows end at fixed step counts, so the ranks of a data-parallel
    world decide together (a collective) after the same step, as the measured steps do."""
    bench, world = spec.bench, trainer.world
    _first_step(trainer, record, log, start)
    count_unknown_state(trainer, record.setup)  # a class the state table lacks: counted now
    bar.update(1)
    started = time.perf_counter()
    skipped = int(trainer.skipped_steps.item())  # a host read: warmup is not measured
    settled, done = skipped == 0, 1

    def finished() -> bool:
        waited = time.perf_counter() - started >= bench.warmup_s
        capped = done >= steps + SCALE_SETTLE_STEPS
        return not world.any_rank(not (waited and (settled or capped)))

    window = Window(trainer, log, "warmup")
    while not (done >= steps and window.count == 0 and finished()):
        window.step()
        done += 1
        bar.update(1)
        if window.count == spec.logger.log_interval or done == steps:
            emit(window)
            now = int(trainer.skipped_steps.item())
            settled, skipped = now == skipped, now
    timing = record.timing
    timing.warmup_steps_run, timing.warmup_s_run = done, time.perf_counter() - started
    if trainer.scaler.is_enabled():
        timing.scaler_settled = settled


def _first_step(trainer: Trainer, record: Record, log: StepLog, start: StartClock) -> None:
    """The first step carries one-time costs (compilation, lazy init): timed alone, synced,
    and with it the time to first step and its parts (probes/startup.py)."""
    synchronize(trainer.device)
    start.before_first_step()
    t0 = time.perf_counter()
    loss = trainer.step()
    synchronize(trainer.device)
    ms = (time.perf_counter() - t0) * 1e3
    start.after_first_step(ms / 1e3)
    for key, value in start.figures(trainer.compiled).items():
        setattr(record.timing, key, value)
    record.timing.first_step_ms = ms
    record.timing.loss_first = loss.item()
    log.add(1, "warmup", ms, trainer.last_data_ms)
    log.rows[-1]["loss"] = record.timing.loss_first


def _profile(spec, trainer: Trainer, record: Record, log: StepLog, out_dir: Path) -> None:
    data_ms = []

    def step() -> None:
        trainer.step()
        data_ms.append(trainer.last_data_ms)

    figures, step_ms = profile_steps(step, trainer.device, spec.bench.profile_steps, out_dir)
    first = trainer.steps_done - len(step_ms) + 1
    for i, (ms, data) in enumerate(zip(step_ms, data_ms, strict=True)):
        log.add(first + i, "profile", ms, data)
    for key, value in figures.items():
        setattr(record.profile, key, value)


def steps_after(bench) -> int:
    """The profiled steps that follow the measured ones: the diagnosis (its recorded steps and
    the one the profiler warms up on) and bench.profile's."""
    return (bench.diagnose_steps + 1) * bench.diagnose + bench.profile_steps * bench.profile


def _measured_steps(spec, trainer: Trainer, record: Record, log, bar, emit) -> None:
    """Windows of steps until bench.measure_steps and bench.measure_s are both done, or the
    time budget is spent once bench.min_measure_steps are in. What the budget allows them is
    bench.time_budget_s less the warmup (after the first step) and less the steps that follow,
    each counted at the measured steps' mean so far."""
    bench, world, timing = spec.bench, trainer.world, record.timing
    interval = spec.logger.log_interval
    window = Window(trainer, log, "measure")
    skipped_before = int(trainer.skipped_steps.item())  # synced already: warmup's last window
    budget_s, after = bench.time_budget_s - timing.warmup_s_run, steps_after(bench)
    started = time.perf_counter()
    done = 0
    while True:
        window.step()
        done += 1
        bar.update(1)
        elapsed = time.perf_counter() - started
        over_budget = elapsed * (1 + after / done) > budget_s
        # The ranks of a data-parallel job must stop after the same step: one that stopped alone
        # would leave the others waiting in DDP's all-reduce. They decide together at window
        # ends, where the device is read anyway: all ranks past both floors, or any rank's clock
        # over budget (so a budget can overrun by up to one window). A world of one ends a
        # window as soon as its own clock runs out.
        window_full = window.count == interval or done == bench.measure_steps
        if window_full or (over_budget and world.size == 1):
            timing.loss_last = emit(window)["loss"]
            floors = done >= bench.measure_steps and elapsed >= bench.measure_s
            if not world.any_rank(not floors):
                break
            if world.any_rank(over_budget) and done >= bench.min_measure_steps:
                break
    timing.measured_s = time.perf_counter() - started
    timing.measured_steps = done
    timing.stopped_by_budget = done < bench.measure_steps or elapsed < bench.measure_s
    timing.step_ms_wall = window.wall_ms_total / window.steps_total
    if trainer.scaler.is_enabled():
        timing.scaler_skipped_steps = int(trainer.skipped_steps.item()) - skipped_before


def _collect(trainer: Trainer, ceilings, record: Record, log: StepLog) -> None:
    """The measured steps as the point's figures are derived from them (analysis/figures.py,
    in one place for one run and for a pool of repeats), and what they are divided by."""
    timing = record.timing
    # Every rank's step times; the job's step is the slowest rank's (train/distributed.py).
    per_rank = trainer.world.gather(log.measured("step_ms"))
    timing.step_ms_per_rank = per_rank
    timing.step_ms_median_per_rank = [stats.summarize(times)["median"] for times in per_rank]
    # The job's step time of each measured step goes on its row: the run's steps are stored
    # once (Record.steps, steps.csv), and the statistics are derived from those rows.
    measured = [row for row in log.rows if row["phase"] == MEASURE]
    for row, ms in zip(measured, slowest_per_step(per_rank), strict=True):
        row[STEP_MS_JOB] = ms
    timing.data_ms_median = stats.summarize(log.measured("data_ms"))["median"]
    timing.step_timer = StepTimer(trainer.device).clock
    record.rates.ceilings = ceilings.to_dict()  # as the worker resolved them, whole
