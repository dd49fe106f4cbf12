"""Where a run's figures go besides its record: sinks with `window(stats)` and `finish(result)`.

Rank 0 alone gets sinks. A sink can never cost a local record: the record is written by the job
process from the measurement, whatever a sink does.
"""

from __future__ import annotations

from nanogpt.config import RunSpec
from nanogpt.distributed import World
from nanogpt.job import Job


def open_sinks(spec: RunSpec, job: Job, world: World) -> list:
    if not world.is_main:
        return []
    return []
