"""A run's steps are stored once (issue 44): steps.csv holds every step, the measured ones with
the time the statistics use (step_ms_job), and result.json only the statistics derived from
them. A sweep dir written before (its records held the measured steps as step_ms_measured, its
steps.csv had no step_ms_job) reads through one converter (analysis/store.read_steps) into the
same figures. A real `python -m nanogpt.run -m` sweep, rewritten to the old shape by hand."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from nanogpt.analysis import store
from nanogpt.analysis import table as report
from nanogpt.record.files import write_json

from .conftest import run_cli, with_micro

# The figures that come from the measured steps: the point's step and its interval, the rates'
# interval, and the speedups against the baseline with theirs (analysis/compare.py)
FROM_STEPS = [
    "step_ms_median",
    "step_ms_mean",
    "step_ms_p10",
    "step_ms_p90",
    "step_ms_ci_low",
    "step_ms_ci_high",
    "tokens_per_s",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
]
RANK0 = 0.9  # the old steps.csv's step_ms made faster than the job's: rank 0 beside a slower rank


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two points of two runs each, as this version writes them (the runs, the points' pools)."""
    root = tmp_path_factory.mktemp("steps_once")
    sweep_dir = root / "sweep"
    args = with_micro(["perf.batch_size=1,2", "bench.repeats=2"])
    proc = run_cli("-m", *args, f"hydra.sweep.dir={sweep_dir}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir


def measured_series(job_dir: Path) -> list[list[float]]:
    """The job's measured step times in a dir's steps.csv, a list per run (pandas, not ours)."""
    steps = pd.read_csv(job_dir / "steps.csv")
    measured = steps[steps["phase"] == "measure"].fillna({"repeat": 1})
    return [list(g["step_ms_job"]) for _, g in measured.groupby("repeat", sort=True)]


def to_old_shape(job_dir: Path) -> None:
    """A dir's record and steps rewritten as a version before this one wrote them: the measured
    steps' times in result.json (timing.step_ms_measured, a list per run), steps.csv without
    step_ms_job and with rank 0's own step_ms, here faster than the job's (RANK0): under
    torchrun the two differed, and the record's were the ones the statistics used."""
    series = measured_series(job_dir)
    data = json.loads((job_dir / "result.json").read_text())
    data["timing"]["step_ms_measured"] = series
    with open(job_dir / "steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    old_columns = [c for c in rows[0] if c != "step_ms_job"]
    for row in rows:
        del row["step_ms_job"]
        if row["phase"] == "measure":
            row["step_ms"] = repr(float(row["step_ms"]) * RANK0)
    with open(job_dir / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns)
        writer.writeheader()
        writer.writerows(rows)
    write_json(job_dir / "result.json", data)


def old_copy(sweep_dir: Path, where: Path) -> Path:
    """A copy of the sweep dir in the old shape: its runs first, then the points' pools (a pool
    newer than its runs is read as it is, not pooled again)."""
    shutil.copytree(sweep_dir, where)
    for run in sorted(where.glob("*/run-*/result.json")):
        to_old_shape(run.parent)
    for point in sorted(where.glob("*/result.json")):
        to_old_shape(point.parent)
    return where


def figures(sweep_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The table's figures from the steps, and the steps table's job times, by point's place."""
    built = report.build_table(sweep_dir)
    table = built.table[FROM_STEPS].reset_index(drop=True)
    steps = built.steps[built.steps["phase"] == "measure"].copy()
    steps["point"] = [Path(d).name for d in steps["job_dir"]]
    steps = steps.sort_values(["point", "repeat"], kind="stable")
    return table, steps[["point", "repeat", "step_ms_job"]].reset_index(drop=True)


@pytest.mark.slow
def test_a_runs_steps_are_in_its_steps_csv_alone(sweep):
    for path in sorted(sweep.glob("*/run-*/result.json")):
        record = json.loads(path.read_text())
        assert "step_ms_measured" not in record["timing"]  # no steps in the record
        # its statistics are those of steps.csv's job times (one run: its own median)
        (series,) = measured_series(path.parent)
        assert record["timing"]["measured_steps"] == len(series) > 0
        assert record["timing"]["step_ms_median"] == pytest.approx(pd.Series(series).median())
    for path in sorted(sweep.glob("*/result.json")):  # a point's pool: its runs' steps, numbered
        pooled = json.loads(path.read_text())["timing"]
        per_run = [pd.Series(s).median() for s in measured_series(path.parent)]
        assert "step_ms_measured" not in pooled and len(per_run) == pooled["repeats"] == 2
        assert pooled["step_ms_median_per_repeat"] == pytest.approx(per_run)


@pytest.mark.slow
def test_a_sweep_dir_of_before_reads_into_the_same_figures(sweep, tmp_path):
    table, steps = figures(sweep)
    assert table["step_ms_ci_low"].notna().all() and steps["step_ms_job"].notna().all()
    # The old points' pools, read as they are (each pooled steps.csv converted run by run)
    pools = old_copy(sweep, tmp_path / "pools")
    assert "step_ms_measured" in json.loads((pools / "0" / "result.json").read_text())["timing"]
    old_table, old_steps = figures(pools)
    pd.testing.assert_frame_equal(old_table, table)
    pd.testing.assert_frame_equal(old_steps, steps)
    # The old runs pooled again, one of them without its steps.csv (the record's times alone)
    runs = old_copy(sweep, tmp_path / "runs")
    for point in ("0", "1"):
        (runs / point / "result.json").unlink()
        (runs / point / "steps.csv").unlink()
    (runs / "1" / "run-2" / "steps.csv").unlink()
    old_table, old_steps = figures(runs)
    pd.testing.assert_frame_equal(old_table, table)
    pd.testing.assert_frame_equal(old_steps, steps)
    # pooled now, the points are written in today's shape: their steps in steps.csv alone
    for point in ("0", "1"):
        assert "step_ms_measured" not in json.loads((runs / point / "result.json").read_text())
        assert measured_series(runs / point) == measured_series(sweep / point)
    run = runs / "1" / "run-2"
    rows = store.read_steps(run, store.read_result(run / "result.json"))
    assert [r["step_ms_job"] for r in rows] == measured_series(sweep / "1" / "run-2")[0]
