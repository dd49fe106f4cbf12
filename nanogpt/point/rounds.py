"""Rounds: a time-to-loss sweep's runs alternated (hydra/launcher=parallel).

A point's runs (bench.repeats) ordinarily run back to back in its job (point/job.py), so a
drift in the machine's speed over the sweep falls on one point's runs only. When every point of
a sweep has a target loss, the parallel launcher runs it in rounds instead: round r enters every
point's job once, and the job measures its run r alone, so run r of every point runs before run
r + 1 (docs/time_to_loss.md). The launcher says which round a job is in through ROUND_ENV.

Each round's run is kept in the job dir (RUNS_DIR/R.json, with the point's point_id and the
launch it ran in) and the point's last round pools them into its result.json, as a job that ran
them all would; until then the point has no result.json. So a resumed sweep measures what is
missing: a kept ok run of the same point counts, and a run that was not ok ends the point's
later rounds of the same launch only (that run's record is the point's, as in a job). The
pooled record's co_running is its last round's neighbours.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nanogpt.files import read_json, write_json
from nanogpt.results.record import Record

ROUND_ENV = "NANOGPT_ROUND"  # "R/N/LAUNCH": this job measures run R of N ("": every run)
RUNS_DIR = "runs"  # job_dir/runs/R.json: run R's record until the last round pools them


@dataclass
class Round:
    number: int  # the run this job measures
    count: int  # the sweep's rounds: the most runs any point has
    launch: str  # which launch of the sweep (a resume is another)


def current(target_loss: float | None) -> Round | None:
    """This job's round, or None (every run here): none outside the launcher's rounds, and none
    for a point without a target."""
    text = os.environ.get(ROUND_ENV)
    if not text or target_loss is None:
        return None
    number, count, launch = text.split("/", 2)
    return Round(int(number), int(count), launch)


def _path(job_dir: Path, number: int) -> Path:
    return job_dir / RUNS_DIR / f"{number}.json"


def save(job_dir: Path, number: int, record: Record, launch: str) -> None:
    write_json(_path(job_dir, number), {"launch": launch, "record": record.to_dict(steps=True)})


def kept(job_dir: Path, number: int, point_id: str) -> Record | None:
    """Run `number` of this point, measured ok in an earlier round or launch; None if not."""
    data = read_json(_path(job_dir, number))
    record = data.get("record") if isinstance(data, dict) else None
    if record and record.get("point_id") == point_id and record.get("status") == "ok":
        return Record.from_dict(record)
    return None


def ended(job_dir: Path, point_id: str, launch: str) -> bool:
    """Whether a run of this point in this launch was not ok: its later rounds measure nothing."""
    for path in sorted((job_dir / RUNS_DIR).glob("*.json")):
        data = read_json(path)
        if not isinstance(data, dict) or data.get("launch") != launch:
            continue
        record = data.get("record") or {}
        if record.get("point_id") == point_id and record.get("status") != "ok":
            return True
    return False


def runs(job_dir: Path, point_id: str, count: int) -> list[Record]:
    """Runs 1..count of this point kept ok, which the last round pools (a run whose file was
    lost is missing from them: ttl_runs says how many there are)."""
    found = [kept(job_dir, number, point_id) for number in range(1, count + 1)]
    return [record for record in found if record is not None]
