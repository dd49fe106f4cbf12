"""hydra/launcher=parallel with dist.nproc > 1 on CUDA: refused before the sweep starts (each
slot sees one GPU, so every point would otherwise start and be refused in its slot), in one line
naming both keys, without asking CUDA in the sweep's process (which would break a later fork).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import check_parallel_ranks

from .conftest import run_cli, with_micro

PARALLEL = "hydra_plugins.nanogpt_launchers.parallel.ParallelLauncher"


@pytest.mark.slow
@pytest.mark.parametrize("device,env", [("cuda", {}), ("auto", {"CUDA_VISIBLE_DEVICES": "0,1"})])
def test_a_multi_rank_cuda_point_under_the_parallel_launcher_stops_the_sweep_at_once(
    tmp_path, device, env
):
    sweep_dir = tmp_path / "sweep"
    overrides = ["hydra/launcher=parallel", "dist.nproc=2", f"bench.device={device}"]
    proc = run_cli(
        "-m",
        *with_micro([*overrides, "perf.batch_size=1,2"]),
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line, line
    assert line.startswith("error: point 1 of 2 (") and ": dist.nproc: is 2, but " in line
    assert "hydra/launcher=parallel gives each point" in line and line.endswith(
        "(nothing was measured)"
    )
    assert not list(sweep_dir.glob("*/result.json")) and not (sweep_dir / "0").exists()


def _point(device: str, nproc: int, gpus: bool = True, target: str = PARALLEL):
    return OmegaConf.create(
        {
            "dist": {"nproc": nproc},
            "bench": {"device": device},
            "hydra": {"launcher": {"_target_": target, "gpus": gpus}},
        }
    )


def test_the_check_asks_no_cuda_and_lets_the_points_that_can_run_go(monkeypatch):
    def asked(*args, **kwargs):
        raise AssertionError("torch.cuda was asked in the sweep's process")

    monkeypatch.setattr(torch.cuda, "is_available", asked)
    monkeypatch.setattr(torch.cuda, "device_count", asked)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match="dist.nproc: is 2, but hydra/launcher=parallel"):
        check_parallel_ranks(_point("cuda:1", 2))
    with pytest.raises(ConfigError):
        check_parallel_ranks(_point("auto", 4))  # auto trains on the GPUs it sees
    check_parallel_ranks(_point("cuda", 1))  # one rank: one GPU is all it needs
    check_parallel_ranks(_point("cpu", 2))  # CPU slots are core sets: gloo ranks run there
    check_parallel_ranks(_point("cuda", 2, gpus=False))  # a core set that sees every GPU
    basic = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    check_parallel_ranks(_point("cuda", 2, target=basic))  # torchrun over the GPUs it sees
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    check_parallel_ranks(_point("auto", 2))  # no GPU visible: auto is the CPU
