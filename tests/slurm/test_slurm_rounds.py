"""Runs round by round and Ctrl-C under `hydra/launcher=slurm` on the one-node test cluster
(tests/slurm/conftest.py): the grid sweeper's rounds alternate a time-to-loss sweep's runs
through SLURM as through any launcher, and a Ctrl-C of the submitting command cancels its jobs,
records them `interrupted` and exits 130; the same command then resumes."""

from __future__ import annotations

import os
import subprocess
import sys

from nanogpt.analysis.tidy import read_summary
from nanogpt.scenarios.time_to_loss import pool as ttl
from tests.conftest import needs_shared
from tests.signalling import in_terminal, interrupt, wait_until
from tests.slurm.conftest import slurm_args, squeue
from tests.slurm.test_slurm_sweeps import job_of, measuring, records
from tests.test_runs_as_jobs import TARGET, assert_rounds, runs_of


@needs_shared
def test_a_target_sweep_alternates_its_runs_round_by_round_on_slurm(slurm_sweep):
    """Issue 43's must-show on SLURM: 2 points × bench.repeats=3 to a target, each run a SLURM
    job: `ttl_run_order` alternated, and every run r of every point started after every run
    r - 1 ended (each run's own span); each round one job array of its own."""
    proc, sweep_dir = slurm_sweep(*TARGET, "bench.repeats=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_rounds(sweep_dir, points=2, runs=3)
    arrays = {rec["slurm_job_id"].split("_")[0] for rec in runs_of(sweep_dir).values()}
    assert len(arrays) == 3  # a launch a round: one array each
    table = read_summary(sweep_dir)
    assert table["ttl_runs"].tolist() == [3, 3] and set(table["status"]) == {"ok"}
    assert table["ttl_run_order"].iloc[1] == ttl.ALTERNATED  # the second point's, against the first


def test_ctrl_c_cancels_the_sweeps_slurm_jobs_records_them_interrupted_and_it_resumes(
    tmp_path, slurm_env
):
    """Issue 44 item 3 on SLURM: one SIGINT to the submitting command's process group (as a
    terminal sends Ctrl-C) while its two jobs measure. The jobs run under slurmd, outside that
    group: the command cancels them (scancel), records both runs `interrupted`, writes the
    table, exits 130 with no traceback; the same command then measures both, ok."""
    sweep_dir = tmp_path / "sweep"
    overrides = ["perf.batch_size=1,2", "bench.measure_steps=100000", "bench.time_budget_s=15"]
    command = [sys.executable, "-m", "nanogpt.run", *slurm_args(overrides, sweep_dir)]
    env = {**os.environ, **slurm_env}
    with in_terminal(
        command, tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        wait_until(
            lambda: measuring(sweep_dir, 0) and measuring(sweep_dir, 1),
            "both points measuring",
            proc,
            timeout=300,
            every=0.5,
        )
        jobs = [job_of(sweep_dir, 0), job_of(sweep_dir, 1)]
        out, err = interrupt(proc, timeout=180)
    err = err.decode(errors="replace")
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"interrupted: cancelled 2 SLURM job(s) of this round: {' '.join(jobs)}" in err
    assert "interrupted at run 1 of 2 point(s)" in err
    for job in jobs:  # cancelled by the command, not left to run out their 15 s
        assert squeue(slurm_env, "-j", job, "-o", "%T").split() == ["CANCELLED"]
    found = records(sweep_dir)
    assert {r["status"] for r in found.values()} == {"interrupted"}
    assert {r["slurm_job_id"] for r in found.values()} == set(jobs)
    assert set(read_summary(sweep_dir)["status"]) == {"interrupted"}  # the table of what is done
    again = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    found = records(sweep_dir)
    assert {r["status"] for r in found.values()} == {"ok"}
    assert not {r["slurm_job_id"] for r in found.values()} & set(jobs)  # measured anew
