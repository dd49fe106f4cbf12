"""The largest batch that fits: grow, then bisect, catching out-of-memory.

`bench.find_max_batch=true` runs this search before a point is measured and records the answer
as `max_batch_size`. The point itself is still measured at its configured perf.batch_size, so
every column of its row describes one run; to measure at the found size, rerun the point with
perf.batch_size=<max_batch_size>.

The search doubles the batch, starting at perf.batch_size, until a step fails with OOM, then
bisects between the last size that fitted and the first that did not. It relies on a training
step's memory growing with batch size (activations and logits are linear in it). Each probe is
one real optimizer step (forward, backward, optimizer update: everything a step holds at its
peak) on a model built exactly as the point asks: compile, dtype, attention, checkpointing,
optimizer, data.

The launcher runs the search in a child process of its own (nanogpt/runner/worker.py, task
"max-batch"): its high-water marks (peak RSS, the allocator's cache, the limit below) never
reach the measured run, and a probe that takes the process down costs the search, not the point.

The budget is bench.max_batch_memory_gib, or else all the memory that is free:
- CUDA: the caching allocator is capped with torch.cuda.set_per_process_memory_fraction.
- CPU: Linux overcommits memory, so an allocation past RAM succeeds and the OOM killer SIGKILLs
  the process later, with nothing to catch. The search therefore sets an address-space limit
  (RLIMIT_AS) of the budget above the process's current size, once the code the trainer's build
  imports is loaded (`load_code`): an allocation past it fails at once (ENOMEM), which PyTorch
  raises as an out-of-memory error. Address space is virtual (thread stacks and allocator
  arenas count too), so on CPU the budget errs on the safe side.
  Ranks of one host share its RAM: each rank's default budget is the free RAM / WORLD_SIZE.
- MPS: torch.mps.set_per_process_memory_fraction caps the allocator when a budget is given.
"""

from __future__ import annotations

import gc
import logging
import resource
from collections.abc import Callable

import psutil
import torch

from nanogpt.config.choices import Fp8
from nanogpt.config.spec import RunSpec
from nanogpt.config.target_nodes import import_target
from nanogpt.hardware.devices import synchronize
from nanogpt.probes.memory import release
from nanogpt.record.faults import describe, is_out_of_memory
from nanogpt.train.distributed import World
from nanogpt.train.float8 import torchao_missing
from nanogpt.train.trainer import Trainer, data_source

log = logging.getLogger(__name__)

GIB = 2**30
# glibc malloc settings that make address space track live memory, for the CPU budget (mallopt(3)):
# one arena (each extra thread's arena reserves 64 MiB of address space) and a fixed mmap
# threshold (big blocks get their own mapping, returned to the OS when freed).
GLIBC_MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def search(fits: Callable[[int], bool], start: int) -> int:
    """The largest batch size for which `fits` holds: double from `start` until one does not
    fit, then bisect between the last that fitted and the first that did not (0: not even 1)."""
    fitted, failed = 0, None
    size = start
    while failed is None:
        if fits(size):
            fitted, size = size, size * 2
        else:
            failed = size
    while failed - fitted > 1:
        middle = (fitted + failed) // 2
        if fits(middle):
            fitted = middle
        else:
            failed = middle
    return fitted


class Prober:
    """One model, one optimizer; `fits(b)` runs one optimizer step at batch size b."""

    def __init__(self, spec: RunSpec, device: torch.device, probes: list[dict], limited: bool):
        # A plain Trainer: bench.inject_fault is aimed at the measured run, not at the probes.
        self.spec = spec
        self.world = World()  # one process: DDP's buckets are not part of the search
        self.trainer = Trainer(self.spec, device, self.world)
        self.probes = probes
        self.limited = limited  # under an address-space limit (RLIMIT_AS, CPU)
        self.unexplained: str | None = None  # the first error taken as a batch that did not fit

    def fits(self, batch_size: int) -> bool:
        trainer = self.trainer
        trainer.source = None  # free the last probe's batches before making bigger ones
        try:
            trainer.source = data_source(self.spec, trainer.device, self.world, batch_size)
            trainer.step()
            synchronize(trainer.device)  # a queued kernel's failure surfaces here, not later
            error = None
        except Exception as exc:
            error = describe(exc)
            if not is_out_of_memory(exc):
                # Under the address-space limit a library that allocates on its own can report
                # the refusal in words of its own: oneDNN says "could not create a primitive"
                # (1 search in 12 of tests/test_checkpointing.py's policies, CPU). An error of
                # torch's C++ (a RuntimeError) there is taken as a batch that did not fit, and
                # the answer stands only if a smaller batch ran (run_search).
                if not (self.limited and isinstance(exc, RuntimeError)):
                    raise
                self.unexplained = self.unexplained or error
            # An OOM after GradScaler.unscale_ (fp16: in clipping or the optimizer step) leaves
            # the scaler mid-step; the next probe's unscale_ would refuse to run again.
            trainer.scaler = torch.amp.GradScaler(
                trainer.device.type, enabled=trainer.scaler.is_enabled()
            )
        # Leaving the except block dropped the failed step's frames; free what they held.
        trainer.optimizer.zero_grad(set_to_none=True)
        release(trainer.device)
        self.probes.append({"batch_size": batch_size, "fits": error is None, "error": error})
        log.info("[max-batch] batch %d: %s", batch_size, "fits" if error is None else error)
        return error is None


