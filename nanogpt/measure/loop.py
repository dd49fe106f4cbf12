"""The measured loop: build the point's trainer, warm up, time the measured steps.

The loop is written so that measuring does not change what is measured:
- no host sync inside the measured steps: CUDA events are read once per log window, and the loss
  is summed on the device and read once per window (a `.item()` per step would stall the GPU);
- warmup steps (the first one carries compilation and allocator growth) never enter a statistic;
- profiled steps, when asked for, run apart and stay out of the timing statistics;
- a time budget stops measuring once enough steps are in, so a slow point cannot stall a sweep.

`measure(...)` takes plain values (the spec, the device, the ceilings MFU divides by, the sinks)
and returns a Record with what it measured: Setup, Timing, Memory, Rates, Profile and the steps.
Whatever goes wrong, the record keeps what was measured up to then, with a status
(nanogpt/faults.py). It knows nothing of Hydra, calibration files or W&B: a sink is anything with
`window(stats)`.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from tqdm import tqdm

from nanogpt.config import RunSpec
from nanogpt.devices import synchronize
from nanogpt.distributed import World, slowest_per_step
from nanogpt.faults import Diverged, classify, describe
from nanogpt.measure import flops, memory
from nanogpt.measure.energy import EnergyProbe
from nanogpt.measure.profiler import profile_steps
from nanogpt.measure.timing import StepTimer
from nanogpt.measure.trainer import Trainer, build_trainer
from nanogpt.results import derive, stats
from nanogpt.results.record import Record, Setup


class StepLog:
    """Per-step rows for steps.csv: loss is known only at window ends (read once a window)."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, step: int, phase: str, step_ms: float, data_ms: float) -> None:
        self.rows.append(
            {"step": step, "phase": phase, "step_ms": step_ms, "data_ms": data_ms, "loss": None}
        )

    def measured(self, key: str) -> list[float]:
        return [r[key] for r in self.rows if r["phase"] == "measure"]


def measure(
    spec: RunSpec,
    device: torch.device,
    world: World,
    ceilings: derive.Ceilings,
    out_dir: Path,
    sinks: list,
) -> Record:
    """Run one point and return its record; on failure, what was measured plus a status."""
    record = Record(setup=Setup(device=str(device), world_size=world.size))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # cuda:N: its stream, allocator and kernels, not GPU 0's
    log = StepLog()
    trainer = None
    # Allocation history (with stack traces) for the snapshot saved on OOM; it slows allocation
    # down a little, so it is on only when asked for.
    record_history = spec.bench.memory_snapshot and device.type == "cuda"
    try:
        if record_history:
            # Python stacks only: C++ ones ("all") cost far more per allocation.
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)
        trainer = build_trainer(spec, device, world)
        _run_phases(spec, trainer, ceilings, record, log, sinks, out_dir)
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


def _run_phases(spec, trainer, ceilings, record: Record, log, sinks, out_dir) -> None:
    bench, device = spec.bench, trainer.device
    record.setup = _setup(spec, trainer)
    probe = memory.MemoryProbe(device)
    probe.start()
    energy = EnergyProbe(device)
    total = bench.warmup_steps + bench.measure_steps
    bar = tqdm(total=total, desc="steps", unit="step", disable=not trainer.world.is_main)

    def emit(window: Window) -> dict:
        if window.phase == "measure":
            energy.sample()  # before close() syncs: the clocks of a device still at work
        figures = window.close()
        figures.update(derive.window_rates(record.setup, figures["step_ms"], ceilings))
        figures.update(probe.sample())
        bar.set_postfix(
            step_ms=f"{figures['step_ms']:.1f}",
            tok_s=f"{figures['tokens_per_s']:,.0f}",
            loss=f"{figures['loss']:.3f}",
        )
        for sink in sinks:
            sink.window(figures)
        return figures

    try:
        _first_step(trainer, record, log)
        bar.update(1)
        window = Window(trainer, log, "warmup")
        for _ in range(bench.warmup_steps - 1):
            window.step()
            bar.update(1)
        if window.count:
            emit(window)
        if bench.profile:
            _profile(spec, trainer, record, log, out_dir)
        energy.start()
        _measured_steps(spec, trainer, record, log, bar, emit)
        record.energy = energy.stop()  # the last window's close synced the device
    finally:
        bar.close()
        for key, value in probe.result().items():
            setattr(record.memory, key, value)
    _derive(spec, trainer, ceilings, record, log)


def _setup(spec: RunSpec, trainer: Trainer) -> Setup:
    model, perf = trainer.raw_model, spec.perf
    formula = flops.model_flops(model)
    estimate = memory.estimate_memory(
        n_params=model.get_num_params(non_embedding=False),
        n_layer=spec.model.n_layer,
        n_head=spec.model.n_head,
        n_embd=spec.model.n_embd,
        block_size=spec.model.block_size,
        vocab_size=spec.model.vocab_size,
        batch_size=perf.batch_size,
        optimizer=spec.optimizer.name,
        dtype=perf.dtype.value,
        attention=perf.attention.value,
        activation_checkpointing=perf.activation_checkpointing,
        loss=perf.loss.value,
        loss_chunk=perf.loss_chunk,
        world_size=trainer.world.size,
        strategy="fsdp2" if trainer.fsdp else "ddp",
        reshard_after_forward=spec.dist.reshard_after_forward,
        n_block_params=sum(p.numel() for p in model.blocks.parameters()),
    )
    fp8 = trainer.fp8_layers
    return Setup(
        device=str(trainer.device),
        world_size=trainer.world.size,
        n_params=model.get_num_params(non_embedding=False),
        n_params_flops=formula["n_params_flops"],
        flops_per_token=formula["flops_per_token"],
        flops_per_token_counted=flops.counted_flops_per_token(model.config),
        flops_per_token_hw=formula["flops_per_token_hw"],
        flops_formula=flops.FORMULA,
        tokens_per_step=trainer.tokens_per_step,
        model_wrapping=trainer.model_wrapping,
        fp8_converted=len(fp8["converted"]) if fp8 is not None else None,
        fp8_layers=fp8,
        host_sync_in_step=trainer.host_sync_in_step,
        inductor_cache=_inductor_cache_state() if perf.compile else None,
        mem_estimate_bytes=estimate["total"],
        mem_estimate=estimate,
    )


