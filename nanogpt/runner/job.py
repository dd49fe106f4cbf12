"""One run of a point, from the Hydra job process's side: resume, launch, record.

A Hydra job is one run: the sweeper (nanogpt/frontend/grid_sweeper.py) sets its dir, POINT/run-R,
and orders the runs round by round (run 1 of every point, then run 2, ...). The job measures run R
(`Job.run`) with its own seed where the point has a target loss, and writes that run's record
once; the point's row is the pool of its runs (analysis/store.pool_runs). A single run
(`python -m nanogpt.run` without -m) of a point with bench.repeats > 1 measures its runs one
after another into RUN_DIR/run-R, pooled into RUN_DIR (`run_single`).

By default the run is measured in a child process of its own: forked from the sweep's fork
server (runner/forkserver.py), or a fresh interpreter (runner/process.py; torchrun for
dist.nproc > 1); `bench.isolate=false` measures it in this process. Either way this process
writes the record: result.json and steps.csv, atomically (analysis/store.py), and hands it back
in memory (`Outcome`): nothing reads the file it has just written.

Resume: a run whose ok record is already in the sweep dir (store.Index: by point_id and run;
an ok record of the point written before runs were jobs counts as all its runs) is kept, not
measured (`skipped`). Ctrl-C: the run is recorded as `interrupted` (with what was measured up
to then) and the job returns that status; the sweep then stops after building its table.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from nanogpt.analysis import store
from nanogpt.analysis.labels import run_name
from nanogpt.config.spec import RunSpec
from nanogpt.publish import wandb_point
from nanogpt.record import Record
from nanogpt.record.faults import signal_hook
from nanogpt.record.identity import legacy_point_id_of, point_id_of
from nanogpt.record.swept import point_key
from nanogpt.runner import compile_cache, forkserver, placement
from nanogpt.runner.handoff import Handoff, Job
from nanogpt.runner.process import run_child
from nanogpt.scenarios import base as scenarios
from nanogpt.train.distributed import World

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a run's job hands back (Hydra's JobReturn.return_value under this project's
    sweepers): its status (`skipped`: an ok record kept), its record (flat, without its steps)
    and the objective for a search (set by run.main)."""

    status: str
    record: dict = field(default_factory=dict)
    objective: float | tuple | None = None
    job_dir: str | None = None  # where the run is (POINT/run-R)


def run_point(spec: RunSpec, job: Job) -> Outcome:
    """Measure run `job.run` of a point (or keep its ok record), write its record; its Outcome."""
    pid = job.point_id or point_id_of(spec)  # carried in the Job to the worker and the record
    job = dataclasses.replace(job, point_id=pid)
    number = job.run or 1
    if job.sweep_dir:
        point_dir = job.job_dir.parent if job.run else job.job_dir
        # what finds this point's records: its point_id, the one it had while bench.repeats
        # was part of it (a pooled record of before), its overrides (before point_id)
        keys = [pid, legacy_point_id_of(spec), "overrides:" + point_key(job.overrides)]
        store.move_other_point(job.sweep_dir, point_dir, keys)
        if not spec.bench.rerun:
            kept = _kept(job, keys, number)
            if kept is not None:
                return Outcome("skipped", kept, job_dir=str(job.job_dir))
    job.job_dir.mkdir(parents=True, exist_ok=True)
    if job.run and spec.bench.repeats > 1:
        job = dataclasses.replace(job, repeat=f"{number}/{spec.bench.repeats}")
    # Measured again (a resume, bench.rerun): its new W&B run supersedes those in its dir.
    job = dataclasses.replace(job, supersedes=wandb_point.earlier_runs(job.job_dir))
    where = job.job_dir.relative_to(job.sweep_dir) if job.sweep_dir else Path(job.job_dir.name)
    beside = placement.Beside(job.name, "_".join(where.parts))
    started = time.perf_counter()
    record = _measure_once(Handoff("point", _seeded(spec, number), job))
    record.wall_s = time.perf_counter() - started
    record.setup.co_running = beside.end()
    store.write_record(job.job_dir, record)
    result = record.to_dict()
    if job.sweep_dir:
        store.index(job.sweep_dir).add(job.job_dir, result, record.steps)
    signal_hook("record-written")  # TESTING ONLY: a test's signal at this moment, if asked
    log.info(summary_line(record, run_name(job.overrides, job.sweep_dir, job.repeat)))
    return Outcome(record.status, result)


