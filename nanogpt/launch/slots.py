"""Where each of a sweep's side-by-side points runs (hydra/launcher=parallel): its slot.

A slot is one GPU (CUDA_VISIBLE_DEVICES names it, so the point sees one device) with a share
of the host's cores, or on a CPU-only machine a set of cores. Every slot's process is pinned to
its cores (sched_setaffinity, inherited by the fork server it starts and every point forked
from it) and torch uses as many threads as the slot has cores (OMP_NUM_THREADS for the
processes it starts, torch.set_num_threads here). Points in different slots still share memory
bandwidth, caches, PCIe and the host: records list their neighbours (launch/placement.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nanogpt.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    cores: tuple[int, ...]
    gpu: str | None = None  # a CUDA device index or UUID, as CUDA_VISIBLE_DEVICES takes it

    def describe(self) -> str:
        where = f"GPU {self.gpu}, " if self.gpu is not None else ""
        return f"{where}cores {','.join(map(str, self.cores))}"


def host_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def plan(
    points: int,
    cores: list[int],
    gpus: list[str],
    slots: int | None = None,
    cores_per_slot: int | None = None,
) -> list[Slot]:
    """The slots for `points` points: one per GPU when there are GPUs, else `slots` sets of
    `cores_per_slot` cores (by default one core each, at most one slot per point)."""
    if gpus:
        count = min(len(gpus), slots or len(gpus), points)
        share = max(1, len(cores) // count)
        return [
            Slot(tuple(cores[i * share : (i + 1) * share]) or (cores[0],), gpus[i])
            for i in range(count)
        ]
    per = cores_per_slot or (len(cores) // slots if slots else 1)
    count = slots or len(cores) // per
    if per < 1 or count < 1 or count * per > len(cores):
        raise ConfigError(
            "hydra.launcher.slots",
            f"{count} slot(s) of {per} core(s) need {count * per} cores; this process may use "
            f"{len(cores)} ({','.join(map(str, cores))})",
            "lower hydra.launcher.slots or hydra.launcher.cores_per_slot",
        )
    count = min(count, points)
    return [Slot(tuple(cores[i * per : (i + 1) * per])) for i in range(count)]


def enter(slot: Slot) -> None:
    """Make this process (a slot's, before it runs any point) live in its slot."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, slot.cores)
    threads = str(len(slot.cores))
    os.environ["OMP_NUM_THREADS"] = threads
    os.environ["MKL_NUM_THREADS"] = threads
    if slot.gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    import torch

    torch.set_num_threads(len(slot.cores))


def visible_gpus() -> list[str]:
    """The GPUs this process may use, without touching CUDA (a process that initialised CUDA
    must not fork, and the launcher forks its slots): CUDA_VISIBLE_DEVICES, else nvidia-smi's
    list, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines())
    return [str(i) for i in range(count)]
