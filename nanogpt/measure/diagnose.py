"""The diagnosis phase: a few steps under torch.profiler, after the measured steps, that say
where a step's time goes (results/bottleneck.py turns the figures into a verdict and a hint).

It runs after the measured window, never before or inside it: Kineto (torch.profiler) can stay
attached to the device after profiling (PyTorch issue 144455) and slow the steps that follow,
and a profiled step is slower than a plain one. Its steps are logged with phase "diagnose" and
never enter a statistic; the memory peaks of the point are read before it starts.

Each diagnosed step runs inside a marker (`nanogpt::step`), synced at its end, so the marker's
length is the step's wall time on the profiler's own clock, the clock the ops and kernels are
timed with; while it runs, the batch source is wrapped in a second marker (`nanogpt::data`), so
the time spent getting batches is known and its ops are not counted as compute. The step's wall
time is then split four ways, summing to 1:

- device: the device computes. CUDA: the union of the kernel intervals (kernels on several
  streams that overlap count once), communication kernels left out. CPU, which has no separate
  device: the self time of aten operators (the time inside each operator's own code, not in the
  operators it calls), which is where a CPU step's arithmetic happens.
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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import psutil
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import profile, record_function

from nanogpt.devices import synchronize
from nanogpt.faults import describe
from nanogpt.results.bottleneck import KINDS, Diagnosis, Setting, judge

STEP_MARK = "nanogpt::step"
DATA_MARK = "nanogpt::data"

# Inductor runs a compiled graph inside this marker (torch/_inductor/output_code.py). On CPU its
# fused C++ kernels are not profiled one by one (unless Inductor's cpp.enable_kernel_profile
# changes the generated code), so the marker's self time, the time in the graph outside the
# aten operators it calls, is counted as compute, of the elementwise kind (fused pointwise,
# reduction and norm kernels; the graph's matmuls are aten operators of their own).
COMPILED_GRAPH = "## Call CompiledFxGraph"
CPU_WORK = ("aten::", COMPILED_GRAPH)

# Names, lower-cased, by kind; the first kind whose words match wins, the operator's callers
# before the operator itself (see `_kind`).
_CALLER_KINDS = (
    ("communication", ("nccl", "gloo", "c10d::", "allreduce", "all_reduce", "record_param_comms")),
    ("optimizer", ("optimizer.", "_foreach_", "_fused_adam", "_fused_sgd", "multi_tensor_apply")),
    ("attention", ("scaled_dot_product", "flash", "fmha", "attention", "_efficient_attention")),
)
# aten's matmuls; cuBLAS/CUTLASS kernel names (gemm, xmma, nvjet on Hopper); Inductor's
# matmul templates (triton_tem_).
MATMUL_WORDS = """aten::mm aten::addmm aten::bmm aten::baddbmm aten::matmul aten::linear
    aten::_addmm_activation aten::addbmm aten::_scaled_mm gemm xmma nvjet cublas cutlass
    triton_tem_"""
_OWN_KINDS = (
    *_CALLER_KINDS,
    ("matmul", tuple(MATMUL_WORDS.split())),
    ("other", ("memcpy", "memset")),
    ("elementwise", (COMPILED_GRAPH.lower(),)),
)


# Operators that do no arithmetic: they make a new view of a tensor, or an empty one. Their
# self time is the fixed cost every operator pays on the host (the dispatcher, a TensorImpl,
# the profiler's own record), so their median is the floor taken off each operator's self time
# on CPU: what is left is arithmetic. Measured in each diagnosis, not a constant.
NO_ARITHMETIC = frozenset(
    f"aten::{name}"
    for name in """view _unsafe_view _reshape_alias reshape as_strided t transpose permute expand
    squeeze unsqueeze slice select split unflatten alias detach empty empty_strided
    empty_like""".split()
)


def op_floor_us(ops: list) -> float:
    """The median self time (us) of the profiled operators that do no arithmetic; 0 if none."""
    times = sorted(op.self_cpu_time_total for op in ops if op.name in NO_ARITHMETIC)
    return statistics.median(times) if times else 0.0


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
        # torch._inductor (seconds, in every point's process).
        with profile(use_device="cuda" if cuda else None, use_kineto=True) as prof:
            for _ in range(n_steps + 1):
                started = time.perf_counter()
                with record_function(STEP_MARK):
                    trainer.step()
                    synchronize(device)
                step_ms.append((time.perf_counter() - started) * 1e3)
                data_ms.append(trainer.last_data_ms)
    finally:
        trainer.source = source
    figures = split_step(prof.function_events, cuda=cuda, skip=1)
    figures["diag_steps"] = n_steps
    return figures, step_ms, data_ms


def split_step(events: Iterable, cuda: bool, skip: int = 0) -> dict:
    """The four shares of the step, the device time by kind, and the ops a step (see above),
    over the marked steps but the first `skip`: the first step under a profiler pays for
    setting it up (CUPTI's activity buffers, on CUDA), which is no part of a step."""
    events = list(events)
    steps = [e for e in events if e.name == STEP_MARK and e.device_type == DeviceType.CPU]
    steps = sorted(steps, key=lambda e: e.time_range.start)[skip:]
    if not steps:
        raise RuntimeError("the profiler recorded no diagnosed step")
    wall = sum(e.time_range.elapsed_us() for e in steps)
    inside = [e for s in steps for e in _descendants(s)]
    data = [e for e in inside if e.name == DATA_MARK]
    data_spans = _merge((e.time_range.start, e.time_range.end) for e in data)
    by_kind = dict.fromkeys(KINDS, 0.0)
    figures: dict = {"diag_op_floor_us": None}
    if cuda:
        # Operators (correlation id = their own id) that launched kernels; the runtime's launch
        # calls carry the operator's id as their link instead, and are left out.
        ops = {e.id: e for e in inside if e.linked_correlation_id == 0}
        spans = [(s.time_range.start, s.time_range.end) for s in steps]
        kernels = [k for k in events if k.device_type == DeviceType.CUDA and _within(k, spans)]
        compute, comm = [], []
        for kernel in kernels:
            kind = _kind(kernel.name, ops.get(kernel.linked_correlation_id))
            by_kind[kind] += kernel.time_range.elapsed_us()
            interval = (kernel.time_range.start, kernel.time_range.end)
            (comm if kind == "communication" else compute).append(interval)
        busy = _merge(compute)
        device_us = _length(busy)
        comm_us = _length(_minus(_merge(comm), busy))
        data_us = _length(_minus(data_spans, _merge(compute + comm)))
        count = len(kernels)
    else:
        ops = [op for op in inside if op.name.startswith(CPU_WORK) or _is_comm(op.name)]
        ops = [op for op in ops if not any(p.name == DATA_MARK for p in _callers(op))]
        floor = op_floor_us(ops)
        for op in ops:
            # An operator's fixed cost (dispatch, bookkeeping) is host work; collectives are
            # waited for whole, and a compiled graph's call is one call.
            whole = _is_comm(op.name) or op.name.startswith(COMPILED_GRAPH)
            cost = op.self_cpu_time_total - (0.0 if whole else floor)
            by_kind[_kind(op.name, op.cpu_parent)] += max(0.0, cost)
        comm_us = by_kind["communication"]
        device_us = sum(by_kind.values()) - comm_us
        data_us = _length(data_spans)
        count = sum(1 for op in ops if op.name.startswith("aten::"))
        figures["diag_op_floor_us"] = floor
    total_kind = sum(by_kind.values())
    # The device's clock is mapped onto the host's, so kernels can overhang a step by a hair:
    # the shares are taken over whichever is longer, the wall or what they add up to.
    whole = max(wall, device_us + comm_us + data_us)
    figures |= {
        "diag_step_device_frac": device_us / whole,
        "diag_step_comm_frac": comm_us / whole,
        "diag_step_data_frac": data_us / whole,
        "diag_step_host_frac": 1 - (device_us + comm_us + data_us) / whole,
        "diag_ops_per_step": count / len(steps),
        "diag_us_per_op": (total_kind / count) if count else None,
    }
    for kind in KINDS:
        figures[f"diag_device_time_{kind}_frac"] = (
            by_kind[kind] / total_kind if total_kind else None
        )
    return figures


def _descendants(event) -> list:
    out, stack = [], list(event.cpu_children)
    while stack:
        e = stack.pop()
        out.append(e)
        stack.extend(e.cpu_children)
    return out


def _callers(event) -> list:
    out, parent = [], event.cpu_parent
    while parent is not None:
        out.append(parent)
        parent = parent.cpu_parent
    return out


def _is_comm(name: str) -> bool:
    return _match(name, _CALLER_KINDS[0][1])


def _match(name: str, words: tuple[str, ...]) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in words)


