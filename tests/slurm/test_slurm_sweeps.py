"""Sweeps through `python -m nanogpt.run -m hydra/launcher=slurm` on a real one-node SLURM
cluster (tests/slurm/conftest.py): every point a SLURM job, records that say where they ran,
and what SLURM's requeue, scancel, time limit and multi-task jobs leave in the records."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess

from nanogpt.analysis.store import RUN_PREFIX, read_result
from nanogpt.analysis.tidy import read_summary
from tests.conftest import run_cli, with_micro
from tests.slurm.conftest import node_names, squeue, wait_for

LONG = ["bench.measure_steps=100000", "bench.time_budget_s=15"]  # measures for 15 s


def run_dir(sweep_dir, number: int):
    """The dir of point `number`'s first run (POINT/run-1): a SLURM job's own dir."""
    return sweep_dir / str(number) / f"{RUN_PREFIX}1"


def records(sweep_dir) -> dict[str, dict]:
    """Each point's record, as its job wrote it (its first run's), by the point's index."""
    found = {}
    for path in sorted(sweep_dir.glob(f"*/{RUN_PREFIX}1/result.json")):
        found[path.parent.parent.name] = read_result(path)
    return found


def measuring(sweep_dir, number: int) -> bool:
    log = run_dir(sweep_dir, number) / "run.log"
    return log.is_file() and b"measure step" in log.read_bytes()


def job_of(sweep_dir, number: int) -> str | None:
    path = sweep_dir / "slurm_jobs.json"
    return json.loads(path.read_text()).get(str(number)) if path.is_file() else None


def scontrol(env, *args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, env={**os.environ, **env})


