"""A job dir per candidate and rung, kept across resumes (SWEEP_DIR/tune_jobs.json): a resumed
search hands a point the dir that holds its record, so the runner finds it there and skips it
(nothing is copied, nothing measured twice)."""

from __future__ import annotations

from pathlib import Path

from nanogpt.files import read_json, write_json

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
