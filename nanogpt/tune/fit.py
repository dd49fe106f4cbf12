"""Which candidates fit before they run: the analytic memory estimate against the device's
budget (nanogpt/train/memory_estimate.py estimate_memory, the same figure a record's mem_estimate
is).

The budget is bench.max_batch_memory_gib when set, else the memory of the device the points will
run on: a CUDA GPU's total as NVML reports it for that very GPU (devices.nvml_handle, matched by
UUID: an NVML index names another GPU under CUDA_VISIBLE_DEVICES, SLURM or MIG), a CPU's RAM
available when the search starts. The GPU is asked in a child process (`python -m
nanogpt.tune.fit DEVICE`): its UUID comes from CUDA, and the sweep's process must hold no CUDA
context (it would take memory on the GPU it measures for the whole search, and be one more
process on that GPU). Where that figure is not known (no NVML, no CUDA here, or the points run
on another machine: a SLURM launcher from a login node) the budget is unknown, with why, and
nothing is pruned by the estimate: never another device's memory.

An estimate past the budget prunes the candidate before any process starts; one within it that
still runs out of memory is recorded `oom` and told to the search as infeasible (a constraint).
Where the built-in GPT's estimate is known to read low (compiled, away from the depth its fit
was measured at: train/gpt.py away_from_fit), the candidate must fit the budget less that error
(`error_margin`: 14.3 % of it in compile's default mode, 19.5 % under CUDA graphs, the largest
errors a GPU measured there; docs/measurement.md), so that a shallow model's batch that would
run out of memory is pruned rather than run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import psutil
import torch
from torch.overrides import TorchFunctionMode

from nanogpt.config.spec import RunSpec
from nanogpt.hardware.devices import nvml_handle, resolve_device
from nanogpt.train.gpt import GPT, away_from_fit
from nanogpt.train.memory_estimate import estimate_of, graph_mode
from nanogpt.train.trainer import gpt_config

GIB = 2**30
ASK_GPU_TIMEOUT_S = 120  # a child imports torch and starts CUDA: seconds, more on a busy node


@dataclass(frozen=True)
class Budget:
    bytes: int | None  # None: unknown, nothing is pruned by estimate
    source: str  # where the figure comes from, or why there is none ("unknown: ...")


def device_budget(device: str, budget_gib: float | None, here: bool = True) -> Budget:
    """The memory a candidate's estimate is held against. here=False: the points run on another
    machine (presets.runs_here), whose memory this one cannot read."""
    if budget_gib is not None:
        return Budget(int(budget_gib * GIB), "bench.max_batch_memory_gib")
    if not here:
        return Budget(None, "unknown: the points run on other machines (the launcher's)")
    if device.startswith("cuda") or (device == "auto" and torch.version.cuda is not None):
        answer = _ask_child(device)  # (`auto` with a torch built without CUDA: the CPU, or MPS)
        if answer["cuda"]:  # a CUDA device: its GPU's memory, or unknown, never the host's RAM
            if answer["bytes"] is None:
                return Budget(None, f"unknown: {answer['why']}")
            return Budget(answer["bytes"], answer["why"])
    return Budget(psutil.virtual_memory().available, "RAM available at the search's start")


def unknown_line(budget: Budget) -> str | None:
    """The one line the search says when its budget is unknown, or None."""
    if budget.bytes is not None:
        return None
    return (
        f"tune: memory budget {budget.source}; no candidate is pruned before it runs (set "
        "bench.max_batch_memory_gib to the memory of the points' device, in GiB, to prune)"
    )


def gpu_memory(device: str) -> dict:
    """What the child answers (run in this process it would start CUDA here): whether `device`
    is a CUDA device in this process (`auto`: the run's own choice, devices.resolve_device), and
    its GPU's total memory by NVML, the handle matched by UUID (a MIG slice's own memory), or
    None and why."""
    if device == "auto":
        if resolve_device(device).type != "cuda":
            return {"cuda": False}
    elif not torch.cuda.is_available():
        return {"cuda": True, "bytes": None, "why": "CUDA is not available here"}
    handle, which = nvml_handle(resolve_device(device))
    if handle is None:
        return {"cuda": True, "bytes": None, "why": which}
    import pynvml  # nvml_handle found it and initialised NVML

    total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    return {"cuda": True, "bytes": total, "why": f"the GPU's memory (NVML, {which})"}


def _ask_child(device: str) -> dict:
    """gpu_memory(device), answered by a fresh interpreter with this process's environment
    (CUDA_VISIBLE_DEVICES included: the GPU the points will see)."""
    command = [sys.executable, "-m", "nanogpt.tune.fit", device]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=ASK_GPU_TIMEOUT_S)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        why = f"the GPU's memory was not read in {ASK_GPU_TIMEOUT_S} s"
    except (ValueError, IndexError):  # no JSON line: the child failed
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"the GPU's memory was not read (exit {done.returncode}: {last[:200]})"
    return {"cuda": True, "bytes": None, "why": why}  # which device is not known either


def estimate_bytes(spec: RunSpec) -> int | None:
    """The point's training memory per rank, bytes: the model is built on the meta device
    (shapes only) for its exact parameter counts. None for a user's model (model.build): the
    search's process never imports the user's code (train/user_model.py), and the built-in GPT's
    estimate is not the user's model's, so nothing is pruned by estimate."""
    if spec.model.build:
        return None
    with torch.device("meta"), _ShapesOnly():
        model = GPT(gpt_config(spec))
    return estimate_of(spec, model, spec.dist.nproc, spec.dist.strategy.value)["total"]


class _ShapesOnly(TorchFunctionMode):
    """On the meta device a tensor is a shape, and the estimate reads only the parameters'
    shapes: the calls that would compute values of their input's shape are skipped, the input
    returned as it is (torch.nn.init's public fills: normal_, zeros_, kaiming_uniform_, ...; the
    manual attention's causal mask, tril). Run, each goes through torch's reference kernels,
    whose first call imports torch._dynamo: a second of the search's own work, before its first
    candidate can launch, or between two batches (benchmarks/search_slots.py). Every other call
    runs as it would."""

    SAME_SHAPE = frozenset({torch.tril, torch.triu, torch.Tensor.tril, torch.Tensor.triu})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        fill = getattr(func, "__module__", None) == "torch.nn.init" and name[-1:] == "_" != name[:1]
        if fill or func in self.SAME_SHAPE:
            return args[0] if args else kwargs.get("tensor", kwargs.get("input"))
        return func(*args, **kwargs)


def error_margin(spec: RunSpec) -> tuple[float, str] | None:
    """The fraction of the budget a candidate's estimate must leave free for the estimate's own
    error, and why: where the built-in GPT's fit is known to read low (train/gpt.py
    away_from_fit), the largest error a GPU measured at such a point; None elsewhere."""
    if spec.model.build:
        return None
    return away_from_fit(spec.model.n_layer, spec.perf.compile, graph_mode(spec))


def misfit(
    estimate: int | None, budget: Budget, margin: tuple[float, str] | None = None
) -> str | None:
    """Why a candidate cannot fit (the estimate against the budget, less `margin`'s fraction for
    the estimate's error: error_margin), or None (None too when either is unknown)."""
    if budget.bytes is None or estimate is None:
        return None
    fraction = margin[0] if margin else 0.0
    if estimate <= (1 - fraction) * budget.bytes:
        return None
    less = f" less {fraction:.1%} for the estimate's error ({margin[1]})" if margin else ""
    return (
        f"estimated {estimate / GIB:.3g} GiB > budget {budget.bytes / GIB:.3g} GiB "
        f"({budget.source}){less}"
    )


def within_margin(used_bytes: int | None, budget: Budget, margin: float) -> bool:
    """Whether a point's footprint (tune/objectives.footprint_bytes) leaves `margin` (a
    fraction) of the budget free: the winner must, so that a batch that only just fitted is
    never recommended."""
    if used_bytes is None or budget.bytes is None:
        return True
    return used_bytes <= (1 - margin) * budget.bytes


if __name__ == "__main__":  # the child of _ask_child: one JSON line on stdout
    print(json.dumps(gpu_memory(sys.argv[1])))
