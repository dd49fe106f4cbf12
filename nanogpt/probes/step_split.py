"""The step split: a list of profiled events in, the shares of a step's wall time out.

Pure arithmetic over torch.profiler's `FunctionEvent`s (probes/diagnose.py records them and
says what each share means); nothing here runs the profiler, so every branch, the CUDA one
included, can be checked on any machine with events built by hand.

Each diagnosed step runs inside a marker (`nanogpt::step`), so the marker's length is the step's
wall time on the profiler's clock; batches are fetched inside a second marker (`nanogpt::data`).
The wall time is split four ways, summing to 1: device, communication, data and host (the rest).

On CUDA, Kineto also emits a `gpu_user_annotation` event of CUDA type for every
`record_function` range (our two markers, `Optimizer.step#...`): it spans the range on the GPU
timeline, idle gaps included, and is no kernel (`FunctionEvent.is_user_annotation`; PyTorch
drops them from its own device totals since pytorch/pytorch#130732). They are left out here, or
the step's own range would count as device time and every CUDA point would read device-bound.

A kernel is tied to the operator that launched it by `linked_correlation_id` (the operator's
correlation id). `FunctionEvent` carries that attribute only in newer torch (pytorch/pytorch
#177662, 2026); probes/diagnose.py copies it from Kineto's own events where it is missing.
An attribute still missing raises `ProfilerAttributeMissing`, which the diagnosis records as
null figures with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from torch.autograd import DeviceType

from nanogpt.analysis.bottleneck import KINDS


class ProfilerAttributeMissing(Exception):
    """This torch's profiler events lack an attribute the split needs (named in the message)."""


# The attributes the CUDA branch reads beyond the ones every supported torch has.
CUDA_ATTRIBUTES = ("linked_correlation_id", "is_user_annotation")


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


def split_step(events: Iterable, cuda: bool, skip: int = 0) -> dict:
    """The four shares of the step, the device time by kind, and the ops a step (see
    probes/diagnose.py),
    over the marked steps but the first `skip`: the first step under a profiler pays for
    setting it up (CUPTI's activity buffers, on CUDA), which is no part of a step."""
    events = list(events)
    steps = [e for e in events if e.name == STEP_MARK and e.device_type == DeviceType.CPU]
    steps = sorted(steps, key=lambda e: e.time_range.start)[skip:]
    if not steps:
        raise RuntimeError("the profiler recorded no diagnosed step")
    inside_by_step = [_descendants(s) for s in steps]
    by_kind = dict.fromkeys(KINDS, 0.0)
    figures: dict = {"diag_op_floor_us": None}
    if cuda:
        _require(events, CUDA_ATTRIBUTES)
        wall = sum(e.time_range.elapsed_us() for e in steps)
        inside = [e for found in inside_by_step for e in found]
        data = [e for e in inside if e.name == DATA_MARK]
        data_spans = _merge((e.time_range.start, e.time_range.end) for e in data)
        # Operators (correlation id = their own id) that launched kernels; the runtime's launch
        # calls carry the operator's id as their link instead, and are left out.
        ops = {e.id: e for e in inside if e.linked_correlation_id == 0}
        spans = [(s.time_range.start, s.time_range.end) for s in steps]
        kernels = [k for k in events if _is_kernel(k) and _within(k, spans)]
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
        ops_by_step = [_cpu_ops(found) for found in inside_by_step]
        floor = op_floor_us([op for ops in ops_by_step for op in ops])
        typical = _typical_cpu_step(
            [
                _cpu_pieces(*each, floor)
                for each in zip(steps, inside_by_step, ops_by_step, strict=True)
            ]
        )
        # The typical step's figures, times the steps, so the shares below read as CUDA's do.
        for kind, cost in zip(typical.kinds, typical.costs, strict=True):
            by_kind[kind] += cost * len(steps)
        wall = typical.wall * len(steps)
        comm_us = by_kind["communication"]
        device_us = sum(by_kind.values()) - comm_us
        data_us = typical.data * len(steps)
        count = typical.aten * len(steps)
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


