"""The peak FLOP/s that MFU divides by, and a record of the environment a run measured in.

MFU (model FLOPs utilisation) is achieved FLOP/s over peak FLOP/s, so the peak has to be the right
one for the device *and* the math mode. A peak comes from one of these sources (`Peak.source`):

- "datasheet": a table of NVIDIA's published figures, looked up by the exact string that
  `torch.cuda.get_device_name()` returns;
- "cpu-estimate": cores x clock x FLOP per cycle, worked out from the CPU's SIMD flags;
- "override": `hardware.peak_tflops=...` given by the user, which always wins;
- "calibrated": the achievable matmul peak measured on this machine (nanogpt/calibrate.py), used
  as `peak_tflops` only when none of the above exists (an unknown GPU, a CPU without an
  estimate, MPS): then `mfu` and `mfu_achievable` are the same number;
- "unknown": none of the above; MFU is then recorded as null rather than guessed.

`peak_source` always describes `peak_tflops`. The calibrated figure also appears on its own, as
`achievable_tflops` beside it, whatever `peak_source` says.

Every figure here is DENSE. NVIDIA prints most tensor-core rates "with sparsity" (2:4 structured
sparsity, which doubles the rate); dense training never gets that factor, so those prints are
halved. A table entry that lacks a dtype means the GPU has no hardware path for it (V100 and T4
have no bf16 or tf32 tensor cores) and the lookup answers None instead of inventing a rate.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import socket
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from nanogpt.errors import ConfigError

# The math modes a run can ask for (see config.Dtype): true fp32, TF32 matmuls, and bf16/fp16
# autocast.
DTYPES = ("fp32", "tf32", "bf16", "fp16")

SOURCES = ("datasheet", "cpu-estimate", "override", "calibrated", "unknown")


# --------------------------------------------------------------------------------------------
# GPU datasheet table
# --------------------------------------------------------------------------------------------


def _without_sparsity(printed_tflops: float) -> float:
    """Halve a rate printed "with sparsity" (marked * in the datasheet) to get the dense one."""
    return printed_tflops / 2


# TFLOP/s by GPU model and dtype. "fp32" is the plain CUDA-core FP32 rate (TF32 off); the others
# are tensor-core rates. Each comment names the source and quotes the figures as printed there.
#
# GeForce and RTX workstation cards print two 16-bit tensor rates: FP16 *accumulate* and the
# (on GeForce, halved) FP32 accumulate. PyTorch's matmuls accumulate in FP32, so that is the
# column used for them.
_GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet: the same figures for SXM4 and PCIe, 40 and 80 GB:
    # FP32 19.5 | TF32 156 (312*) | BF16 312 (624*) | FP16 312 (624*).
    "A100 SXM": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    "A100 PCIe": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column:
    # FP32 67 | TF32 989* | BF16 1,979* | FP16 1,979*.
    "H100 SXM": {
        "fp32": 67,
        "tf32": _without_sparsity(989),
        "bf16": _without_sparsity(1979),
        "fp16": _without_sparsity(1979),
    },
    # Same datasheet, H100 PCIe column: FP32 51 | TF32 756* | BF16 1,513* | FP16 1,513*.
    "H100 PCIe": {
        "fp32": 51,
        "tf32": _without_sparsity(756),
        "bf16": _without_sparsity(1513),
        "fp16": _without_sparsity(1513),
    },
    # Same datasheet, H100 NVL column (per GPU, current edition): FP32 60 | TF32 835* |
    # BF16 1,671* | FP16 1,671*. The launch edition printed the NVLink-bridged *pair* instead
    # (FP32 134, BF16 3,958*); one CUDA device is one GPU, so the per-GPU figures are used.
    "H100 NVL": {
        "fp32": 60,
        "tf32": _without_sparsity(835),
        "bf16": _without_sparsity(1671),
        "fp16": _without_sparsity(1671),
    },
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (same compute as H100 SXM, more
    # and faster memory): FP32 67 | TF32 989* | BF16 1,979* | FP16 1,979*.
    "H200 SXM": {
        "fp32": 67,
        "tf32": _without_sparsity(989),
        "bf16": _without_sparsity(1979),
        "fp16": _without_sparsity(1979),
    },
    # Same datasheet, H200 NVL column: FP32 60 | TF32 835* | BF16 1,671* | FP16 1,671*.
    "H200 NVL": {
        "fp32": 60,
        "tf32": _without_sparsity(835),
        "bf16": _without_sparsity(1671),
        "fp16": _without_sparsity(1671),
    },
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 | TF32 120* | BF16 242* | FP16 242*.
    "L4": {
        "fp32": 30.3,
        "tf32": _without_sparsity(120),
        "bf16": _without_sparsity(242),
        "fp16": _without_sparsity(242),
    },
    # NVIDIA L40S datasheet (prints dense | sparse): FP32 91.6 | TF32 183 | 366* |
    # BF16 362.05 | 733* | FP16 362.05 | 733*.
    "L40S": {"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05},
    # NVIDIA L40 datasheet (dense | sparse): FP32 90.5 | TF32 90.5 | 181* |
    # BF16 181.05 | 362.1* | FP16 181.05 | 362.1*.
    "L40": {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05},
    # NVIDIA A10 Tensor Core GPU datasheet (dense | sparse): FP32 31.2 | TF32 62.5 | 125* |
    # BF16 125 | 250* | FP16 125 | 250*.
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125},
    # A10G (AWS G5 only): NVIDIA publishes no datasheet, so these are LESS CERTAIN. Baseten's
    # "NVIDIA A10 vs A10G for ML model inference" tabulates FP32 35 | TF32 35 | BF16/FP16 70
    # TFLOPS: the GA102 GeForce pattern (FP32-accumulate tensor math at half rate) rather than
    # the A10's. A public matmul benchmark of an A10G (zzc0721/torch-performance-test-data
    # issue #126) reached 69.5 TFLOP/s bf16 and 34.7 tf32, which fits 70/35 and not 125/62.5.
    "A10G": {"fp32": 35, "tf32": 35, "bf16": 70, "fp16": 70},
    # NVIDIA Tesla V100 datasheet, SXM2 column: single precision 15.7 | tensor 125 (mixed FP16
    # multiply with FP32 accumulate; Volta has no sparsity, no bf16 and no tf32).
    "V100 SXM2": {"fp32": 15.7, "fp16": 125},
    # Same datasheet, PCIe column: single precision 14 | tensor 112.
    "V100 PCIe": {"fp32": 14, "fp16": 112},
    # NVIDIA V100S datasheet (PCIe): single precision 16.4 | tensor 130.
    "V100S PCIe": {"fp32": 16.4, "fp16": 130},
    # NVIDIA T4 datasheet: single precision 8.1 | mixed precision (FP16/FP32) 65. Turing has no
    # bf16 or tf32.
    "T4": {"fp32": 8.1, "fp16": 65},
    # NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix "GeForce RTX 3090":
    # FP32 35.6 | TF32 35.6/71* | BF16 (FP32 acc.) 71/142* | FP16 with FP32 accumulate 71/142*
    # (FP16 accumulate, which PyTorch does not use, is 142/284*).
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71},
    # Same whitepaper, appendix "RTX A6000": FP32 38.7 | TF32 77.4/154.8* |
    # BF16 154.8/309.7* | FP16 with FP32 accumulate 154.8/309.7*.
    "RTX A6000": {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8},
    # NVIDIA Ada GPU Architecture whitepaper, GeForce RTX 4090 column: FP32 82.6 |
    # TF32 82.6/165.2* | BF16 165.2/330.4* | FP16 with FP32 accumulate 165.2/330.4*.
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    # Same whitepaper, RTX 6000 Ada Generation column: FP32 91.1 | TF32 182.1/364.2* |
    # BF16 364.2/728.5* | FP16 with FP32 accumulate 364.2/728.5*.
    "RTX 6000 Ada": {"fp32": 91.1, "tf32": 182.1, "bf16": 364.2, "fp16": 364.2},
}

# How a device-name string maps to a table row. Rules are tried in order and the first match
# wins, so a specific rule must come before a general one ("H100 ... NVL" before plain "H100").
# Names are upper-cased first, so the patterns are too.
#
# \b (a word boundary) is what keeps look-alikes apart: in "L40S" there is no boundary after
# "L4" or "L40", so r"\bL4\b" cannot match it; likewise "A10G" vs "A10" vs "A100", and "GH200"
# (a Grace Hopper superchip, not in the table) vs "H200". GeForce names are anchored at the end
# ($) so that "RTX 3090 Ti", "RTX 4090 D" and "RTX 4090 Laptop GPU" (other chips, other clocks)
# fall through to None.
_GPU_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    # The SXM part reports itself as "NVIDIA H100 80GB HBM3" (the PCIe card uses HBM2e). A bare
    # "H100" matches nothing: PCIe is 24% below SXM, too big a difference to guess across.
    (r"\bH100\b.*\b(SXM|HBM3)", "H100 SXM"),
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    # The SXM part reports itself simply as "NVIDIA H200".
    (r"\bH200\b", "H200 SXM"),
    (r"\bA100\b.*\bPCIE\b", "A100 PCIe"),
    # "NVIDIA A100-SXM4-40GB", "...-80GB", and any A100 that names no form factor: the A100
    # datasheet gives SXM4 and PCIe identical peaks, so this choice only affects the label.
    (r"\bA100\b", "A100 SXM"),
    (r"\bL40S\b", "L40S"),
    (r"\bL40\b", "L40"),
    (r"\bL4\b", "L4"),
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bV100S\b", "V100S PCIe"),
    # "Tesla V100-SXM2-16GB" / "-32GB". SXM3 (DGX-2) and bare "V100" names match nothing.
    (r"\bV100\b.*\bSXM2\b", "V100 SXM2"),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
    (r"\bT4\b", "T4"),
    (r"\bRTX 3090$", "RTX 3090"),
    (r"\bRTX 4090$", "RTX 4090"),
    (r"\bRTX A6000$", "RTX A6000"),
    (r"\bRTX 6000 ADA\b", "RTX 6000 Ada"),
)


def gpu_model(device_name: str) -> str | None:
    """The table row for a CUDA device name ("NVIDIA H100 PCIe" -> "H100 PCIe"); None if unknown."""
    name = device_name.strip().upper()
    for pattern, model in _GPU_NAME_RULES:
        if re.search(pattern, name):
            return model
    return None


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense datasheet peak in FLOP/s for a CUDA device name; None if unknown or unsupported."""
    _check_dtype(dtype)
    model = gpu_model(device_name)
    if model is None:
        return None
    tflops = _GPU_PEAK_TFLOPS[model].get(dtype)
    return None if tflops is None else tflops * 1e12


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


