"""hydra/launcher=parallel: a sweep's points side by side, one per slot (cores here; GPUs where
there are some), in real `python -m nanogpt.run -m` processes and real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import psutil
import pytest

from nanogpt.errors import ConfigError
from nanogpt.launch.slots import Slot, plan
from tests.conftest import signal_state, start_in_terminal, with_micro

PARALLEL = "hydra/launcher=parallel"
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sched_setaffinity and the fork server: Linux"
)


def test_slots_are_one_per_gpu_else_sets_of_cores():
    assert plan(4, [0, 1], []) == [Slot((0,)), Slot((1,))]
    assert plan(1, [0, 1], []) == [Slot((0,))]  # never more slots than points
    assert plan(4, [0, 1, 2, 3], [], slots=2) == [Slot((0, 1)), Slot((2, 3))]
    assert plan(4, list(range(8)), ["0", "1"]) == [Slot((0, 1, 2, 3), "0"), Slot((4, 5, 6, 7), "1")]
    with pytest.raises(ConfigError, match="hydra.launcher.slots"):
        plan(4, [0, 1], [], slots=2, cores_per_slot=2)


def records(sweep_dir) -> dict[str, dict]:
    found = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        record = json.loads(path.read_text())
        found[record["overrides_str"]] = record
    return found


@pytest.mark.slow
@linux_only
def test_points_run_side_by_side_pinned_and_name_their_neighbours(sweep):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    proc, sweep_dir = sweep(PARALLEL, "hydra.launcher.slots=2", "perf.batch_size=1,2,3,4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir)
    assert len(found) == 4 and {r["status"] for r in found.values()} == {"ok"}
    assert {len(r["cpu_set"]) for r in found.values()} == {1}  # one core each ...
    assert len({tuple(r["cpu_set"]) for r in found.values()}) == 2  # ... two sets
    # Neighbours: points ran side by side, and each pair agrees on it (the last point of the
    # slower slot may run alone once the other slot has finished: [] is its honest answer)
    assert sum(bool(r["co_running"]) for r in found.values()) >= 2
    for name, record in found.items():
        for other in record["co_running"]:
            assert name in found[other]["co_running"]
    assert "beside" in proc.stdout  # the printed table counts them
    table = pd.read_csv(sweep_dir / "summary.csv")
    assert table["co_running"].notna().all()
    # The same command again: every point kept, none measured again
    again, _ = sweep(PARALLEL, "hydra.launcher.slots=2", "perf.batch_size=1,2,3,4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: skipped 4 point(s)" in again.stdout
    assert records(sweep_dir) == found


@pytest.mark.slow
@linux_only
def test_a_failed_point_costs_only_itself(sweep):
    proc, sweep_dir = sweep(PARALLEL, "bench.inject_fault=null,raise@2", "perf.batch_size=1,2")
    assert proc.returncode == 1
    statuses = sorted(r["status"] for r in records(sweep_dir).values())
    assert statuses == ["error", "error", "ok", "ok"]
    assert "2 point(s) failed" in proc.stderr
    assert len(pd.read_csv(sweep_dir / "summary.csv")) == 4


@pytest.mark.slow
@linux_only
def test_ctrl_c_records_the_running_points_starts_no_other_and_builds_the_table(tmp_path):
    sweep_dir = tmp_path / "sweep"
    long = ["bench.measure_steps=100000", "bench.time_budget_s=600", "perf.batch_size=1,2,3,4"]
    args = ["-m", PARALLEL, "hydra.launcher.slots=2", *with_micro(long)]
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        command = [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep_dir}"]
        proc = start_in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        logs = [sweep_dir / "0" / "run.log", sweep_dir / "1" / "run.log"]
        deadline = time.monotonic() + 240
        while not all(p.is_file() and b"measure step" in p.read_bytes() for p in logs):
            assert time.monotonic() < deadline, "the two points never measured"
            time.sleep(0.1)
        processes = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pids = [p.pid for p in processes]
            raise AssertionError(f"no exit 120 s after Ctrl-C; {signal_state(pids)}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted at" in err and f"hydra.sweep.dir={sweep_dir}" in err
    found = records(sweep_dir)
    started = sorted(name.split()[-1] for name in found)
    assert started == ["perf.batch_size=1", "perf.batch_size=2"]  # no other started
    assert {r["status"] for r in found.values()} == {"interrupted"}
    assert all(r["measured_steps"] >= 1 for r in found.values())
    assert sorted(pd.read_csv(sweep_dir / "summary.csv")["status"]) == ["interrupted"] * 2
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive  # no slot, fork server or measuring process left behind