def _kept(job: Job, keys: list[str], number: int) -> dict | None:
    """The ok record of this run kept from an earlier run of the sweep (copied into this job's
    dir when it lies elsewhere: a resumed sweep whose list of points changed), or None."""
    found = store.index(job.sweep_dir).find(keys, number)
    if found is None:
        return None
    where, pooled, record = found
    if pooled:  # one pooled record, written before runs were jobs: all the point's runs
        point_dir = job.job_dir.parent if job.run else job.job_dir
        log.info("[skip] %s: ok pooled record in %s (all its runs)", job.name, where)
        return store.copy_record(where, point_dir, record)
    log.info("[skip] %s: ok record in %s (bench.rerun=true measures it again)", job.name, where)
    return store.copy_record(where, job.job_dir, record)


def run_single(spec: RunSpec, job: Job) -> Outcome:
    """A single run (no sweep) of a point with bench.repeats runs: each measured in turn into
    JOB_DIR/run-R, then pooled into JOB_DIR, as a sweep's point is; with one run, JOB_DIR."""
    if spec.bench.repeats <= 1:
        return run_point(spec, job)
    job = dataclasses.replace(job, point_id=point_id_of(spec))  # once for all its runs
    outcomes = []
    for number in range(1, spec.bench.repeats + 1):
        run = dataclasses.replace(job, job_dir=store.run_dir(job.job_dir, number), run=number)
        outcomes.append(run_point(spec, run))
        if outcomes[-1].status not in ("ok", "skipped"):
            break  # a failed run is the point's record
    record = store.pool_runs(job.job_dir)
    status = record.status if record else outcomes[-1].status
    return Outcome(status, record.to_dict() if record else outcomes[-1].record)


def _seeded(spec: RunSpec, number: int) -> RunSpec:
    """Run `number`'s spec, as its scenario has it (a time-to-loss run: its own seed)."""
    return scenarios.of_spec(spec).checks.run_spec(spec, number)


def _measure_once(handoff: Handoff) -> Record:
    spec = handoff.spec
    try:
        # dist.nproc ranks are started here (torchrun), unless SLURM started them as the job's
        # tasks (hydra/launcher=slurm): then this process is rank 0 and measures in place.
        ranks_here = World.from_env().size == spec.dist.nproc > 1
        if (spec.bench.isolate or spec.dist.nproc > 1) and not ranks_here:
            return _measure_in_child(handoff)
        from nanogpt.runner.worker import measure_point  # in this process: torch, now

        record = measure_point(handoff)
        _freeze_what_outlives_a_run()
        return record
    except KeyboardInterrupt:  # Ctrl-C outside the measured loop, which records it itself
        return _failure(handoff, "interrupted", "KeyboardInterrupt: before any figures")


_frozen_after_a_run = False  # _freeze_what_outlives_a_run: done in this process


def _freeze_what_outlives_a_run() -> None:
    """Once a process, after its first run measured here: the run's memory was collected as it
    ended (probes/memory.release), so what is left is the process's own (torch's modules and
    what they made, torch._dynamo's among them, Hydra's, the sweep's). gc.freeze() moves that
    out of the collector's sight, so each later collection (one as every run ends, and the
    collector's own full passes) walks only what the runs make: over torch's objects one took
    0.2 s a run on 2 CPU cores, about a quarter of a micro run's measuring (a 6-point sweep:
    4.9 CPU-s against 5.6). The fork server does the same before it forks
    (runner/forkserver_preload.py). A frozen object is still freed when its last reference
    goes; only a cycle of them that becomes garbage later is kept (a first job's own config).
    Once, by its own flag: the process may have frozen its start's imports already (run.cli,
    process.collector_paused), before torch."""
    global _frozen_after_a_run
    if not _frozen_after_a_run:
        _frozen_after_a_run = True
        gc.freeze()


