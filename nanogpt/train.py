"""Measure one sweep point: build the model as asked, warm up, time the measured steps.

The loop is written so that measuring does not change what is measured:
- no host sync inside the measured steps: CUDA events are read once per log window, and the loss
  is summed on the device and read once per window (a `.item()` per step would stall the GPU);
- warmup steps (the first one carries compilation and allocator growth) never enter a statistic;
- profiled steps, when asked for, run apart and stay out of the timing statistics;
- a time budget stops measuring once enough steps are in, so a slow point cannot stall a sweep.

`measure(spec, ...)` returns a plain dict of figures (see nanogpt/records.py for the schema).
Whatever goes wrong, it returns what was measured up to then, with a status (nanogpt/faults.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from nanogpt import hardware
from nanogpt.config import Attention, Dtype, RunSpec
from nanogpt.data import open_source
from nanogpt.distributed import World, slowest_per_step
from nanogpt.faults import Diverged, Fault, classify, describe
from nanogpt.model import GPT, GPTConfig
from nanogpt.optim import build_optimizer
from nanogpt.probes import flops as flops_probe
from nanogpt.probes.memory import MemoryProbe, estimate_memory, release
from nanogpt.probes.timing import StepTimer, summarize, synchronize

AUTOCAST_DTYPES = {Dtype.bf16: torch.bfloat16, Dtype.fp16: torch.float16}
SDPA_BACKENDS = {
    Attention.flash: SDPBackend.FLASH_ATTENTION,
    Attention.efficient: SDPBackend.EFFICIENT_ATTENTION,
    Attention.cudnn: SDPBackend.CUDNN_ATTENTION,
    Attention.math: SDPBackend.MATH,
}


def resolve_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def gpt_config(spec: RunSpec) -> GPTConfig:
    m = spec.model
    return GPTConfig(
        block_size=m.block_size,
        vocab_size=m.vocab_size,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.n_embd,
        dropout=m.dropout,
        bias=m.bias,
        attention=spec.perf.attention.value,
        activation_checkpointing=spec.perf.activation_checkpointing,
    )


def set_matmul_precision(dtype: Dtype) -> None:
    """TF32 only when asked: with dtype=fp32 every matmul is true fp32."""
    tf32 = dtype is Dtype.tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def data_source(spec: RunSpec, device: torch.device, world: World, batch_size: int):
    """The batches a Trainer draws (nanogpt/maxbatch.py reopens it at other batch sizes)."""
    return open_source(
        spec.data,
        vocab_size=spec.model.vocab_size,
        block_size=spec.model.block_size,
        batch_size=batch_size,
        device=device,
        seed=spec.bench.seed + world.rank,
    )


class Trainer:
    """Model, optimizer, precision and data for one point; `step()` is one optimizer step."""

    def __init__(self, spec: RunSpec, device: torch.device, world: World):
        perf = spec.perf
        self.device = device
        self.world = world
        torch.manual_seed(spec.bench.seed + world.rank)
        set_matmul_precision(perf.dtype)
        self.raw_model = GPT(gpt_config(spec)).to(device)
        self.model = self.raw_model
        if perf.compile:
            mode = None if perf.compile_mode == "default" else perf.compile_mode
            self.model = torch.compile(self.model, mode=mode)
        self.model = world.wrap(self.model, device)
        self.optimizer = build_optimizer(self.raw_model, spec.optimizer)
        # fp16's narrow range needs loss scaling (Micikevicius et al., 2018); bf16 does not.
        self.scaler = torch.amp.GradScaler(device.type, enabled=perf.dtype is Dtype.fp16)
        self.autocast_dtype = AUTOCAST_DTYPES.get(perf.dtype)
        self.backend = SDPA_BACKENDS.get(perf.attention)
        self.grad_accum = perf.grad_accum
        self.tokens_per_step = (
            perf.batch_size * spec.model.block_size * perf.grad_accum * world.size
        )
        self.grad_clip = spec.optimizer.grad_clip
        self.source = data_source(spec, device, world, perf.batch_size)
        self.fault = Fault.parse(spec.bench.inject_fault)
        self.steps_done = 0
        self.last_data_ms = 0.0

    def _forward_context(self):
        stack = contextlib.ExitStack()
        if self.autocast_dtype is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast_dtype))
        if self.backend is not None:
            stack.enter_context(sdpa_kernel(self.backend))
        return stack

    def step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches. Returns the mean loss, on device."""
        self.steps_done += 1
        total = torch.zeros((), device=self.device)
        data_s = 0.0
        for micro in range(self.grad_accum):
            t0 = time.perf_counter()
            x, y = self.source.next_batch()
            data_s += time.perf_counter() - t0
            # DDP all-reduces gradients only on the last micro-step of accumulation.
            last = micro == self.grad_accum - 1
            with self.world.sync_grads(self.model, last), self._forward_context():
                _, loss = self.model(x, y)
            loss = loss / self.grad_accum
            if self.fault:
                loss = self.fault.trigger(self.steps_done, loss, self.device)
            self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_data_ms = data_s * 1e3
        return total


