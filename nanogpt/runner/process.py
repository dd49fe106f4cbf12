"""Run a Handoff in a fresh child process: `python -m nanogpt.runner.worker DIR TASK`, or the same
under torchrun for a data-parallel point (dist.nproc > 1).

A fresh process gives a clean allocator and clean peaks, no compiled graphs or W&B state carried
over from the previous point, and a crash or kill -9 of it costs one answer, never the sweep.
On Linux the child dies with its parent (PR_SET_PDEATHSIG), so a kill -9 of the sweep leaves no
orphan still measuring.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nanogpt.record.faults import Stopped
from nanogpt.runner.handoff import Handoff, take_answer

# After Ctrl-C, how long the child gets to write its figures before it is told again (SIGINT)
# and then killed (SIGKILL).
INTERRUPT_GRACE_S = 10.0
# The signals whose handlers raise (Ctrl-C's KeyboardInterrupt, SIGTERM's faults.Stopped)
HELD = frozenset({signal.SIGINT, signal.SIGTERM})
PR_SET_PDEATHSIG = 1  # prctl(2) option, from <linux/prctl.h>

FORK_UNSAFE = 86  # exit code: a forked child found CUDA touched before the fork (runner/worker.py)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a process imports what it runs, then what the
    imports made frozen (gc.freeze: no collection walks it again) and the collector back on.

    An import makes many objects and next to no garbage, and the collector runs every 700 new
    objects, each time walking the young ones and, every hundredth time, all of them. A fork
    server's preload took 1.31 CPU-s paused against 1.57 with the collector on, a fresh worker's
    imports 0.85 against 1.19 (benchmarks/import_collector.py; 2-core EPYC, Python 3.11), and
    every sweep's fork server, fresh worker and rank pays them. Inside a block already paused
    (the fork server's preload imports the worker) it changes nothing."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _libc_prctl():
    """libc's prctl, looked up now: die_with_parent runs between fork and exec, where a process
    with other threads (a DDP rank's NCCL and gloo threads) must not load a library (dlopen
    takes a lock another thread may have held at the fork). None off Linux/glibc."""
    try:
        return ctypes.CDLL("libc.so.6").prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


@dataclass
class Outcome:
    answer: dict | None  # None when the child left no answer
    returncode: int
    interrupted: bool  # Ctrl-C came while it ran

    def ended(self) -> str:
        """How the child ended: 'was killed by signal 9', 'exited with code 1'."""
        if self.returncode < 0:
            return f"was killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def crash(self) -> str:
        """Why a child left no answer, for the record."""
        return f"WorkerCrash: the measuring process {self.ended()} before writing its figures"


def run_child(handoff: Handoff, folder: Path, nproc: int = 1, env: dict | None = None) -> Outcome:
    """Write the handoff into `folder`, run its task in a child process, take its answer."""
    handoff.write(folder)
    command = [sys.executable, "-m", "nanogpt.runner.worker", str(folder), handoff.task]
    if nproc > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        command = [sys.executable, *launcher, *command[1:]]
    # with a preexec_fn, Popen runs Python's at-fork handlers: Ctrl-C is held as the child starts
    with signals_held() as held:
        proc = subprocess.Popen(command, env={**os.environ, **(env or {})}, preexec_fn=_exec_ready)
    interrupted = wait_for(proc, held)
    return Outcome(take_answer(folder, handoff.task), proc.returncode, interrupted)


@contextlib.contextmanager
def signals_held(signums=HELD) -> Iterator[list[int]]:
    """Hold `signums` while the block runs, and yield the list of those that came meanwhile
    (in order); the caller raises them where it can handle them (signal.raise_signal).

    A handler that raises must not run in the middle of some things. Inside a fork, Python runs
    its at-fork handlers (logging's locks, random's reseed), and an exception raised there is
    reported as "ignored" and dropped: a Ctrl-C that lands there is lost, and the sweep would
    run on and exit 0. Mid-way through starting a parallel launcher's slots, a slot would be left
    with nothing to read. Here they are blocked in this thread, and a handler that notes them
    takes them where another thread gets one; mask and handlers are restored after. Off the
    main thread (which alone may set handlers, and alone runs them) nothing is held."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    handlers = {signum: signal.signal(signum, lambda n, _: held.append(n)) for signum in signums}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield held
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending one runs the note
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def raise_first(held: list[int]) -> None:
    """The first signal signals_held noted, raised now, to its own handler (KeyboardInterrupt,
    faults.Stopped); none: nothing."""
    for signum in held[:1]:
        signal.raise_signal(signum)


def wait_for(proc, held: list[int] | None = None) -> bool:
    """Wait for the child to exit; True if Ctrl-C or SIGTERM came meanwhile. `proc` is a
    subprocess.Popen or anything with its wait(timeout), send_signal and kill. `held`: the
    signals that came while the child started (signals_held), raised first, as if they had come
    now.

    Ctrl-C in a terminal sends SIGINT to the whole foreground process group, so the child gets it
    too: it records what it measured as `interrupted` and exits. It gets INTERRUPT_GRACE_S to do
    so; if it is still running (the signal went to this process alone, e.g. `kill -INT`), SIGINT
    is passed on, then SIGKILL. A second Ctrl-C kills it at once. SIGTERM (faults.Stopped) is
    passed on at once, as SIGTERM (the child ignores a second one), then SIGKILL. Any other
    exception that ends the wait (submitit's time-limit handler raises once it stops requeuing)
    kills the child first: it must not run on after this process has given its point up.
    """
    try:
        if held and held[0] == signal.SIGINT:  # it came before the child was: passed on now
            proc.send_signal(signal.SIGINT)
        raise_first(held or [])  # its handler raises: KeyboardInterrupt or Stopped
        proc.wait()
        return False
    except Stopped:
        steps = (signal.SIGTERM, signal.SIGKILL)
    except KeyboardInterrupt:
        steps = (None, signal.SIGINT, signal.SIGKILL)
    except BaseException as err:
        if isinstance(err, SystemExit):  # this process is leaving (submitit exits so once it
            # has requeued the job): the SIGTERM with which SLURM then ends the run must not
            # turn into an `interrupted` record on the way out
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        proc.kill()
        proc.wait()
        raise
    try:
        for escalate in steps:
            if escalate is not None:
                proc.send_signal(escalate)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
    return True


def _exec_ready() -> None:
    """A fresh interpreter's preexec_fn, between fork and exec: the signals run_child held are
    unblocked (an exec keeps the mask, and resets the handlers), and it dies with its parent."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    die_with_parent()


def die_with_parent() -> None:
    """Runs in a child (before exec, or first thing after a fork; Linux): SIGKILL it when its
    parent dies. A parent that died before this ran has left it to init: it exits now."""
    if _PRCTL is None:  # not Linux/glibc: an orphan finishes its task and exits
        return
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)
