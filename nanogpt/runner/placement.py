"""Where a point ran, for its record: its SLURM job and node, and the points beside it.

Under SLURM (hydra/launcher=slurm) the job's own environment says where it runs: the job (an
array task, as `scancel`/`squeue` name it), the node, how often it was requeued, and, for a
point across nodes, each rank's node (the ranks tell each other when they join:
distributed.rank_nodes). Under
hydra/launcher=parallel several points run at once on one machine, each in its own set of cores
or on its own GPU; they share memory bandwidth, PCIe and the host, so each record lists the
points that ran beside it. The launcher names a folder (CORUN_ENV) where every point it runs
notes when it started and ended; a point's neighbours are those whose time overlapped its own.
A point writes its end before it reads the others', so two overlapping points see each other.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from nanogpt.record import Setup
from nanogpt.record.files import read_json, write_json
from nanogpt.train.distributed import TIMEOUT_S, World, rank_nodes

CORUN_ENV = "NANOGPT_CORUN_DIR"  # set by hydra/launcher=parallel in each of its slots


def slurm_job_id(env=os.environ) -> str | None:
    """The job as SLURM's commands take it: ARRAYJOB_TASK for an array task, else the job id."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def fill(setup: Setup) -> None:
    """The placement fields of a record, from this process's environment."""
    env = os.environ
    setup.slurm_job_id = slurm_job_id(env)
    if setup.slurm_job_id:
        setup.slurm_node = env.get("SLURMD_NODENAME")
        setup.slurm_restarts = int(env.get("SLURM_RESTART_COUNT", 0))
        # each rank's node, as the ranks told each other (a world of one: this node)
        ranks = rank_nodes() or [setup.slurm_node]
        if all(ranks):
            setup.rank_nodes, setup.nodes = ranks, len(set(ranks))
    if World.from_env().size > 1:
        setup.dist_timeout_s = TIMEOUT_S
    if env.get(CORUN_ENV):
        if hasattr(os, "sched_getaffinity"):
            setup.cpu_set = sorted(os.sched_getaffinity(0))
        setup.gpu_set = env.get("CUDA_VISIBLE_DEVICES")


class Beside:
    """This point's note in the launcher's folder, and its neighbours' (none without one)."""

    def __init__(self, name: str, key: str):
        folder = os.environ.get(CORUN_ENV)
        self.path = Path(folder) / f"{key}.json" if folder else None
        self.name = name
        self.started = time.time()
        if self.path:
            write_json(self.path, {"point": name, "start": self.started, "end": None})

    def end(self) -> list[str] | None:
        """Note the end; the points whose time overlapped this one's (None: not side by side)."""
        if self.path is None:
            return None
        ended = time.time()
        write_json(self.path, {"point": self.name, "start": self.started, "end": ended})
        beside = []
        for note_path in sorted(self.path.parent.glob("*.json")):
            note = read_json(note_path)
            if note_path == self.path or not isinstance(note, dict):
                continue
            other_end = note.get("end")
            if note["start"] < ended and (other_end is None or other_end > self.started):
                beside.append(note["point"])
        return beside
