"""The diagnosis phase: a few steps under torch.profiler, after the measured steps, that say
where a step's time goes (analysis/bottleneck.py turns the figures into a verdict and a hint).

It runs after the measured window, never before or inside it: Kineto (torch.profiler) can stay
attached to the device after profiling (PyTorch issue 144455) and slow the steps that follow,
and a profiled step is slower than a plain one. Its steps are logged with phase "diagnose" and
never enter a statistic; the memory peaks of the point are read before it starts.

Each diagnosed step runs inside a marker (`nanogpt::step`), synced at its end, so the marker's
length is the step's wall time on the profiler's own clock, the clock the ops and kernels are
timed with; while it runs, the batch source is wrapped in a second marker (`nanogpt::data`), so
the time spent getting batches is known and its ops are not counted as compute. The step's wall
time is then split four ways, summing to 1 (the arithmetic: probes/step_split.py):

- device: the device computes. CUDA: the union of the kernel intervals (kernels on several
  streams that overlap count once), communication kernels and the GPU-timeline shadows of
  `record_function` ranges (`gpu_user_annotation`) left out. CPU, which has no separate
  device: the self time of aten operators (the time inside each operator's own code, not in
  the operators it calls), less the per-operator floor, which is where a CPU step's arithmetic
  happens. The core is shared with the rest of the machine, and time another process takes is
  added to whichever operator or gap was running: each operator's and each gap's least time
  over the diagnosed steps is kept (step_split._typical_cpu_step), the step undisturbed.
- communication: CUDA: time in which only communication kernels (NCCL) run, the communication
  compute does not hide; CPU: time inside collective calls (gloo).
- data: the batch source runs and the device is idle.
- host: the rest: the device waits for the host, which runs Python, the autograd engine and the
  dispatcher and launches kernels.

The device time is also split by kind (matmul, attention, elementwise/norm, optimizer,
communication, other): on CUDA the sum of kernel durations (not their union) by kind, on CPU the
operator self time by kind. A kernel's kind comes from the operator that launched it and that
operator's callers (an `aten::bmm` inside `aten::scaled_dot_product_attention` is attention, an
`aten::mul_` inside `Optimizer.step` is optimizer), else from the kernel's own name.

Older torch (before pytorch/pytorch#177662) has no `linked_correlation_id` on `FunctionEvent`,
only on Kineto's own events: `restore_from_kineto` copies it (and `is_user_annotation`) over,
matched by device, correlation id and start time. Where neither has it, the figures are null
with the reason ("unavailable: ..."), never an AttributeError.
"""

from __future__ import annotations

import logging
import statistics
import time

import psutil
import torch
from torch.autograd.profiler import profile, record_function

from nanogpt.analysis.bottleneck import Setting, allocator_warning, judge
from nanogpt.hardware.devices import synchronize
from nanogpt.probes.kineto_log import quiet_profiler
from nanogpt.probes.step_split import (
    CUDA_ATTRIBUTES,
    DATA_MARK,
    STEP_MARK,
    ProfilerAttributeMissing,
    split_step,
)
from nanogpt.record import Diagnosis
from nanogpt.record.faults import describe

logger = logging.getLogger(__name__)


class _MarkedSource:
    """A batch source whose batches are fetched inside the data marker (diagnosis only)."""

    def __init__(self, source):
        self.source = source

    def next_batch(self):
        with record_function(DATA_MARK):
            return self.source.next_batch()


def profile_diagnosis(trainer, n_steps: int) -> tuple[dict, list[float], list[float]]:
    """Run n_steps of `trainer` under the profiler; returns the figures (the Diagnosis fields),
    each step's wall time (ms) and data time (ms), which the caller logs apart."""
    device = trainer.device
    cuda = device.type == "cuda"
    step_ms, data_ms = [], []
    source, trainer.source = trainer.source, _MarkedSource(trainer.source)
    try:
        synchronize(device)
        # Kineto, as torch.profiler.profile drives it, without the wrapper's start-up import of
        # torch._inductor (seconds, in every point's process); its USDT lines kept off stderr.
        with quiet_profiler(profile(use_device="cuda" if cuda else None, use_kineto=True)) as prof:
            for _ in range(n_steps + 1):
                started = time.perf_counter()
                with record_function(STEP_MARK):
                    trainer.step()
                    synchronize(device)
                step_ms.append((time.perf_counter() - started) * 1e3)
                data_ms.append(trainer.last_data_ms)
    finally:
        trainer.source = source
    events = list(prof.function_events)
    try:
        if cuda:
            restore_from_kineto(events, prof.kineto_results)
        figures = split_step(events, cuda=cuda, skip=1)
    except ProfilerAttributeMissing as missing:
        reason = f"unavailable: torch {torch.__version__}'s profiler events have no {missing}"
        return {"diag_error": reason}, step_ms, data_ms
    figures["diag_steps"] = n_steps
    return figures, step_ms, data_ms