def _cpu_ops(inside: list) -> list:
    """The operators a CPU step (`inside`: its events) counts, in the order they started:
    aten's, compiled graphs' calls and collectives, less those the batch source ran."""
    ops = [op for op in inside if op.name.startswith(CPU_WORK) or _is_comm(op.name)]
    ops = [op for op in ops if not any(p.name == DATA_MARK for p in _callers(op))]
    return sorted(ops, key=lambda op: (op.time_range.start, -op.time_range.end))


@dataclass
class _CpuStep:
    """One CPU step in pieces. `costs`: each operator's time above the floor (its arithmetic),
    of the kind in `kinds`; `spans`: the step's wall time cut where its outermost operators
    start and end (the gaps between them, host time, and their lengths), which add up to the
    step; `data`: the time the batch source ran; `shape`: what must match for two steps to be
    compared piece by piece (each operator's name and whether it is outermost)."""

    shape: tuple
    costs: list[float]
    kinds: list[str]
    spans: list[float]
    data: float
    aten: float

    @property
    def wall(self) -> float:
        return sum(self.spans)


def _cpu_pieces(step, inside: list, ops: list, floor: float) -> _CpuStep:
    """`step`'s pieces, from its events (`inside`) and the operators it counts (`ops`)."""
    ids = {op.id for op in ops}
    outermost = [not any(p.id in ids for p in _callers(op)) for op in ops]
    costs = []
    for op in ops:
        # An operator's fixed cost (dispatch, bookkeeping) is host work; collectives are
        # waited for whole, and a compiled graph's call is one call.
        whole = _is_comm(op.name) or op.name.startswith(COMPILED_GRAPH)
        costs.append(max(0.0, op.self_cpu_time_total - (0.0 if whole else floor)))
    edges = [step.time_range.start]
    for op, outer in zip(ops, outermost, strict=True):
        edges += [op.time_range.start, op.time_range.end] if outer else []
    edges.append(step.time_range.end)
    data = [(e.time_range.start, e.time_range.end) for e in inside if e.name == DATA_MARK]
    return _CpuStep(
        shape=tuple(zip((op.name for op in ops), outermost, strict=True)),
        costs=costs,
        kinds=[_kind(op.name, op.cpu_parent) for op in ops],
        spans=[max(0.0, b - a) for a, b in pairwise(edges)],
        data=_length(_merge(data)),
        aten=sum(1 for op in ops if op.name.startswith("aten::")),
    )


def _typical_cpu_step(steps: list[_CpuStep]) -> _CpuStep:
    """The step undisturbed: each piece's least time over the steps.

    A CPU step shares its core with whatever else the machine runs; the time another process
    takes the core is added to whichever piece was running, an operator (counted as arithmetic)
    or a gap between operators (host). One such preemption, a few ms, outweighs a small model's
    whole step, and summed over the steps it decides the verdict (a tiny model read device-bound
    on a busy machine). Others' work only ever adds time, so, as timeit keeps the least of its
    repeats, each piece keeps its least time over the steps that ran the same operators in the
    same order: a preemption hits one piece of one step and is gone. Steps that differ (a
    recompile, a step that ran other operators) cannot be matched and are averaged whole."""
    first = steps[0]
    if all(s.shape == first.shape for s in steps):
        return _CpuStep(
            shape=first.shape,
            costs=[min(c) for c in zip(*(s.costs for s in steps), strict=True)],
            kinds=first.kinds,
            spans=[min(t) for t in zip(*(s.spans for s in steps), strict=True)],
            data=min(s.data for s in steps),
            aten=first.aten,
        )
    n = len(steps)
    return _CpuStep(
        shape=(),
        costs=[c / n for s in steps for c in s.costs],
        kinds=[k for s in steps for k in s.kinds],
        spans=[s.wall / n for s in steps],
        data=sum(s.data for s in steps) / n,
        aten=sum(s.aten for s in steps) / n,
    )


def _require(events: list, names: tuple[str, ...]) -> None:
    """Raise ProfilerAttributeMissing naming the first of `names` the events lack."""
    for name in names:
        if events and not hasattr(events[0], name):
            raise ProfilerAttributeMissing(f"FunctionEvent.{name}")


def _is_kernel(event) -> bool:
    """A device event that is work: of CUDA type and no `record_function` range's shadow."""
    return event.device_type == DeviceType.CUDA and not event.is_user_annotation


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
