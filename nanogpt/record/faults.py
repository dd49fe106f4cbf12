"""How a run can end, and a testing knob that makes it end that way.

Every point ends with a record whose status is one of:

  ok           measured to the end
  oom          out of memory (CUDA, MPS or the CPU allocator)        -- a result: the sweep goes on
  diverged     the loss became NaN/inf (checked once per log window) -- a result: the sweep goes on
  error        any other exception, or a crash of the measuring process (type and message kept)
  interrupted  Ctrl-C or SIGTERM: recorded, then the sweep stops (exit 130 or 143) after
               building its table
  cancelled    (SLURM) the scheduler cancelled the point's job (scancel, a node failure)
  timeout      (SLURM) the job reached its time limit, and was not (or no longer) requeued
  skipped      (returned, never recorded) a resumed sweep kept the point's earlier ok record

A failed point's record keeps what was measured before the failure (static figures, first step,
memory peak, the completed measured steps). `error` and `interrupted` rows make the multirun
exit non-zero, naming them, once the table is built (nanogpt/frontend/callback.py). A single run
exits with its status's code (EXIT_CODES), so a script never mistakes a failed point for success.

SIGTERM (what `timeout`, schedulers and SLURM preemption send) stops a run like Ctrl-C: after
`handle_sigterm()` it is raised as `Stopped`, a KeyboardInterrupt, so every path that records an
interrupted point records it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanogpt.config.errors import ConfigError

if TYPE_CHECKING:
    import torch

RESULT_STATUSES = ("ok", "oom", "diverged")  # the sweep goes on and exits 0
# The multirun exits 1 once its table is built. cancelled and timeout are set by the SLURM
# launcher (nanogpt/frontend/launchers/slurm.py), which sees how the scheduler ended a job.
FAILED_STATUSES = ("error", "interrupted", "cancelled", "timeout")
FAULT_KINDS = ("oom", "nan", "raise", "kill")
# A single run's exit code by its point's status; bad input exits CONFIG_EXIT before any run.
# interrupted is 128 + the signal, the shell's convention: 130 for Ctrl-C, 143 for SIGTERM.
EXIT_CODES = {"ok": 0, "error": 1, "oom": 3, "diverged": 4}
CONFIG_EXIT = 2
IO_EXIT = 74  # a file cannot be written (disk full, not writable): sysexits.h's EX_IOERR
_stop_signal: int | None = None  # the first SIGTERM this process got, once it got one


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be."""


