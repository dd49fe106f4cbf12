"""What a device can run, asked without importing torch where the answer needs none.

The precision and attention rules live here once: validate/ turns a reason into a one-line
config error, hardware/calibration.py skips a dtype that has one, and the trainer runs what they
allow. A sweep's own process checks every point before it measures any (validate/), and for a
point on the CPU nothing here imports torch: that process then starts without it (seconds on
two cores), leaving torch to the processes that measure. A CUDA or MPS device is asked through
torch, imported then.

`device` below is a torch.device or a `Place`: anything with `.type` and `.index`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from nanogpt.config.spec import Attention, Dtype

# Native bf16 and TF32 tensor-core math arrived with Ampere (compute capability 8.0). Older
# GPUs run bf16 only by emulation, which torch.cuda.is_bf16_supported() counts as support.
AMPERE = (8, 0)
SIXTEEN_BIT = (Dtype.bf16, Dtype.fp16)  # trained under torch.autocast to that dtype
CUDA_ONLY_ATTENTION = (Attention.efficient, Attention.cudnn)
# The flash and cuDNN SDPA kernels take 16-bit tensors only, on Ampere or newer (PyTorch's
# scaled_dot_product_attention docs); with fp32/tf32 they fail at the first step.
SIXTEEN_BIT_ATTENTION = (Attention.flash, Attention.cudnn)
_NAME = re.compile(r"(?P<type>cpu|cuda|mps)(?::(?P<index>\d+))?")


class Place(NamedTuple):
    """A device by name, as torch.device would read it (type, index), without torch."""

    type: str
    index: int | None = None


def parse_device(name: str) -> Place | None:
    """`cpu`, `cuda`, `cuda:N`, `mps` as a Place; None for any other name."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    index = match["index"]
    return Place(match["type"], None if index is None else int(index))


def _capability(device) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(device.index)


def precision_unavailable(device, dtype: Dtype) -> str | None:
    """Why `device` has no native path for `dtype`; None when it has one."""
    if dtype is Dtype.tf32 and device.type != "cuda":
        return f"TF32 is a CUDA tensor-core mode, not available on {device.type}"
    if device.type == "cuda" and dtype in (Dtype.tf32, Dtype.bf16):
        capability = _capability(device)
        if capability < AMPERE:
            import torch

            name = torch.cuda.get_device_name(device.index)
            return (
                f"{name} (compute capability {capability[0]}.{capability[1]}) has no native "
                f"{dtype.value}: it needs compute capability 8.0 (Ampere) or newer"
            )
    return None


def attention_unavailable(device, attention: Attention, dtype: Dtype) -> str | None:
    """Why the SDPA kernel `attention` cannot run on `device` in `dtype`; None when it can."""
    if attention in CUDA_ONLY_ATTENTION and device.type != "cuda":
        return f"the {attention.value} SDPA kernel exists only on CUDA"
    if device.type != "cuda" or attention not in SIXTEEN_BIT_ATTENTION:
        return None
    if dtype not in SIXTEEN_BIT:
        return f"the {attention.value} SDPA kernel takes bf16/fp16 tensors, not {dtype.value}"
    capability = _capability(device)
    if capability < AMPERE:
        return (
            f"the {attention.value} SDPA kernel needs compute capability 8.0 (Ampere) or newer, "
            f"not {capability[0]}.{capability[1]}"
        )
    return None
