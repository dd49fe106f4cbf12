"""Contention: what else used the point's device while its measured steps ran.

These machines are shared, and so are many users' machines: a step time measured while another
process computed on the same device is slower than the point's own, and nothing in the step
times themselves says so. `bench.exclusive` (warn by default) records what else ran during the
measured window and flags the point `contended`:

- CPU: the CPU time of other processes over the window: the machine's busy CPU time
  (psutil.cpu_times: user, nice, system, irq, softirq; steal is another VM's, not a process
  here) less the point's own (its process and descendants, e.g. the W&B service, summed over
  the ranks). Counting the machine's total rather than a process list also catches processes
  that started and ended inside the window. The point is contended when the others used more
  than OTHERS_SHARE of the point's own CPU time: a ratio, so a short window or a point on few
  threads is judged against what it used itself.
- CUDA: the compute processes NVML lists on the point's GPU, at the window's start and end, other
  than the point's own ranks; any such process makes the point contended. (NVML's pids are the
  host's: inside a container whose pid namespace differs, the point's own process is not among
  them, and all but one are counted, said so in `contention`.)

`warn` logs one line and keeps the figures; `fail` makes the point fail with the reason (status
error, the measured figures kept); `off` probes nothing (`contended` null, with why).
"""

from __future__ import annotations

import logging
import os
import time

import psutil
import torch

from nanogpt.devices import nvml_handle

log = logging.getLogger(__name__)

OTHERS_SHARE = 0.1  # others' CPU time above this share of the point's own: contended


class Contended(RuntimeError):
    """bench.exclusive=fail and another process used the device during the measured window."""


def busy_cpu_s() -> float:
    """The machine's busy CPU time so far, all CPUs, in seconds."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def tree_cpu_s(root: psutil.Process) -> dict[int, float]:
    """CPU seconds (user + system) of `root` and its live descendants, by pid."""
    out = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        out[proc.pid] = t.user + t.system
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes alive at the end used since `before` (new ones: all of theirs)."""
    return sum(max(0.0, s - before.get(pid, 0.0)) for pid, s in after.items())


def judge_cpu(others_s: float, own_s: float) -> bool:
    """Contended: other processes used more than OTHERS_SHARE of the point's own CPU time."""
    return others_s > OTHERS_SHARE * max(own_s, 1e-9)


class ContentionProbe:
    """Start at the measured window's start, stop at its end (after the last sync): the record's
    fields; then `enforce()`. `world` gathers the ranks' own CPU time and pids. `scope`, for
    CPU: None counts every other process of the machine; a psutil.Process counts only its
    descendants (the processes a caller controls, e.g. a test's), the point's own left out."""

    def __init__(self, device: torch.device, mode: str, world=None, scope=None):
        self.device, self.mode, self.world, self.scope = device, mode, world, scope
        self.fields: dict = {"contended": None, "contention": f"off (bench.exclusive={mode})"}
        self._handle = None
        if mode != "off" and device.type == "cuda":
            self._handle, _ = nvml_handle(device)
        elif mode != "off" and device.type != "cpu":
            self.fields["contention"] = f"not probed on {device.type}"
            self.mode = "off"

    def start(self) -> None:
        if self.mode == "off":
            return
        self._t0 = time.perf_counter()
        self._scope0 = tree_cpu_s(self.scope) if self.scope is not None else {}
        self._own0 = self._own()
        self._busy0 = busy_cpu_s() if self.scope is None else None
        self._gpu_pids = self._gpu_processes()

    def stop(self) -> dict:
        """The record's fields (Timing: contended, contention, ...), kept in `fields` too."""
        if self.mode == "off":
            return self.fields
        window_s = time.perf_counter() - self._t0
        scope_now = tree_cpu_s(self.scope) if self.scope is not None else {}
        own_now = self._own(scope_now)
        busy = busy_cpu_s() - self._busy0 if self.scope is None else None
        own_s = cpu_delta(self._own0, own_now)
        ranks = self.world.gather([own_s, os.getpid()]) if self.world else [[own_s, os.getpid()]]
        own_total = sum(r[0] for r in ranks)
        own_pids = {int(r[1]) for r in ranks}
        if self.scope is None:
            others_s = max(0.0, busy - own_total)
        else:
            mine = set(own_now) | own_pids
            others_s = cpu_delta(
                {p: s for p, s in self._scope0.items() if p not in mine},
                {p: s for p, s in scope_now.items() if p not in mine},
            )
        fields = {
            "contention_window_s": window_s,
            "own_cpu_s": own_total,
            "others_cpu_s": others_s,
            "others_gpu_processes": None,
        }
        if self.device.type == "cuda":
            gpu = self._gpu_pids | self._gpu_processes()
            others, note = _others(gpu, own_pids)
            fields["others_gpu_processes"] = sorted(others)
            contended = bool(others) if self._handle is not None else None
            fields["contention"] = (
                f"NVML lists {len(others)} other compute process(es) on the GPU{note}"
                if self._handle is not None
                else "unknown: no NVML handle for this GPU"
            )
        else:
            contended = judge_cpu(others_s, own_total)
            fields["contention"] = (
                f"other processes used {others_s:.2f} CPU-s in the {window_s:.2f} s window, "
                f"{others_s / max(own_total, 1e-9):.2f}x the point's own {own_total:.2f} CPU-s "
                f"(contended above {OTHERS_SHARE:g}x)"
            )
        if self.world is not None and self.world.size > 1:  # the ranks agree: all fail or none
            contended = self.world.any_rank(bool(contended)) or (
                None if contended is None else False
            )
        fields["contended"] = contended
        self.fields = fields
        if contended:
            log.warning(
                "contended: %s; the figures may be slower than the point's own",
                fields["contention"],
            )
        return fields

    def enforce(self) -> None:
        """With bench.exclusive=fail, raise Contended for a contended point (after the caller
        has put the fields in the record: the failed point keeps them)."""
        if self.mode == "fail" and self.fields.get("contended"):
            raise Contended(f"bench.exclusive=fail: {self.fields['contention']}")

    def _own(self, scope: dict[int, float] | None = None) -> dict[int, float]:
        """CPU seconds of this process and its descendants, by pid, those in scope left out
        (a neighbour a test started is its child, but not the point's)."""
        outside = set(scope if scope is not None else self._scope0)
        return {p: s for p, s in tree_cpu_s(psutil.Process()).items() if p not in outside}

    def _gpu_processes(self) -> set[int]:
        if self._handle is None:
            return set()
        try:
            import pynvml

            return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)}
        except Exception:
            return set()


def _others(pids: set[int], own: set[int]) -> tuple[set[int], str]:
    """The pids not the point's own; where none of its own is among them (another pid namespace),
    all but one, and a note saying so."""
    if not pids or pids & own:
        return pids - own, ""
    return set(sorted(pids)[1:]), " (NVML's pids are another namespace's: all but one counted)"