# --------------------------------------------------------------------------------------------
# CPU estimate
# --------------------------------------------------------------------------------------------
#
# A CPU publishes no single peak figure, so we build one from its parts:
#
#     peak = physical cores x max clock (Hz) x FLOP per cycle per core
#
# FLOP per cycle for fp32 = SIMD lanes x 2 if the CPU has FMA (a fused multiply-add is two
# FLOPs) x the number of FMA units a core can feed each cycle. The lanes come from the widest
# vector extension /proc/cpuinfo lists: AVX-512 registers hold 16 fp32 values, AVX2 8, SSE 4.
#
# Assumption: AVX2 and AVX-512 cores have 2 FMA units. That holds for Intel server cores since
# Haswell/Skylake-SP and for AMD Zen 2-4 at 256 bits, but some parts have only one 512-bit unit
# (lower-bin Xeons, and Zen 4 splits a 512-bit op into two 256-bit halves). Together with the
# max clock (often a single-core turbo that wide vector code does not sustain), this makes the
# estimate an upper bound, so CPU MFU errs low rather than high.

_SIMD_LANES_FP32 = (("avx512f", 16), ("avx2", 8), ("sse", 4))

# Native low-precision math, in FLOP per cycle per core:
# - AMX (amx_bf16, and amx_fp16 on Granite Rapids): one tile-multiply unit per core, which
#   Intel's AMX overview rates at 1,024 BF16 FLOP/cycle (vs 64 for fp32 AVX-512 with 2 FMAs).
#   We assume the same for FP16 tiles.
# - AVX512_BF16 (VDPBF16PS) and AVX512_FP16: twice the fp32 lanes per 512-bit register at the
#   same instruction rate, so 2x the fp32 FLOP/cycle.
# Without these, PyTorch's CPU autocast converts to fp32 to do the math: there is no honest
# bf16/fp16 peak to quote, so the estimate is None.
_AMX_FLOP_PER_CYCLE = 1024
_LOW_PRECISION_FLAGS = {
    "bf16": ("amx_bf16", "avx512_bf16"),
    "fp16": ("amx_fp16", "avx512_fp16"),
}


