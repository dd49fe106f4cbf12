"""Data parallelism: which process this is, how the ranks agree, and what DDP needs from the loop.

A data-parallel job is N processes (ranks), one per device, that train one model in lockstep.
Two launchers start them:
- torchrun: `torchrun --standalone --nproc_per_node=N -m nanogpt.run ...` by hand, or the job
  process's own `torchrun -m nanogpt.runner.worker JOB_DIR point` for dist.nproc=N. It exports RANK,
  LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT to every rank.
- submitit with tasks_per_node=N (hydra/launcher=slurm or local): every task is a rank, and
  `adopt_submitit_tasks()` exports the same variables from submitit's job environment.
Without these variables this is a world of one and every method is a no-op, so the training loop
reads the same either way.

Rank 0 leads: it decides what to measure, writes the record and logs. The other ranks follow
(nanogpt/runner/worker.py `follow`): they receive the point from rank 0 (`share`), measure it in
lockstep, and write nothing to the job dir.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import inspect
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch

# torch is imported by the methods that use it, not here: a sweep's own process reads World
# from its environment and, for a single-rank point on the CPU, never needs torch (validate/).

# How long a collective waits for every rank before it fails (the process group's timeout): a
# rank lost without closing its connections (a node down, a network cut) fails the point within
# this, instead of hanging it until the job's time limit. A rank that dies on a live node closes
# its sockets and its peers fail at once. It bounds how long ranks wait for each other, e.g. for
# rank 0's calibration (hardware.calibrate) before the first step. Stated in every
# data-parallel record (dist_timeout_s).
TIMEOUT_S = 90.0
_rank_nodes: list[str | None] = []  # each rank's SLURM node, in rank order (World.init)


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @classmethod
    def from_env(cls) -> World:
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            size=int(os.environ.get("WORLD_SIZE", 1)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested: torch.device) -> torch.device:
        """One GPU per process: cuda becomes this rank's GPU among those it can see (all of the
        node's under torchrun; often just one under SLURM, which may bind a GPU to each task)."""
        if requested.type == "cuda" and self.size > 1:
            import torch

            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return requested

    def init(self) -> None:
        """Join the job's process group (rendezvous at MASTER_ADDR:MASTER_PORT).

        One group, two transports chosen by a tensor's device: NCCL carries CUDA tensors (DDP's
        gradient all-reduce), gloo carries CPU tensors and pickled objects (the point, the stop
        flag, step times). Without CUDA, gloo carries everything. It does not depend on
        bench.device, so a rank can join before it knows the point it will measure. Across
        nodes the same: MASTER_ADDR is the first node's name (submitit), which every node
        resolves. Once joined, the ranks tell each other their SLURM node (`rank_nodes`).
        """
        if self.size == 1:
            return
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            backend = "cpu:gloo,cuda:nccl"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=TIMEOUT_S))
        # SLURMD_NODENAME: the node as SLURM names it (every node of a cluster on one machine
        # has the machine's hostname)
        _rank_nodes[:] = self.gather(os.environ.get("SLURMD_NODENAME"))

    def shutdown(self) -> None:
        if self.size == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def exit(self, code: int) -> NoReturn:
        """End this rank's process with `code`, its work done and recorded.

        In a world of one: sys.exit. Otherwise the process group is destroyed (after success
        alone: after a failure a peer may still be stuck in a collective, which gloo's
        destructor would wait for), the exit's handlers run (logging's flush, W&B's, the
        files' and the launcher's) and the process ends without the interpreter's teardown.
        That teardown can abort a rank that did all its work: gloo's worker threads outlive
        destroy_process_group (DDP's reducer keeps the group alive from C++), and one that
        releases a finished collective's tensor while Python finalizes asks for the GIL, is
        ended by the interpreter and calls std::terminate ("terminate called without an active
        exception", SIGABRT; PyTorch issue 190489). On a loaded machine it took one torchrun
        run in about ten (torch 2.11, 2 ranks, 2 cores).
        """
        if self.size == 1:
            sys.exit(code)
        if code == 0:
            self.shutdown()
        atexit._run_exitfuncs()  # what a normal exit would run first (CPython's own hook)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        # Every rank builds the same buffers (the causal mask): broadcasting them from rank 0
        # at every forward, DDP's default, would only add a collective to each step. torch 2.13
        # names that switch forward_sync_buffers, and warns at the old name on every rank.
        known = inspect.signature(DistributedDataParallel).parameters
        switch = "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"
        return DistributedDataParallel(model, device_ids=ids, **{switch: False})

    def sync_grads(self, model: torch.nn.Module, last_micro_step: bool):
        """Skip DDP's gradient all-reduce on all but the last micro-step of accumulation: the
        gradients accumulate locally and are averaged across ranks once per optimizer step."""
        if self.size > 1 and not last_micro_step:
            return model.no_sync()
        return contextlib.nullcontext()

    def share(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank (the others pass anything, e.g. None)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if it is True on any rank."""
        if self.size == 1:
            return flag
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def gather(self, values: Any) -> list:
        """Every rank's value (a list of step times, a node's name), on every rank, in rank
        order."""
        if self.size == 1:
            return [values]
        import torch.distributed as dist

        out: list = [None] * self.size
        dist.all_gather_object(out, values)
        return out


def rank_nodes() -> list[str | None]:
    """Each rank's SLURM node, in rank order, as the ranks told each other when they joined
    (World.init); empty in a world of one or before joining."""
    return list(_rank_nodes)


def slowest_per_step(per_rank: list[list[float]]) -> list[float]:
    """Per step, the slowest rank's time: a data-parallel step ends when every rank's does (the
    gradient all-reduce waits for the last one), so that is the job's step time."""
    return [max(times) for times in zip(*per_rank, strict=True)]


def adopt_submitit_tasks() -> bool:
    """Make this submitit task a rank when its job has several tasks (tasks_per_node or nodes
    > 1): export RANK, WORLD_SIZE, MASTER_ADDR... from submitit's job environment, the
    variables torchrun would set. True if it did.

    GPUs stay as SLURM made them visible (`World.device` picks this rank's among them).
    """
    if "SUBMITIT_EXECUTOR" not in os.environ or "WORLD_SIZE" in os.environ:
        return False
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if JobEnvironment().num_tasks == 1:
        return False
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True
