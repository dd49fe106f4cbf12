"""Calibration: the matmul FLOP/s this machine actually achieves, per dtype.

`python -m nanogpt.calibrate [bench.device=cuda] [hardware.recalibrate=true]`

A datasheet peak is a ceiling no training job reaches, and a CPU has no datasheet at all (its
clock-based estimate can even sit *below* what a plain matmul measures). So, as the "maximum
achievable matmul FLOPS" (MAMF) finder of Stas Bekman's *Machine Learning Engineering* does, we
time large matmuls over a small search of shapes and keep the best rate per dtype. MFU against it
(`mfu_achievable`) answers "how far from what this machine can actually do"; `mfu`, against
`peak_tflops`, still answers "how far from the spec sheet" (see nanogpt/hardware.py).

What is timed is the matmul training runs. Every nn.Linear calls F.linear(x, W) with W stored as
(out_features, in_features). Under torch.autocast (bf16/fp16) autocast casts x and W down and
dispatches that same aten::linear -> aten::mm to the low-precision kernel; we time exactly that
call with the operands already cast, because the casts are elementwise work with no matmul FLOPs.
fp32 and tf32 run under the matmul-precision settings training uses (train.set_matmul_precision).
An (M, K) input times an (N, K) weight is 2*M*N*K FLOPs: a multiply and an add per term.

How: per shape, one warm-up call (kernel selection, page faults, GPU clock ramp-up), then up to
MAX_TRIALS trials, each timed by perf_counter between two device synchronizations and repeating
the call until it lasts about TRIAL_S (so a short GPU matmul is not drowned by the sync). The
fastest trial counts, since noise only ever slows a trial down. A time budget per dtype (BUDGET_S,
warm-ups included) is shared by the shapes and bounds the search.

Which dtypes: fp32, bf16 and fp16 wherever torch has kernels for them; tf32 only on CUDA GPUs of
compute capability 8.0+, because TF32 is a tensor-core math mode that runs use on CUDA only
(validate.py rejects perf.dtype=tf32 elsewhere): on a CPU there is no run it could be the peak of.

The result is cached per machine in one JSON file (see `cache_path`), keyed by the device type
and name, the device count (CUDA: GPUs; CPU: the threads torch uses, which matmul throughput
scales with), the torch version and the NVIDIA driver. Runs read it (train._derive): a run with
`hardware.calibrate=true` first calibrates its dtype if the cache has no entry for it, and
`hardware.recalibrate=true` measures it again either way.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nanogpt import hardware, records
from nanogpt.config import Dtype
from nanogpt.errors import ConfigError
from nanogpt.probes.timing import synchronize
from nanogpt.train import AUTOCAST_DTYPES, resolve_device, set_matmul_precision

CACHE_ENV = "NANOGPT_CALIBRATION_CACHE"  # path of the cache file (tests point it at a tmp dir)
SHAPES_ENV = "NANOGPT_CALIBRATION_SHAPES"  # e.g. "256x256x256,512x512x512": a smaller search
CACHE_VERSION = 1

OP = "F.linear(x[M,K], W[N,K]) in the compute dtype, as nn.Linear under autocast; 2*M*N*K FLOPs"
CLOCK = "perf_counter+synchronize, fastest trial"

Shape = tuple[int, int, int]  # (M, N, K): an (M, K) input times an (N, K) weight

# The searches: large enough for the kernels to reach full rate, small enough that one dtype
# fits in BUDGET_S. On 2 CPU cores a 2048^3 fp32 matmul takes ~50 ms; on a GPU, 8192^3 at bf16
# takes a few ms, and rates keep rising up to about that size.
CPU_SHAPES: tuple[Shape, ...] = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 1024, 4096))
CUDA_SHAPES: tuple[Shape, ...] = (
    (4096, 4096, 4096),
    (6144, 6144, 6144),
    (8192, 8192, 8192),
    (16384, 8192, 4096),
)
BUDGET_S = 8.0  # per dtype, warm-ups included
MAX_TRIALS = 10
TRIAL_S = 0.05  # a trial repeats the call until it lasts about this long


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def unavailable(device: torch.device, dtype: str) -> str | None:
    """Why `dtype` cannot be calibrated on `device`; None when it can."""
    if dtype == "tf32" and device.type != "cuda":
        return "TF32 is a CUDA tensor-core mode; runs use it on CUDA only"
    if dtype == "tf32" and torch.cuda.get_device_capability(device) < (8, 0):
        return "TF32 needs a GPU of compute capability 8.0 (Ampere) or newer"
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 support"
    return None


@contextlib.contextmanager
def training_precision(dtype: str):
    """fp32/tf32 matmul settings exactly as a training run sets them, restored afterwards."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    set_matmul_precision(Dtype(dtype))
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def _seconds_per_call(call, calls: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def linear_flops(device: torch.device, dtype: str, shape: Shape, seconds: float) -> float:
    """Best FLOP/s of one F.linear shape in one dtype, searched for about `seconds`."""
    m, n, k = shape
    compute_dtype = AUTOCAST_DTYPES.get(Dtype(dtype), torch.float32)
    x = torch.randn(m, k, device=device).to(compute_dtype)
    w = torch.randn(n, k, device=device).to(compute_dtype)

    def call():
        return F.linear(x, w)

    deadline = time.perf_counter() + seconds
    best = math.inf
    with training_precision(dtype):
        per_call = _seconds_per_call(call, 1, device)  # warm-up
        for _ in range(MAX_TRIALS):
            calls = max(1, math.ceil(TRIAL_S / per_call))
            per_call = _seconds_per_call(call, calls, device)
            best = min(best, per_call)
            if time.perf_counter() > deadline:
                break
    return 2 * m * n * k / best


def measure(
    device: torch.device, dtype: str, shapes: tuple[Shape, ...], budget_s: float, bar=None
) -> dict:
    """The cache entry of one dtype: the best rate over `shapes`, and every shape's rate."""
    started = time.perf_counter()
    by_shape = {}
    for i, shape in enumerate(shapes):
        share = (started + budget_s - time.perf_counter()) / (len(shapes) - i)  # time left, split
        by_shape[shape_name(shape)] = linear_flops(device, dtype, shape, share)
        if bar is not None:
            bar.set_postfix(dtype=dtype, best_tflops=f"{max(by_shape.values()) / 1e12:.3f}")
            bar.update(1)
    best = max(by_shape, key=by_shape.get)
    return {
        "tflops": by_shape[best] / 1e12,
        "shape": best,
        "by_shape_tflops": {name: flops / 1e12 for name, flops in by_shape.items()},
        "seconds": time.perf_counter() - started,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "op": OP,
        "clock": CLOCK,
    }


def shape_name(shape: Shape) -> str:
    return "x".join(map(str, shape))


def default_shapes(device: torch.device) -> tuple[Shape, ...]:
    """$NANOGPT_CALIBRATION_SHAPES if set, else the search for the device type."""
    text = os.environ.get(SHAPES_ENV)
    if not text:
        return CUDA_SHAPES if device.type == "cuda" else CPU_SHAPES
    try:
        shapes = tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ConfigError(
            SHAPES_ENV,
            f"'{text}' is not a list of shapes",
            "give MxNxK[,MxNxK...], e.g. 256x256x256",
        )
    return shapes


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------


def cache_path() -> Path:
    """$NANOGPT_CALIBRATION_CACHE, else $XDG_CACHE_HOME/nanogpt-sweep/calibration.json (the XDG
    base-directory convention, as data.py's token cache; ~/.cache when XDG_CACHE_HOME is unset)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nanogpt-sweep" / "calibration.json"


def machine(device: torch.device) -> dict:
    """What a calibration is valid for: the same device, count, torch and driver."""
    cuda = device.type == "cuda"
    return {
        "device_type": device.type,
        "device_name": hardware.device_name(device),  # the CPU model, on a CPU
        "device_count": torch.cuda.device_count() if cuda else torch.get_num_threads(),
        "count_of": "gpus" if cuda else "threads",
        "torch": torch.__version__,
        "driver": hardware.nvidia_driver() if cuda else None,
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
    records.write_json(path, {"version": CACHE_VERSION, "machines": machines})


def lookup(device: torch.device | str, dtype: str, cache: Path | None = None) -> dict | None:
    """The cached entry for this machine and dtype, or None."""
    device = torch.device(device)
    machines = read_cache(cache or cache_path())
    return machines.get(machine_key(machine(device)), {}).get("dtypes", {}).get(dtype)


def calibrate(
    device: torch.device | str,
    dtypes: tuple[str, ...] = hardware.DTYPES,
    force: bool = False,
    shapes: tuple[Shape, ...] | None = None,
    budget_s: float = BUDGET_S,
    cache: Path | None = None,
) -> dict[str, dict | None]:
    """Entry per dtype: cached, or measured and cached when missing or `force`d.

    None for a dtype the device cannot run (`unavailable` says why)."""
    device = torch.device(device)
    path = cache or cache_path()
    ident = machine(device)
    cached = read_cache(path).get(machine_key(ident), {}).get("dtypes", {})
    runnable = [d for d in dtypes if unavailable(device, d) is None]
    todo = [d for d in runnable if force or d not in cached]
    shapes = shapes or default_shapes(device)
    fresh = {}
    with tqdm(
        total=len(todo) * len(shapes), desc="calibrate", unit="shape", disable=not todo
    ) as bar:
        for dtype in todo:
            fresh[dtype] = measure(device, dtype, shapes, budget_s, bar)
    if fresh:
        _store(path, ident, fresh)
    return {d: (fresh.get(d) or cached.get(d)) if d in runnable else None for d in dtypes}


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def calibrate_for_run(device: torch.device, dtype: str, force: bool) -> None:
    """Before a run with hardware.calibrate (or recalibrate): fill the cache for its dtype.

    Calibration runs in a process of its own: its large matrices must not raise the run's peak
    RSS (a process-lifetime figure) or stay cached in the run's CUDA allocator.
    """
    if unavailable(device, dtype) or (not force and lookup(device, dtype) is not None):
        return
    process = multiprocessing.get_context("spawn").Process(
        target=calibrate, args=(str(device), (dtype,), force)
    )
    process.start()
    process.join()
    if process.exitcode != 0:
        warnings.warn(
            f"calibrating {dtype} on {device} failed (exit code {process.exitcode}), so "
            "achievable_tflops and mfu_achievable will be null",
            stacklevel=2,
        )


def run_peak(
    device: torch.device, device_name: str, dtype: str, override_tflops: float | None
) -> hardware.Peak:
    """The peak a run's MFU divides by: override, datasheet or CPU estimate, and the calibrated
    figure only where none of those exists (hardware.resolve_peak)."""
    entry = lookup(device, dtype)
    return hardware.resolve_peak(
        device.type,
        device_name,
        dtype,
        override_tflops,
        calibrated_flops=entry["tflops"] * 1e12 if entry else None,
    )


def achievable_figures(device: torch.device, dtype: str, achieved_flops: float) -> dict:
    """achievable_tflops, mfu_achievable and mfu_flag of a run, and where the peak came from.

    mfu_flag is True when the run beats the best matmul this machine managed: no training step
    can, so the FLOP count or the timing is wrong.
    """
    entry = lookup(device, dtype)
    if entry is None:
        return dict.fromkeys(("achievable_tflops", "mfu_achievable", "mfu_flag", "calibration"))
    mfu = achieved_flops / (entry["tflops"] * 1e12)
    if mfu > 1:
        warnings.warn(
            f"mfu_achievable is {mfu:.0%}: the run beat the best {dtype} matmul this machine "
            "measured, so the FLOP count or the timing is wrong (mfu_flag is set)",
            stacklevel=2,
        )
    provenance = {k: entry[k] for k in ("shape", "measured_at", "op", "clock")}
    return {
        "achievable_tflops": entry["tflops"],
        "mfu_achievable": mfu,
        "mfu_flag": mfu > 1,
        "calibration": {**provenance, "cache": str(cache_path())},
    }


# --------------------------------------------------------------------------------------------
# The table and the command
# --------------------------------------------------------------------------------------------


def format_table(
    device: torch.device,
    results: dict[str, dict | None],
    measured_since: str = "",
    override_tflops: float | None = None,
) -> str:
    """Achievable vs peak per dtype; entries measured before `measured_since` say "cached"."""
    name = hardware.device_name(device)
    header = (
        "dtype",
        "achievable TFLOP/s",
        "best shape",
        "peak TFLOP/s",
        "peak source",
        "ach/peak",
    )
    rows, notes = [header], []
    for dtype, entry in results.items():
        if entry is None:
            rows.append((dtype, "-", "-", "-", "-", "-"))
            notes.append(f"{dtype}: not calibrated: {unavailable(device, dtype)}.")
            continue
        with warnings.catch_warnings():  # resolve_peak's "MFU will be null" is about runs
            warnings.simplefilter("ignore")
            peak = hardware.resolve_peak(device.type, name, dtype, override_tflops)
        ratio = entry["tflops"] * 1e12 / peak.flops if peak.flops else None
        when = "cached" if entry["measured_at"] < measured_since else f"{entry['seconds']:.1f} s"
        rows.append(
            (
                dtype,
                f"{entry['tflops']:.4g}",
                entry["shape"],
                f"{peak.flops / 1e12:.4g}" if peak.flops else "-",
                peak.source,
                f"{ratio:.0%} ({when})" if ratio else f"- ({when})",
            )
        )
        if ratio and ratio > 1:
            notes.append(
                f"{dtype}: the measured matmul beats the {peak.source} peak, which is therefore "
                "no ceiling here; mfu_achievable is the honest figure."
            )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([f"{name} ({device})", *lines, *notes])


def main(argv: list[str] | None = None) -> int:
    """Hydra-composed like nanogpt/run.py (same conf/ and schema), with no output dir of its own.

    Hydra is imported here, in the entry point only: library code never needs it.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    # Importing run registers the RunSpec schema; its error line is the runner's too.
    from nanogpt.run import CONF_DIR, hydra_error_line, to_spec

    overrides = sys.argv[1:] if argv is None else argv
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            spec = to_spec(compose(config_name="config", overrides=overrides))
        device = resolve_device(spec.bench.device)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat()
        results = calibrate(device, force=spec.hardware.recalibrate)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (CompactHydraException, OmegaConfBaseException) as err:
        print(f"error: {hydra_error_line(err)}", file=sys.stderr)
        return 2
    print(format_table(device, results, started, spec.hardware.peak_tflops))
    print(f"cache: {cache_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
