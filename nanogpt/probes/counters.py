"""Energy counters, and the sampler that turns their coarse steps into a mean power.

An energy counter does not count continuously: NVML's total-energy counter (millijoules since
the driver loaded) is refreshed by the driver every so often, RAPL's every millisecond or so.
Read at the two ends of a window, it is off by up to one refresh at each end: over a 0.55 s
window on an H100 two identical points read 750 W and 631 W on a 700 W card. So a thread polls
the counter every POLL_S while the steps run and keeps the moments it *changed* (its edges).
Between the first and the last edge the energy is exact (both readings were fresh), and so is
the mean power over that span; the window's energy is that power times the window's length.
The only error left is when, within one poll, each edge happened: at most 2 * POLL_S over the
span, recorded as `energy_error_pct`. Fewer than MIN_UPDATES edges give no figure: null, and
the reason says how often the counter advanced and how long to measure instead.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.01
MIN_UPDATES = 10


class NvmlCounter:
    """NVML's total-energy counter of one GPU (a 64-bit mJ count: it does not wrap)."""

    def __init__(self, handle):
        self.handle = handle

    def read(self) -> float | None:
        try:
            import pynvml

            return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3
        except Exception:  # a device or driver without the counter
            return None


class RaplCounter:
    """The RAPL package domains, summed, as one running total in joules. Each raw counter wraps
    to 0 past max_energy_range_uj (minutes at full power): the total adds each domain's change
    modulo its range, so it only needs reading more often than that."""

    def __init__(self, domains: list[Path]):
        self.domains = domains
        self.ranges = [int((d / "max_energy_range_uj").read_text()) for d in domains]
        self._raw = self._read_raw()
        self._total_uj = 0

    def _read_raw(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def read(self) -> float | None:
        try:
            raw = self._read_raw()
        except OSError:
            return None
        changes = (
            (new - old) % span for old, new, span in zip(self._raw, raw, self.ranges, strict=True)
        )
        self._total_uj += sum(changes)
        self._raw = raw
        return self._total_uj / 1e6


@dataclass
class Reading:
    """What the sampler saw over one window."""

    energy_j: float | None  # mean power over the edges' span x the window's length
    window_s: float
    updates: int  # how many times the counter changed
    update_ms: float | None  # the median time between two changes
    error_pct: float | None  # bound on energy_j's error from the edges' timing
    note: str | None  # why energy_j is null


class CounterSampler:
    """Polls a counter (anything with `read() -> joules or None`) in a thread: start() before
    the measured steps, stop() after the device finished them."""

    def __init__(self, counter, poll_s: float = POLL_S, min_updates: int = MIN_UPDATES):
        self.counter, self.poll_s, self.min_updates = counter, poll_s, min_updates
        self._edges: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def start(self) -> None:
        self._edges.clear()
        self._stop.clear()
        self._started = time.perf_counter()
        self._last = self.counter.read()
        self._thread = threading.Thread(target=self._poll, name="energy-sampler", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            value = self.counter.read()
            if value is not None and value != self._last:
                self._edges.append((time.perf_counter(), value))
                self._last = value

    def stop(self) -> Reading:
        window_s = time.perf_counter() - self._started
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll_once_more()
        edges = list(self._edges)
        gaps = [b[0] - a[0] for a, b in zip(edges, edges[1:], strict=False)]
        update_ms = statistics.median(gaps) * 1e3 if gaps else None
        if len(edges) < self.min_updates:
            every = f"every {update_ms:.0f} ms" if update_ms else "less often"
            note = (
                f"the counter advanced {len(edges)} times in {window_s:.2f} s ({every}); "
                f"a mean power needs {self.min_updates}: measure longer (bench.measure_s)"
            )
            return Reading(None, window_s, len(edges), update_ms, None, note)
        (t0, e0), (t1, e1) = edges[0], edges[-1]
        span = t1 - t0
        power = (e1 - e0) / span
        error = 2 * self.poll_s / span * 100
        return Reading(power * window_s, window_s, len(edges), update_ms, error, None)

    def halt(self) -> None:
        """Stop polling without a reading (a failed point); harmless after stop()."""
        self._stop.set()

    def _poll_once_more(self) -> None:
        """A last look (the thread has stopped), so an edge after its last poll counts."""
        value = self.counter.read()
        if value is not None and value != self._last:
            self._edges.append((time.perf_counter(), value))
            self._last = value
