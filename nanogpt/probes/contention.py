"""Contention: what else used the point's device while its measured steps ran.

These machines are shared, and so are many users' machines: a step time measured while another
process computed on the same device is slower than the point's own, and nothing in the step
times themselves says so. `bench.exclusive` (warn by default) records what else ran during the
measured window and flags the point `contended`:

- CPU: the CPU time of other processes over the window: the machine's busy CPU time
  (psutil.cpu_times: user, nice, system, irq, softirq; steal is another VM's, not a process
  here) less the point's own (its process and descendants, e.g. the W&B service, summed over
  the ranks). Counting the machine's total rather than a process list also catches processes
  that started and ended inside the window. The tool's own processes that the point runs
  under (the sweep's process, the fork server, torchrun's agent: `tool_cpu_s`) are not others
  either. The point is contended when the others used more than OTHERS_SHARE of the point's
  own CPU time: a ratio, so a short window or a point on few threads is judged against what it
  used itself.
  The counters count clock ticks (10 ms), so a difference of two reads is off by up to a tick
  a counter (`resolution_s`), and on a short window a few ticks are the ratio's whole
  threshold: a micro point's quiet 0.07 s window read 0.02 CPU-s of others, two ticks, and was
  flagged. So contended is said only where others' time is above the threshold by more than
  that resolution, not contended only where it is below by as much; in between the point is
  null, "too short to judge".
- CUDA: the compute processes NVML lists on the point's GPU, at the window's start and end, other
  than the point's own ranks; any such process makes the point contended. (NVML's pids are the
  host's: inside a container whose pid namespace differs, the point's own process is not among
  them, and all but one are counted, said so in `contention`.) A query NVML refuses (a GPU
  lost, a call the driver lacks) is no "none seen": null, with NVML's error.

`warn` logs one line and keeps the figures; `fail` makes the point fail with the reason (status
error, the measured figures kept); `off` probes nothing (`contended` null, with why).
"""

from __future__ import annotations

import logging
import os
import time

import psutil
import torch

from nanogpt.hardware.devices import nvml_handle

log = logging.getLogger(__name__)

OTHERS_SHARE = 0.1  # others' CPU time above this share of the point's own: contended
# The unit of the CPU-time counters psutil reads (/proc/stat, /proc/PID/stat): clock ticks,
# USER_HZ a second (100 on Linux: 10 ms). A difference of two truncated reads is off by less
# than one tick.
TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")  # steal is another VM's


class Contended(RuntimeError):
    """bench.exclusive=fail and another process used the device during the measured window."""


def busy_cpu_s() -> float:
    """The machine's busy CPU time so far, all CPUs, in seconds."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in BUSY_FIELDS)


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


def tool_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of the tool's processes this one runs under, by pid: its
    parents that run the same Python (the job's or sweep's process, the fork server, torchrun's
    agent, a SLURM job's submitit process), nearest first, up to the first that does not (a
    shell, SLURM's step daemon). They wait on the point; what they use is the tool's, not
    another process's. (A neighbour point of hydra/launcher=parallel is no parent: it counts.)"""
    out = {}
    try:
        me = psutil.Process()
        exe = me.exe()
        for parent in me.parents():
            if parent.pid <= 1 or parent.exe() != exe:
                break
            t = parent.cpu_times()
            out[parent.pid] = t.user + t.system
    except psutil.Error:  # a parent gone, or not ours to read: the chain ends there
        pass
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes alive at the end used since `before` (new ones: all of theirs)."""
    return sum(max(0.0, s - before.get(pid, 0.0)) for pid, s in after.items())


def resolution_s(processes: int) -> float:
    """How far others' CPU time can be off by the counters' ticks alone: a tick for each
    counter read twice, the machine's busy ones and user + system of each process subtracted."""
    return TICK_S * (len(BUSY_FIELDS) + 2 * processes)


def judge_cpu(others_s: float, own_s: float, resolution: float = 0.0) -> bool | None:
    """Contended: other processes used more than OTHERS_SHARE of the point's own CPU time, by
    more than the counters' `resolution`; not contended: less, by as much; else None (too
    short a window for the counters to tell)."""
    threshold = OTHERS_SHARE * max(own_s, 1e-9)
    if others_s - resolution > threshold:
        return True
    if others_s + resolution <= threshold:
        return False
    return None