@dataclass
class StepLog:
    """Per-step rows for steps.csv: loss is known only at window ends (read once a window)."""

    rows: list[dict]

    def add(self, step: int, phase: str, step_ms: float, data_ms: float) -> None:
        self.rows.append(
            {"step": step, "phase": phase, "step_ms": step_ms, "data_ms": data_ms, "loss": None}
        )

    def measured(self, key: str) -> list[float]:
        return [r[key] for r in self.rows if r["phase"] == "measure"]


def measure(spec: RunSpec, device: torch.device, out_dir: Path, world: World, sinks: list) -> dict:
    """Run one point and return its figures; on failure, what was measured plus a status."""
    figures: dict = {"device": str(device), "world_size": world.size, "status": "running"}
    log = StepLog(rows=[])
    trainer = None
    # Allocation history (with stack traces) for the snapshot saved on OOM; it slows allocation
    # down a little, so it is on only when asked for.
    record_history = spec.bench.memory_snapshot and device.type == "cuda"
    try:
        if record_history:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        trainer = Trainer(spec, device, world)
        _run_phases(spec, trainer, figures, log, sinks, out_dir)
        figures["status"] = "ok"
    except BaseException as exc:  # noqa: B036 - a failed point is a result; Ctrl-C is recorded
        figures["status"] = classify(exc)
        figures["error"] = describe(exc)
        _keep_measured_steps(figures, log)
        if figures["status"] == "oom" and record_history:
            figures["memory_snapshot"] = _save_memory_snapshot(out_dir)
    finally:
        figures["steps"] = log.rows
        if record_history:
            torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
        del trainer  # the model, optimizer, batches and compiled graph go with it
        release(device)
    return figures


def _keep_measured_steps(figures: dict, log: StepLog) -> None:
    """After a failure, the timing of the measured steps that completed (this rank's clock)."""
    step_ms = log.measured("step_ms")
    figures["measured_steps"] = len(step_ms)
    if step_ms:
        figures.update({f"step_ms_{k}": v for k, v in summarize(step_ms).items()})


def _run_phases(spec, trainer, figures, log, sinks, out_dir) -> None:
    bench, device = spec.bench, trainer.device
    figures.update(_static_figures(spec, trainer))
    memory = MemoryProbe(device)
    memory.start()
    total = bench.warmup_steps + bench.measure_steps
    bar = tqdm(total=total, desc="steps", unit="step", disable=not trainer.world.is_main)
    try:
        _first_step(trainer, figures, log)
        bar.update(1)
        _warmup(spec, trainer, log, bar, sinks, memory)
        if bench.profile:
            figures.update(_profile(spec, trainer, log, out_dir))
        _measured_steps(spec, trainer, figures, log, bar, sinks, memory)
    finally:
        bar.close()
        figures.update(memory.result())
    _derive(spec, trainer, figures, log)


def _static_figures(spec: RunSpec, trainer: Trainer) -> dict:
    model = trainer.raw_model
    perf = spec.perf
    counted = flops_probe.counted_flops_per_token(model.config)
    figures = flops_probe.model_flops(model)
    figures.update(
        n_params=model.get_num_params(non_embedding=False),
        flops_per_token_counted=counted,
        flops_formula=flops_probe.FORMULA,
        device_name=hardware.device_name(trainer.device),
        tokens_per_step=trainer.tokens_per_step,
        inductor_cache=_inductor_cache_state() if perf.compile else None,
    )
    estimate = estimate_memory(
        n_params=figures["n_params"],
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
    )
    figures.update(mem_estimate_bytes=estimate["total"], mem_estimate=estimate)
    return figures


def _inductor_cache_state() -> str:
    """'warm' when Inductor's on-disk cache already holds entries, else 'cold'."""
    default = Path("/tmp") / f"torchinductor_{os.environ.get('USER', 'root')}"
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", default))
    return "warm" if cache.is_dir() and any(cache.iterdir()) else "cold"


def _first_step(trainer: Trainer, figures: dict, log: StepLog) -> None:
    """The first step carries one-time costs (compilation, lazy init): timed alone, synced."""
    synchronize(trainer.device)
    t0 = time.perf_counter()
    loss = trainer.step()
    synchronize(trainer.device)
    ms = (time.perf_counter() - t0) * 1e3
    figures["first_step_ms"] = ms
    figures["loss_first"] = loss.item()
    log.add(1, "warmup", ms, trainer.last_data_ms)
    log.rows[-1]["loss"] = figures["loss_first"]


def _warmup(spec, trainer, log, bar, sinks, memory) -> None:
    window = Window(trainer, log, "warmup")
    for _ in range(spec.bench.warmup_steps - 1):
        window.step()
        bar.update(1)
    if window.count:
        _emit(window.close(), sinks, memory, bar)


