"""The sweep's steps: one long table, a row per point and step, keyed by the point's job dir.

Columns: job_dir (the summary table's job_dir, the key to join on), repeat (1.., bench.repeats),
step, phase (warmup | profile | measure), step_ms, data_ms, loss (at window ends), and step_ms_job:
on measured rows, the step time the statistics use (the slowest rank's under torchrun; step_ms is
rank 0's own). Each point's rows are its record's steps as they are stored, once (steps.csv,
analysis/store.py: a sweep dir written before that reads converted there), or as this process
holds them.

Intervals and speedups (analysis/compare.py) take each row's measured steps from here, by key.
"""

from __future__ import annotations

import pandas as pd

from nanogpt.analysis import store

COLUMNS = ("job_dir", "repeat", "step", "phase", "step_ms", "data_ms", "loss", "step_ms_job")


def build(records: list[dict]) -> pd.DataFrame:
    """The long steps table of the records (each with its job_dir)."""
    rows: list[dict] = []
    for record in records:
        rows += _point_rows(record)
    steps = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("repeat", "step"):
        steps[column] = pd.to_numeric(steps[column], errors="coerce").astype("Int64")
    for column in ("step_ms", "data_ms", "loss", "step_ms_job"):
        steps[column] = pd.to_numeric(steps[column], errors="coerce").astype("float64")
    steps["phase"] = steps["phase"].astype("string")
    steps["job_dir"] = steps["job_dir"].astype("string")
    return steps


def _point_rows(record: dict) -> list[dict]:
    """A point's steps: held (a point pooled in this process: its rows, not read back), else
    read once with its record (store.read_steps); a point measured once has no repeat: 1."""
    held = record.get("steps")
    rows = store.read_steps(record["job_dir"], record) if held is None else held
    return [{**row, "job_dir": record["job_dir"], "repeat": row.get("repeat") or 1} for row in rows]


def series(steps: pd.DataFrame, job_dirs) -> list[list[list[float]]]:
    """Per job dir, in the given order: its measured steps, a list per repeat ([] if none)."""
    measured = steps[steps["step_ms_job"].notna()]
    grouped = measured.groupby(["job_dir", "repeat"], sort=True)["step_ms_job"].apply(list)
    by_job: dict[str, list[list[float]]] = {}
    for (job_dir, _), values in grouped.items():
        by_job.setdefault(job_dir, []).append(values)
    return [by_job.get(str(job_dir), []) for job_dir in job_dirs]