def _inductor_cache_state() -> str:
    """'warm' when Inductor's on-disk cache already holds entries, else 'cold'. The dir is the
    one Inductor itself uses: TORCHINDUCTOR_CACHE_DIR, else its per-user default ('unknown'
    where this torch does not say which that is)."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        except ImportError:  # torch releases before this module: not asked, so not guessed
            return "unknown"
        cache = default_cache_dir()
    return "warm" if Path(cache).is_dir() and any(Path(cache).iterdir()) else "cold"


def _first_step(trainer: Trainer, record: Record, log: StepLog) -> None:
    """The first step carries one-time costs (compilation, lazy init): timed alone, synced."""
    synchronize(trainer.device)
    t0 = time.perf_counter()
    loss = trainer.step()
    synchronize(trainer.device)
    ms = (time.perf_counter() - t0) * 1e3
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


def _measured_steps(spec, trainer: Trainer, record: Record, log, bar, emit) -> None:
    bench, world = spec.bench, trainer.world
    interval = spec.logger.log_interval
    window = Window(trainer, log, "measure")
    started = time.perf_counter()
    done = 0
    while done < bench.measure_steps:
        window.step()
        done += 1
        bar.update(1)
        over_budget = time.perf_counter() - started > bench.time_budget_s
        # The ranks of a data-parallel job must stop after the same step: one that stopped alone
        # would leave the others waiting in DDP's all-reduce. They decide together at window
        # ends, where the device is read anyway, stopping when any rank's clock is over budget
        # (so a budget can overrun by up to one window). A world of one ends a window as soon as
        # its own clock runs out.
        window_full = window.count == interval or done == bench.measure_steps
        if window_full or (over_budget and world.size == 1):
            record.timing.loss_last = emit(window)["loss"]
            if world.any_rank(over_budget) and done >= bench.min_measure_steps:
                break
    record.timing.measured_steps = done
    record.timing.stopped_by_budget = done < bench.measure_steps


class Window:
    """Steps between two reads of the device: timing and loss are synced once per window."""

    def __init__(self, trainer: Trainer, log: StepLog, phase: str):
        self.trainer, self.log, self.phase = trainer, log, phase
        self.timer = StepTimer(trainer.device)
        self.loss_sum = torch.zeros((), device=trainer.device)
        self.data_ms: list[float] = []
        self.count = 0

    def step(self) -> None:
        self.timer.start()
        self.loss_sum += self.trainer.step()
        self.timer.stop()
        self.data_ms.append(self.trainer.last_data_ms)
        self.count += 1

    def close(self) -> dict:
        """The window's median step and mean loss (one device read); its rows go to the log."""
        times = self.timer.flush()
        first = self.trainer.steps_done - len(times) + 1
        for i, (ms, data_ms) in enumerate(zip(times, self.data_ms, strict=True)):
            self.log.add(first + i, self.phase, ms, data_ms)
        loss = self.loss_sum.item() / self.count
        self.log.rows[-1]["loss"] = loss
        if not math.isfinite(loss):
            raise Diverged(f"loss is {loss} in the window ending at step {self.trainer.steps_done}")
        window = {
            "phase": self.phase,
            "step": self.trainer.steps_done,
            "step_ms": stats.summarize(times)["median"],
            "loss": loss,
            "lr": self.trainer.optimizer.param_groups[0]["lr"],  # a host float: no sync
        }
        self.loss_sum.zero_()
        self.data_ms.clear()
        self.count = 0
        return window


def _derive(spec, trainer: Trainer, ceilings, record: Record, log: StepLog) -> None:
    """Statistics over measured steps only, then the derived figures (results/derive.py)."""
    timing = record.timing
    # Every rank's step times; the job's step is the slowest rank's (distributed.py).
    per_rank = trainer.world.gather(log.measured("step_ms"))
    timing.step_ms_per_rank = per_rank
    timing.step_ms_median_per_rank = [stats.summarize(times)["median"] for times in per_rank]
    steps = slowest_per_step(per_rank)
    timing.set_stats(stats.summarize(steps))
    timing.step_ms_ci_low, timing.step_ms_ci_high = stats.median_ci([steps])
    timing.ci_method = stats.METHOD
    timing.repeats = 1
    timing.step_ms_measured = [steps]
    timing.step_ms_median_per_repeat = [timing.step_ms_median]
    timing.data_ms_median = stats.summarize(log.measured("data_ms"))["median"]
    timing.clock = StepTimer(trainer.device).clock
    record.rates = derive.rates(
        record.setup,
        timing.step_ms_median,
        timing.first_step_ms,
        ceilings,
        compiled=spec.perf.compile,
        checkpointing=spec.perf.activation_checkpointing,
        dtype=spec.perf.dtype.value,
        step_ms_ci=(timing.step_ms_ci_low, timing.step_ms_ci_high),
        energy=record.energy,
        measured_steps=timing.measured_steps,
        fp8=trainer.fp8_layers is not None,
    )
