"""The measuring process: `python -m nanogpt.worker JOB_DIR` (or under torchrun).

It reads the spec handed over in JOB_DIR/job.json, measures, streams to the sinks, and writes
its result to JOB_DIR/measurement.json for the job process to record. Rank 0 alone writes.

In a data-parallel world rank 0 leads and the other ranks `follow`. Rank 0 alone reads the
hand-off (or runs Hydra, under torchrun by hand); it sends each point it measures to the others,
records it, and sends None when it is done (`release_followers`). After a failed measurement no
rank sends or waits for anything more, as a peer may still be stuck in a collective: each exits,
non-zero, and torchrun stops the rest.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from nanogpt import calibrate, hardware, maxbatch, records, tracking
from nanogpt.config import RunSpec, spec_from_dict, spec_to_dict
from nanogpt.distributed import World
from nanogpt.job import HANDOFF_FILE, MEASUREMENT_FILE, Job
from nanogpt.train import measure, resolve_device


def assemble(spec: RunSpec, job: Job, measurement: dict) -> dict:
    """The record of a point: what was asked (spec, overrides) plus what was measured."""
    perf = spec.perf
    result = dict.fromkeys(records.RESULT_COLUMNS)
    result.update(
        overrides=job.overrides,
        overrides_str=job.name,
        model=spec.model.name,
        dtype=perf.dtype.value,
        compile=perf.compile,
        compile_mode=perf.compile_mode,
        attention=perf.attention.value,
        activation_checkpointing=perf.activation_checkpointing,
        optimizer=spec.optimizer.name,
        optimizer_impl=spec.optimizer.impl.value,
        batch_size=perf.batch_size,
        block_size=spec.model.block_size,
        grad_accum=perf.grad_accum,
        warmup_steps=spec.bench.warmup_steps,
        job_dir=str(job.job_dir),
    )
    result.update(measurement)
    result["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    result["env"] = hardware.environment()
    return result


def measure_point(spec: RunSpec, job: Job) -> dict:
    """Measure here (in this process) and return the record. In a data-parallel world this is
    rank 0: it first sends the point to the other ranks, which wait for it in `follow`."""
    world = World.from_env()
    world.init()
    world.share({"spec": spec_to_dict(spec), "job": job.to_dict()})
    return _measure_here(spec, job, world)


def follow() -> int:
    """A rank > 0: measure each point rank 0 sends, in lockstep, until it sends None (a skipped
    point or a bad config: none at all). Returns the exit code."""
    world = World.from_env()
    world.init()
    while (point := world.share(None)) is not None:
        spec, job = spec_from_dict(point["spec"]), Job.from_dict(point["job"])
        if exit_code(_measure_here(spec, job, world)):
            return 1
    world.shutdown()
    return 0


def release_followers(world: World) -> None:
    """Rank 0 is done (it may have measured nothing): the ranks waiting in `follow` exit."""
    world.init()
    world.share(None)
    world.shutdown()


def exit_code(result: dict) -> int:
    return 0 if result["status"] == "ok" else 1


def own_dir(job: Job, world: World) -> Path:
    """Where this rank's own files go (profiler trace, memory snapshot): the job dir for rank 0,
    JOB_DIR/rank<N> for the others, so that no two ranks write one file."""
    if world.is_main:
        return job.job_dir
    path = job.job_dir / f"rank{world.rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _measure_here(spec: RunSpec, job: Job, world: World) -> dict:
    device = world.device(resolve_device(spec.bench.device))
    searched = {}
    if spec.bench.find_max_batch:  # before anything else holds memory; in its own process
        searched = maxbatch.find_in_child(spec, device, own_dir(job, world) / maxbatch.SEARCH_FILE)
    hw = spec.hardware
    if world.is_main and (hw.calibrate or hw.recalibrate):  # before the run holds memory
        calibrate.calibrate_for_run(device, spec.perf.dtype.value, force=hw.recalibrate)
    sinks = tracking.open_sinks(spec, job, world)
    measured = {**searched, **measure(spec, device, own_dir(job, world), world, sinks)}
    if not world.is_main:
        return measured  # the record is rank 0's
    result = assemble(spec, job, measured)
    for sink in sinks:
        sink.finish(result)
    return result


def main(argv: list[str]) -> int:
    """Exit code 1 when the point failed (the job process reads measurement.json either way)."""
    if not World.from_env().is_main:
        return follow()
    job_dir = Path(argv[0])
    handoff = json.loads((job_dir / HANDOFF_FILE).read_text())
    spec = spec_from_dict(handoff["spec"])
    job = Job.from_dict(handoff["job"])
    result = measure_point(spec, job)
    records.write_json(job_dir / MEASUREMENT_FILE, result)
    if result["status"] == "ok":
        release_followers(World.from_env())
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
