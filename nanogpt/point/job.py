"""One sweep point, from the Hydra job process's side: resume, launch, record.

By default the point is measured in a child process of its own: forked from the sweep's fork
server (point/forkserver.py), or a fresh interpreter (point/process.py; torchrun for
dist.nproc > 1); `bench.isolate=false` measures it in this process. Either way this process
writes the record: result.json and steps.csv, atomically (results/store.py).

Ctrl-C: the point is recorded as `interrupted` (with what was measured up to then) and the job
returns that status; the Hydra callback then stops the sweep after building its table.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from nanogpt.distributed import World
from nanogpt.files import read_json, write_atomic, write_json
from nanogpt.point import forkserver, placement, rounds
from nanogpt.point.handoff import Handoff, Job
from nanogpt.point.process import run_child
from nanogpt.reporters import wandb_point
from nanogpt.results import store
from nanogpt.results.figures import derive_point
from nanogpt.results.identity import point_id_of
from nanogpt.results.record import Record
from nanogpt.spec import RunSpec

log = logging.getLogger(__name__)
SKIPPED_FILE = "skipped.json"  # this job kept an earlier ok record: where from, and when


def run_point(spec: RunSpec, job: Job) -> str:
    """Measure a point (or skip it when an ok record exists), write its record; its status."""
    pid = point_id_of(spec)  # once per point: carried in the Job to the worker and the record
    job = dataclasses.replace(job, point_id=pid)
    if job.sweep_dir:
        store.move_other_point(job.sweep_dir, job.job_dir, pid, job.overrides)
    if job.sweep_dir and not spec.bench.rerun:
        done = store.find_ok(job.sweep_dir, pid, job.overrides)
        if done is not None:
            log.info(
                "[skip] %s: ok record in %s (bench.rerun=true measures it again)", job.name, done
            )
            _keep_record(done, job.job_dir)
            return "skipped"
    job.job_dir.mkdir(parents=True, exist_ok=True)
    (job.job_dir / SKIPPED_FILE).unlink(missing_ok=True)  # from an earlier run of the sweep
    count = spec.bench.repeats
    # hydra/launcher=parallel's round of a time-to-loss sweep: this job measures run R alone
    round_ = rounds.current(spec.bench.target_loss)
    if round_ and (round_.number > count or rounds.ended(job.job_dir, pid, round_.launch)):
        return point_status(job.job_dir)  # its runs are done, or one was not ok
    # Measured again (a resume, bench.rerun): its new W&B runs supersede those in its dir.
    if round_ is None or round_.number == 1:  # (a later round's are this point's own runs)
        job = dataclasses.replace(job, supersedes=wandb_point.earlier_runs(job.job_dir))
    handoff = Handoff("point", spec, job)
    beside = placement.Beside(job.name, job.job_dir.name)
    started = time.perf_counter()
    measured = []
    for number in [round_.number] if round_ else range(1, count + 1):  # each a fresh process
        repeat = dataclasses.replace(job, repeat=f"{number}/{count}") if count > 1 else job
        keep = round_ and not spec.bench.rerun and rounds.kept(job.job_dir, number, pid)
        measured.append(
            keep
            or _measure_once(dataclasses.replace(handoff, spec=_seeded(spec, number), job=repeat))
        )
        if round_:  # kept for the point's last round, with this round's wall time
            measured[-1].wall_s = measured[-1].wall_s if keep else time.perf_counter() - started
            rounds.save(job.job_dir, number, measured[-1], round_.launch)
        if measured[-1].status != "ok":
            break  # a failed repeat is the point's record
    if round_ and measured[-1].status == "ok":
        if round_.number < count:
            beside.end()  # this round's note ends (a neighbour reads it); its record is later
            return "ok"  # the point's record is written at its last round
        measured = rounds.runs(job.job_dir, pid, count) or measured
    record = measured[-1]
    if len(measured) > 1 and record.status == "ok":
        record = derive_point(measured, spec.bench.measure_s)  # the pool's figures
    record.wall_s = (
        sum(r.wall_s or 0 for r in measured) if round_ else time.perf_counter() - started
    )
    record.setup.co_running = beside.end()
    store.write_record(job.job_dir, record)
    log.info(summary_line(record))
    return record.status


def _seeded(spec: RunSpec, number: int) -> RunSpec:
    """A time-to-loss run's spec: its own seed (bench.seed + number - 1: the model's init and
    the batches' draw), as a run of a distribution over seeds. A throughput repeat keeps it."""
    if spec.bench.target_loss is None or number == 1:
        return spec
    bench = dataclasses.replace(spec.bench, seed=spec.bench.seed + number - 1)
    return dataclasses.replace(spec, bench=bench)


