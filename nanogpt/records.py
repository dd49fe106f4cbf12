"""The record of one sweep point: `result.json` and `steps.csv` in the job dir.

`RESULT_COLUMNS` is the one schema: the record, the sweep table, W&B's summary and the notebook
all read these names. Units are in the names (_ms, _s, _bytes, _tflops, tokens_per_s) and
README.md documents each. Every file is written atomically: a temp file in the same directory,
then os.replace, so a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
STEPS_COLUMNS = ("step", "phase", "step_ms", "data_ms", "loss")

# Scalar columns of the table, in order. Nested values (env, mem_estimate, profile_top_ops)
# stay in result.json only.
RESULT_COLUMNS = (
    "status",
    "error",
    "overrides",
    "model",
    "n_params",
    "n_params_flops",
    "dtype",
    "compile",
    "compile_mode",
    "attention",
    "activation_checkpointing",
    "optimizer",
    "optimizer_impl",
    "batch_size",
    "block_size",
    "grad_accum",
    "tokens_per_step",
    "device",
    "device_name",
    "world_size",
    "warmup_steps",
    "measured_steps",
    "stopped_by_budget",
    "clock",
    "compile_s",
    "inductor_cache",
    "first_step_ms",
    "step_ms_median",
    "step_ms_mean",
    "step_ms_p10",
    "step_ms_p90",
    "step_ms_std",
    "step_ms_cv",
    "step_ms_median_per_rank",  # a list, one median per rank (step_ms_* are the slowest rank's)
    "data_ms_median",
    "tokens_per_s",
    "flops_per_token",
    "flops_per_token_counted",
    "flops_per_token_hw",
    "achieved_tflops",
    "peak_tflops",
    "peak_source",
    "mfu",
    "hfu",
    "achievable_tflops",
    "mfu_achievable",
    "mfu_flag",
    "mem_peak_allocated_bytes",
    "mem_peak_reserved_bytes",
    "mem_nvml_used_bytes",
    "mem_peak_rss_bytes",
    "mem_estimate_bytes",
    "loss_first",
    "loss_last",
    "max_batch_size",
    "wall_s",
    "finished_at",
    "job_dir",
)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    binary = isinstance(data, bytes)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_steps(job_dir: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=STEPS_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(job_dir / STEPS_FILE, buf.getvalue())


def write_result(job_dir: Path, result: dict) -> None:
    write_json(job_dir / RESULT_FILE, result)


def read_result(path: Path) -> dict | None:
    """A record, or None when the file is unreadable or not a complete record."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and "status" in data else None


def point_key(overrides: list[str]) -> str:
    """A sweep point's identity: its overrides, order-free (job numbers can change)."""
    return " ".join(sorted(overrides))


def iter_records(sweep_dir: Path):
    """(path, record or None) for every result.json below a sweep dir."""
    for path in sorted(sweep_dir.rglob(RESULT_FILE)):
        yield path, read_result(path)


def find_ok(sweep_dir: Path, overrides: list[str]) -> Path | None:
    """The job dir of an earlier `ok` record of the same point, if any."""
    key = point_key(overrides)
    for path, record in iter_records(sweep_dir):
        if record and record.get("status") == "ok" and point_key(record["overrides"]) == key:
            return path.parent
    return None
