"""One way to start, wait on, signal and clean up a process in the tests that signal (Ctrl-C,
SIGTERM, kill -9): a command started as a terminal's foreground job (conftest.start_in_terminal)
and killed with its whole group if the test leaves it running; a wait that fails naming what
never came; one signal, then a bounded wait that fails naming each process's signal state."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from .conftest import signal_state, start_in_terminal


@contextlib.contextmanager
def in_terminal(command: list[str], cwd: Path, **popen) -> Iterator[subprocess.Popen]:
    """`command` as a shell's foreground job, for the block; still running at its end (a failed
    assert), it is killed with its process group, so no test leaves a sweep behind."""
    proc = start_in_terminal(command, cwd, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_until(
    ready: Callable[[], object],
    what: str,
    proc: subprocess.Popen | None = None,
    timeout: float = 240.0,
    every: float = 0.1,
) -> object:
    """Poll `ready()` until it holds and return what it gave; fail naming `what` when `timeout`
    passes first, or when `proc` exits before it (with the tail of its stderr, where it was
    piped)."""
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            err = err.decode(errors="replace") if isinstance(err, bytes) else err
            raise AssertionError(f"exited ({proc.returncode}) before {what}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(every)
    return found


def interrupt(
    proc: subprocess.Popen,
    sig: int = signal.SIGINT,
    group: bool = True,
    timeout: float = 120.0,
    held: tuple[psutil.Process, ...] = (),
) -> tuple:
    """One signal, as a terminal sends Ctrl-C (SIGINT to the process group) or a scheduler
    SIGTERM (to the group, or with group=False to the process alone), then wait for the exit
    (proc.returncode): what it wrote to the pipes it has, as `communicate` gives it, or a
    failure naming every process's SIGINT state (ignored, blocked, caught). `held`: processes
    the test stopped (SIGSTOP) to pin where the signal lands, resumed once it is sent."""
    try:
        pids = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        pids = [proc.pid]
    (os.killpg if group else os.kill)(proc.pid, sig)
    for stopped in held:
        stopped.resume()
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        name = signal.Signals(sig).name
        raise AssertionError(f"no exit {timeout:g} s after {name}; {signal_state(pids)}") from None
