"""The checks that ask this machine's devices: is the device there, how many GPUs, its precision
and attention kernels, fp8's tensor cores, CUDA graphs' warmup.

validate.check runs them only where the point will run here (not for a SLURM node's points). On
a CPU they need no torch (hardware/device_support.py answers); a CUDA, MPS or `auto` device is asked
through torch, imported then.
"""

from __future__ import annotations

from nanogpt.config.errors import ConfigError
from nanogpt.config.protocol import CUDA_GRAPH_MODES, CUDA_GRAPH_WARMUP
from nanogpt.config.spec import Dtype, Fp8, RunSpec
from nanogpt.hardware.device_support import (
    Place,
    attention_unavailable,
    parse_device,
    precision_unavailable,
)


def check_device(name: str) -> Place:
    """The device a run will use (a bare `cuda` is cuda:0, as the run resolves it); fails when
    it is not there."""
    if name == "auto":
        from nanogpt.hardware.devices import (
            resolve_device,  # the run's own choice: cuda, mps, then cpu
        )

        device = resolve_device(name)
        return Place(device.type, device.index)
    place = parse_device(name)
    if place is None:
        import torch

        try:
            torch.device(name)
        except RuntimeError:
            raise ConfigError(
                "bench.device", f"'{name}' is not a device", "use auto, cpu, cuda, cuda:N or mps"
            ) from None
        raise ConfigError("bench.device", f"'{name}' is not supported", "use cpu, cuda or mps")
    if place.type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "bench.device",
                "cuda was asked for but CUDA is not available",
                "use bench.device=cpu",
            )
        if place.index is not None and place.index >= torch.cuda.device_count():
            raise ConfigError(
                "bench.device",
                f"{name} does not exist ({torch.cuda.device_count()} CUDA devices)",
                "pick an index below the device count",
            )
        return Place("cuda", place.index or 0)
    if place.type == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError("bench.device", "mps is not available here", "use bench.device=cpu")
    return place


def check_gpus_per_point(nproc: int, device: Place) -> None:
    """One GPU per rank: more ranks than GPUs would share devices and skew every figure."""
    if device.type != "cuda":
        return
    import torch

    if nproc > torch.cuda.device_count():
        raise ConfigError(
            "dist.nproc",
            f"{nproc} ranks but only {torch.cuda.device_count()} CUDA devices are visible",
            "use at most one rank per GPU",
        )


def check_precision(spec: RunSpec, device: Place) -> None:
    dtype, attention = spec.perf.dtype, spec.perf.attention
    reason = precision_unavailable(device, dtype)
    if reason:
        fix = "use perf.dtype=fp32" if dtype is Dtype.tf32 else "use perf.dtype=fp16 or fp32"
        raise ConfigError("perf.dtype", reason, fix)
    reason = attention_unavailable(device, attention, dtype)
    if reason and device.type != "cuda":
        fix = f"use perf.attention=auto, flash, math or manual on {device.type}"
        raise ConfigError("perf.attention", reason, fix)
    if reason:
        fix = "use perf.dtype=bf16 or fp16 with it, or perf.attention=auto, efficient or math"
        raise ConfigError("perf.attention", reason, fix)


def check_cuda_graph_warmup(spec: RunSpec, device: Place) -> None:
    """reduce-overhead and max-autotune capture CUDA graphs: the first calls of each compiled
    graph run eagerly, the next records the graph, and only later calls replay it. With fewer
    warmup steps the recording would fall into the measured steps."""
    perf, warmup = spec.perf, spec.bench.warmup_steps
    graphs = perf.compile and perf.compile_mode in CUDA_GRAPH_MODES
    if warmup is None:  # auto: the protocol gives the mode what it needs
        return
    if graphs and device.type == "cuda" and warmup < CUDA_GRAPH_WARMUP:
        raise ConfigError(
            "bench.warmup_steps",
            f"is {warmup}, but perf.compile_mode={perf.compile_mode} records CUDA graphs in the "
            f"first {CUDA_GRAPH_WARMUP} steps",
            f"set bench.warmup_steps={CUDA_GRAPH_WARMUP} or more",
        )


# torchao's float8 matmuls (torch._scaled_mm) need float8 tensor cores: Ada and Hopper, 8.9+.
FP8_CAPABILITY = (8, 9)


def check_fp8(spec: RunSpec, device: Place | None) -> None:
    """perf.fp8 runs under bf16 autocast on a CUDA GPU of compute capability 8.9 or more, with
    torchao installed. device None: the checks that need no device (any machine)."""
    fp8 = spec.perf.fp8
    if fp8 is Fp8.none:
        return
    if device is None:
        if spec.perf.dtype is not Dtype.bf16:
            raise ConfigError(
                "perf.fp8",
                f"{fp8.value} runs the other ops under bf16 autocast, not {spec.perf.dtype.value}",
                "set perf.dtype=bf16 with it",
            )
        if not spec.perf.compile:
            # Eager float8 casts and takes amaxes around every matmul unfused: it would compare
            # that overhead with eager bf16, not float8 training (torchtitan: compile required).
            raise ConfigError(
                "perf.fp8",
                f"{fp8.value} without torch.compile runs unfused casts around every matmul",
                "set perf.compile=true with it",
            )
        return
    if device.type != "cuda":
        raise ConfigError(
            "perf.fp8", f"float8 matmuls need a CUDA GPU, not {device.type}", "use perf.fp8=none"
        )
    import torch

    from nanogpt.train.float8 import torchao_missing

    capability = torch.cuda.get_device_capability(device.index)
    if capability < FP8_CAPABILITY:
        raise ConfigError(
            "perf.fp8",
            f"{torch.cuda.get_device_name(device.index)} (compute capability "
            f"{capability[0]}.{capability[1]}) has no float8 tensor cores: it needs 8.9 or newer",
            "use perf.fp8=none",
        )
    missing = torchao_missing()
    if missing:
        raise ConfigError("perf.fp8", missing, "pip install -e '.[fp8]'")