def _measure_once(handoff: Handoff) -> Record:
    spec = handoff.spec
    try:
        # dist.nproc ranks are started here (torchrun), unless SLURM started them as the job's
        # tasks (hydra/launcher=slurm): then this process is rank 0 and measures in place.
        ranks_here = World.from_env().size == spec.dist.nproc > 1
        if (spec.bench.isolate or spec.dist.nproc > 1) and not ranks_here:
            return _measure_in_child(handoff)
        from nanogpt.point.worker import measure_point  # in this process: torch, now

        return measure_point(handoff)
    except KeyboardInterrupt:  # Ctrl-C outside the measured loop, which records it itself
        return _failure(handoff, "interrupted", "KeyboardInterrupt: before any figures")


def _measure_in_child(handoff: Handoff) -> Record:
    spec = handoff.spec
    env = {}
    if spec.bench.cold_compile_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(handoff.job.job_dir / "inductor_cache")
    if spec.dist.nproc > 1:
        outcome = run_child(handoff, handoff.job.job_dir, nproc=spec.dist.nproc, env=env)
    else:
        outcome = forkserver.run_forked(handoff, handoff.job.job_dir, env=env)
    if outcome.answer is None:
        status = "interrupted" if outcome.interrupted else "error"
        return _failure(handoff, status, outcome.crash())
    record = Record.from_dict(outcome.answer)
    if outcome.interrupted:
        # Ctrl-C stops the sweep whatever the point's figures say; a resume measures it again.
        record.status = "interrupted"
        record.error = record.error or "KeyboardInterrupt: interrupted while finishing"
    return record


def _failure(handoff: Handoff, status: str, error: str) -> Record:
    """The record of a point that ended before the measuring code could report any figures."""
    from nanogpt.point.worker import finish_record  # its environment() asks torch

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
    if earlier:
        store.write_result(job.job_dir, record.to_dict())  # its steps.csv stays
    else:
        store.write_record(job.job_dir, record)
    log.info(summary_line(record))
    return status


def _keep_record(done: Path, job_dir: Path) -> None:
    """The ok record of a resumed point, copied into this job's dir if it lives elsewhere.

    Hydra numbers job dirs by position in the sweep, so when a resumed sweep's list of points
    changed, the record may sit in a dir that a later job of this sweep reuses and overwrites.
    """
    record = store.read_result(done / store.RESULT_FILE)
    if done.resolve() != job_dir.resolve():
        steps = done / store.STEPS_FILE
        if steps.is_file():
            write_atomic(job_dir / store.STEPS_FILE, steps.read_text(encoding="utf-8"))
        store.write_result(job_dir, {**record, "job_dir": str(job_dir)})
    write_json(job_dir / SKIPPED_FILE, {"kept_from": str(done), "at": time.time()})


def point_status(job_dir: Path) -> str:
    """The status of the point recorded in job_dir: `skipped` for a kept earlier record,
    `error` where no record was written."""
    record = store.read_result(job_dir / store.RESULT_FILE)
    if record is None:
        return "error"
    marker = read_json(job_dir / SKIPPED_FILE)
    if record.get("status") == "ok" and isinstance(marker, dict):
        return "skipped"
    return record["status"]


def skipped_since(sweep_dir: Path, since: float) -> int:
    """How many jobs below sweep_dir kept an earlier ok record at or after `since` (epoch s)."""
    count = 0
    for marker in sweep_dir.rglob(SKIPPED_FILE):
        data = read_json(marker)  # None when unreadable: not written by this run (atomic writes)
        at = data.get("at") if isinstance(data, dict) else None
        count += isinstance(at, int | float) and at >= since
    return count


def summary_line(record: Record) -> str:
    result = record.to_dict()

    def fmt(key: str, spec: str) -> str:
        value = result.get(key)
        return "-" if value is None else format(value, spec)

    mfu = result.get("mfu")
    if result.get("ttl_target_loss") is not None:  # a run to a target loss: no step window
        return (
            f"[{result['status']}] {result['overrides_str']}: time to loss "
            f"{result['ttl_target_loss']:g} {fmt('time_to_loss_s', '.2f')} s "
            f"({result.get('ttl_note') or '-'})"
            + (f" ({result['error']})" if result.get("error") else "")
        )
    return (
        f"[{result['status']}] {result['overrides_str']}: "
        f"step {fmt('step_ms_median', '.1f')} ms, {fmt('tokens_per_s', ',.0f')} tok/s, "
        f"{fmt('achieved_tflops', '.3f')} TFLOP/s, "
        f"MFU {'-' if mfu is None else f'{mfu:.1%}'}"
        + (f" ({result['error']})" if result.get("error") else "")
    )
