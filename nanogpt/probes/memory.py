"""Memory: what the allocator, the driver and the OS saw, and an analytic estimate beside it.

- CUDA caching allocator: peak bytes held by tensors (allocated) and peak bytes the allocator
  took from the driver (reserved), over the measured steps: reset when the probe starts and
  again between warmup and the measured steps (`split`), which keeps warmup's peaks apart
  (mem_warmup_peak_*: compilation, autotuning and CUDA-graph recording transients).
  CUDA-graph compile modes (reduce-overhead, max-autotune): their replays allocate nothing (the
  graphs' memory is a private pool of the allocator, taken while warmup recorded them and held
  since), so a measured-only peak would read about weights + gradients + optimizer state. The
  peaks are still reset after warmup (the graphs are recorded by then: validate/device.py asks
  CUDA_GRAPH_WARMUP steps), which leaves warmup's one-time bytes out (the first compile,
  autotuning, the recording's own transients); the pool's bytes that are no live tensor (free
  between replays, written again by each) are added to the measured peak (`graph_aware_peak`,
  the pool read from the allocator's snapshot: `graph_pool_bytes`), and warmup's peak stays its
  own field. mem_peak_allocated_from says "measured+graph pool".
- NVML (nvidia-ml-py): device memory in use as the driver sees it, all processes included;
  sampled at each window, the largest sample kept.
- Process peak RSS (resident host memory). On Linux the kernel's peak (VmHWM) is reset when the
  probe starts, so it covers this point alone even when several points share a process
  (bench.isolate=false). Elsewhere it falls back to getrusage's ru_maxrss, which cannot be reset:
  the peak of the process's whole life, exact only when each point has its own process (the
  default). The record says which method it used (mem_peak_rss_method).
- The CUDA caching allocator's counters of trouble over the measured steps
  (torch.cuda.memory_stats, which torchtitan records and warns on too): `num_alloc_retries`, a
  cudaMalloc that failed, after which the allocator freed its cached blocks and tried again
  (slow, and the first sign of fragmentation near the memory limit), and `num_ooms`, the
  allocations that failed even then. Read when the measured steps start and end (`split`,
  `window_end`); null with the reason (mem_alloc_note) where there is no such allocator.
The analytic estimate beside these is train/memory_estimate.py's.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import resource
import sys
from pathlib import Path

import psutil
import torch

from nanogpt.hardware.devices import nvml_handle

log = logging.getLogger(__name__)

# proc(5): writing "5" to clear_refs resets the process's peak RSS (VmHWM) to its current RSS.
CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")
# The record's field for each of torch.cuda.memory_stats' counters, over the measured steps
ALLOC_COUNTERS = {"mem_alloc_retries": "num_alloc_retries", "mem_ooms": "num_ooms"}


class MemoryProbe:
    def __init__(self, device: torch.device, cuda_graphs: bool = False):
        self.device = device
        self.cuda = device.type == "cuda"
        self.cuda_graphs = cuda_graphs  # a CUDA-graph compile mode: its pool is warmup's
        self._nvml_handle, self._nvml_device = nvml_handle(device) if self.cuda else (None, None)
        self._nvml_peak: int | None = None
        self.rss_method = "ru_maxrss"
        self.warmup: dict[str, int | None] = {}  # warmup's peaks, once split() has run
        self._counts_at_start: dict[str, int] | None = None  # the allocator's, at split()
        self._counts: dict[str, int] | None = None  # over the measured steps, at window_end()
        self._rss_at_split: int | None = None  # the RSS the measured steps started at (vmhwm)

    def start(self) -> None:
        self.rss_method = reset_peak_rss()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self) -> dict[str, int | None]:
        """Current figures for a log window (no device sync)."""
        sample = {"mem_rss_bytes": psutil.Process().memory_info().rss}
        if self.cuda:
            sample["mem_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            sample["mem_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
            used = _nvml_used(self._nvml_handle)
            if used is not None:
                self._nvml_peak = max(used, self._nvml_peak or 0)
        return sample

    def split(self) -> None:
        """Between warmup and the measured steps: keep warmup's peaks apart (first-step
        compilation, autotuner clones and benchmark buffers, CUDA-graph recording) and start
        the peaks again, so that mem_peak_* are the measured steps' own. No empty_cache: the
        blocks warmup cached stay reserved (the measured steps reuse them), so the reserved
        peak can still hold warmup's; the allocated peak is the measured steps' tensors."""
        self.sample()
        self.warmup = {
            "mem_warmup_peak_allocated_bytes": None,
            "mem_warmup_peak_reserved_bytes": None,
            "mem_warmup_peak_rss_bytes": peak_rss_bytes(self.rss_method),
        }
        if self.cuda:
            self.warmup["mem_warmup_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(
                self.device
            )
            self.warmup["mem_warmup_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(
                self.device
            )
            torch.cuda.reset_peak_memory_stats(self.device)
            self._counts_at_start = _alloc_counts(self.device)
        self._nvml_peak = None
        # Only a resettable peak (VmHWM) can be the measured steps' own; ru_maxrss stays the
        # process's whole life, warmup included (mem_peak_rss_method says which).
        self.rss_method = reset_peak_rss() if self.rss_method == "vmhwm" else self.rss_method
        if self.rss_method == "vmhwm":  # the peak was reset to the RSS of now: the steps' floor
            self._rss_at_split = peak_rss_bytes(self.rss_method)

    def window_end(self) -> None:
        """The measured steps are done: the allocator's counters over them (the profiled and
        diagnosed steps after them are not counted)."""
        self._counts = self._counts_since_split()

    def _counts_since_split(self) -> dict[str, int] | None:
        if self._counts_at_start is None:
            return None
        now = _alloc_counts(self.device)
        return {field: now[field] - self._counts_at_start[field] for field in ALLOC_COUNTERS}

    def alloc_figures(self) -> dict:
        """mem_alloc_retries and mem_ooms over the measured steps, or null with the reason
        (mem_alloc_note). A window that failed midway (an OOM) counts up to the failure."""
        counts = self._counts if self._counts is not None else self._counts_since_split()
        if counts is not None:
            return {**counts, "mem_alloc_note": None}
        if not self.cuda:
            why = (
                f"{self.device.type}: no CUDA caching allocator, whose retries and OOMs "
                "torch.cuda.memory_stats counts"
            )
        else:
            why = "the measured steps did not start"
        return {**dict.fromkeys(ALLOC_COUNTERS), "mem_alloc_note": why}

    def result(self) -> dict[str, int | None]:
        self.sample()
        out = {
            **self.warmup,
            "mem_peak_allocated_bytes": None,
            "mem_peak_allocated_from": None,
            "mem_peak_reserved_bytes": None,
            "mem_nvml_used_bytes": self._nvml_peak,
            "mem_nvml_device": self._nvml_device,
            "mem_peak_rss_bytes": peak_rss_bytes(self.rss_method),
            "mem_peak_rss_method": self.rss_method,
            "mem_step_rss_bytes": None,
            **self.alloc_figures(),
        }
        if self._rss_at_split is not None and self.rss_method == "vmhwm":
            out["mem_step_rss_bytes"] = out["mem_peak_rss_bytes"] - self._rss_at_split
        if self.cuda:
            pool = None
            if self.cuda_graphs:
                pool = graph_pool_bytes(torch.cuda.memory_snapshot(), self.device)
                out["mem_graph_pool_bytes"] = pool[0]
            out["mem_peak_allocated_bytes"], out["mem_peak_allocated_from"] = graph_aware_peak(
                torch.cuda.max_memory_allocated(self.device), pool
            )
            out["mem_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
        return out


def _alloc_counts(device: torch.device) -> dict[str, int]:
    """The caching allocator's counters now, by the record's field (ALLOC_COUNTERS)."""
    stats = torch.cuda.memory_stats(device)
    return {field: int(stats.get(key, 0)) for field, key in ALLOC_COUNTERS.items()}


def graph_aware_peak(
    measured: int | None, pool: tuple[int, int] | None
) -> tuple[int | None, str | None]:
    """The allocated peak a record reports, and where it comes from. Normally the measured
    steps' own ("measured"). Under CUDA graphs (`pool`: the graphs' pool's reserved and
    allocated bytes, graph_pool_bytes) the replays allocate nothing yet use all of the pool: its
    bytes that are no live tensor, which max_memory_allocated does not count, are added
    ("measured+graph pool"). Warmup's peak is never taken: it holds one-time bytes (the first
    compile, autotuning, recording) the steps after it do not need."""
    if measured is None:
        return None, None
    reserved, live = pool or (0, 0)
    if reserved > live:
        return measured + reserved - live, "measured+graph pool"
    return measured, "measured"


# The default pool's id in the allocator's snapshot; a CUDA graph records into a private pool of
# its own (torch._inductor.cudagraph_trees.get_cudagraph_segments reads its segments the same way)
DEFAULT_POOL = (0, 0)


def graph_pool_bytes(segments: list[dict], device: torch.device) -> tuple[int, int]:
    """The bytes the allocator's private pools (the CUDA graphs') hold on `device`: reserved
    (their segments' cudaMalloc'd total_size) and allocated (in live tensors, which
    max_memory_allocated already counts). `segments`: torch.cuda.memory_snapshot(), whose
    fields torch.cuda.memory._snapshot documents (Segment: device, total_size, allocated_size,
    segment_pool_id)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    pools = [
        s
        for s in segments
        if s.get("device", index) == index and tuple(s["segment_pool_id"]) != DEFAULT_POOL
    ]
    return sum(s["total_size"] for s in pools), sum(s["allocated_size"] for s in pools)


