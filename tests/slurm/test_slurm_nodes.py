"""Points across nodes, and sweeps spread over them, on a real two-node SLURM cluster
(tests/slurm/conftest.py: two slurmd on this machine, node names of their own that resolve):
`dist.nodes=2` is one job on two nodes, a task (rank) on each, meeting at the first node (gloo);
a rank killed on the second node fails its point, naming that node, and the sweep goes on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from nanogpt.analysis import sweep_lock
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.frontend.launchers.slurm_queue import unresolvable
from tests.slurm.conftest import SCRIPT, node_names, squeue, wait_for
from tests.slurm.test_slurm_sweeps import job_of, measuring, records, run_dir

KILLED_WITHIN_S = 120  # a lost rank ends its point within this (the bound)


def point_of(found: dict[str, dict], **asked) -> dict:
    """The one record whose asked keys have these values."""
    (record,) = [r for r in found.values() if all(r[k] == v for k, v in asked.items())]
    return record


def losses(job_dir: Path) -> list[float]:
    steps = pd.read_csv(job_dir / "steps.csv")
    return steps["loss"].dropna().tolist()


@pytest.fixture(scope="session")
def across(tmp_path_factory, slurm2_env):
    """One sweep of 2-rank points, DDP and FSDP2, each on one node and across two, for the
    session (pytest-xdist may run another file's test between the two that read it):
    (process, sweep_dir)."""
    from tests.slurm.conftest import sweeper

    tmp_path = tmp_path_factory.mktemp("across")
    return sweeper(tmp_path, slurm2_env)(
        "dist.nproc=2", "dist.nodes=1,2", "dist.strategy=ddp,fsdp2", "logger.log_interval=1"
    )


@pytest.mark.xdist_group("across")  # one worker runs the sweep the two tests read
def test_a_ddp_point_across_two_nodes_trains_as_on_one(across, slurm2_env):
    proc, sweep_dir = across
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir)
    two = point_of(found, dist_strategy="ddp", nodes=2)
    one = point_of(found, dist_strategy="ddp", nodes=1)
    assert two["status"] == one["status"] == "ok"
    assert two["world_size"] == one["world_size"] == 2
    # a rank on each node, as SLURM names them (SLURMD_NODENAME), rank 0 on the first
    assert two["rank_nodes"] == node_names(slurm2_env) and two["nodes"] == 2
    assert len(set(one["rank_nodes"])) == 1 and one["nodes"] == 1
    # the same training, whichever the nodes: the same batches on each rank, the same all-reduce
    a, b = losses(Path(two["job_dir"])), losses(Path(one["job_dir"]))
    assert len(a) == len(b) >= 3 and a == pytest.approx(b, rel=1e-5)
    assert two["loss_last"] == pytest.approx(one["loss_last"], rel=1e-5)
    # the step is the slowest rank's; the communication share is measured, and the process
    # group's timeout stated
    assert two["step_ms_median"] >= 0.99 * min(two["step_ms_median_per_rank"])
    assert len(two["step_ms_median_per_rank"]) == 2
    assert two["diag_step_comm_frac"] is not None and 0 < two["diag_step_comm_frac"] < 1
    assert two["dist_timeout_s"] is not None and two["dist_timeout_s"] <= KILLED_WITHIN_S
    table = read_summary(sweep_dir)
    assert len(table) == 4 and set(table["status"]) == {"ok"}
    assert sorted(table["nodes"]) == [1, 1, 2, 2]


@pytest.mark.xdist_group("across")
def test_an_fsdp2_point_across_two_nodes_trains_as_on_one(across, slurm2_env):
    proc, sweep_dir = across
    found = records(sweep_dir)
    two = point_of(found, dist_strategy="fsdp2", nodes=2)
    one = point_of(found, dist_strategy="fsdp2", nodes=1)
    assert two["status"] == one["status"] == "ok", (two["error"], one["error"])
    assert two["rank_nodes"] == node_names(slurm2_env) and two["world_size"] == 2
    assert losses(Path(two["job_dir"])) == pytest.approx(losses(Path(one["job_dir"])), rel=1e-5)


def rank_pid(array_task: str, rank: int) -> tuple[int, str]:
    """The process of a SLURM task (a rank) of a running job array task, and its node: found
    through /proc, by the variables SLURM gave it."""
    job, _, index = array_task.partition("_")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(v.split("=", 1) for v in raw.decode(errors="replace").split("\0") if "=" in v)
        if (
            env.get("SUBMITIT_EXECUTOR") == "slurm"
            and env.get("SLURM_ARRAY_JOB_ID") == job
            and env.get("SLURM_ARRAY_TASK_ID") == index
            and env.get("SLURM_PROCID") == str(rank)
        ):
            return int(entry.name), env["SLURMD_NODENAME"]
    return 0, ""


def test_a_rank_killed_on_the_second_node_fails_its_point_naming_it(
    slurm2_start, slurm2_env, tmp_path
):
    # two points across the nodes, side by side: rank 1 of the first is killed mid-measurement
    proc, sweep_dir = slurm2_start(
        "dist.nproc=2",
        "dist.nodes=2",
        "perf.batch_size=2,4",
        "bench.measure_steps=100000",
        "bench.time_budget_s=20",
    )
    wait_for(lambda: measuring(sweep_dir, 0), 300, "the first point's measured window")
    job = job_of(sweep_dir, 0)
    pid, node = wait_for(lambda: rank_pid(job, 1)[0] and rank_pid(job, 1), 30, "rank 1")
    first, second = node_names(slurm2_env)
    assert node == second
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    assert proc.wait(timeout=600) == 1  # the sweep goes on, then fails with its table
    found = records(sweep_dir)
    lost, other = found["0"], found["1"]
    assert other["status"] == "ok" and other["rank_nodes"] == [first, second]
    assert lost["status"] == "error" and lost["nodes"] == 2
    assert f"task 1 on node {second}: Killed" in lost["error"], lost["error"]
    assert lost["error"].startswith(f"SlurmJob: job {job} ended FAILED")
    assert lost["dist_timeout_s"] is not None
    ended = (run_dir(sweep_dir, 0) / "result.json").stat().st_mtime
    assert ended - killed < KILLED_WITHIN_S  # no hang in a collective
    assert sorted(read_summary(sweep_dir)["status"]) == ["error", "ok"]
    assert "1 point(s) failed" in (tmp_path / "sweep.out").read_text()
    # the node is usable again: idle, and a job on it runs
    env = {**os.environ, **slurm2_env}
    states = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env
    )
    assert sorted(states.stdout.splitlines()) == [f"{first} idle", f"{second} idle"]
    ran = subprocess.run(["srun", "-w", second, "-n", "1", "printenv", "SLURMD_NODENAME"],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.strip() == second


def test_a_sweep_of_one_node_points_spreads_over_both_nodes(slurm2_sweep, slurm2_env):
    proc, sweep_dir = slurm2_sweep("perf.batch_size=1,2,3,4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir).values()
    assert len(found) == 4 and {r["status"] for r in found} == {"ok"}
    assert {r["slurm_node"] for r in found} == set(node_names(slurm2_env))  # both nodes
    assert {r["nodes"] for r in found} == {1}
    table = read_summary(sweep_dir)
    assert sorted(table["batch_size"]) == [1, 2, 3, 4] and set(table["status"]) == {"ok"}
    assert read_result(run_dir(sweep_dir, 0) / "result.json")["world_size"] == 1


def test_the_test_cluster_starts_under_a_private_folder(tmp_path):
    """`scripts/slurm_cluster.sh start "$(mktemp -d)/c" 2`: a folder above DIR is private
    (0700), which munge's own user cannot pass; its files live where it reaches them, the two
    nodes come up and run a job, and `stop` leaves no munge folder behind."""
    private = Path(tempfile.mkdtemp())  # 0700, as mktemp -d makes it
    assert private.stat().st_mode & 0o777 == 0o700
    cluster = private / "c"
    try:
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", str(cluster), "2"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == f"export SLURM_CONF={cluster / 'slurm.conf'}"
        env = {**os.environ, "SLURM_CONF": str(cluster / "slurm.conf")}
        munge = (cluster / "munge").resolve()
        assert munge != cluster / "munge" and (munge / "munge.socket").exists()
        ran = subprocess.run(["srun", "-N", "2", "-n", "2", "printenv", "SLURMD_NODENAME"],
                             capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert len(set(ran.stdout.split())) == 2  # a task on each node
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(cluster)], timeout=120)
    assert not munge.exists() and not (cluster / "munge").exists()
    shutil.rmtree(private, ignore_errors=True)


PENDING_TIMEOUT_S = 30  # hydra.launcher.pending_timeout_s of the test below


def test_a_point_pending_on_a_lost_node_is_cancelled_naming_it_and_the_sweep_goes_on(
    slurm2_start, slurm2_env, tmp_path
):
    """kill -9 of the second node's slurmd under a 2-node point: SLURM requeues its job, which
    can then only wait on the DOWN node. The sweep cancels it once that has lasted
    hydra.launcher.pending_timeout_s, records its point `error` naming SLURM's reason and the
    node, runs the other point (which waited for resources meanwhile: no such reason), writes
    the table and exits 1."""
    proc, sweep_dir = slurm2_start(
        "dist.nproc=2",
        "dist.nodes=2,1",  # the 1-node point's 2 ranks fit no node beside the 2-node point's
        "bench.measure_steps=100000",
        "bench.time_budget_s=120",  # the lost point still runs when SLURM marks its node down
        f"hydra.launcher.pending_timeout_s={PENDING_TIMEOUT_S}",
    )
    first, second = node_names(slurm2_env)
    conf = Path(slurm2_env["SLURM_CONF"])
    env = {**os.environ, **slurm2_env}
    wait_for(lambda: measuring(sweep_dir, 0), 300, "the 2-node point's measured window")
    job = job_of(sweep_dir, 0)
    assert f"pid {proc.pid} " in sweep_lock.holder(sweep_dir)  # the submitting process's dir
    slurmd = int((conf.parent / f"slurmd-{second}.pid").read_text())
    os.kill(slurmd, signal.SIGKILL)
    try:

        def stuck() -> bool:  # as SLURM says it: pending for a reason it cannot resolve
            state = squeue(slurm2_env, "-j", job.split("_")[0], "-o", "%i|%T|%r")
            line = next((x for x in state.splitlines() if x.startswith(f"{job}|")), "||")
            return unresolvable(*line.split("|", 2)[1:])

        wait_for(stuck, 400, "the requeued job pending on the lost node")
        stuck_at = time.time()
        assert proc.wait(timeout=600) == 1  # the sweep went on, then failed with its table
    finally:  # the node back for the worker's other tests: its slurmd again, idle
        subprocess.run(["slurmd", "-f", str(conf), "-N", second], env=env, check=True)
        wait_for(
            lambda: sorted(squeue_nodes(env)) == [f"{first} idle", f"{second} idle"],
            120,
            "both nodes idle again",
        )
    found = records(sweep_dir)
    lost, other = found["0"], found["1"]
    assert other["status"] == "ok" and other["nodes"] == 1 and other["slurm_node"] == first
    assert lost["status"] == "error" and lost["nodes"] == 2, lost
    assert lost["error"].startswith(
        f"SlurmJob: job {job} pending over hydra.launcher.pending_timeout_s={PENDING_TIMEOUT_S} s"
    ), lost["error"]
    assert "DOWN" in lost["error"] or "ReqNodeNotAvail" in lost["error"]  # SLURM's reason
    assert f"nodes out: {second} (down" in lost["error"]
    recorded = (run_dir(sweep_dir, 0) / "result.json").stat().st_mtime
    assert recorded - stuck_at < PENDING_TIMEOUT_S + 60
    assert sorted(read_summary(sweep_dir)["status"]) == ["error", "ok"]
    out = (tmp_path / "sweep.out").read_text()
    assert "1 point(s) failed" in out and f"[error] SLURM job {job}: pending over" in out


def squeue_nodes(env: dict) -> list[str]:
    states = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env
    )
    return states.stdout.splitlines()
