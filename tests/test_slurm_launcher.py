"""hydra/launcher=slurm where there is no SLURM: one line naming hydra/launcher and what is
missing, exit 2, nothing written. (With a real cluster: tests/slurm/, `make test-slurm`.)"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

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