def _measure_in_child(handoff: Handoff) -> Record:
    spec = handoff.spec
    # the compile caches it starts with (perf.compile_cache): a priming run first, if asked
    try:
        env, caches = compile_cache.prepare(handoff, _prime)
    except RuntimeError as err:  # its priming run failed: the point fails, saying so
        return _failure(handoff, "error", str(err))
    if spec.dist.nproc > 1:
        outcome = run_child(handoff, handoff.job.job_dir, nproc=spec.dist.nproc, env=env)
    else:
        outcome = forkserver.run_forked(handoff, handoff.job.job_dir, env=env)
    if outcome.answer is None:
        status = "interrupted" if outcome.interrupted else "error"
        return _failure(handoff, status, outcome.crash())
    record = Record.from_dict(outcome.answer)
    for key, value in caches.items():
        setattr(record.setup, key, value)
    if outcome.interrupted:
        # Ctrl-C stops the sweep whatever the point's figures say; a resume measures it again.
        record.status = "interrupted"
        record.error = record.error or "KeyboardInterrupt: interrupted while finishing"
    return record


def _prime(prime: Handoff, env: dict) -> bool:
    """The priming run of runner/compile_cache.py, in a child of its own: whether it ended
    with its answer."""
    outcome = forkserver.run_forked(prime, prime.job.job_dir, env=env)
    if outcome.interrupted:
        raise KeyboardInterrupt
    return outcome.answer is not None


def _failure(handoff: Handoff, status: str, error: str) -> Record:
    """The record of a point that ended before the measuring code could report any figures."""
    from nanogpt.runner.worker import finish_record  # its environment() asks torch

    return finish_record(Record(status=status, error=error), handoff)


def record_ended_outside(
    spec: RunSpec, job: Job, status: str, error: str, slurm_job_id: str, node: str | None
) -> str:
    """A point whose job the scheduler ended (scancel, time limit): record it with `status`,
    keeping what its job recorded before it was stopped (an `interrupted` record after SIGTERM).
    An ok record stays ok: the job had finished measuring. Returns the point's status."""
    job = dataclasses.replace(job, point_id=point_id_of(spec))  # once, as in run_point
    job.job_dir.mkdir(parents=True, exist_ok=True)
    earlier = store.read_result(job.job_dir / store.RESULT_FILE)
    if earlier and earlier.get("point_id") != job.point_id:
        earlier = None  # another point's, from an earlier run of the sweep
    if earlier and earlier["status"] == "ok":
        return "ok"
    if earlier:
        record = Record.from_dict(earlier)
        error = f"{error}; before that: {record.error}" if record.error else error
    else:
        record = _failure(Handoff("point", spec, job), status, error)
    record.status, record.error = status, error
    record.setup.slurm_job_id = record.setup.slurm_job_id or slurm_job_id
    record.setup.slurm_node = record.setup.slurm_node or node
    if earlier:  # its steps as they are stored (one written before: converted, store.py)
        record.steps = store.read_steps(job.job_dir, earlier)
    store.write_record(job.job_dir, record)
    log.info(summary_line(record))
    return status


def point_status(job_dir: Path) -> str:
    """The status of the run recorded in job_dir (`error` where no record was written): what a
    sweeper that is not this project's leaves the callback to read, as it gets the objective."""
    record = store.read_result(job_dir / store.RESULT_FILE)
    return "error" if record is None else record["status"]


def summary_line(record: Record, name: str | None = None) -> str:
    """The run's [status] line; `name`: what its sweep varies (analysis/labels.run_name)."""
    result = record.to_dict()
    name = name or result["overrides_str"]

    def fmt(key: str, spec: str) -> str:
        value = result.get(key)
        return "-" if value is None else format(value, spec)

    line = scenarios.of_record(record).part.console_line(result, fmt)  # the scenario's figures
    return f"[{result['status']}] {name}: {line}" + (
        f" ({result['error']})" if result.get("error") else ""
    )