def _kind(name: str, op) -> str:
    """The kind of an operator or kernel `name`, launched by `op` (None when unknown)."""
    chain = [] if op is None else [op, *_callers(op)]
    for kind, words in _CALLER_KINDS:
        if any(_match(e.name, words) for e in chain):
            return kind
    for kind, words in _OWN_KINDS:
        if _match(name, words) or (op is not None and _match(op.name, words)):
            return kind
    if name.startswith("aten::") or (op is not None and op.name.startswith("aten::")):
        return "elementwise"
    return (
        "elementwise"
        if _match(name, ("elementwise", "reduce", "norm", "softmax", "triton_"))
        else "other"
    )


def _within(kernel, spans) -> bool:
    return any(start <= kernel.time_range.start < end for start, end in spans)


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering the same time."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(merged) -> float:
    return sum(b - a for a, b in merged)


def _minus(a, b) -> list[tuple[float, float]]:
    """The parts of merged intervals `a` that no interval of merged `b` covers."""
    out, j = [], 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


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
    measurement stands either way."""
    device = trainer.device
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
        return
    first = trainer.steps_done - len(step_ms) + 1
    for i, (ms, data) in enumerate(zip(step_ms, data_ms, strict=True)):
        log.add(first + i, "diagnose", ms, data)
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
    record.diagnosis = judge(diagnosis, Setting.of(spec, device.type, matmul_emulated, used))


METHODS = {
    True: "torch.profiler: union of CUDA kernel intervals over each step's synced wall time",
    False: "torch.profiler: aten operator self time less the no-arithmetic floor, over wall time",
}
