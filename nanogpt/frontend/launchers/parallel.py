"""`hydra/launcher=parallel`: a sweep's points side by side on this machine, one per slot.

A slot is a GPU (the point sees that one device) when the points train on CUDA, else a set of
cores (affinity and thread count): hardware/slots.py. One process per slot runs Hydra's job for
one point after another, taken from a shared queue, exactly as the basic launcher runs them
here: the same job dirs and logs, each point measured in a child process of its own, pinned to
the slot, the same records. Every record lists the points that ran beside it
(runner/placement.py) and the table counts them (`beside`).

Where the processes come from (runner/forkserver.py):
- The slots are children of the sweep's fork server, never forks of this process: the sweep's
  check may have asked CUDA here (a device's capability, is_available), and a fork of a process
  that has would fail at its first CUDA call ("Cannot re-initialize CUDA in forked
  subprocess"). The server only imported (torch, and this module): a slot starts in
  milliseconds with torch imported. The launcher starts the server as Hydra sets it up, so its
  imports (seconds) run beside the sweeper's own start. Where there is no fork server, the
  slots are fresh interpreters (multiprocessing's spawn).
- A CPU slot forks each point itself: it runs no point in-process and touches no CUDA, so its
  child is as clean as a server's. A GPU slot starts a fork server of its own, pinned and with
  its device set, and its points are that server's children.
What a slot needs goes to it pickled: Hydra's singletons (its config store and this run's
config), the sweep's config and config loader, the callbacks, where the task function lives (by
name) and, through the queue, each point's overrides. Each slot sends its points' answers back
on a pipe of its own, whose closing also tells it the sweep's process is gone.

Ctrl-C reaches every process of the terminal's group: each slot records its point
`interrupted` and stops, no further point starts, and the table of what is done is built as
after any multirun, which then exits 130 (nanogpt/frontend/callback.py). SIGTERM to this process
alone is passed on to the slots. A slot holds both signals until it can handle them (a Ctrl-C while
it starts stops it before any point). A resumed sweep skips runs with an ok record, as ever.

The launcher knows no rounds: a job is one run of a point, and the sweeper
(nanogpt/frontend/grid_sweeper.py) hands it one round per launch, so the points' runs alternate
here as under any launcher. The slots are kept from one launch to the next, waiting for work,
and end with the sweep's process (or at once when it is gone, or after a Ctrl-C). A sweeper
that knows its first launch's size early (the search) starts the slots with `start_slots`
while it composes that launch's points (a thread waits for the server meanwhile).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.singleton import Singleton
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    run_job,
    setup_globals,
)
from hydra.plugins.launcher import Launcher
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict

from nanogpt.config.errors import ConfigError
from nanogpt.frontend.presets import expose_checkout_plugins
from nanogpt.hardware.slots import check_counts, enter, gpus_for, host_cores, plan
from nanogpt.record.faults import CONFIG_EXIT, Stopped, handle_sigterm
from nanogpt.runner import forkserver, placement
from nanogpt.runner.job import Outcome
from nanogpt.runner.process import HELD, raise_first, signals_held

log = logging.getLogger(__name__)
POINT_KEYS = ("bench.device",)  # what the launcher reads of each point: its device (the slots)


class ParallelLauncher(Launcher):
    def __init__(
        self, slots: int | None = None, cores_per_slot: int | None = None, gpus: bool = True
    ) -> None:
        try:  # Hydra builds the launcher before the sweep writes anything
            check_counts(slots=slots, cores_per_slot=cores_per_slot)
        except ConfigError as err:
            _refuse(err)
        self.slots, self.cores_per_slot, self.use_gpus = slots, cores_per_slot, gpus
        self.config = self.hydra_context = self.task_function = None
        self.pool: _Pool | None = None  # the slots, kept from one launch to the next
        self.starting: _Starting | None = None  # start_slots' slots, while they start
        atexit.register(self.close)  # before multiprocessing's own exit joins them

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        if OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN:
            # The slots are forks of the sweep's fork server: it imports torch (seconds) from
            # now, beside the sweeper's own start (the search's imports, study, first batch)
            forkserver.warm(_logs_to_wandb(config), slots=True)

    def start_slots(self, jobs: int) -> None:
        """Start now the slots that a first launch of `jobs` points on the sweep's own device
        will be planned: a sweeper that knows that size before it can launch (the search builds
        its study and composes and estimates its first batch first) has the sweep's fork server
        import torch and the slots start meanwhile (a thread waits for the server), not after.
        The launch keeps them where it plans the same slots, else starts its own, as ever; a
        plan this machine refuses is the launch's to say, in its one line."""
        setup_globals()
        device = OmegaConf.select(self.config, POINT_KEYS[0])
        gpus = gpus_for([str(device or "cpu")]) if self.use_gpus else []
        try:
            slots = plan(jobs, host_cores(), gpus, self.slots, self.cores_per_slot)
        except ConfigError:
            return
        self.close()
        self.starting = _Starting(slots, self._notes(), self._sweep())

    def _ready(self) -> _Pool | None:
        """The slots, once those start_slots began to start have (None: none started)."""
        if self.starting is not None:  # kept until it answers: a Ctrl-C meanwhile leaves it
            try:  # to close() at the exit
                self.pool = self.starting.result()
            finally:
                if not self.starting.is_alive():
                    self.starting = None
        return self.pool

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        values = self._values(job_overrides)
        gpus = gpus_for([str(v or "cpu") for v in values]) if self.use_gpus else []
        try:
            slots = plan(len(job_overrides), host_cores(), gpus, self.slots, self.cores_per_slot)
        except ConfigError as err:
            _refuse(err)
        notes = self._notes()
        for old in notes.glob("*.json"):  # from an earlier run of this sweep dir
            old.unlink()
        numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
        print(f"parallel: {len(slots)} slot(s): " + "; ".join(s.describe() for s in slots))
        for number, overrides in zip(numbers, job_overrides, strict=True):
            print(f"  #{number} : {' '.join(filter_overrides(overrides))}")
        work = list(zip(numbers, job_overrides, strict=True))
        sys.stdout.flush()
        return self._run(slots, work, notes)

    def _notes(self) -> Path:
        """The sweep's folder of when each point ran (placement.Beside), made."""
        notes = Path(str(self.config.hydra.sweep.dir)) / ".parallel"
        notes.mkdir(parents=True, exist_ok=True)
        return notes

    def _values(self, job_overrides: Sequence[Sequence[str]]) -> list:
        """Each job's device: the sweep's own (its master config), unless the job's overrides
        set it or choose a config group (one may set it, as a case does): such a job is
        composed here to read it. Overrides given once, not swept, are the master's."""
        given = set(self.config.hydra.overrides.task)
        parser = OverridesParser.create()
        found = []
        for overrides in job_overrides:
            own = [o for o in overrides if o not in given and not o.startswith("hydra.")]
            own = parser.parse_overrides(own)
            config = self.config
            if any(o.key_or_group in POINT_KEYS or "." not in o.key_or_group for o in own):
                compose = self.hydra_context.config_loader.load_sweep_config
                config = compose(self.config, list(overrides))
            found.append(OmegaConf.select(config, POINT_KEYS[0]))
        return found

    def _run(self, slots, work, notes: Path) -> list[JobReturn]:
        handle_sigterm()
        returns: dict[int, JobReturn] = {}
        interrupted = False
        pool = self._ready()
        try:
            with _held():  # the slots start whole; a signal meanwhile is raised after
                if pool is None or not pool.serves(slots):
                    self.close()
                    pool = self.pool = _Pool.start(slots, notes, self._sweep())
                for item in work:
                    pool.todo.put(item)
        except KeyboardInterrupt as signalled:  # the slots got Ctrl-C too: they run no point
            interrupted = self._stop(signalled, pool.workers, pool.stop)
        workers = pool.workers
        while len(returns) < len(work) and any(w.is_alive() for w in workers):
            try:
                for number, plain in pool.answers(timeout=0.5):
                    returns[number] = _job_return(plain)
            except KeyboardInterrupt as signalled:  # Ctrl-C (the slots got it too) or SIGTERM
                if interrupted:  # a second one: the slots' points are killed
                    for worker in workers:
                        worker.kill()
                    break
                interrupted = self._stop(signalled, workers, pool.stop)
        if interrupted or len(returns) < len(work):  # the slots stop (a slot that ended: all)
            self.close()
        for number, plain in pool.answers(timeout=0):  # answers sent as the slots stopped
            returns[number] = _job_return(plain)
        if interrupted and not returns:  # no run returned: the sweeper's Ctrl-C (its table of
            raise KeyboardInterrupt  # what is on disk, one line, 130), as if it had it itself
        return [returns[number] for number, _ in work if number in returns]

    def _sweep(self) -> tuple:
        """What a slot needs of the sweep: Hydra's singletons (its resolvers are the slot's
        own), the sweep's config and loader, where the task function lives."""
        hydra = Singleton.get_state()["instances"]
        return hydra, (self.config, self.hydra_context, _where(self.task_function))

    def close(self) -> None:
        """The slots end (they wait between launches: a sweeper launches a round at a time, so
        the slots start once a sweep); at this process's exit too."""
        with contextlib.suppress(Exception):  # slots that failed to start: none to close
            self._ready()
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    @staticmethod
    def _stop(signalled: KeyboardInterrupt, workers: list, stop) -> bool:
        """The first Ctrl-C or SIGTERM: no point starts; SIGTERM, sent to this process alone,
        is passed on to the slots (Ctrl-C reached them with this one)."""
        stop.set()
        if isinstance(signalled, Stopped):
            for worker in workers:
                if worker.is_alive():
                    os.kill(worker.pid, signal.SIGTERM)
        return True


@dataclass
class _Pool:
    """The slots' processes, the queue of work they take from (None: end), and each one's link
    to this process: the slot sends its answers on it, and reads its end closing as this
    process gone (a kill -9 of it leaves no slot waiting forever)."""

    slots: list
    workers: list
    todo: Any
    links: list
    stop: Any
    kept: list  # answers read while the slots were closing, for the launch to take

    @classmethod
    def start(cls, slots: list, notes: Path, sweep: tuple) -> _Pool:
        """The slots start as children of the sweep's fork server (torch and this module
        preloaded, so each starts in milliseconds: forkserver.slot_context), else as fresh
        interpreters (spawn), never as forks of this process (the module's docstring says why)."""
        hydra, state = sweep
        served = forkserver.slot_context(_logs_to_wandb(state[0]))
        if served is not None:
            try:
                return cls._start(served, slots, notes, sweep, served=True)
            except (OSError, EOFError) as exc:  # the server did not start, or died preloading
                log.warning(
                    "no fork server for the slots (%s: %s); they start afresh",
                    type(exc).__name__,
                    exc,
                )
        return cls._start(multiprocessing.get_context("spawn"), slots, notes, sweep, served=False)

    @classmethod
    def _start(cls, context, slots: list, notes: Path, sweep: tuple, served: bool) -> _Pool:
        hydra, state = sweep
        todo, stop = context.Queue(), context.Event()
        links, workers = [], []
        for number, slot in enumerate(slots):
            mine, theirs = context.Pipe()
            args = (slot, todo, theirs, stop, hydra, state, notes, served)
            workers.append(context.Process(target=_slot, args=args, name=f"slot {number}"))
            links.append((mine, theirs))
        try:
            for worker in workers:
                worker.start()
        except BaseException:
            for worker in workers:  # those started: no slot is left without its pool
                if worker.pid is not None:
                    worker.kill()
            raise
        for _, theirs in links:
            theirs.close()  # the slot's end is the slot's alone: its EOF then says it ended
        return cls(list(slots), workers, todo, [mine for mine, _ in links], stop, [])

    def serves(self, slots: list) -> bool:
        """Whether these slots, all alive, can take a launch planned as `slots` (the same
        slots, or more of them: a launch of fewer jobs plans fewer)."""
        alive = all(w.is_alive() for w in self.workers)
        return alive and self.slots[: len(slots)] == list(slots)

    def answers(self, timeout: float) -> list:
        """The (number, answer) pairs the slots have sent, waiting up to `timeout` s for one
        (or for a slot to end: its link's end)."""
        got, self.kept = self.kept, []
        for link in multiprocessing.connection.wait(self.links, timeout):
            try:
                got.append(link.recv())
            except EOFError:  # the slot ended
                self.links.remove(link)
        return got

    def close(self) -> None:
        for _ in self.workers:
            self.todo.put(None)
        deadline = time.monotonic() + 30
        while any(w.is_alive() for w in self.workers) and time.monotonic() < deadline:
            alive = [w.sentinel for w in self.workers if w.is_alive()]
            multiprocessing.connection.wait([*self.links, *alive], timeout=1.0)
            self.kept += self.answers(timeout=0)  # what a slot sends as it stops
        for worker in self.workers:
            if worker.is_alive():
                worker.kill()
            worker.join()
        self.kept += self.answers(timeout=0)


class _Starting(threading.Thread):
    """start_slots' slots, started beside the sweeper's own work: each slot's start waits for
    the fork server's preload (seconds: torch), which this thread waits out instead of the
    sweeper. Signals stay the sweep's main thread's (this one holds them, and a slot spawned
    from here inherits them held, as from `_held`)."""

    def __init__(self, slots: list, notes: Path, sweep: tuple):
        super().__init__(name="slots start", daemon=True)
        self.args, self.pool, self.error = (slots, notes, sweep), None, None
        self.start()

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        try:
            self.pool = _Pool.start(*self.args)
        except BaseException as err:  # noqa: BLE001 - raised by result(), in the sweep's thread
            self.error = err

    def result(self) -> _Pool:
        self.join()
        if self.error is not None:
            raise self.error
        return self.pool


def _logs_to_wandb(config) -> bool:
    """Whether the sweep's points log to W&B (the fork server then imports wandb too)."""
    return str(OmegaConf.select(config, "logger.backend")) == "wandb"


def _refuse(err: ConfigError) -> None:
    print(f"error: {err} (nothing was measured)", file=sys.stderr)
    sys.exit(CONFIG_EXIT)


@contextlib.contextmanager
def _held():
    """SIGINT and SIGTERM held while the slots start, then raised (to their own handlers:
    KeyboardInterrupt, Stopped). Raised mid-start, they would leave a slot started with nothing
    to read. A slot inherits the mask of the thread that starts it, so there they stay blocked
    until _slot can handle them."""
    with signals_held(HELD) as held:
        # now, not as a slot starts: it unblocks both as it returns, so they are blocked again
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
        yield
    raise_first(held)


def _where(task_function) -> tuple[str, str]:
    """The task function by name: the module it was defined in (its spec's name where it ran as
    `python -m`, where __module__ says only __main__) and its name there."""
    spec = task_function.__globals__.get("__spec__")
    module = spec.name if spec is not None else task_function.__module__
    return module, task_function.__qualname__


def _task(where: tuple[str, str]):
    """The task function in this interpreter, found by name (run.main: not decorated; run.py
    applies Hydra's decorator when called)."""
    module, name = where
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _slot(slot, todo, link, stop, hydra, sweep, notes: Path, served: bool) -> None:
    """One slot's process (a child of the sweep's fork server, else a fresh interpreter):
    compose and run points until the queue is empty or the sweep stops."""
    try:
        handle_sigterm()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
        master, hydra_context, task = sweep
        task_function = _task(task)  # imported first: its modules register their resolvers
        resolvers = Singleton.get_state()["omegaconf_resolvers"]
        expose_checkout_plugins()  # set_state lists Hydra's plugins again, as run.cli did
        Singleton.set_state({"instances": hydra, "omegaconf_resolvers": resolvers})
        setup_globals()
        enter(slot)
        os.environ[placement.CORUN_ENV] = str(notes)
        if _forks(master) and served and slot.gpu is None:
            forkserver.fork_here()  # a CPU slot, torch imported: its points are its own forks
        elif _forks(master):  # pinned and in its environment: the server starts while we wait
            forkserver.warm(_logs_to_wandb(master))
        while not stop.is_set() and (item := _next(todo, link)) is not None:
            number, overrides = item
            config = hydra_context.config_loader.load_sweep_config(master, list(overrides))
            with open_dict(config):
                config.hydra.job.id = f"{os.getpid()}_{number}"
                config.hydra.job.num = number
            HydraConfig.instance().set_config(config)
            job_return = run_job(
                hydra_context=hydra_context,
                task_function=task_function,
                config=config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
            try:
                link.send((number, _plain(job_return)))
            except OSError:  # the sweep's process is gone (its end closed): no one to tell
                break
            completed = job_return.status == JobStatus.COMPLETED
            value = job_return.return_value if completed else None  # the run's Outcome
            if isinstance(value, Outcome) and value.status == "interrupted":  # a signal to
                stop.set()  # this slot: the sweep stops, no slot starts another point
    except KeyboardInterrupt:  # between points: nothing to record
        pass
    link.close()
    # The sweep's process waits for this one to end (close): what it imported is left to the
    # exit, not walked by the interpreter's last collections first (tenths of a second)
    gc.freeze()


def _forks(master) -> bool:
    """Whether the sweep's points measure in forked children (of the slot itself, or of its
    own fork server), as runner/job.py decides for each (bench.isolate, one rank), with no
    hydra.job.env_set: a server the first job starts inherits that job's environment, one
    started before any job would not. A point that does otherwise starts or skips the server
    itself, as ever."""
    try:
        isolated = bool(OmegaConf.select(master, "bench.isolate"))
        one_rank = int(OmegaConf.select(master, "dist.nproc") or 1) == 1
        return isolated and one_rank and not OmegaConf.select(master, "hydra.job.env_set")
    except Exception:  # noqa: BLE001 - a key that needs a point's composition: not decided here
        return False


def _next(todo, link):
    """The slot's next job, waiting between launches; None (end) once the sweep's process is
    gone: it never sends on the link, so its end readable means closed (a kill -9 of it
    leaves no slot waiting forever)."""
    while True:
        try:
            return todo.get(timeout=1.0)
        except queue.Empty:
            if link.poll(0):
                return None


def _plain(job_return: JobReturn) -> dict:
    """What the sweep needs of a JobReturn, picklable (its configs hold Hydra's classes): the
    run's Outcome, or the exception of a job that raised (its return_value raises it)."""
    try:
        value = job_return.return_value
    except Exception as err:  # noqa: BLE001 - the job's own exception, kept as text
        value = repr(err)
    return {
        "overrides": list(job_return.overrides or []),
        "status": job_return.status.name,
        "value": value,
        "working_dir": job_return.working_dir,
        "task_name": job_return.task_name,
    }


def _job_return(plain: dict) -> JobReturn:
    status = JobStatus[plain["status"]]
    value = plain["value"]
    return JobReturn(
        overrides=plain["overrides"],
        working_dir=plain["working_dir"],
        task_name=plain["task_name"],
        status=status,
        _return_value=RuntimeError(value) if status == JobStatus.FAILED else value,
    )
