"""The device a run trains on: which device `auto` means, how to wait for queued work, its
NVML handle, and the math mode (config.Dtype) set up the same way by the trainer and the
calibration. Which modes a device runs natively is hardware/device_support.py's (no torch needed
there).
"""

from __future__ import annotations

import contextlib

import torch

from nanogpt.config.spec import Dtype
from nanogpt.hardware.device_support import SIXTEEN_BIT

# bf16/fp16 train under torch.autocast to these dtypes; fp32/tf32 keep fp32 tensors.
AUTOCAST_DTYPES = {Dtype.bf16: torch.bfloat16, Dtype.fp16: torch.float16}
assert set(AUTOCAST_DTYPES) == set(SIXTEEN_BIT)


def resolve_device(name: str) -> torch.device:
    """`auto` is the best device here (cuda, then mps, then cpu); any other name as given, but a
    bare `cuda` becomes `cuda:0`, the first GPU this process sees (what `cuda` means in a fresh
    process). The calls that pin a process to its GPU, torch.cuda.set_device and the
    allocator's memory fraction, refuse a CUDA device without an index."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        else:
            name = "mps" if torch.backends.mps.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    return device


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on the device (used outside the measured loop only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def nvml_handle(device: torch.device) -> tuple[object | None, str | None]:
    """The NVML handle of a CUDA device and which device it is, matched by UUID.

    NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES, while CUDA numbers the
    visible ones fastest first: an index would read another GPU (under SLURM, another job's).
    The UUID names the same device in both. A MIG slice is looked up as such; where the driver
    gives no handle for it, the parent GPU's figures would be all there is, so none is used.
    (None, why) when there is no handle.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception as exc:  # no driver, no library
        return None, f"no NVML ({type(exc).__name__})"
    for prefix in ("GPU-", "MIG-"):
        name = uuid if uuid.startswith(prefix) else prefix + uuid
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name), name
        except Exception:
            continue
    return None, f"NVML has no device with UUID {uuid}"


def set_matmul_precision(dtype: Dtype) -> None:
    """TF32 only when asked: with dtype=fp32 every matmul is true fp32."""
    tf32 = dtype is Dtype.tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


@contextlib.contextmanager
def matmul_precision(dtype: Dtype):
    """set_matmul_precision for the code inside, the previous settings restored afterwards."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    set_matmul_precision(dtype)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])