def apply_budget(device: torch.device, budget_gib: float | None) -> dict:
    """Cap this process's memory at the budget; returns what was capped, and how."""
    budget = int(budget_gib * GIB) if budget_gib is not None else None
    source = "bench.max_batch_memory_gib"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        if budget is None:
            return {"budget_bytes": free, "budget_source": "free device memory", "limit": None}
        torch.cuda.set_per_process_memory_fraction(min(budget / total, 1.0), device)
        return {"budget_bytes": budget, "budget_source": source, "limit": "allocator fraction"}
    if device.type == "mps":
        if budget is None:
            return {"budget_bytes": None, "budget_source": "MPS allocator limit", "limit": None}
        torch.mps.set_per_process_memory_fraction(budget / torch.mps.recommended_max_memory())
        return {"budget_bytes": budget, "budget_source": source, "limit": "allocator fraction"}
    if budget is None:
        budget = psutil.virtual_memory().available // World.from_env().size
        source = "available RAM" + (" / WORLD_SIZE" if World.from_env().size > 1 else "")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = psutil.Process().memory_info().vms + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return {"budget_bytes": budget, "budget_source": source, "limit": "RLIMIT_AS"}


def load_code(spec: RunSpec) -> None:
    """Import, before the budget is set, the code that building the point's trainer imports on
    its way: torch._dynamo (torch.optim's optimizers import it as they are made: about 800
    modules, sympy's and mpmath's among them), torchao for perf.fp8, and the module that
    model.build names (a transformers model's: all of transformers). On CPU the budget is
    address space, and code mapped under it would count as memory the step holds: on the
    policies test's model (3 MiB of weights) the build took 75 MiB of a 0.1 GiB budget, 2 MiB
    once this has run. The budget is then what the model, its optimizer and a step hold."""
    import torch._dynamo  # noqa: F401

    if spec.perf.fp8 is not Fp8.none:
        torchao_missing()  # imports torchao, quietly; the build says if it cannot
    if spec.model.build:
        target = str(spec.model.build.get("_target_"))
        import_target(target, "model.build._target_", spec.model.code_dir)


def run_search(spec: RunSpec, device: torch.device) -> dict:
    """Search in this process; returns the figures for the record."""
    details: dict = {"device": str(device), "start": spec.perf.batch_size, "probes": []}
    found, details["error"] = None, None
    try:
        load_code(spec)
        details.update(apply_budget(device, spec.bench.max_batch_memory_gib))
        prober = Prober(spec, device, details["probes"], details["limit"] == "RLIMIT_AS")
        # What lives through the whole search (torch's modules, torch._dynamo's that the first
        # optimizer imported, the model and optimizer) is moved out of the collector's sight:
        # each probe's release (gc.collect) then walks only what the probe made, where it
        # walked all of torch's objects, 0.2 s a probe on 2 CPU cores (a search of 10 probes:
        # 2 s). The fork server does the same (runner/forkserver_preload.py).
        gc.freeze()
        found = search(prober.fits, spec.perf.batch_size)
        if found == 0 and prober.unexplained:  # no batch ran: the error is the point's own
            found, details["error"] = None, prober.unexplained
    except Exception as exc:
        details["error"] = describe(exc)
        if is_out_of_memory(exc):
            found = 0  # the model and optimizer alone do not fit
    return {"max_batch_size": found, "max_batch_search": details}
