"""Isolated points without paying for a fresh interpreter each: a fork server.

The first isolated point of a sweep starts multiprocessing's fork server (a parallel
launcher's slot starts its own as the slot starts: `warm`), which imports torch, torch._dynamo
and the worker once (runner/forkserver_preload.py) and then forks one clean child per point. A
forked child has all of isolation's guarantees: it never ran a point before (the server only
imported), so its allocator, peaks, compiled graphs and W&B state start clean, and a crash or
kill -9 costs one point. What it saves is the interpreter start and torch's imports,
seconds a point (benchmarks/point_isolation.py).

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

import logging
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
from pathlib import Path

from nanogpt.runner.handoff import Handoff, take_answer
from nanogpt.runner.process import FORK_UNSAFE, Outcome, run_child, wait_for

log = logging.getLogger(__name__)
PRELOAD = ["nanogpt.runner.forkserver_preload"]
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
    try:
        process.start()
    except (OSError, EOFError) as exc:  # the server did not start, or died in its preload
        log.warning(
            "no fork server (%s: %s); points now start fresh interpreters", type(exc).__name__, exc
        )
        _fork_safe = False
        return run_child(handoff, folder, env=env)
    child = _Forked(process)
    interrupted = wait_for(child)
    if child.returncode == FORK_UNSAFE:
        log.warning("CUDA was initialised before the fork; points now start fresh interpreters")
        _fork_safe = False
        return run_child(handoff, folder, env=env)
    return Outcome(take_answer(folder, handoff.task), child.returncode, interrupted)


def _forked_main(folder: str, task: str, env: dict) -> None:
    """The child's entry: worker.forked_main, named here so that the sweep's process, which
    pickles the target by name, need not import the worker (and torch); the server has."""
    from nanogpt.runner.worker import forked_main

    forked_main(folder, task, env)


def warm(logs_to_wandb: bool = False) -> None:
    """Start the server now, before the first point asks for it: its preload (torch, the
    worker: seconds) runs beside what this process does meanwhile. A parallel launcher's slot
    calls it as it starts, while the sweep composes its first points. The server inherits this
    process's environment and affinity as they are now, so the caller has set them."""
    if _fork_safe:
        _server(logs_to_wandb)
        multiprocessing.forkserver.ensure_running()  # spawns it and returns; it preloads alone


def _server(logs_to_wandb: bool = False) -> multiprocessing.context.BaseContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
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
