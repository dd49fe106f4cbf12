"""The measuring process: `python -m nanogpt.worker JOB_DIR` (or under torchrun).

It reads the spec handed over in JOB_DIR/job.json, measures, streams to the sinks, and writes
its result to JOB_DIR/measurement.json for the job process to record. Rank 0 alone writes.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from nanogpt import hardware, records, tracking
from nanogpt.config import RunSpec, spec_from_dict
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
    """Measure here (in this process) and return the record."""
    world = World.from_env()
    device = world.device(resolve_device(spec.bench.device))
    world.init(device)
    sinks = tracking.open_sinks(spec, job, world)
    try:
        result = assemble(spec, job, measure(spec, device, job.job_dir, world, sinks))
        for sink in sinks:
            sink.finish(result)
    finally:
        world.shutdown()
    return result


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    handoff = json.loads((job_dir / HANDOFF_FILE).read_text())
    spec = spec_from_dict(handoff["spec"])
    job = Job.from_dict(handoff["job"])
    result = measure_point(spec, job)
    if World.from_env().is_main:
        records.write_json(job_dir / MEASUREMENT_FILE, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
