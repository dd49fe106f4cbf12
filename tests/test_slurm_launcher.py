"""hydra/launcher=slurm where there is no SLURM: one line naming hydra/launcher and what is
missing, exit 2, nothing written; and what each point's job asks SLURM for (a GPU per rank),
as the launcher hands it to submitit, nothing submitted. (With a real cluster:
tests/slurm/, `make test-slurm`.)"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from nanogpt.frontend.presets import CONF_DIR
from tests.conftest import run_cli, with_micro

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
ARGS = ["-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "perf.batch_size=1,2"]


def launch(tmp_path, env):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(*ARGS, *with_micro([]), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path, env=env)
    return proc, sweep_dir


@pytest.mark.slow
def test_no_sbatch_is_one_line(tmp_path):
    bare = tmp_path / "bin"  # a PATH with this Python and nothing of SLURM's
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    proc, sweep_dir = launch(tmp_path, {"PATH": str(bare)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: hydra/launcher=slurm: sbatch is not on PATH")
    assert not sweep_dir.exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs SLURM's client (sbatch) here")
def test_sbatch_without_a_cluster_is_one_line(tmp_path):
    proc, sweep_dir = launch(tmp_path, {"SLURM_CONF": str(Path(tmp_path) / "no-such.conf")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: hydra/launcher=slurm: sbatch is here but no SLURM controller")
    assert "SLURM_CONF" in line
    assert not sweep_dir.exists()


# ------------------------------------------------------------------------------------------
# A GPU per rank: dist.nproc=N asks SLURM for N GPUs, or is refused before anything is submitted
# ------------------------------------------------------------------------------------------


def composed(tmp_path, *overrides: str):
    """A point's config as the multirun composes it for hydra/launcher=slurm, hydra node and
    all (Hydra's compose API)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(
            "config",
            ["hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}", *overrides],
            return_hydra_config=True,
        )


def job_parameters(config) -> dict:
    """What the launcher asks submitit's executor for, for the point's job (nothing submitted)."""
    from nanogpt.frontend.compose import job_gpus, job_shape
    from nanogpt.frontend.launchers.slurm import SlurmLauncher

    params = OmegaConf.to_container(config.hydra.launcher, resolve=True)
    params.pop("_target_")
    return SlurmLauncher(**params).job_parameters(job_shape(config), job_gpus(config))


@pytest.mark.parametrize(
    ("overrides", "gpus", "tasks"),
    [
        (["dist.nproc=2", "bench.device=cuda"], 2, 2),  # a GPU per rank, from dist.nproc
        (["bench.device=auto"], 1, 1),  # a single-rank point: its own GPU, as ever
        (["dist.nproc=2", "bench.device=cpu"], None, 2),  # a CPU point asks for no GPU
        (["dist.nproc=2", "bench.device=cuda", "hydra.launcher.gpus_per_node=4"], 4, 2),
        # across nodes: dist.nproc stays the point's ranks, a GPU per rank on each node
        (["dist.nproc=8", "dist.nodes=2", "bench.device=cuda"], 4, 4),
        (["dist.nproc=2", "dist.nodes=2", "bench.device=cpu"], None, 1),
        (["dist.nproc=4", "dist.nodes=2", "hydra.launcher.tasks_per_node=2"], 2, 2),  # agrees
    ],
)
def test_a_points_job_asks_slurm_for_a_gpu_per_rank(tmp_path, overrides, gpus, tasks):
    config = composed(tmp_path, *overrides)
    asked = job_parameters(config)
    assert asked["gpus_per_node"] == gpus and asked["tasks_per_node"] == tasks
    assert asked["nodes"] == config.dist.nodes
    assert asked["slurm_partition"] is None and asked["timeout_min"] == 60  # the rest as set


def test_fewer_gpus_than_ranks_is_refused_before_anything_is_submitted(tmp_path, capsys):
    # The multirun's own check (the callback, every point composed as its job will be): one
    # line naming the key and the fix, exit 2, and no sweep dir; before, every job queued,
    # started and was refused by its own device check.
    from nanogpt.frontend.callback import SweepReport

    sweep_dir = tmp_path / "sweep"
    point = ["dist.nproc=2", "bench.device=cuda", "hydra.launcher.gpus_per_node=1"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = compose(
            "config",
            ["hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}", *point],
            return_hydra_config=True,
        )
        with pytest.raises(SystemExit) as stopped:
            SweepReport().on_multirun_start(config)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: point 1 of 1 (dist.nproc=2 bench.device=cuda): hydra.launcher.gpus_per_node: "
        "is 1, but dist.nproc=2 ranks on cuda need a GPU each; set "
        "hydra.launcher.gpus_per_node=2, or leave it unset (null: a GPU per rank). "
        "(nothing was measured)"
    )
    assert not sweep_dir.exists()


def refusal(tmp_path, capsys, *point: str, launcher: str = "slurm") -> str:
    """The multirun's one line for a point refused at its start (nothing written), exit 2."""
    from nanogpt.frontend.callback import SweepReport

    sweep_dir = tmp_path / "sweep"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = compose(
            "config",
            [f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep_dir}", *point],
            return_hydra_config=True,
        )
        with pytest.raises(SystemExit) as stopped:
            SweepReport().on_multirun_start(config)
    assert stopped.value.code == 2 and not sweep_dir.exists()
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize(
    ("point", "launcher", "keys"),
    [
        # dist.nproc is every node's ranks: the same on each
        (["dist.nproc=3", "dist.nodes=2"], "slurm", ["dist.nproc: is 3", "dist.nodes=2"]),
        # a launcher key set by hand that contradicts dist.*: both named
        (
            ["dist.nproc=4", "dist.nodes=2", "hydra.launcher.nodes=4"],
            "slurm",
            ["hydra.launcher.nodes: is 4", "dist.nodes=2"],
        ),
        (
            ["dist.nproc=4", "dist.nodes=2", "hydra.launcher.tasks_per_node=4"],
            "slurm",
            ["hydra.launcher.tasks_per_node: is 4", "dist.nproc=4 over dist.nodes=2"],
        ),
        # the launchers that run a point's ranks on this machine
        (["dist.nproc=2", "dist.nodes=2"], "basic", ["dist.nodes: is 2", "hydra/launcher=slurm"]),
        (["dist.nproc=2", "dist.nodes=2"], "parallel", ["dist.nodes: is 2", "ParallelLauncher"]),
    ],
)
def test_dist_nodes_that_cannot_be_is_one_line(tmp_path, capsys, point, launcher, keys):
    line = refusal(tmp_path, capsys, *point, "bench.device=cpu", launcher=launcher)
    assert line.startswith("error: point 1 of 1 (") and line.endswith("(nothing was measured)")
    for key in keys:
        assert key in line, line
