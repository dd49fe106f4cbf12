"""The one form in which a point crosses a process boundary.

In: a `Handoff` (a task, the point's spec and its Job), as one JSON-ready dict. It is written to
a file for a child process (`python -m nanogpt.runner.worker DIR TASK`) and broadcast as the same
dict from rank 0 to the other ranks of a data-parallel world.
Out: the child's answer, one JSON file beside it (for the `point` task, the Record's dict).

Tasks:
  point       measure the point; the answer is its record (with its steps)
  max-batch   search the largest batch that fits (probes/max_batch.py); the answer is its figures
  calibrate   fill the calibration cache for the point's dtype (hardware/calibration.py)
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nanogpt.config.spec import RunSpec, spec_from_dict, spec_to_dict
from nanogpt.record.files import read_json, write_json

# (handoff file, answer file) per task, in the dir the child is given. The point's own names
# are the job dir's job.json and measurement.json.
FILES = {
    "point": ("job.json", "measurement.json"),
    "max-batch": ("max_batch.job.json", "max_batch.json"),
    "calibrate": ("calibrate.job.json", "calibrate.json"),
    "compile-cache": ("compile_cache.job.json", "compile_cache.json"),  # runner/compile_cache.py
}


@dataclass
class Job:
    """What the job process knows about a point beyond its spec."""

    job_dir: Path
    overrides: list[str] = field(default_factory=list)
    sweep_dir: Path | None = None  # set in a multirun
    group: str | None = None  # the sweep's id (its dir name)
    config: dict = field(default_factory=dict)  # the resolved config, for W&B
    repeat: str | None = None  # "2/3": which run of the point's bench.repeats this is
    run: int | None = None  # the run this job measures (POINT/run-R: R); None outside runs
    logging: dict | None = None  # the job's logging config, resolved: the child logs there too
    supersedes: list[str] = field(default_factory=list)  # W&B runs of earlier measurements
    # The point's identity (record/identity.py), computed once by the job process (run_point)
    # and carried: the record, the W&B run's id and the resume all read this one value.
    point_id: str | None = None

    @property
    def name(self) -> str:
        """The point's name (its W&B run's): its overrides, and which repeat this is."""
        name = " ".join(self.overrides) or "defaults"
        return f"{name} (repeat {self.repeat})" if self.repeat else name


@dataclass
class Handoff:
    task: str
    spec: RunSpec
    job: Job

    def to_dict(self) -> dict[str, Any]:
        job = asdict(self.job)
        job["job_dir"] = str(self.job.job_dir)
        job["sweep_dir"] = str(self.job.sweep_dir) if self.job.sweep_dir else None
        return {"task": self.task, "spec": spec_to_dict(self.spec), "job": job}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Handoff:
        job = dict(data["job"])
        job["job_dir"] = Path(job["job_dir"])
        job["sweep_dir"] = Path(job["sweep_dir"]) if job["sweep_dir"] else None
        return cls(data["task"], spec_from_dict(data["spec"]), Job(**job))

    def for_task(self, task: str, device) -> Handoff:
        """This point's handoff for a helper task, on the exact device the point runs on (a
        rank's own GPU, where the spec may say only `cuda`)."""
        bench = dataclasses.replace(self.spec.bench, device=str(device))
        return Handoff(task, dataclasses.replace(self.spec, bench=bench), self.job)

    def write(self, folder: Path) -> None:
        handoff_file, answer_file = FILES[self.task]
        (folder / answer_file).unlink(missing_ok=True)
        write_json(folder / handoff_file, self.to_dict())

    @classmethod
    def read(cls, folder: Path, task: str) -> Handoff:
        return cls.from_dict(read_json(folder / FILES[task][0]))


def write_answer(folder: Path, task: str, answer: dict) -> None:
    write_json(folder / FILES[task][1], answer)


def take_answer(folder: Path, task: str) -> dict | None:
    """The child's answer (removed once read), or None when it left none."""
    path = folder / FILES[task][1]
    answer = read_json(path)
    path.unlink(missing_ok=True)
    return answer if isinstance(answer, dict) else None
