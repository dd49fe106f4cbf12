"""One sweep point, from the Hydra job process's side: resume, launch, record.

By default the point is measured in a fresh child process (`python -m nanogpt.worker JOB_DIR`,
or torchrun with dist.nproc > 1): a clean allocator and clean peaks, no compiled graphs or W&B
state carried over from the previous point, and a crash or kill -9 of the measuring process
costs one record's figures, never the sweep. This process writes the record.

Ctrl-C: the point is recorded as `interrupted` (with what was measured up to then) and the job
returns that status; the Hydra callback then stops the sweep after building its table.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nanogpt import records
from nanogpt.config import RunSpec, spec_to_dict

HANDOFF_FILE = "job.json"  # spec + job info, for the measuring process
MEASUREMENT_FILE = "measurement.json"  # the measuring process's result, before it is recorded
SKIPPED_FILE = "skipped.json"  # this job kept an earlier ok record: where from, and when
# After Ctrl-C, how long the measuring process gets to write its figures before it is told again
# (SIGINT) and then killed (SIGKILL).
INTERRUPT_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2) option, from <linux/prctl.h>


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
            return {**_keep_record(done, job.job_dir), "status": "skipped"}
    job.job_dir.mkdir(parents=True, exist_ok=True)
    (job.job_dir / SKIPPED_FILE).unlink(missing_ok=True)  # from an earlier run of the sweep
    started = time.perf_counter()
    try:
        if spec.bench.isolate or spec.dist.nproc > 1:
            result = _measure_in_child(spec, job)
        else:
            from nanogpt.worker import measure_point

            result = measure_point(spec, job)
    except KeyboardInterrupt:  # Ctrl-C outside the measured loop, which records it itself
        result = _failure(spec, job, "interrupted", "KeyboardInterrupt: before any figures")
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
    proc = subprocess.Popen(_child_command(spec, job), env=env, preexec_fn=_die_with_parent)
    interrupted = _wait_for(proc)
    result = records.read_result(measurement)
    if result is None:
        how = (
            f"was killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else (f"exited with code {proc.returncode}")
        )
        error = f"WorkerCrash: the measuring process {how} before writing its figures"
        result = _failure(spec, job, "interrupted" if interrupted else "error", error)
    if interrupted:
        # Ctrl-C stops the sweep whatever the point's figures say; a resume measures it again.
        result["status"] = "interrupted"
        result["error"] = result.get("error") or "KeyboardInterrupt: interrupted while finishing"
    measurement.unlink(missing_ok=True)
    return result


def _wait_for(proc: subprocess.Popen) -> bool:
    """Wait for the measuring process to exit; True if Ctrl-C came meanwhile.

    Ctrl-C in a terminal sends SIGINT to the whole foreground process group, so the measuring
    process gets it too: it records what it measured as `interrupted` and exits. It gets
    INTERRUPT_GRACE_S to do so; if it is still running (the signal went to this process alone,
    e.g. `kill -INT`), SIGINT is passed on, then SIGKILL. A second Ctrl-C kills it at once.
    """
    try:
        proc.wait()
        return False
    except KeyboardInterrupt:
        pass
    try:
        for escalate in (None, signal.SIGINT, signal.SIGKILL):
            if escalate is not None:
                proc.send_signal(escalate)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
    return True


def _die_with_parent() -> None:
    """Runs in the child before exec (Linux): SIGKILL it when this job process dies, so a kill -9
    of the sweep leaves no orphan still measuring (and skewing the timings of a rerun)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux/glibc: an orphan finishes its point and exits
        pass


def _failure(spec: RunSpec, job: Job, status: str, error: str) -> dict:
    """The record of a point that ended before the measuring code could report any figures."""
    from nanogpt.worker import assemble

    return assemble(spec, job, {"status": status, "error": error})


def _keep_record(done: Path, job_dir: Path) -> dict:
    """The ok record of a resumed point, copied into this job's dir if it lives elsewhere.

    Hydra numbers job dirs by position in the sweep, so when a resumed sweep's list of points
    changed, the record may sit in a dir that a later job of this sweep reuses and overwrites.
    """
    record = records.read_result(done / records.RESULT_FILE)
    if done.resolve() != job_dir.resolve():
        steps = done / records.STEPS_FILE
        if steps.is_file():
            records.write_atomic(job_dir / records.STEPS_FILE, steps.read_text(encoding="utf-8"))
        record = {**record, "job_dir": str(job_dir)}
        records.write_result(job_dir, record)
    records.write_json(job_dir / SKIPPED_FILE, {"kept_from": str(done), "at": time.time()})
    return record


def skipped_since(sweep_dir: Path, since: float) -> int:
    """How many jobs below sweep_dir kept an earlier ok record at or after `since` (epoch s)."""
    count = 0
    for marker in sweep_dir.rglob(SKIPPED_FILE):
        try:
            at = json.loads(marker.read_text(encoding="utf-8"))["at"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, so not written by this run (writes are atomic)
        if at >= since:
            count += 1
    return count


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