def cpu_flop_per_cycle(flags: set[str], dtype: str) -> int | None:
    """FLOP per cycle per core for a set of /proc/cpuinfo flags; None if there is no native path."""
    _check_dtype(dtype)
    if dtype == "tf32":
        return None  # TF32 is a CUDA tensor-core mode; CPUs have no such thing.
    fp32 = _fp32_flop_per_cycle(flags)
    if fp32 is None or dtype == "fp32":
        return fp32
    amx_flag, avx512_flag = _LOW_PRECISION_FLAGS[dtype]
    if amx_flag in flags:
        return _AMX_FLOP_PER_CYCLE
    if avx512_flag in flags:
        return 2 * fp32
    return None


def _fp32_flop_per_cycle(flags: set[str]) -> int | None:
    lanes = next((n for flag, n in _SIMD_LANES_FP32 if flag in flags), None)
    if lanes is None:
        return None  # Not an x86 SIMD we know (e.g. ARM, whose cpuinfo has no such flags).
    # Every AVX-512 CPU has FMA even if an odd hypervisor hides the separate "fma" flag.
    has_fma = "fma" in flags or "avx512f" in flags
    wide = "avx2" in flags or "avx512f" in flags
    return lanes * (2 if has_fma else 1) * (2 if wide else 1)


