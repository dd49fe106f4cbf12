"""The device a run trains on, and what it can do: which device `auto` means, how to wait for
queued work, and which math modes (config.Dtype) the device runs natively.

The precision rules live here once: validate.py turns a reason into a one-line config error,
hardware/calibration.py skips a dtype that has one, and the trainer and the calibration set up
the math mode the same way.
"""

from __future__ import annotations

import contextlib

import torch

from nanogpt.config import Dtype

# bf16/fp16 train under torch.autocast to these dtypes; fp32/tf32 keep fp32 tensors.
AUTOCAST_DTYPES = {Dtype.bf16: torch.bfloat16, Dtype.fp16: torch.float16}
# Native bf16 and TF32 tensor-core math arrived with Ampere (compute capability 8.0). Older
# GPUs run bf16 only by emulation, which torch.cuda.is_bf16_supported() counts as support.
AMPERE = (8, 0)


def resolve_device(name: str) -> torch.device:
    """`auto` is the best device here (cuda, then mps, then cpu); any other name as given."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on the device (used outside the measured loop only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def precision_unavailable(device: torch.device, dtype: Dtype) -> str | None:
    """Why `device` has no native path for `dtype`; None when it has one."""
    if dtype is Dtype.tf32 and device.type != "cuda":
        return f"TF32 is a CUDA tensor-core mode, not available on {device.type}"
    if device.type == "cuda" and dtype in (Dtype.tf32, Dtype.bf16):
        capability = torch.cuda.get_device_capability(device)
        if capability < AMPERE:
            name = torch.cuda.get_device_name(device)
            return (
                f"{name} (compute capability {capability[0]}.{capability[1]}) has no native "
                f"{dtype.value}: it needs compute capability 8.0 (Ampere) or newer"
            )
    return None


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
