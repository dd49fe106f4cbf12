"""The sweep's steps: one long table, a row per point and step, keyed by the point's job dir.

Columns: job_dir (the summary table's job_dir, the key to join on), repeat (1.., bench.repeats),
step, phase (warmup | profile | measure), step_ms, data_ms, loss (at window ends), and step_ms_job:
on measured rows, the step time the statistics use (the slowest rank's under torchrun, which is
the record's step_ms_measured; step_ms is rank 0's own). Built from each point's steps.csv and
result.json; a point whose steps.csv is missing or does not match its record gets its measured
steps from the record alone (step and the other columns empty).

Intervals and speedups (analysis/compare.py) take each row's measured steps from here, by key.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd

from nanogpt.analysis import store

COLUMNS = ("job_dir", "repeat", "step", "phase", "step_ms", "data_ms", "loss", "step_ms_job")
MEASURE = "measure"


def build(records: list[dict]) -> pd.DataFrame:
    """The long steps table of the records (each with its job_dir)."""
    rows: list[dict] = []
    for record in records:
        rows += _point_rows(record)
    steps = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("repeat", "step"):  # "" in steps.csv: a point measured once has no repeat
        steps[column] = pd.to_numeric(steps[column], errors="coerce").astype("Int64")
    for column in ("step_ms", "data_ms", "loss", "step_ms_job"):
        steps[column] = pd.to_numeric(steps[column], errors="coerce").astype("float64")
    steps["phase"] = steps["phase"].astype("string")
    steps["job_dir"] = steps["job_dir"].astype("string")
    return steps


def _point_rows(record: dict) -> list[dict]:
    job_dir = record["job_dir"]
    held = record.get("steps")  # a point pooled in this process: its rows, not read back
    if held is None:
        rows = _read_csv(Path(job_dir) / store.STEPS_FILE)
    else:
        rows = [{key: (None if value == "" else value) for key, value in r.items()} for r in held]
    for row in rows:
        row["job_dir"] = job_dir
        row["repeat"] = row.get("repeat") or 1
    measured = record.get("step_ms_measured") or []
    for number, series in enumerate(measured, 1):
        at = [row for row in rows if row.get("phase") == MEASURE and int(row["repeat"]) == number]
        if len(at) == len(series):
            for row, ms in zip(at, series, strict=True):
                row["step_ms_job"] = ms
            continue
        dropped = {id(row) for row in at}  # the record is the authority
        rows = [row for row in rows if id(row) not in dropped]
        rows += [
            {"job_dir": job_dir, "repeat": number, "phase": MEASURE, "step_ms": ms}
            | {"step_ms_job": ms}
            for ms in series
        ]
    return rows


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [
                {key: (value if value != "" else None) for key, value in row.items()}
                for row in csv.DictReader(f)
            ]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def series(steps: pd.DataFrame, job_dirs) -> list[list[list[float]]]:
    """Per job dir, in the given order: its measured steps, a list per repeat ([] if none)."""
    measured = steps[steps["step_ms_job"].notna()]
    grouped = measured.groupby(["job_dir", "repeat"], sort=True)["step_ms_job"].apply(list)
    by_job: dict[str, list[list[float]]] = {}
    for (job_dir, _), values in grouped.items():
        by_job.setdefault(job_dir, []).append(values)
    return [by_job.get(str(job_dir), []) for job_dir in job_dirs]
