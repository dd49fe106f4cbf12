"""A job dir per candidate and rung, kept across resumes (SWEEP_DIR/tune_jobs.json): a resumed
search hands a point the dir that holds its record, so the runner finds it there and skips it
(nothing is copied, nothing measured twice). And what the search keeps of that record."""

from __future__ import annotations

from pathlib import Path

from nanogpt.record.files import read_json, write_json
from nanogpt.tune import objectives

JOBS_FILE = "tune_jobs.json"


class JobNumbers:
    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / JOBS_FILE
        self.numbers: dict[str, int] = read_json(self.path) or {}

    def of(self, key: str) -> int:
        """The job number of `key` (a rung and a candidate), a new one the first time."""
        if key not in self.numbers:
            self.numbers[key] = max(self.numbers.values(), default=-1) + 1
            write_json(self.path, self.numbers)
        return self.numbers[key]


def kept(record: dict, job_dir: Path, names: list[str], prices: dict) -> dict:
    """The figures of a point's record (result.json) the search keeps, by its own names
    (objectives.record_fields), with its objectives' values and where the record is."""
    slim = {name: objectives.field(record, name) for name in objectives.record_fields()}
    slim["objectives"] = objectives.values(record, names, **prices)
    slim["footprint_bytes"] = objectives.footprint_bytes(record)
    slim["peak_memory_gib"] = objectives.peak_memory_gib(record)
    slim["wall_s"] = record.get("wall_s")
    slim["job_dir"] = str(job_dir)
    slim["grad_accum"] = (record.get("measured_config") or {}).get("perf", {}).get("grad_accum")
    return slim
