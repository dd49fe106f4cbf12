"""Which candidates fit before they run: the analytic memory estimate against the device's
budget (nanogpt/measure/memory.py estimate_memory, the same figure a record's mem_estimate is).

The budget is bench.max_batch_memory_gib when set, else the device's memory: a CUDA GPU's total
as NVML reports it (the sweep's process must not initialise CUDA: its points are forked from
it), a CPU's RAM available when the search starts. An estimate past the budget prunes the
candidate before any process starts; one within it that still runs out of memory is recorded
`oom` and told to the search as infeasible (a constraint).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from nanogpt.measure.memory import estimate_of
from nanogpt.measure.trainer import gpt_config
from nanogpt.model import GPT
from nanogpt.spec import RunSpec

GIB = 2**30


@dataclass(frozen=True)
class Budget:
    bytes: int | None  # None: unknown, nothing is pruned by estimate
    source: str


def device_budget(device: str, budget_gib: float | None) -> Budget:
    if budget_gib is not None:
        return Budget(int(budget_gib * GIB), "bench.max_batch_memory_gib")
    if device.startswith("cuda") or device == "auto":
        total = _nvml_total(int(device.partition(":")[2] or 0))
        if total is not None:
            return Budget(total, "the GPU's memory (NVML)")
        if device != "auto":
            return Budget(None, "unknown: NVML does not answer")
    return Budget(psutil.virtual_memory().available, "RAM available at the search's start")


def _nvml_total(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU: the budget falls back to RAM or unknown
        return None


def estimate_bytes(spec: RunSpec) -> int:
    """The point's training memory per rank, bytes: the model is built on the meta device
    (shapes only) for its exact parameter counts."""
    with torch.device("meta"):
        model = GPT(gpt_config(spec))
    return estimate_of(spec, model, spec.dist.nproc, spec.dist.strategy.value)["total"]


def misfit(estimate: int, budget: Budget) -> str | None:
    """Why a candidate cannot fit (the estimate against the budget), or None."""
    if budget.bytes is None or estimate <= budget.bytes:
        return None
    return (
        f"estimated {estimate / GIB:.3g} GiB > budget {budget.bytes / GIB:.3g} GiB "
        f"({budget.source})"
    )


def within_margin(used_bytes: int | None, budget: Budget, margin: float) -> bool:
    """Whether a point's footprint (tune/objectives.footprint_bytes) leaves `margin` (a
    fraction) of the budget free: the winner must, so that a batch that only just fitted is
    never recommended."""
    if used_bytes is None or budget.bytes is None:
        return True
    return used_bytes <= (1 - margin) * budget.bytes