def handle_sigterm() -> None:
    """From now on SIGTERM raises Stopped, once: a second one, while the first is being
    recorded, is ignored (the job process passes SIGTERM on to its measuring child, which may
    have got its own already from a scheduler that signals the whole job)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame) -> None:
    global _stop_signal
    if _stop_signal is None:
        _stop_signal = signum
        raise Stopped("SIGTERM")


@contextlib.contextmanager
def finishing(what: str) -> Iterator[list[int]]:
    """While `what` is written (a sweep's table: a second or so), a Ctrl-C or SIGTERM does not
    cost it: the first is noted with one line and the work goes on; a second Ctrl-C stops it at
    once (KeyboardInterrupt, as ever); a further SIGTERM is ignored (a scheduler that signals a
    job's processes sends several: one request; its SIGKILL follows if it must). Yields the
    list that holds the signal once one came: the caller then stops (interrupted_exit(): 130,
    or 143 for SIGTERM). Main thread only, as signal handlers are."""
    came: list[int] = []

    def on_signal(signum, frame) -> None:
        global _stop_signal
        if came and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if came:
            return
        came.append(signum)
        if signum == signal.SIGTERM:
            _stop_signal = _stop_signal or signum  # the exit says which signal stopped it
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"{name}: finishing {what} first (Ctrl-C again stops at once)", file=sys.stderr)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield came
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupted_exit() -> int:
    """The exit code of a stopped run: 128 + SIGTERM if this process got one, else + SIGINT."""
    return 128 + (_stop_signal or signal.SIGINT)


def exit_code(status: str) -> int:
    return interrupted_exit() if status == "interrupted" else EXIT_CODES.get(status, 1)


class Diverged(RuntimeError):
    """The loss became non-finite (fp16 overflow past the scaler's recovery, or divergence)."""


def classify(exc: BaseException) -> str:
    """The status of a run that raised `exc`."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, Diverged):
        return "diverged"
    if is_out_of_memory(exc):
        return "oom"
    return "error"


def is_out_of_memory(exc: BaseException) -> bool:
    # torch is not imported here (the report's and the sweep's processes do without it): an
    # exception of torch's means a process that imported it.
    torch = sys.modules.get("torch")
    if isinstance(exc, MemoryError) or (torch and isinstance(exc, torch.OutOfMemoryError)):
        return True
    # A system call refused memory (ENOMEM): an mmap, a thread's stack, a library's mapping
    # (dlopen's ImportError carries the errno's text), e.g. under the max-batch search's RLIMIT_AS.
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    # CPU allocation failures surface as a plain RuntimeError: from the default allocator (a
    # tensor's storage), or torch's translation of C++'s std::bad_alloc (an autograd node, a
    # vector: under a limit, any small allocation in torch's C++ can be the one refused).
    message = str(exc)
    return isinstance(exc, RuntimeError | ImportError | OSError) and (
        "can't allocate memory" in message
        or "out of memory" in message.lower()
        or "std::bad_alloc" in message
        or os.strerror(errno.ENOMEM) in message
    )


def describe(exc: BaseException) -> str:
    """One line for the record: the exception's type and the first line of its message."""
    message = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {message.splitlines()[0]}" if message else name


@dataclass(frozen=True)
class Fault:
    """TESTING ONLY (bench.inject_fault=KIND@STEP): make a real run fail at an optimizer step.

    oom   allocates far more memory than any machine has (the real allocator fails)
    nan   multiplies the loss by NaN (the real divergence check catches it)
    raise raises RuntimeError
    kill  SIGKILLs its own process (a hard crash of the measuring process)
    """

    kind: str
    step: int

    @classmethod
    def parse(cls, text: str | None) -> Fault | None:
        if not text:
            return None
        kind, _, step = text.partition("@")
        if kind not in FAULT_KINDS or not step.isdigit():
            raise ConfigError(
                "bench.inject_fault",
                f"'{text}' is not KIND@STEP",
                f"use one of {', '.join(k + '@3' for k in FAULT_KINDS)} or leave it unset",
            )
        return cls(kind, int(step))

    def trigger(self, step: int, loss: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Called once per step with the step's loss; returns the (possibly poisoned) loss."""
        if step != self.step:
            return loss
        if self.kind == "oom":
            import torch

            torch.empty(1 << 47, dtype=torch.uint8, device=device)  # 128 TiB
        if self.kind == "raise":
            raise RuntimeError(f"injected fault at step {step}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return loss * float("nan")


# TESTING ONLY: "MOMENT:N:SIGNAL:COUNTER" sends SIGNAL (INT or TERM) to this process's group,
# as a terminal's Ctrl-C or a scheduler does, at the N-th time any process of the sweep reaches
# MOMENT (counted in the file COUNTER): tests reach a moment deterministically, not by timing
# luck. Moments: `record-written` (a run's job has written its record, before it returns) and
# `job-start` (Hydra has composed the next job and is starting it: Hydra's own code).
SIGNAL_HOOK_ENV = "NANOGPT_TEST_SIGNAL"


def signal_hook(moment: str) -> None:
    """TESTING ONLY (SIGNAL_HOOK_ENV): the signal of a test that asked for it at `moment`."""
    text = os.environ.get(SIGNAL_HOOK_ENV)
    if not text:
        return
    want, count, name, counter = text.split(":", 3)
    if want != moment:
        return
    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")  # one byte an occurrence, appended atomically by every process
        reached = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if reached == int(count):
        os.killpg(os.getpgrp(), getattr(signal, f"SIG{name}"))