def cpu_peak_estimate(dtype: str) -> float | None:
    """Estimated peak FLOP/s of this machine's CPUs; None where it cannot honestly be estimated."""
    per_cycle = cpu_flop_per_cycle(_cpu_flags(), dtype)
    cores = _physical_cores()
    clock_hz = _max_clock_hz()
    if per_cycle is None or cores is None or clock_hz is None:
        return None
    return float(cores * clock_hz * per_cycle)


def cpu_model_name() -> str:
    """E.g. "Intel(R) Xeon(R) Platinum 8480+"; falls back to what `platform` knows."""
    name = _cpuinfo().get("model name") or _macos_cpu_brand() or platform.processor()
    return name or platform.machine() or "unknown CPU"


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo as key -> value; {} where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if info:
                break  # One block is enough: all cores of a machine report the same features.
            continue
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def _cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def _physical_cores() -> int | None:
    try:
        cores = psutil.cpu_count(logical=False)
    except Exception:
        cores = None
    # Without a physical count, the logical one (which counts SMT siblings twice) at least keeps
    # the estimate an upper bound.
    return cores or os.cpu_count()


def _max_clock_hz() -> float | None:
    """Max clock from psutil, else the "cpu MHz" of /proc/cpuinfo (a current, not max, clock)."""
    try:
        freq = psutil.cpu_freq()
        mhz = freq.max if freq else 0.0
    except Exception:
        mhz = 0.0
    if not mhz:  # Many VMs expose no cpufreq driver, so psutil reports max=0.
        try:
            mhz = float(_cpuinfo().get("cpu MHz", 0))
        except ValueError:
            mhz = 0.0
    return mhz * 1e6 if mhz > 0 else None