def test_the_readme_sweep_runs_every_point_as_a_slurm_job(slurm_sweep, slurm_env, tmp_path):
    proc, sweep_dir = slurm_sweep("perf.compile=true,false", "perf.dtype=bf16,fp16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir)
    assert len(found) == 4 and {r["status"] for r in found.values()} == {"ok"}
    ids = {r["slurm_job_id"] for r in found.values()}
    assert len(ids) == 4 and len({i.split("_")[0] for i in ids}) == 1  # tasks of one job array
    assert {r["slurm_node"] for r in found.values()} == set(node_names(slurm_env))  # its one
    assert {r["slurm_restarts"] for r in found.values()} == {0}
    assert len(list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))) == 4  # real submitit jobs
    # The table a local sweep writes, with the same points: same columns, same rows
    table = read_summary(sweep_dir)
    assert sorted(table["status"]) == ["ok"] * 4 and table["slurm_job_id"].notna().all()
    local = run_cli(
        "-m", *with_micro(["perf.compile=false", "perf.dtype=bf16,fp16"]),
        f"hydra.sweep.dir={tmp_path / 'local'}", cwd=tmp_path,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr[-2000:]
    local_table = read_summary(tmp_path / "local")
    # the same columns, and one more per swept key: the local sweep does not sweep compile
    assert set(local_table.columns) <= set(table.columns) and "perf.compile" in table

    def points(t):
        return set(zip(t["compile"], t["dtype"], strict=True))

    assert points(local_table) < points(table) and len(points(table)) == 4
    assert local_table["slurm_job_id"].isna().all()


def test_two_single_cpu_points_run_at_once(slurm_sweep, slurm_env):
    proc, sweep_dir = slurm_sweep(
        "perf.batch_size=1,2", "bench.measure_steps=100000", "bench.time_budget_s=8"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir).values()
    spans = []  # SLURM's own start and end of each job
    for record in found:
        line = squeue(slurm_env, "-j", record["slurm_job_id"], "-o", "%S|%e").strip()
        start, end = (datetime.datetime.fromisoformat(t) for t in line.split("|"))
        spans.append((start, end))
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end, spans  # their jobs overlap in time
    assert all(r["measured_s"] >= 7 for r in found)  # each measured its 8 s beside the other


def test_a_requeue_mid_measurement_ends_with_one_ok_record(slurm_start, slurm_env):
    proc, sweep_dir = slurm_start(*LONG)
    wait_for(lambda: measuring(sweep_dir, 0), 300, "the point's first measured window")
    job = job_of(sweep_dir, 0)
    scontrol(slurm_env, "requeue", job)
    assert proc.wait(timeout=600) == 0
    (record,) = records(sweep_dir).values()
    assert record["status"] == "ok" and record["error"] is None
    assert record["slurm_job_id"] == job and record["slurm_restarts"] == 1
    assert record["measured_s"] >= 14  # the whole window again, not the cut one
    assert len(read_summary(sweep_dir)) == 1


def test_scancel_of_one_point_records_it_cancelled_and_the_sweep_fails_with_its_table(
    slurm_start, slurm_env, tmp_path
):
    proc, sweep_dir = slurm_start("perf.batch_size=1,2", *LONG)
    wait_for(lambda: measuring(sweep_dir, 0), 300, "the first point's measured window")
    job = job_of(sweep_dir, 0)
    subprocess.run(["scancel", job], check=True, env={**os.environ, **slurm_env})
    assert proc.wait(timeout=600) == 1
    found = records(sweep_dir)
    assert found["0"]["status"] == "cancelled" and found["1"]["status"] == "ok"
    assert found["0"]["error"].startswith(f"SlurmJob: job {job} ended CANCELLED")
    assert found["0"]["slurm_job_id"] == job
    table = read_summary(sweep_dir)
    assert sorted(table["status"]) == ["cancelled", "ok"]
    out = (tmp_path / "sweep.out").read_text()
    assert "1 point(s) failed" in out


def test_a_job_past_its_time_limit_is_requeued_once_then_recorded_timeout(slurm_start, slurm_env):
    # submitit asks SLURM for SIGUSR2 signal_delay_s before the limit; SLURM sends it up to
    # 60 s earlier than that (its 30 s time-limit sweep). With a 1-minute limit the signal is
    # due at the job's start and may come before submitit's handler is in place (the step dies
    # of signal 12) or before the step exists (the signal is lost and the job runs on to its
    # hard limit: CI saw that). With 2 minutes it comes at least 30 s into each run: the first
    # time submitit requeues the job (max_num_timeout=1); SLURM holds it pending about 2
    # minutes (its BeginTime), then runs it again, and the second signal ends it ("timed-out
    # too many times"). The launcher waits for the rerun, then records `timeout`.
    proc, sweep_dir = slurm_start(
        "hydra.launcher.timeout_min=2",
        "hydra.launcher.signal_delay_s=30",
        "hydra.launcher.max_num_timeout=1",
        "bench.measure_steps=1000000",
        "bench.time_budget_s=600",
    )
    assert proc.wait(timeout=900) == 1
    (record,) = records(sweep_dir).values()
    assert record["status"] == "timeout", record["error"]
    assert any(
        why in record["error"]
        for why in ("timed-out too many times", "requeued 1 time(s) at its time limit")
    ), record["error"]
    (log,) = sweep_dir.glob(".submitit/*/*_0_log.out")
    assert log.read_text().count(" - Requeued job ") == 1  # the first signal: requeued once
    # the record was written after the rerun started: the launcher waited for it
    (line,) = squeue(slurm_env, "-j", record["slurm_job_id"], "-o", "%S").split()
    rerun = datetime.datetime.fromisoformat(line).timestamp()
    written = (run_dir(sweep_dir, 0) / "result.json").stat().st_mtime
    assert written >= rerun
    assert len(read_summary(sweep_dir)) == 1


def test_dist_nproc_2_is_two_slurm_tasks_of_one_job_on_a_users_own_model(slurm_sweep, tmp_path):
    """dist.nproc=2: two SLURM tasks of one job, each a rank. The model is the user's
    (model.build): its module, in the directory the sweep runs from, is found by the tasks SLURM
    starts on the node (sys.path) and built by each rank, never by the sweep's own process."""
    from tests.test_byo import BUILD, MODERN_GPT

    (tmp_path / "modern_gpt.py").write_text(MODERN_GPT)
    proc, sweep_dir = slurm_sweep(*BUILD, "dist.nproc=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = records(sweep_dir).values()
    assert record["status"] == "ok" and record["world_size"] == 2
    assert len(record["step_ms_median_per_rank"]) == 2
    assert record["model"] == "modern_gpt.GPT" and record["flops_source"].startswith("counted")
    logs = sorted(sweep_dir.glob(".submitit/*/*_log.out"))
    assert len(logs) == 2  # one log per SLURM task: rank 0 and rank 1
    assert "torch.distributed.run" not in (run_dir(sweep_dir, 0) / "run.log").read_text()
    importers = (tmp_path / "modern_gpt.py.imported").read_text().split()
    assert len(set(importers)) == 2  # the two ranks; a third would be the sweep's process


def test_the_sweep_killed_then_run_again_keeps_its_finished_points(slurm_start, tmp_path):
    sweep = ["bench.measure_steps=100000", "bench.time_budget_s=1,60"]
    proc, sweep_dir = slurm_start(*sweep)
    wait_for(lambda: records(sweep_dir).get("0", {}).get("status") == "ok", 300, "the first point")
    first = records(sweep_dir)["0"]
    os.kill(proc.pid, signal.SIGKILL)  # the sweep's own process, not its jobs
    proc.wait()
    again = slurm_start(*sweep)[0]
    assert again.wait(timeout=600) == 0
    out = (tmp_path / "sweep.out").read_text()
    assert "resume: kept 1 run(s) of 1 point(s)" in out
    found = records(sweep_dir)
    assert found["0"]["finished_at"] == first["finished_at"]  # not measured again
    assert found["1"]["status"] == "ok"
