"""torch.profiler over a window of steps: a Chrome trace and the top ops by self time.

`bench.profile=true` runs bench.profile_steps extra steps after the measured steps, never before
or among them (Kineto can stay attached and slow the steps that follow it, PyTorch issue
144455), under torch.profiler (PyTorch docs, "PyTorch Profiler" recipe). The profiler adds its
own overhead, so these steps are logged with phase "profile" and never enter a timing statistic.

Written: trace.json in the job dir (under torchrun, each rank's own dir), for chrome://tracing
or ui.perfetto.dev; and in the record `profile_top_ops`, the ops with the most self time on the
host (time inside the op itself, not in the ops it calls), plus `profile_top_ops_cuda` by GPU
kernel time on CUDA.
`self_ms` is the total over the profiled steps; `calls` counts the op's calls in them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from nanogpt.hardware.devices import synchronize
from nanogpt.probes.kineto_log import quiet_profiler

TOP_OPS = 15
TRACE_FILE = "trace.json"


def profile_steps(
    step: Callable[[], object], device: torch.device, n_steps: int, out_dir: Path
) -> tuple[dict, list[float]]:
    """Run `step` n_steps times under the profiler, each synced and timed; returns the record's
    profile figures and the profiled step times (ms), which the caller logs apart."""
    step_ms = []
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with quiet_profiler(profile(activities=activities)) as prof:  # Kineto's USDT lines off
        for _ in range(n_steps):
            synchronize(device)
            started = time.perf_counter()
            step()
            synchronize(device)
            step_ms.append((time.perf_counter() - started) * 1e3)
    trace = _export_trace(prof, out_dir)
    events = prof.key_averages()
    figures = {
        "profile_trace": trace.name,
        "profile_top_ops": _top_ops(events, "self_cpu_time_total"),
    }
    if device.type == "cuda":
        figures["profile_top_ops_cuda"] = _top_ops(events, "self_device_time_total")
    return figures, step_ms


def _export_trace(prof, out_dir: Path) -> Path:
    """out_dir/trace.json, written beside and then renamed: never half a file."""
    path = out_dir / TRACE_FILE
    partial = out_dir / f".{TRACE_FILE}.tmp"
    try:
        prof.export_chrome_trace(str(partial))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _top_ops(events, self_time: str) -> list[dict]:
    """The TOP_OPS ops with the largest `self_time` (microseconds in torch's averages)."""
    ranked = sorted(events, key=lambda e: getattr(e, self_time), reverse=True)
    return [
        {"name": e.key, "self_ms": getattr(e, self_time) / 1e3, "calls": e.count}
        for e in ranked[:TOP_OPS]
        if getattr(e, self_time) > 0
    ]