def _macos_cpu_brand() -> str | None:
    """E.g. "Apple M2 Pro"; macOS has no /proc/cpuinfo and platform.processor() says only "arm"."""
    if sys.platform != "darwin":
        return None
    return _run(["sysctl", "-n", "machdep.cpu.brand_string"])


# --------------------------------------------------------------------------------------------
# Choosing the peak for a run
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU divides by, and where that number came from (one of SOURCES)."""

    flops: float | None
    source: str

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"Peak.source must be one of {SOURCES}, got {self.source!r}")


def resolve_peak(
    device_type: str,
    device_name: str,
    dtype: str,
    override_tflops: float | None = None,
    calibrated_flops: float | None = None,
) -> Peak:
    """The peak for one run: the user's override, else the datasheet (cuda) or estimate (cpu),
    else the calibrated (measured) matmul peak."""
    _check_dtype(dtype)
    if override_tflops is not None:
        if override_tflops <= 0:
            raise ConfigError("hardware.peak_tflops", "must be positive", "give TFLOP/s or null")
        return Peak(override_tflops * 1e12, "override")
    if device_type == "cuda":
        flops, source = peak_flops(device_name, dtype), "datasheet"
    elif device_type == "cpu":
        flops, source = cpu_peak_estimate(dtype), "cpu-estimate"
    else:
        flops, source = None, "unknown"
    if flops is None and calibrated_flops is not None:
        flops, source = calibrated_flops, "calibrated"
    if flops is None:
        warnings.warn(
            f"No peak FLOP/s known for {device_type} device {device_name!r} at {dtype}, so MFU "
            "will be null; set hardware.peak_tflops=<TFLOP/s> to supply one, or "
            "hardware.calibrate=true to measure one.",
            stacklevel=2,
        )
        return Peak(None, "unknown")
    return Peak(flops, source)


def device_name(device: torch.device | str) -> str:
    """A human-readable name for the device a run trains on (the key the peak lookup uses)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_model_name()
    if device.type == "mps":
        return f"Apple MPS ({cpu_model_name()})"
    return device.type


# --------------------------------------------------------------------------------------------
# Environment record
# --------------------------------------------------------------------------------------------
#
# Stored with every result so a number can be traced to the software and hardware that made it.
# Each probe is guarded: a missing driver or a tarball checkout must cost a None, not the run.

_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def environment() -> dict:
    """Versions, devices, CPU, host and git state as a JSON-ready dict. Never raises."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=_PROJECT_ROOT)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _guarded(torch.backends.cudnn.version),
        "nvidia_driver": nvidia_driver(),
        "device_count": _guarded(torch.cuda.device_count) or 0,
        "gpu_names": _guarded(_gpu_names) or [],
        "cpu_model": _guarded(cpu_model_name),
        "cpu_logical_cores": _guarded(os.cpu_count),
        "cpu_physical_cores": _guarded(_physical_cores),
        "torch_threads": _guarded(torch.get_num_threads),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": _guarded(socket.gethostname),
        "git_commit": commit,
        "git_dirty": _git_dirty() if commit else None,  # dirty relative to a commit
    }


def _guarded(probe):
    """probe(), or None if it raises: one failed probe must not lose the whole record."""
    try:
        return probe()
    except Exception:
        return None


def _gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def nvidia_driver() -> str | None:
    """Driver version via NVML (the nvidia-ml-py package); None without an NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # No package, no libnvidia-ml.so, or no driver loaded.
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _git_dirty() -> bool | None:
    """True if tracked files differ from HEAD; None if git cannot tell.

    --no-optional-locks stops `git status` from rewriting the index while we only look, so it
    cannot collide with a git command someone runs in the same checkout. Untracked files
    (outputs, caches) do not count as dirty.
    """
    status = _run(
        ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
        cwd=_PROJECT_ROOT,
        keep_empty=True,
    )
    return None if status is None else status != ""


def _run(cmd: list[str], cwd: Path | None = None, keep_empty: bool = False) -> str | None:
    """A short command's stripped stdout; None if it fails, times out or prints nothing."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    if done.returncode != 0 or (not out and not keep_empty):
        return None
    return out
