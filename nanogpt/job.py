"""One sweep point, from the Hydra job process's side: resume, launch, record.

By default the point is measured in a fresh child process (`python -m nanogpt.worker JOB_DIR`,
or torchrun with dist.nproc > 1): a clean allocator and clean peaks, no compiled graphs or W&B
state carried over from the previous point, and a crash or kill -9 of the measuring process
costs one record's figures, never the sweep. This process writes the record.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nanogpt import records
from nanogpt.config import RunSpec, spec_to_dict

HANDOFF_FILE = "job.json"  # spec + job info, for the measuring process
MEASUREMENT_FILE = "measurement.json"  # the measuring process's result, before it is recorded


@dataclass
class Job:
    """What the job process knows about a point beyond its spec."""

    job_dir: Path
    overrides: list[str] = field(default_factory=list)
    sweep_dir: Path | None = None  # set in a multirun
    group: str | None = None  # the sweep's id (its dir name)
    config: dict = field(default_factory=dict)  # the resolved config, for W&B

    @property
    def name(self) -> str:
        return " ".join(self.overrides) or "defaults"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["job_dir"] = str(self.job_dir)
        data["sweep_dir"] = str(self.sweep_dir) if self.sweep_dir else None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        data = dict(data)
        data["job_dir"] = Path(data["job_dir"])
        data["sweep_dir"] = Path(data["sweep_dir"]) if data["sweep_dir"] else None
        return cls(**data)


def run_point(spec: RunSpec, job: Job) -> dict:
    """Measure a point (or skip it when an ok record exists) and write its record."""
    if job.sweep_dir and not spec.bench.rerun:
        done = records.find_ok(job.sweep_dir, job.overrides)
        if done is not None:
            print(f"[skip] {job.name}: ok record in {done} (bench.rerun=true measures it again)")
            return {**records.read_result(done / records.RESULT_FILE), "status": "skipped"}
    job.job_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if spec.bench.isolate or spec.dist.nproc > 1:
        result = _measure_in_child(spec, job)
    else:
        from nanogpt.worker import measure_point

        result = measure_point(spec, job)
    result["wall_s"] = time.perf_counter() - started
    records.write_steps(job.job_dir, result.pop("steps", []))
    records.write_result(job.job_dir, result)
    print(summary_line(result))
    return result


def _measure_in_child(spec: RunSpec, job: Job) -> dict:
    records.write_json(
        job.job_dir / HANDOFF_FILE, {"spec": spec_to_dict(spec), "job": job.to_dict()}
    )
    measurement = job.job_dir / MEASUREMENT_FILE
    measurement.unlink(missing_ok=True)
    env = dict(os.environ)
    if spec.bench.cold_compile_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(job.job_dir / "inductor_cache")
    proc = subprocess.run(_child_command(spec, job), env=env)
    result = records.read_result(measurement)
    if result is None:
        from nanogpt.worker import assemble

        how = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else (f"exited with code {proc.returncode}")
        )
        error = f"WorkerCrash: the measuring process {how} before writing its figures"
        result = assemble(spec, job, {"status": "error", "error": error})
    measurement.unlink(missing_ok=True)
    return result


def _child_command(spec: RunSpec, job: Job) -> list[str]:
    worker = ["-m", "nanogpt.worker", str(job.job_dir)]
    if spec.dist.nproc > 1:
        launcher = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={spec.dist.nproc}",
        ]
        return [sys.executable, *launcher, *worker]
    return [sys.executable, *worker]


def summary_line(result: dict) -> str:
    def fmt(key: str, spec: str) -> str:
        value = result.get(key)
        return "-" if value is None else format(value, spec)

    mfu = result.get("mfu")
    return (
        f"[{result['status']}] {result.get('overrides_str') or 'defaults'}: "
        f"step {fmt('step_ms_median', '.1f')} ms, {fmt('tokens_per_s', ',.0f')} tok/s, "
        f"{fmt('achieved_tflops', '.3f')} TFLOP/s, "
        f"MFU {'-' if mfu is None else f'{mfu:.1%}'}"
        + (f" ({result['error']})" if result.get("error") else "")
    )
