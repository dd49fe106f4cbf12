"""Time to first step and its parts: from the measuring process's start to the end of its first
optimizer step (the record's `time_to_first_step_s`, `ttfs_*`), measured once a run, before
the measured steps.

The parts follow one another, so they sum to the whole:

  ttfs_process_s    the process's start (the kernel's start time of this process) to the
                    measured loop: the interpreter, imports (a fork server's child inherits
                    torch already imported: runner/forkserver_preload.py), the worker's set-up
                    (W&B, the peak, a user's model's first step seen on meta)
  ttfs_build_s      the trainer: the model built and moved, wrapped (DDP, FSDP2), torch.compile
                    wrapped (no compiling yet: Dynamo compiles at the first call), the optimizer,
                    the data source
  ttfs_setup_s      the runner's counting before the first step (FLOPs, the memory estimate, the
                    probes started)
  ttfs_dynamo_s     inside the first step: Dynamo's own work, bytecode tracing and guards, the
                    frames' compile time less their backend's (torch._dynamo.utils.
                    calculate_time_spent: entire_frame_compile - backend_compile)
  ttfs_inductor_s   inside the first step: the backend, AOTAutograd's joint graph and Inductor's
                    code generation and compilation (C++ or Triton), forward and backward, or
                    their load from a cache (backend_compile + entire_backward_compile). On a
                    CPU a cache hit still compiles the C++ kernels of a graph whose .so files
                    are not in the dir (the artifacts of save_cache_artifacts carry none)
  ttfs_execution_s  the first step's wall time less the two above: running it, lazy inits

An eager point has no compiling: its ttfs_dynamo_s and ttfs_inductor_s are 0. A figure this
machine cannot give (no process start time off Linux) is null, `ttfs_note` says why; so is the
whole for a run measured in a process that measured one before it (bench.isolate=false), which
did not start that process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PARTS = ("process", "build", "setup", "dynamo", "inductor", "execution")
# perf.compile_cache=artifacts (runner/compile_cache.py sets them): the measuring process loads
# the first file before it builds the model; the priming run saves its artifacts to the second
ARTIFACTS_LOAD_ENV = "NANOGPT_COMPILE_ARTIFACTS"
ARTIFACTS_SAVE_ENV = "NANOGPT_COMPILE_ARTIFACTS_SAVE"


def process_age_s() -> float | None:
    """Seconds since this process started: the kernel's start time of it (/proc/self/stat's
    22nd field, clock ticks after boot) against CLOCK_BOOTTIME now. None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        # the fields after the command's closing parenthesis (a command may hold spaces)
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def compile_seconds() -> tuple[float, float] | None:
    """(all compile time, its backend's: AOTAutograd + Inductor) this process has spent so
    far, from Dynamo's own timers (torch._dynamo.utils.calculate_time_spent); None where this
    torch keeps none."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        spent = calculate_time_spent()
    except (ImportError, AttributeError, TypeError):
        return None
    frames, backward = (
        spent.get("entire_frame_compile", 0.0),
        spent.get("entire_backward_compile", 0.0),
    )
    return frames + backward, spent.get("backend_compile", 0.0) + backward


_clocks_started = 0  # StartClocks made in this process: a second run here has no start of its own


class StartClock:
    """Made as the measured loop starts; `built()` after the trainer, `first_step()` around it;
    `figures()` the record's ttfs fields."""

    def __init__(self):
        global _clocks_started
        _clocks_started += 1
        # a run measured in a process that measured one before (bench.isolate=false: the job
        # process) did not start it: its age is no part of this run's wait
        self.reused = _clocks_started > 1
        self.age_s = None if self.reused else process_age_s()
        self.t0 = time.perf_counter()
        self.t_built = self.t_step = None
        self.step_s = self.compiled = None

    def built(self) -> None:
        self.t_built = time.perf_counter()

    def before_first_step(self) -> None:
        self.t_step = time.perf_counter()
        self.compiled = compile_seconds()

    def after_first_step(self, step_s: float) -> None:
        """`step_s`: the first step's own wall time, synced (scenarios/loop._first_step)."""
        self.step_s = step_s
        after = compile_seconds()
        if self.compiled is not None and after is not None:
            self.compiled = tuple(
                max(0.0, a - b) for a, b in zip(after, self.compiled, strict=True)
            )
        else:
            self.compiled = None

    def figures(self, compiled: bool) -> dict:
        """The record's time_to_first_step_s and its parts (Timing's ttfs_* fields)."""
        if self.step_s is None or self.t_built is None:
            return {"ttfs_note": "no first step (a time-to-loss run times its own)"}
        out = {
            "ttfs_build_s": self.t_built - self.t0,
            "ttfs_setup_s": self.t_step - self.t_built,
        }
        notes = []
        if compiled and self.compiled is None:
            notes.append("this torch keeps no calculate_time_spent: the compile parts are null")
            dynamo = inductor = None
            out["ttfs_execution_s"] = None
        else:
            total, inductor = self.compiled if compiled else (0.0, 0.0)
            dynamo = max(0.0, total - inductor)
            out["ttfs_execution_s"] = max(0.0, self.step_s - total)
        out["ttfs_dynamo_s"], out["ttfs_inductor_s"] = dynamo, inductor
        if self.reused:
            notes.append(
                "measured in a process that ran a point before it (bench.isolate=false): "
                "no process start of its own, time_to_first_step_s is null"
            )
            out["ttfs_process_s"] = out["time_to_first_step_s"] = None
        elif self.age_s is None:
            notes.append("no process start time (not Linux): time_to_first_step_s is null")
            out["ttfs_process_s"] = out["time_to_first_step_s"] = None
        else:
            out["ttfs_process_s"] = self.age_s
            out["time_to_first_step_s"] = self.age_s + (self.t_step - self.t0) + self.step_s
            out["time_to_first_step_s_per_run"] = [out["time_to_first_step_s"]]  # pooled: each
        out["ttfs_note"] = "; ".join(notes) or None
        return out


def load_artifacts(environ) -> int | None:
    """In the measuring process, before the model is built: the saved artifacts loaded into
    this process's (empty) caches, as a fresh cluster job would; their size, or None."""
    path = environ.get(ARTIFACTS_LOAD_ENV)
    if not path:
        return None
    import torch

    data = Path(path).read_bytes()
    torch.compiler.load_cache_artifacts(data)
    return len(data)


def save_artifacts(environ) -> None:
    """In the priming run, after its first step: what it compiled, saved for other processes
    (torch.compiler.save_cache_artifacts), written atomically."""
    path = environ.get(ARTIFACTS_SAVE_ENV)
    if not path:
        return
    import torch

    from nanogpt.record.files import write_atomic

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        raise RuntimeError("torch.compiler.save_cache_artifacts() saved nothing")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(path), saved[0])