class ContentionProbe:
    """Start at the measured window's start, stop at its end (after the last sync): the record's
    fields; then `enforce()`. `world` gathers the ranks' own CPU time and pids."""

    def __init__(self, device: torch.device, mode: str, world=None):
        self.device, self.mode, self.world = device, mode, world
        self.fields: dict = {"contended": None, "contention": f"off (bench.exclusive={mode})"}
        self._handle, self._no_handle, self._nvml_error = None, None, None
        if mode != "off" and device.type == "cuda":
            self._handle, self._no_handle = nvml_handle(device)  # (None, why) without one
        elif mode != "off" and device.type != "cpu":
            self.fields["contention"] = f"not probed on {device.type}"
            self.mode = "off"

    def start(self) -> None:
        if self.mode == "off":
            return
        self._t0 = time.perf_counter()
        self._own0 = self._own()
        self._tool0 = tool_cpu_s()
        self._busy0 = busy_cpu_s()
        self._gpu_pids = self._gpu_processes()

    def stop(self) -> dict:
        """The record's fields (Timing: contended, contention, ...), kept in `fields` too."""
        if self.mode == "off":
            return self.fields
        window_s = time.perf_counter() - self._t0
        own_now = self._own()
        tool_now = tool_cpu_s()
        busy = busy_cpu_s() - self._busy0
        own_s = cpu_delta(self._own0, own_now)
        tool = {p: s - self._tool0[p] for p, s in tool_now.items() if p in self._tool0}
        mine = [own_s, os.getpid(), len(own_now), tool]
        ranks = self.world.gather(mine) if self.world else [mine]
        own_total = sum(r[0] for r in ranks)
        own_pids = {int(r[1]) for r in ranks}
        tools = {int(p): s for r in ranks for p, s in r[3].items()}  # ranks share their parents
        others_s = max(0.0, busy - own_total - sum(tools.values()))
        resolution = resolution_s(sum(int(r[2]) for r in ranks) + len(tools))
        fields = {
            "contention_window_s": window_s,
            "own_cpu_s": own_total,
            "others_cpu_s": others_s,
            "others_gpu_processes": None,
        }
        if self.device.type == "cuda":
            contended, fields["contention"], fields["others_gpu_processes"] = self._judge_gpu(
                own_pids
            )
        else:
            contended = judge_cpu(others_s, own_total, resolution)
            fields["contention"] = _cpu_text(contended, others_s, own_total, window_s, resolution)
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

    def _own(self) -> dict[int, float]:
        """CPU seconds of this process and its descendants, by pid."""
        return tree_cpu_s(psutil.Process())

    def _gpu_processes(self) -> set[int] | None:
        """The pids NVML lists on the GPU; None when the query failed (its error kept)."""
        if self._handle is None:
            return set()
        try:
            import pynvml

            return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)}
        except Exception as exc:  # pynvml.NVMLError: a GPU lost, a call the driver lacks, ...
            self._nvml_error = f"{type(exc).__name__}: {exc}"
            return None

    def _judge_gpu(self, own_pids: set[int]) -> tuple[bool | None, str, list[int] | None]:
        """contended, contention, others_gpu_processes from the window's two NVML queries: a
        process seen in either contends; none seen is "not contended" only if both answered."""
        if self._handle is None:
            return None, f"unknown: no NVML handle for this GPU ({self._no_handle})", None
        answers = [self._gpu_pids, self._gpu_processes()]
        others, note = _others(set().union(*(a for a in answers if a is not None)), own_pids)
        failed = sum(a is None for a in answers)
        if failed and not others:
            why = f"NVML's process query failed at {failed} of the window's 2 reads"
            return None, f"unknown: {why} ({self._nvml_error})", None
        text = f"NVML lists {len(others)} other compute process(es) on the GPU{note}"
        if failed:
            text += f" (one of the window's 2 reads failed: {self._nvml_error})"
        return bool(others), text, sorted(others)


def _cpu_text(
    contended: bool | None, others_s: float, own_s: float, window_s: float, resolution: float
) -> str:
    """What the CPU probe saw, in words: others' CPU time against the point's own."""
    seen = f"other processes used {others_s:.2f} ± {resolution:.2f} CPU-s in the {window_s:.2f} s"
    if contended is None:
        return (
            f"too short to judge: {seen} window, against {OTHERS_SHARE * own_s:.3f} CPU-s "
            f"that would be contended ({OTHERS_SHARE:g}x the point's own {own_s:.2f}); the ± is "
            f"the CPU-time counters' {TICK_S * 1000:.0f} ms ticks; a longer window "
            "(bench.measure_s) can tell"
        )
    return (
        f"{seen} window, {others_s / max(own_s, 1e-9):.2f}x the point's own {own_s:.2f} CPU-s "
        f"(contended above {OTHERS_SHARE:g}x)"
    )


def _others(pids: set[int], own: set[int]) -> tuple[set[int], str]:
    """The pids not the point's own; where none of its own is among them (another pid namespace),
    all but one, and a note saying so."""
    if not pids or pids & own:
        return pids - own, ""
    return set(sorted(pids)[1:]), " (NVML's pids are another namespace's: all but one counted)"
