"""A CPU's peak FLOP/s, estimated from its parts, and its model name.

A CPU publishes no single peak figure, so we build one from its parts:

    peak = usable cores x max clock (Hz) x FLOP per cycle per core

Usable cores are the fewest of: physical cores, the CPUs this process may run on (its
affinity), the CPU quota of its cgroup (containers, SLURM), and the threads torch computes with.

FLOP per cycle for fp32 = SIMD lanes x 2 if the CPU has FMA (a fused multiply-add is two
FLOPs) x the number of FMA units a core can feed each cycle. The lanes come from the widest
vector extension /proc/cpuinfo lists: AVX-512 registers hold 16 fp32 values, AVX2 8, SSE 4.

Assumption: AVX2 and AVX-512 cores have 2 FMA units. That holds for Intel server cores since
Haswell/Skylake-SP and for AMD Zen 2-4 at 256 bits. AMD Zen 4 (family 19h, the first AMD cores
with AVX-512) runs each 512-bit op as two 256-bit halves on its 256-bit units (AMD's Zen 4
software optimization guide), so it is counted at AVX2's width: 32 fp32 FLOP/cycle, not 64.
Some Intel parts have only one 512-bit unit (lower-bin Xeons); with the max clock (often a
single-core turbo that wide vector code does not sustain), this keeps the estimate an upper
bound, so CPU MFU errs low rather than high. One exception: a VM that exposes no max clock
(no cpufreq driver) leaves only its nominal clock, which a boosting core exceeds (a 2.6 GHz
EPYC VM measured 1.1x its one-core estimate); max_clock() says which clock it is.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil

from nanogpt.config.spec import Dtype

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
    Dtype.bf16: ("amx_bf16", "avx512_bf16"),
    Dtype.fp16: ("amx_fp16", "avx512_fp16"),
}


def cpu_flop_per_cycle(
    flags: set[str], dtype: Dtype, avx512_on_256_bit_units: bool = False
) -> int | None:
    """FLOP per cycle per core for a set of /proc/cpuinfo flags; None if there is no native path."""
    dtype = Dtype(dtype)
    if dtype is Dtype.tf32:
        return None  # TF32 is a CUDA tensor-core mode; CPUs have no such thing.
    fp32 = _fp32_flop_per_cycle(flags)
    if fp32 is not None and avx512_on_256_bit_units and "avx512f" in flags:
        fp32 //= 2
    if fp32 is None or dtype is Dtype.fp32:
        return fp32
    amx_flag, avx512_flag = _LOW_PRECISION_FLAGS[dtype]
    if amx_flag in flags:
        return _AMX_FLOP_PER_CYCLE
    if avx512_flag in flags:
        return 2 * fp32
    return None


def matmul_emulated(dtype: Dtype, flags: set[str] | None = None) -> str | None:
    """Why this CPU has no native matmul for a 16-bit `dtype`: one sentence naming the flags it
    lacks and the 16-bit dtype it does run natively, if any. None for fp32, for a native
    dtype, and where the flags say nothing (not x86: unknown, not guessed)."""
    flags = _cpu_flags() if flags is None else flags
    dtype = Dtype(dtype)
    if dtype not in _LOW_PRECISION_FLAGS or _fp32_flop_per_cycle(flags) is None:
        return None
    if cpu_flop_per_cycle(flags, dtype) is not None:
        return None
    native = [d.value for d in _LOW_PRECISION_FLAGS if cpu_flop_per_cycle(flags, d) is not None]
    lacking = " or ".join(_LOW_PRECISION_FLAGS[dtype])
    also = f"; {', '.join(native)} is native here" if native else ""
    return f"{dtype.value} matmuls are emulated on this CPU (no {lacking} flag){also}"


def _fp32_flop_per_cycle(flags: set[str]) -> int | None:
    lanes = next((n for flag, n in _SIMD_LANES_FP32 if flag in flags), None)
    if lanes is None:
        return None  # Not an x86 SIMD we know (e.g. ARM, whose cpuinfo has no such flags).
    # Every AVX-512 CPU has FMA even if an odd hypervisor hides the separate "fma" flag.
    has_fma = "fma" in flags or "avx512f" in flags
    wide = "avx2" in flags or "avx512f" in flags
    return lanes * (2 if has_fma else 1) * (2 if wide else 1)


def cpu_peak_estimate(dtype: Dtype) -> float | None:
    """Estimated peak FLOP/s of this machine's CPUs; None where it cannot honestly be estimated."""
    per_cycle = cpu_flop_per_cycle(_cpu_flags(), dtype, _splits_avx512(_cpuinfo()))
    cores = usable_cores()
    clock_hz, _ = max_clock()
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


def _splits_avx512(info: dict[str, str]) -> bool:
    """AMD family 19h with AVX-512 is Zen 4, which executes 512-bit ops on 256-bit units."""
    return info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25"


def usable_cores() -> int | None:
    """The cores a run can compute on: the fewest of physical cores, this process's CPU
    affinity, its cgroup's CPU quota and torch's threads."""
    import torch  # the threads torch's kernels use; imported here: torch is heavy to import

    limits = [physical_cores(), _affinity(), _cgroup_cpus(), torch.get_num_threads()]
    known = [n for n in limits if n]
    return min(known) if known else None


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def _cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """CPUs the cgroup quota allows (rounded up), from cgroup v2's cpu.max ("200000 100000":
    quota and period in us) or v1's cfs files; None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return max(1, -(-int(quota) // int(period)))  # ceil
    except (ValueError, ZeroDivisionError):
        return None


def physical_cores() -> int | None:
    try:
        cores = psutil.cpu_count(logical=False)
    except Exception:
        cores = None
    # Without a physical count, the logical one (which counts SMT siblings twice) at least keeps
    # the estimate an upper bound.
    return cores or os.cpu_count()


def max_clock() -> tuple[float | None, bool]:
    """(clock in Hz, whether it is the max clock). psutil's max clock (cpufreq) where there is
    one; else the "cpu MHz" of /proc/cpuinfo, a current clock: in a VM (many expose no cpufreq
    driver, so psutil reports max=0) that is the host's nominal clock, which a boosting core
    exceeds, so an estimate built on it is no upper bound (False)."""
    try:
        freq = psutil.cpu_freq()
        mhz = freq.max if freq else 0.0
    except Exception:
        mhz = 0.0
    if mhz > 0:
        return mhz * 1e6, True
    try:
        mhz = float(_cpuinfo().get("cpu MHz", 0))
    except ValueError:
        mhz = 0.0
    return (mhz * 1e6 if mhz > 0 else None), False


def _macos_cpu_brand() -> str | None:
    """E.g. "Apple M2 Pro"; macOS has no /proc/cpuinfo and platform.processor() says only "arm"."""
    if sys.platform != "darwin":
        return None
    return run_command(["sysctl", "-n", "machdep.cpu.brand_string"])


def run_command(cmd: list[str], cwd: Path | None = None, keep_empty: bool = False) -> str | None:
    """A short command's stripped stdout; None if it fails, times out or prints nothing."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    if done.returncode != 0 or (not out and not keep_empty):
        return None
    return out
