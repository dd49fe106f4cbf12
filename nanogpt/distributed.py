"""Data parallelism under torchrun: which process this is, and what DDP needs from the loop.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE. Without them this is a world of one and every
method is a no-op, so the training loop reads the same either way.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
        """One GPU per process: cuda becomes cuda:LOCAL_RANK."""
        if requested.type == "cuda" and self.size > 1:
            return torch.device("cuda", self.local_rank)
        return requested

    def init(self, device: torch.device) -> None:
        """NCCL between GPUs, gloo between CPU processes."""
        if self.size > 1 and not dist.is_initialized():
            if device.type == "cuda":
                torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    def shutdown(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if self.size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def sync_grads(self, model: torch.nn.Module, last_micro_step: bool):
        """Skip DDP's gradient all-reduce on all but the last micro-step of accumulation."""
        if self.size > 1 and not last_micro_step:
            return model.no_sync()
        return contextlib.nullcontext()

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's list, on every rank."""
        if self.size == 1:
            return [values]
        out: list = [None] * self.size
        dist.all_gather_object(out, values)
        return out

    def slowest_per_step(self, step_ms: list[float]) -> list[float]:
        """Per step, the slowest rank's time: a data-parallel step ends when all ranks do."""
        per_rank = self.gather(step_ms)
        return [max(times) for times in zip(*per_rank, strict=True)]
