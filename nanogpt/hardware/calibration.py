"""Calibration: the matmul FLOP/s this machine actually achieves, per dtype, cached per machine.

A datasheet peak is a ceiling no training job reaches, and a CPU has no datasheet at all (its
clock-based estimate can even sit *below* what a plain matmul measures). So, as the "maximum
achievable matmul FLOPS" (MAMF) finder of Stas Bekman's *Machine Learning Engineering* does, we
time large matmuls over a small search of shapes (hardware/matmul.py) and keep the best rate per
dtype. MFU against it (`mfu_achievable`) answers "how far from what this machine can actually
do"; `mfu`, against `peak_tflops`, still answers "how far from the spec sheet" (peaks.py).

Which dtypes: fp32, bf16 and fp16 wherever the device runs them natively; tf32 only on CUDA GPUs
of compute capability 8.0+ (device_support.precision_unavailable, the rule validate/ applies
to runs).

The result is cached per machine in one JSON file (see `cache_path`), keyed by the device type
and name, the device count (CUDA: GPUs; CPU: the threads torch uses, which matmul throughput
scales with), the torch version and the NVIDIA driver. A run reads it once, before it measures
(`ceilings_for_run`); with `hardware.calibrate=true` the launcher first calibrates the run's
dtype in a process of its own if the cache has no entry for it (`needs_calibration`), and
`hardware.recalibrate=true` measures it again either way.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

from nanogpt.analysis.derive import Ceilings
from nanogpt.config.spec import Dtype
from nanogpt.hardware.cpu import matmul_emulated
from nanogpt.hardware.device_support import precision_unavailable
from nanogpt.hardware.env import device_name, nvidia_driver
from nanogpt.hardware.matmul import BUDGET_S, Shape, default_shapes, measure
from nanogpt.hardware.peaks import resolve_peak
from nanogpt.logs import bar_drawn
from nanogpt.record.files import user_cache_dir, write_json

CACHE_ENV = "NANOGPT_CALIBRATION_CACHE"  # path of the cache file (tests point it at a tmp dir)
CACHE_VERSION = 1


def cache_path() -> Path:
    """$NANOGPT_CALIBRATION_CACHE, else calibration.json in the user cache (files.py)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return user_cache_dir() / "calibration.json"


def machine(device: torch.device) -> dict:
    """What a calibration is valid for: the same device, count, torch and driver."""
    cuda = device.type == "cuda"
    return {
        "device_type": device.type,
        "device_name": device_name(device),  # the CPU model, on a CPU
        "device_count": torch.cuda.device_count() if cuda else torch.get_num_threads(),
        "count_of": "gpus" if cuda else "threads",
        "torch": torch.__version__,
        "driver": nvidia_driver() if cuda else None,
    }


def machine_key(ident: dict) -> str:
    """E.g. "cpu | Intel(R) Xeon(R) Processor | 2 threads | torch 2.13.0+cpu"."""
    parts = [
        ident["device_type"],
        ident["device_name"],
        f"{ident['device_count']} {ident['count_of']}",
        f"torch {ident['torch']}",
    ]
    if ident["driver"]:
        parts.append(f"driver {ident['driver']}")
    return " | ".join(parts)


def read_cache(path: Path) -> dict:
    """Machine key -> {"machine", "dtypes"}; {} for a missing file, and a warning for a bad one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        warnings.warn(f"ignoring unreadable calibration cache {path} ({err})", stacklevel=2)
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    return data.get("machines", {})


def _store(path: Path, ident: dict, fresh: dict) -> None:
    """Merge fresh entries into the file (re-read just before: another process may have written)."""
    machines = read_cache(path)
    key = machine_key(ident)
    dtypes = {**machines.get(key, {}).get("dtypes", {}), **fresh}
    machines[key] = {"machine": ident, "dtypes": dtypes}
    write_json(path, {"version": CACHE_VERSION, "machines": machines})


def lookup(device: torch.device | str, dtype: Dtype, cache: Path | None = None) -> dict | None:
    """The cached entry for this machine and dtype, or None."""
    device = torch.device(device)
    machines = read_cache(cache or cache_path())
    return machines.get(machine_key(machine(device)), {}).get("dtypes", {}).get(Dtype(dtype).value)


def calibrate(
    device: torch.device | str,
    dtypes: tuple[Dtype, ...] = tuple(Dtype),
    force: bool = False,
    shapes: tuple[Shape, ...] | None = None,
    budget_s: float = BUDGET_S,
    cache: Path | None = None,
) -> dict[str, dict | None]:
    """Entry per dtype (keyed by its name): cached, or measured and cached when missing or
    `force`d. None for a dtype the device cannot run (precision_unavailable says why)."""
    device = torch.device(device)
    dtypes = tuple(Dtype(d) for d in dtypes)
    path = cache or cache_path()
    ident = machine(device)
    cached = read_cache(path).get(machine_key(ident), {}).get("dtypes", {})
    runnable = [d.value for d in dtypes if precision_unavailable(device, d) is None]
    todo = [d for d in runnable if force or d not in cached]
    shapes = shapes or default_shapes(device)
    fresh = {}
    shown = bool(todo) and bar_drawn()  # a bar on a terminal only: no redraws in a file
    total = len(todo) * len(shapes)
    with tqdm(total=total, desc="calibrate", unit="shape", disable=not shown) as bar:
        for name in todo:
            fresh[name] = measure(device, Dtype(name), shapes, budget_s, bar)
    if fresh:
        _store(path, ident, fresh)
    return {
        d.value: (fresh.get(d.value) or cached.get(d.value)) if d.value in runnable else None
        for d in dtypes
    }


def needs_calibration(device: torch.device, dtype: Dtype, force: bool) -> bool:
    """Whether a run with hardware.calibrate (or recalibrate, `force`) must calibrate first."""
    if precision_unavailable(device, dtype):
        return False
    return force or lookup(device, dtype) is None


def ceilings_for_run(device: torch.device, dtype: Dtype, override_tflops: float | None) -> Ceilings:
    """What a run's FLOP/s are divided by, resolved once before it measures: the peak (override,
    datasheet or CPU estimate, and the calibrated figure only where none of those exists), and
    the calibrated figure on its own, with its provenance, when this machine has one."""
    entry = lookup(device, dtype)
    achievable = entry["tflops"] * 1e12 if entry else None
    peak = resolve_peak(device.type, device_name(device), dtype, override_tflops, achievable)
    emulated = matmul_emulated(dtype) if device.type == "cpu" else None
    if entry is None:
        return Ceilings(peak, matmul_emulated=emulated)
    provenance = {k: entry[k] for k in ("shape", "measured_at", "op", "clock")}
    return Ceilings(peak, achievable, {**provenance, "cache": str(cache_path())}, emulated)