def _measured_steps(spec, trainer, figures, log, bar, sinks, memory) -> None:
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
            stats = window.close()
            figures["loss_last"] = stats["loss"]
            _emit(stats, sinks, memory, bar)
            if world.any_rank(over_budget) and done >= bench.min_measure_steps:
                break
    figures["measured_steps"] = done
    figures["stopped_by_budget"] = done < bench.measure_steps


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
        times = self.timer.flush()
        first = self.trainer.steps_done - len(times) + 1
        for i, (ms, data_ms) in enumerate(zip(times, self.data_ms, strict=True)):
            self.log.add(first + i, self.phase, ms, data_ms)
        loss = self.loss_sum.item() / self.count
        self.log.rows[-1]["loss"] = loss
        if not math.isfinite(loss):
            raise Diverged(f"loss is {loss} in the window ending at step {self.trainer.steps_done}")
        median_ms = summarize(times)["median"]
        stats = {
            "phase": self.phase,
            "step": self.trainer.steps_done,
            "step_ms": median_ms,
            "tokens_per_s": self.trainer.tokens_per_step / (median_ms / 1e3),
            "loss": loss,
            "lr": self.trainer.optimizer.param_groups[0]["lr"],  # a host float: no sync
        }
        self.loss_sum.zero_()
        self.data_ms.clear()
        self.count = 0
        return stats


def _emit(stats: dict, sinks: list, memory: MemoryProbe, bar) -> None:
    stats.update(memory.sample())
    bar.set_postfix(
        step_ms=f"{stats['step_ms']:.1f}",
        tok_s=f"{stats['tokens_per_s']:,.0f}",
        loss=f"{stats['loss']:.3f}",
    )
    for sink in sinks:
        sink.window(stats)


def _profile(spec, trainer, log, out_dir: Path) -> dict:
    from nanogpt.probes.profile import profile_steps

    return profile_steps(trainer, spec.bench.profile_steps, out_dir, log)


def _derive(spec: RunSpec, trainer: Trainer, figures: dict, log: StepLog) -> None:
    """Statistics over measured steps only, then tokens/s, FLOP/s and MFU."""
    # Every rank's step times; the job's step is the slowest rank's (distributed.py).
    per_rank = trainer.world.gather(log.measured("step_ms"))
    figures["step_ms_per_rank"] = per_rank
    figures["step_ms_median_per_rank"] = [summarize(times)["median"] for times in per_rank]
    stats = summarize(slowest_per_step(per_rank))
    figures.update({f"step_ms_{k}": v for k, v in stats.items()})
    figures["data_ms_median"] = summarize(log.measured("data_ms"))["median"]
    median_s = stats["median"] / 1e3
    tokens_per_rank = figures["tokens_per_step"] / trainer.world.size
    figures["tokens_per_s"] = figures["tokens_per_step"] / median_s
    achieved = figures["flops_per_token"] * tokens_per_rank / median_s  # per device
    figures["achieved_tflops"] = achieved / 1e12
    # The measured matmul peak, if this machine was calibrated (nanogpt/calibrate.py imports
    # this module, hence the local import).
    from nanogpt import calibrate

    dtype = spec.perf.dtype.value
    figures.update(calibrate.achievable_figures(trainer.device, dtype, achieved))
    peak = calibrate.run_peak(
        trainer.device, figures["device_name"], dtype, spec.hardware.peak_tflops
    )
    figures["peak_tflops"] = peak.flops / 1e12 if peak.flops else None
    figures["peak_source"] = peak.source
    figures["mfu"] = achieved / peak.flops if peak.flops else None
    hw = figures["flops_per_token_hw"] * tokens_per_rank / median_s
    figures["hfu"] = hw / peak.flops if peak.flops and spec.perf.activation_checkpointing else None
    if spec.perf.compile:
        # What the first step cost beyond a steady one: compilation, autotuning, lazy init.
        figures["compile_s"] = max(figures["first_step_ms"] - stats["median"], 0.0) / 1e3
    figures["clock"] = StepTimer(trainer.device).clock


def _save_memory_snapshot(out_dir: Path) -> str | None:
    """Save the CUDA allocator's snapshot, the pickle that pytorch.org/memory_viz reads (PyTorch
    docs, "Understanding CUDA Memory Usage"). Written beside, then renamed: never half a file."""
    path = out_dir / "memory_snapshot.pickle"
    partial = out_dir / ".memory_snapshot.pickle.tmp"
    try:
        torch.cuda.memory._dump_snapshot(str(partial))
        os.replace(partial, path)
    except Exception as exc:  # the record matters more than the snapshot
        partial.unlink(missing_ok=True)
        print(f"warning: no memory snapshot ({describe(exc)})")
        return None
    return path.name