def reset_peak_rss() -> str:
    """Start a fresh peak-RSS count; returns how peak_rss_bytes will read it.

    "vmhwm": the kernel's high-water mark, reset now (Linux; needs a writable clear_refs).
    "ru_maxrss": getrusage's peak, not resettable: the peak since the process started.
    """
    try:
        CLEAR_REFS.write_text("5")
    except OSError:  # not Linux, or /proc is read-only (some sandboxes)
        return "ru_maxrss"
    return "vmhwm" if _vmhwm_bytes() is not None else "ru_maxrss"


def peak_rss_bytes(method: str = "ru_maxrss") -> int:
    if method == "vmhwm":
        peak = _vmhwm_bytes()
        if peak is not None:
            return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _vmhwm_bytes() -> int | None:
    try:
        status = PROC_STATUS.read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    return None


def release(device: torch.device) -> None:
    """Free what a finished job held so the next one in this process starts clean.

    The caller drops its references (model, optimizer, batches); this collects them, drops
    compiled graphs and their guards, returns cached CUDA blocks to the driver and resets the
    peaks, and hands free C-heap pages back to the OS so the next point's RSS starts low.
    """
    dynamo = sys.modules.get("torch._dynamo")  # loaded only if something was compiled
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        except RuntimeError as exc:
            # After a sticky CUDA error (an illegal access, a device assert) every CUDA call
            # raises again; the point's figures are already in its record, so say so and go on.
            log.warning("releasing %s failed (%s: %s)", device, type(exc).__name__, exc)
    _trim_c_heap()


def save_snapshot(out_dir: Path) -> str | None:
    """Save the CUDA allocator's snapshot, the pickle that pytorch.org/memory_viz reads (PyTorch
    docs, "Understanding CUDA Memory Usage"). Written beside, then renamed: never half a file."""
    path = out_dir / "memory_snapshot.pickle"
    partial = out_dir / ".memory_snapshot.pickle.tmp"
    try:
        torch.cuda.memory._dump_snapshot(str(partial))
        os.replace(partial, path)
    except Exception as exc:  # the record matters more than the snapshot
        partial.unlink(missing_ok=True)
        log.warning("no memory snapshot (%s: %s)", type(exc).__name__, exc)
        return None
    return path.name


def _trim_c_heap() -> None:
    """glibc keeps freed memory in its heap for reuse (still resident): malloc_trim(0) returns
    what it can to the OS. A no-op where there is no glibc (macOS, musl)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _nvml_used(handle) -> int | None:
    if handle is None:
        return None
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None
