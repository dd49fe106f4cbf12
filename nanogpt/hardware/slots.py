"""Where each of a sweep's side-by-side points runs (hydra/launcher=parallel): its slot.

The points' device decides the kind of slot: points that train on CUDA get one GPU each
(CUDA_VISIBLE_DEVICES names it, so the point sees one device: a card, or under MIG one of its
instances) with a share of the host's cores. An index in CUDA_VISIBLE_DEVICES counts in CUDA's
order, fastest card first, unless CUDA_DEVICE_ORDER=PCI_BUS_ID; nvidia-smi numbers cards in PCI
order. So a slot's environment names its order beside its card (`Slot.order`): PCI_BUS_ID for a
card from nvidia-smi's listing, the sweep's own order for one from its CUDA_VISIBLE_DEVICES. On
a host of mixed GPUs the card a slot's label and its record's gpu_set name is then the one its
points run on. CPU points (and MPS ones) get a set of cores, GPUs or not. Every slot's process
is pinned to its cores (sched_setaffinity, inherited by the fork server it starts and every
point forked from it) and torch uses as many threads as the slot has cores (OMP_NUM_THREADS,
read when torch is imported; torch.set_num_threads where it already is). Points in different
slots still share memory bandwidth, caches, PCIe and the host: records list their neighbours
(runner/placement.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from nanogpt.config.errors import ConfigError
from nanogpt.hardware.device_support import parse_device

# What null means for each count (ParallelLauncherConf), for the refusal's fix.
COUNTS = {"slots": "one slot per GPU or core set", "cores_per_slot": "the cores split evenly"}


# CUDA's orders of devices (the CUDA C Programming Guide, "CUDA Environment Variables"): an
# index in CUDA_VISIBLE_DEVICES counts in the order CUDA_DEVICE_ORDER names, FASTEST_FIRST when
# it is unset; nvidia-smi (and NVML) number cards in PCI_BUS_ID order.
PCI_ORDER = "PCI_BUS_ID"
CUDA_DEFAULT_ORDER = "FASTEST_FIRST"


@dataclass(frozen=True)
class Slot:
    cores: tuple[int, ...]
    gpu: str | None = None  # a CUDA device index or UUID, as CUDA_VISIBLE_DEVICES takes it
    order: str = PCI_ORDER  # CUDA_DEVICE_ORDER, in which an index `gpu` counts (gpu_order)

    def describe(self) -> str:
        where = f"GPU {self.gpu}, " if self.gpu is not None else ""
        return f"{where}cores {','.join(map(str, self.cores))}"


def check_counts(**counts) -> None:
    """hydra.launcher.slots and cores_per_slot are null or a count of at least 1: 0 slots would
    run nothing, and a slot of 0 cores could not be pinned."""
    for key, value in counts.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"hydra.launcher.{key}",
                f"is {value!r}, not a count of at least 1",
                f"give a positive whole number, or null for {COUNTS[key]}",
            )


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
    """The slots for `points` points: one per GPU when there are GPUs (gpus_for: only for CUDA
    points), else `slots` sets of `cores_per_slot` cores (by default one core each), at most
    one slot per point."""
    check_counts(slots=slots, cores_per_slot=cores_per_slot)
    if gpus:
        count = min(len(gpus), slots or len(gpus), points)
        share = max(1, len(cores) // count)
        order = gpu_order()
        return [
            Slot(tuple(cores[i * share : (i + 1) * share]) or (cores[0],), gpus[i], order)
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
    if slot.gpu is not None:  # the card, and the order its index counts in (never CUDA's
        os.environ["CUDA_DEVICE_ORDER"] = slot.order  # default by accident: module docstring)
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu
    torch = sys.modules.get("torch")  # not imported yet: it reads OMP_NUM_THREADS when it is
    if torch is not None:
        torch.set_num_threads(len(slot.cores))


def gpus_for(devices: Iterable[str]) -> list[str]:
    """The GPUs to plan slots on: those visible when a point trains on CUDA (`cuda`, `cuda:N`,
    or `auto` where torch finds CUDA, as the point will: devices.resolve_device), none otherwise:
    CPU points take core sets, GPUs or not. Asking torch is safe here: the launcher's slots are
    children of the sweep's fork server (or fresh interpreters where there is none), never forks
    of this process, so they inherit no CUDA state (frontend/launchers/parallel.py)."""
    names = set(devices)
    cuda = any((place := parse_device(name)) and place.type == "cuda" for name in names)
    if not cuda and "auto" not in names:
        return []
    gpus = visible_gpus()
    if gpus and not cuda:
        import torch  # for `auto`; the sweep's check has imported it to resolve `auto` too

        return gpus if torch.cuda.is_available() else []
    return gpus


def gpu_order() -> str:
    """The CUDA_DEVICE_ORDER in which visible_gpus' indices count: the sweep's own (CUDA's
    default, FASTEST_FIRST, when unset) where CUDA_VISIBLE_DEVICES named them, as its indices
    meant there; else PCI_BUS_ID, the order of nvidia-smi's listing they were read from."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return os.environ.get("CUDA_DEVICE_ORDER", CUDA_DEFAULT_ORDER)
    return PCI_ORDER


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them, without
    touching CUDA: CUDA_VISIBLE_DEVICES itself, else nvidia-smi's list, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return listed_gpus(listed.stdout)


_CARD = re.compile(r"GPU (\d+):")
_MIG = re.compile(r"\s*MIG .*\(UUID: (MIG-[^)\s]+)\)")


def listed_gpus(listing: str) -> list[str]:
    """The CUDA devices in `nvidia-smi -L`'s listing: a card by its index, or where MIG splits
    a card, each of its instances by UUID (CUDA takes MIG instances by UUID only, and runs
    nothing on the card itself then). The listing reads

        GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d5ba0d6-...)
        GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0c8b1b0a-...)
          MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-...)
          MIG 3g.20gb     Device  1: (UUID: MIG-cba663e8-...)

    which is three devices: 0, MIG-c6d4f1ef-..., MIG-cba663e8-...."""
    cards: list[tuple[str, list[str]]] = []  # (index, its MIG instances)
    for line in listing.splitlines():
        if card := _CARD.match(line):
            cards.append((card[1], []))
        elif (mig := _MIG.match(line)) and cards:
            cards[-1][1].append(mig[1])
    return [device for index, migs in cards for device in (migs or [index])]
