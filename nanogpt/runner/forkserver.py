"""Isolated points without paying for a fresh interpreter each: a fork server.

The first isolated point of a sweep starts multiprocessing's fork server (the parallel
launcher starts it as Hydra sets the launcher up: `warm`), which imports torch, torch._dynamo
and the worker once (runner/forkserver_preload.py) and then forks one clean child per point. A
forked child has all of isolation's guarantees: it never ran a point before (the server only
imported), so its allocator, peaks, compiled graphs and W&B state start clean, and a crash or
kill -9 costs one point. What it saves is the interpreter start and torch's imports,
seconds a point (benchmarks/point_isolation.py).

The parallel launcher's slots are the server's children too (`slot_context`: the launcher's
module preloaded as well), and a CPU slot forks its points itself (`fork_here`): it is a child
of the server that runs no point in-process and touches no CUDA, so its children are as clean,
and no slot pays a server's imports again. A GPU slot starts a server of its own (`warm`), with
its device set, as the basic launcher's sweep does.

Every child first runs the sweep's main module again, as `__mp_main__`: multiprocessing does
that for each child of a fork server (multiprocessing.spawn.prepare), so that what the parent
sent can name the main module's objects. Ours names none, and the main module is light:
`nanogpt.run` imports Hydra, OmegaConf and the launch code inside its functions, never at its
top, so running it again costs a child milliseconds, not the entry point's imports (1-2 s a
point on 2 cores). tests/test_forkserver.py checks that it stays light. A script of one's own
that starts points so needs multiprocessing's usual `if __name__ == "__main__":` guard.

A process that has initialised CUDA must not fork. The server never touches CUDA, and the child
checks it first thing: if CUDA was touched before the fork, the child exits with FORK_UNSAFE
and this and every later point of the process run in a fresh interpreter instead
(runner/process.py), as they do where the server cannot start or dies, where there is no fork
server (not Linux) and with NANOGPT_FORKSERVER=0 in the environment (an escape hatch, and the
benchmark's comparison).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
from pathlib import Path

from nanogpt.record.faults import interrupted_exit
from nanogpt.runner.handoff import Handoff, take_answer
from nanogpt.runner.process import (
    FORK_UNSAFE,
    HELD,
    Outcome,
    raise_first,
    run_child,
    signals_held,
    wait_for,
)

log = logging.getLogger(__name__)
PRELOAD = ["nanogpt.runner.forkserver_preload"]
SLOT_MODULE = "nanogpt.frontend.launchers.parallel"  # a slot's code, preloaded for the slots
# Whether the server imports wandb too (a second of a sweep's start): set from the first point
# that starts it; a later point that logs to W&B where the first did not imports it itself.
WANDB_ENV = "NANOGPT_FORKSERVER_WANDB"
_context: multiprocessing.context.BaseContext | None = None
# Linux: PR_SET_PDEATHSIG, and where the fork server is tested.
_fork_safe = sys.platform.startswith("linux") and os.environ.get("NANOGPT_FORKSERVER") != "0"


def run_forked(handoff: Handoff, folder: Path, env: dict | None = None) -> Outcome:
    """Run the handoff's task in a child forked from the server (or a fresh interpreter)."""
    global _fork_safe
    if not _fork_safe:
        return run_child(handoff, folder, env=env)
    handoff.write(folder)
    server = _server(logs_to_wandb=handoff.spec.logger.backend == "wandb")
    process = server.Process(target=_forked_main, args=(str(folder), handoff.task, env or {}))
    held: list[int] = []
    try:
        # Ctrl-C or SIGTERM while the child starts is raised once it has: in a CPU slot
        # (fork_here) this process forks, and one raised inside the fork would be lost
        with signals_held() as held:
            process.start()
    except (OSError, EOFError) as exc:  # the server did not start, or died in its preload
        log.warning(
            "no fork server (%s: %s); points now start fresh interpreters", type(exc).__name__, exc
        )
        _fork_safe = False
        raise_first(held)  # no child started: raised here, before another is
        return run_child(handoff, folder, env=env)
    child = _Forked(process)
    interrupted = wait_for(child, held)
    if child.returncode == FORK_UNSAFE:
        log.warning("CUDA was initialised before the fork; points now start fresh interpreters")
        _fork_safe = False
        return run_child(handoff, folder, env=env)
    return Outcome(take_answer(folder, handoff.task), child.returncode, interrupted)


def _forked_main(folder: str, task: str, env: dict) -> None:
    """The child's entry: worker.forked_main, named here so that the sweep's process, which
    pickles the target by name, need not import the worker (and torch); the server has."""
    # A server's child starts as the server is: SIGINT held (its preload), SIGTERM ignored. A
    # child of a slot's own fork (fork_here) inherits signals_held's: both held, handlers that
    # only note them. Either starts here as the server's does, Ctrl-C raising, SIGTERM ignored
    # until the worker handles it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)  # one that came meanwhile: raised here
        gc.freeze()  # what the child inherited (a slot's compositions too) is never walked here
        from nanogpt.runner.worker import forked_main

        forked_main(folder, task, env)
    except KeyboardInterrupt:  # before the worker could record anything: the job records the
        sys.exit(interrupted_exit())  # point as interrupted (it had the Ctrl-C too)


def slot_context(logs_to_wandb: bool) -> multiprocessing.context.BaseContext | None:
    """The context a parallel launcher starts its slots in: children of this process's fork
    server, which preloads the launcher's module (SLOT_MODULE) with torch, so that a slot starts
    in milliseconds, torch imported, instead of as a fresh interpreter importing Hydra and torch
    (seconds of a 2-core machine's start, beside each slot's server doing it again). None where
    there is no fork server: the launcher spawns its slots then."""
    if not _fork_safe:
        return None
    return _server(logs_to_wandb, [SLOT_MODULE])


def fork_here() -> None:
    """This process forks its points itself, with no server of its own: a parallel launcher's
    CPU slot, a child of the sweep's fork server that never runs a point in-process and never
    touches CUDA (its points' Hydra jobs compose, validate and write records, no more). Its
    children are then as clean as the server's, less a server's start: the seconds of a slot's
    start that torch's imports took. A child that finds CUDA touched exits FORK_UNSAFE and the
    slot starts fresh interpreters from then on, as anywhere."""
    global _context
    if _fork_safe:
        _context = multiprocessing.get_context("fork")


def warm(logs_to_wandb: bool = False, slots: bool = False) -> None:
    """Start the server now, before the first point asks for it: its preload (torch, the
    worker: seconds) runs beside what this process does meanwhile. A parallel launcher calls it
    as Hydra sets it up, before the sweeper's own imports, for its slots (`slots`: the
    launcher's module preloaded too); a GPU slot for its points. The server inherits this
    process's environment and affinity as they are now, so the caller has set them."""
    if _fork_safe:
        _server(logs_to_wandb, [SLOT_MODULE] if slots else None)
        multiprocessing.forkserver.ensure_running()  # spawns it and returns; it preloads alone


def _server(
    logs_to_wandb: bool = False, also: list[str] | None = None
) -> multiprocessing.context.BaseContext:
    """This process's context for its points: its fork server's (the preload set as it is
    first asked for; the server starts with its first child), or `fork_here`'s."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([*PRELOAD, *(also or [])])
        os.environ[WANDB_ENV] = "1" if logs_to_wandb else "0"
    return _context


class _Forked:
    """A forked Process with the part of subprocess.Popen's interface that wait_for uses."""

    def __init__(self, process: multiprocessing.Process):
        self.process = process

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"point {self.process.pid}", timeout)
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        if self.process.exitcode is None:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