def restore_from_kineto(events: list, kineto_results) -> int:
    """Give each FunctionEvent the CUDA_ATTRIBUTES this torch leaves off it, from the Kineto
    event it was built from (same device type, correlation id and start in ns since the trace
    began). Returns how many events got them; does nothing where the attributes are there."""
    missing = [name for name in CUDA_ATTRIBUTES if events and not hasattr(events[0], name)]
    if not missing:
        return 0
    try:
        origin = kineto_results.trace_start_ns()
        kineto_events = list(kineto_results.events())
        by_key = {
            (k.device_type(), k.correlation_id(), k.start_ns() - origin): k for k in kineto_events
        }
    except AttributeError as exc:
        raise ProfilerAttributeMissing(f"FunctionEvent.{missing[0]} (nor Kineto's)") from exc
    for name in missing:
        if kineto_events and not hasattr(kineto_events[0], name):
            raise ProfilerAttributeMissing(f"FunctionEvent.{name} (nor Kineto's)")
    restored = 0
    for event in events:
        start_ns = round(event.time_range.start * 1000)
        kineto = by_key.get((event.device_type, event.id, start_ns))
        if kineto is None:
            continue  # an event torch made itself (memory, out-of-memory): no kernel, no link
        for name in missing:
            setattr(event, name, getattr(kineto, name)())
        restored += 1
    for event in events:  # those without a Kineto twin: launched nothing, annotate nothing
        for name in missing:
            if not hasattr(event, name):
                setattr(event, name, 0 if name == "linked_correlation_id" else False)
    return restored


def memory_headroom(device: torch.device, peak_bytes: int | None) -> tuple[int | None, int | None]:
    """(bytes, total) the point could still use: on CUDA the device's memory less the allocator's
    peak reservation, on CPU the machine's memory less the process's peak RSS."""
    if peak_bytes is None:
        return None, None
    if device.type == "cuda":
        total = torch.cuda.mem_get_info(device)[1]
    else:
        total = psutil.virtual_memory().total
    return max(0, total - peak_bytes), total


def run_diagnosis(spec, trainer, record, log, matmul_emulated: str | None) -> None:
    """The diagnosis phase of a point whose measured steps are done: record.diagnosis gets the
    figures, the verdict and the hint; its steps go to the log with phase "diagnose". A
    diagnosis that cannot run or fails leaves the figures null with the reason: the point's
    measurement stands either way. The CUDA allocator's retries in the measured steps are
    warned of whether it runs or not, and lead its hint when it does."""
    device = trainer.device
    allocator = allocator_warning(record.memory.mem_alloc_retries, record.memory.mem_ooms)
    if allocator:
        logger.warning("%s", allocator)
    if not spec.bench.diagnose:
        record.diagnosis = Diagnosis(diag_error="off (bench.diagnose=false)")
        return
    if device.type not in ("cpu", "cuda"):
        # MPS runs its kernels asynchronously and Kineto does not time them: the host's view
        # alone would call every MPS point host-bound.
        record.diagnosis = Diagnosis(diag_error=f"skipped: the profiler has no {device} kernels")
        return
    if device.type == "cuda" and not spec.bench.isolate:
        # The profiler can stay attached after it stops (PyTorch issue 144455): in a process that
        # measures further points it would slow their measured steps.
        record.diagnosis = Diagnosis(
            diag_error="skipped: on CUDA it needs a process of its own per point (bench.isolate)"
        )
        return
    try:
        figures, step_ms, data_ms = profile_diagnosis(trainer, spec.bench.diagnose_steps)
    except Exception as exc:  # the measured figures stand without a diagnosis
        record.diagnosis = Diagnosis(diag_error=f"failed: {describe(exc)}")
        logger.warning("the diagnosis failed (%s); the measured figures stand", describe(exc))
        return
    first = trainer.steps_done - len(step_ms) + 1
    for i, (ms, data) in enumerate(zip(step_ms, data_ms, strict=True)):
        log.add(first + i, "diagnose", ms, data)
    if "diag_error" in figures:  # the steps ran; this torch's events cannot be split
        record.diagnosis = Diagnosis(diag_error=figures["diag_error"])
        return
    memory = record.memory
    peak = memory.mem_peak_reserved_bytes if device.type == "cuda" else memory.mem_peak_rss_bytes
    headroom, total = memory_headroom(device, peak)
    diagnosis = Diagnosis(
        **figures,
        diag_step_ms=statistics.median(step_ms[1:]),  # the recorded ones
        diag_mem_headroom_bytes=headroom,
        diag_mem_headroom_frac=headroom / total if total else None,
        diag_method=METHODS[device.type == "cuda"],
    )
    used = record.setup.optimizer_impl_used
    setting = Setting.of(spec, device.type, matmul_emulated, used)
    record.diagnosis = judge(diagnosis, setting, allocator)


METHODS = {
    True: "torch.profiler: union of CUDA kernel intervals over each step's synced wall time",
    False: "torch.profiler: aten operator self time less the no-arithmetic floor, over wall time",
}
