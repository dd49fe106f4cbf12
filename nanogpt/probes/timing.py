"""Step timing without host syncs inside the measured loop.

On CUDA, kernels run asynchronously: a host clock read after `optimizer.step()` measures when the
work was *queued*, not when it finished. CUDA events are recorded into the current stream *of the
measured device* around each step (with bench.device=cuda:1 that is GPU 1's stream, whatever the
process's current device is) and read back once per window, so the loop itself never waits for
the GPU. On CPU the work is
synchronous and `time.perf_counter` is the right clock. Every result says which clock it used.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    """Times steps; `flush()` returns the step times (ms) recorded since the last flush."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.clock = "cuda-events" if self.cuda else "perf_counter"
        if device.type == "mps":
            self.clock = "perf_counter+mps-sync"
        self._pending: list = []
        self._start = None
        self._first = self._last = None  # perf_counter at the window's first start, last stop
        self.wall_ms = 0.0  # the last flushed window's first start to last end

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._start = time.perf_counter()
            if self._first is None:
                self._first = self._start

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            self._pending.append((self._start, end))
        else:
            if self.device.type == "mps":
                torch.mps.synchronize()
            self._last = time.perf_counter()
            self._pending.append((self._last - self._start) * 1e3)

    def flush(self) -> list[float]:
        """Step times in ms. On CUDA this waits for the last recorded event (one sync a window).

        Also sets `wall_ms`: from the first step's start to the last one's end, on the same
        clock, so the host's pauses *between* steps count (the step times leave them out)."""
        pending, self._pending = self._pending, []
        if not self.cuda:
            self.wall_ms = (self._last - self._first) * 1e3 if pending else 0.0
            self._first = None
            return pending
        if pending:
            pending[-1][1].synchronize()
            self.wall_ms = pending[0][0].elapsed_time(pending[-1][1])
        else:
            self.wall_ms = 0.0
        return [start.elapsed_time(end) for start, end in pending]
