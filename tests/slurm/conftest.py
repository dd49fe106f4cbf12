"""Real SLURM clusters (scripts/slurm_cluster.sh) for the tests in this folder: one of one node
(`slurm_env`, the tests of one machine's points) and one of two nodes (`slurm2_env`, points
across nodes and sweeps spread over them), both on this machine.

Every test here carries the `slurm` marker (and `slow`): `make test` leaves them out, `make
test-slurm` runs them, on two pytest-xdist workers. Each cluster starts once per worker, the
first time a test asks for it, with its state in a temporary folder, and stops after: node
names are unique to a cluster, so two workers' clusters run side by side. Where SLURM cannot
be installed or started, the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, with_micro

SCRIPT = REPO / "scripts" / "slurm_cluster.sh"
# Each point a one-CPU job with one thread and no GPU: two run at once on this 2-core node.
SLURM = [
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=10",
]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.slow)


def start_cluster(nodes: int):
    """Start a cluster of `nodes` nodes; yield the environment its clients need (SLURM_CONF)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash to run scripts/slurm_cluster.sh")
    state = Path(tempfile.mkdtemp(prefix="nanogpt-slurm-"))  # 0700: the script opens it
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(state), str(nodes)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if started.returncode != 0:
        why = (started.stderr.strip().splitlines() or ["no reason given"])[-1]
        pytest.skip(f"no SLURM cluster: scripts/slurm_cluster.sh start failed: {why}")
    env = {"SLURM_CONF": str(state / "slurm.conf"), "OMP_NUM_THREADS": "1"}
    yield env
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], timeout=120)
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_env():
    """A one-node cluster."""
    yield from start_cluster(1)


@pytest.fixture(scope="session")
def slurm2_env():
    """A two-node cluster: two slurmd on this machine, each node with all its cores."""
    yield from start_cluster(2)


def node_names(env: dict) -> list[str]:
    """The cluster's nodes, as SLURM names them (unique to the cluster, not the hostname)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env={**os.environ, **env}
    ).stdout
    return sorted(set(out.split()))


def slurm_args(overrides, sweep_dir: Path) -> list[str]:
    return ["-m", *SLURM, *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}"]


def sweeper(tmp_path, env: dict):
    """Run a micro sweep through hydra/launcher=slurm on the cluster of `env`; returns
    (process, sweep_dir)."""

    def _run(*overrides: str, sweep_dir: Path | None = None, timeout: float = 600):
        sweep_dir = sweep_dir or tmp_path / "sweep"
        proc = subprocess.run(
            [sys.executable, "-m", "nanogpt.run", *slurm_args(overrides, sweep_dir)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
        )
        return proc, sweep_dir

    return _run


@pytest.fixture
def slurm_sweep(tmp_path, slurm_env):
    return sweeper(tmp_path, slurm_env)


@pytest.fixture
def slurm2_sweep(tmp_path, slurm2_env):
    return sweeper(tmp_path, slurm2_env)


def starter(tmp_path, env: dict):
    """Start micro sweeps through hydra/launcher=slurm in the background, on the cluster of
    `env`: yields start(*overrides) -> (Popen, sweep_dir); at the end kills what is left and
    cancels the cluster's jobs."""
    started = []

    def _start(*overrides: str):
        sweep_dir = tmp_path / "sweep"
        out = open(tmp_path / "sweep.out", "w")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(
            [sys.executable, "-m", "nanogpt.run", *slurm_args(overrides, sweep_dir)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
        )
        started.append((proc, out))
        return proc, sweep_dir

    yield _start
    for proc, out in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    subprocess.run(["scancel", "-u", os.environ.get("USER", "root")], env={**os.environ, **env})


@pytest.fixture
def slurm_start(tmp_path, slurm_env):
    """Start a micro sweep through hydra/launcher=slurm in the background; (Popen, sweep_dir)."""
    yield from starter(tmp_path, slurm_env)


@pytest.fixture
def slurm2_start(tmp_path, slurm2_env):
    """The same on the two-node cluster."""
    yield from starter(tmp_path, slurm2_env)


def squeue(env: dict, *args: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    ).stdout


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
