"""The matmul FLOP/s a device achieves: timing F.linear over a small search of shapes.

What is timed is the matmul training runs. Every nn.Linear calls F.linear(x, W) with W stored as
(out_features, in_features). Under torch.autocast (bf16/fp16) autocast casts x and W down and
dispatches that same aten::linear -> aten::mm to the low-precision kernel; we time exactly that
call with the operands already cast, because the casts are elementwise work with no matmul FLOPs.
fp32 and tf32 run under the matmul-precision settings training uses (devices.matmul_precision).
An (M, K) input times an (N, K) weight is 2*M*N*K FLOPs: a multiply and an add per term.

How: per shape, one warm-up call (kernel selection, page faults, GPU clock ramp-up), then up to
MAX_TRIALS trials, each timed by perf_counter between two device synchronizations and repeating
the call until it lasts about TRIAL_S (so a short GPU matmul is not drowned by the sync). The
fastest trial counts, since noise only ever slows a trial down. A time budget per dtype (BUDGET_S,
warm-ups included) is shared by the shapes and bounds the search.
"""

from __future__ import annotations

import datetime
import math
import time

import torch
import torch.nn.functional as F

from nanogpt.config.spec import Dtype
from nanogpt.hardware.devices import AUTOCAST_DTYPES, matmul_precision, synchronize

OP = "F.linear(x[M,K], W[N,K]) in the compute dtype, as nn.Linear under autocast; 2*M*N*K FLOPs"
CLOCK = "perf_counter+synchronize, fastest trial"

Shape = tuple[int, int, int]  # (M, N, K): an (M, K) input times an (N, K) weight

# The searches: ladders of growing shapes, climbed until the rate has stopped rising (by more
# than PLATEAU) for PATIENCE shapes in a row, the operands no longer fit, or BUDGET_S is spent.
# On 2 CPU cores a 2048^3 fp32 matmul takes ~50 ms. On an H100 bf16 reached 772.7 TFLOP/s at
# 6144^3 and about 798 at 8192^3 (2026-11-23): the plateau lies at 8192 or beyond, so the
# ladder goes on to 16384^3 while the rate rises.
CPU_SHAPES: tuple[Shape, ...] = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 1024, 4096))
CUDA_SHAPES: tuple[Shape, ...] = (
    (4096, 4096, 4096),
    (6144, 6144, 6144),
    (8192, 8192, 8192),
    (12288, 12288, 12288),
    (16384, 16384, 16384),
)
PLATEAU = 0.01  # a shape less than 1 % faster than the best so far is a flat step
# Flat steps in a row that end the climb. One is not a plateau: on an H100, 6144^3 ran within
# 1 % of 4096^3 and 8192^3 about 3 % above both, so stopping at the first flat step read the
# ceiling 3 % low (and mfu_achievable 3 % high).
PATIENCE = 2
MEMORY_SHARE = 0.5  # a shape's operands (and their fp32 sources) may take this much free memory
BUDGET_S = 8.0  # per dtype, warm-ups included
MAX_TRIALS = 10
TRIAL_S = 0.05  # a trial repeats the call until it lasts about this long


def _seconds_per_call(call, calls: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def linear_flops(device: torch.device, dtype: Dtype, shape: Shape, seconds: float) -> float:
    """Best FLOP/s of one F.linear shape in one dtype, searched for about `seconds`."""
    m, n, k = shape
    compute_dtype = AUTOCAST_DTYPES.get(dtype, torch.float32)
    x = torch.randn(m, k, device=device).to(compute_dtype)
    w = torch.randn(n, k, device=device).to(compute_dtype)

    def call():
        return F.linear(x, w)

    deadline = time.perf_counter() + seconds
    best = math.inf
    with matmul_precision(dtype):  # fp32/tf32 exactly as a training run sets them
        per_call = _seconds_per_call(call, 1, device)  # warm-up
        for _ in range(MAX_TRIALS):
            calls = max(1, math.ceil(TRIAL_S / per_call))
            per_call = _seconds_per_call(call, calls, device)
            best = min(best, per_call)
            if time.perf_counter() > deadline:
                break
    return 2 * m * n * k / best


def measure(
    device: torch.device,
    dtype: Dtype,
    shapes: tuple[Shape, ...],
    budget_s: float,
    bar=None,
    rate=linear_flops,
) -> dict:
    """The cache entry of one dtype: the best rate over `shapes`, and every shape's rate.
    `rate(device, dtype, shape, seconds)` is the FLOP/s of one shape (linear_flops)."""
    started = time.perf_counter()
    by_shape: dict[str, float] = {}
    stopped = "the last shape"
    flat = 0  # flat steps in a row
    for i, shape in enumerate(shapes):
        if by_shape and not fits(device, shape):
            stopped = f"{shape_name(shape)} does not fit in memory"
            break
        left = started + budget_s - time.perf_counter()
        if by_shape and left <= 0:
            stopped = "the time budget"
            break
        best_so_far = max(by_shape.values(), default=0.0)
        by_shape[shape_name(shape)] = rate(device, dtype, shape, left / (len(shapes) - i))
        if bar is not None:
            bar.set_postfix(dtype=dtype.value, best_tflops=f"{max(by_shape.values()) / 1e12:.3f}")
            bar.update(1)
        if len(by_shape) < 2:
            continue
        flat = flat + 1 if by_shape[shape_name(shape)] < best_so_far * (1 + PLATEAU) else 0
        if flat >= PATIENCE:
            stopped = f"a plateau: {PATIENCE} shapes in a row not {PLATEAU:.0%} faster"
            break
    best = max(by_shape, key=by_shape.get)
    return {
        "stopped_at": stopped,
        "tflops": by_shape[best] / 1e12,
        "shape": best,
        "by_shape_tflops": {name: flops / 1e12 for name, flops in by_shape.items()},
        "seconds": time.perf_counter() - started,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "op": OP,
        "clock": CLOCK,
    }


def fits(device: torch.device, shape: Shape) -> bool:
    """Whether a shape's operands fit in MEMORY_SHARE of the device's free memory (CUDA; on
    CPU the ladder is short enough for any machine that runs the model)."""
    if device.type != "cuda":
        return True
    m, n, k = shape
    free, _ = torch.cuda.mem_get_info(device)
    # x and W made in fp32, then cast; the output in the compute dtype (at most fp32)
    need = (m * k + n * k) * 4 * 2 + m * n * 4
    return need <= free * MEMORY_SHARE


def shape_name(shape: Shape) -> str:
    return "x".join(map(str, shape))


def default_shapes(device: torch.device) -> tuple[Shape, ...]:
    """The search for the device type."""
    return CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES
