"""`hydra/launcher=parallel`: a sweep's points side by side on this machine, one per slot.

A slot is a GPU (the point sees that one device) or, without GPUs, a set of cores (affinity and
thread count): launch/slots.py. One process per slot is forked from this one before any point
runs (this process has not touched CUDA: it must not, to fork) and runs Hydra's job for one
point after another, taken from a shared queue, exactly as the basic launcher runs them here:
the same job dirs and logs, each point measured in a child forked from the slot's own fork
server (pinned to the slot with it), the same records. Every record lists the points that ran
beside it (launch/placement.py) and the table counts them (`beside`).

Ctrl-C reaches every process of the terminal's group: each slot records its point
`interrupted` and stops, no further point starts, and the table of what is done is built as
after any multirun, which then exits 130 (nanogpt/callbacks.py). SIGTERM to this process alone
is passed on to the slots. A resumed sweep skips points with an ok record, as ever.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
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
from omegaconf import open_dict

from nanogpt.errors import ConfigError
from nanogpt.faults import CONFIG_EXIT, Stopped, handle_sigterm
from nanogpt.launch import placement, slots

log = logging.getLogger(__name__)


class ParallelLauncher(Launcher):
    def __init__(
        self, slots: int | None = None, cores_per_slot: int | None = None, gpus: bool = True
    ) -> None:
        self.slots, self.cores_per_slot, self.use_gpus = slots, cores_per_slot, gpus
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        gpus = slots.visible_gpus() if self.use_gpus else []
        try:
            plan = slots.plan(
                len(job_overrides), slots.host_cores(), gpus, self.slots, self.cores_per_slot
            )
        except ConfigError as err:
            print(f"error: {err} (nothing was measured)", file=sys.stderr)
            sys.exit(CONFIG_EXIT)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        notes = sweep_dir / ".parallel"  # when each point ran (placement.Beside)
        notes.mkdir(exist_ok=True)
        for old in notes.glob("*.json"):  # from an earlier run of this sweep dir
            old.unlink()
        numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
        print(f"parallel: {len(plan)} slot(s): " + "; ".join(s.describe() for s in plan))
        for number, overrides in zip(numbers, job_overrides, strict=True):
            print(f"  #{number} : {' '.join(filter_overrides(overrides))}")
        sys.stdout.flush()
        return self._run(plan, list(zip(numbers, job_overrides, strict=True)), notes)

    def _run(self, plan, work, notes: Path) -> list[JobReturn]:
        context = multiprocessing.get_context("fork")
        todo, done, stop = context.Queue(), context.Queue(), context.Event()
        for item in work:
            todo.put(item)
        for _ in plan:
            todo.put(None)
        state = Singleton.get_state()
        workers = [
            context.Process(target=self._slot, args=(slot, todo, done, stop, state, notes))
            for slot in plan
        ]
        handle_sigterm()
        for worker in workers:
            worker.start()
        returns: dict[int, JobReturn] = {}
        interrupted = False
        while len(returns) < len(work) and any(w.is_alive() for w in workers):
            try:
                number, plain = done.get(timeout=0.5)
                returns[number] = job_return = _job_return(plain)
                if job_return.status == JobStatus.COMPLETED and plain["value"] == "interrupted":
                    stop.set()  # a point stopped by a signal to its slot: start no other
            except queue.Empty:
                continue
            except KeyboardInterrupt as signalled:  # Ctrl-C (the slots got it too) or SIGTERM
                stop.set()
                if interrupted:  # a second one: the slots' points are killed
                    for worker in workers:
                        worker.kill()
                    break
                interrupted = True
                if isinstance(signalled, Stopped):
                    for worker in workers:
                        if worker.is_alive():
                            os.kill(worker.pid, signal.SIGTERM)
        for worker in workers:
            worker.join(timeout=30)
        while not done.empty():  # answers sent as the slots stopped
            number, plain = done.get()
            returns[number] = _job_return(plain)
        return [returns[number] for number, _ in work if number in returns]

    def _slot(self, slot, todo, done, stop, state, notes: Path) -> None:
        """One slot's process: run points until the queue is empty or the sweep stops."""
        try:
            handle_sigterm()
            Singleton.set_state(state)
            slots.enter(slot)
            os.environ[placement.CORUN_ENV] = str(notes)
            while not stop.is_set() and (item := todo.get()) is not None:
                number, overrides = item
                config = self.hydra_context.config_loader.load_sweep_config(
                    self.config, list(overrides)
                )
                with open_dict(config):
                    config.hydra.job.id = f"{os.getpid()}_{number}"
                    config.hydra.job.num = number
                HydraConfig.instance().set_config(config)
                job_return = run_job(
                    hydra_context=self.hydra_context,
                    task_function=self.task_function,
                    config=config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
                done.put((number, _plain(job_return)))
        except KeyboardInterrupt:  # between points: nothing to record
            pass
        done.close()
        done.join_thread()


def _plain(job_return: JobReturn) -> dict:
    """What the sweep needs of a JobReturn, picklable (its configs hold Hydra's classes)."""
    failed = job_return.status == JobStatus.FAILED
    return {
        "overrides": list(job_return.overrides or []),
        "status": job_return.status.name,
        "value": repr(job_return._return_value) if failed else job_return._return_value,
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
