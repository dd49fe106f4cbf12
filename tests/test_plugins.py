"""Hydra's plugin conventions (issue 45 item 3): the shims Hydra imports at every start import
nothing heavy; the parallel launcher's config is typed and registered by its plugin, so a bad
value fails at composition in Hydra's words; a launcher says what it can on its own class."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from nanogpt.frontend.compose import CONF_DIR  # the schema (base_config) registered
from nanogpt.frontend.presets import expose_checkout_plugins, launcher_capabilities

from .conftest import REPO, run_cli, with_micro

SHIMS = (
    "hydra_plugins.nanogpt_launchers.parallel",
    "hydra_plugins.nanogpt_launchers.slurm",
    "hydra_plugins.nanogpt_tune.plugin",
)


@pytest.mark.slow
def test_importing_the_plugin_shims_imports_no_torch_pandas_or_nanogpt():
    """What Hydra's scan of its plugins costs every start: Hydra itself, and none of torch,
    pandas or the package (the run's internals come when a launcher or sweeper is built)."""
    code = (
        "import sys, importlib\n"
        f"for name in {SHIMS!r}: importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('torch', 'pandas', 'nanogpt'))\n"
        "print(' '.join(heavy) or 'none')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["none"]


def test_the_parallel_launchers_config_is_typed_by_its_plugin():
    expose_checkout_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = compose("config", ["hydra/launcher=parallel"], return_hydra_config=True)
        assert config.hydra.launcher.slots is None and config.hydra.launcher.gpus is True
        set_two = ["hydra/launcher=parallel", "hydra.launcher.slots=2"]
        assert compose("config", set_two, return_hydra_config=True).hydra.launcher.slots == 2
        with pytest.raises(Exception, match=r"hydra.launcher.slots|could not be converted"):
            compose("config", ["hydra/launcher=parallel", "hydra.launcher.slots=x"])


@pytest.mark.slow
def test_a_bad_slots_fails_at_composition_in_one_line(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["hydra/launcher=parallel", "hydra.launcher.slots=x", "perf.batch_size=1,2"]
    proc = run_cli("-m", *with_micro(args), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "hydra.launcher.slots" in lines[0] and "'x'" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and not sweep_dir.exists()


def test_a_launcher_says_what_it_can_on_its_own_class():
    ours = "hydra_plugins.nanogpt_launchers.parallel.ParallelLauncher"
    parallel = launcher_capabilities(ours)
    assert not parallel.runs_elsewhere and parallel.jobs_apart
    basic = launcher_capabilities("hydra._internal.core_plugins.basic_launcher.BasicLauncher")
    assert not basic.runs_elsewhere and not basic.jobs_apart
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    slurm = launcher_capabilities("hydra_plugins.nanogpt_launchers.slurm.SlurmLauncher")
    assert slurm.runs_elsewhere and slurm.jobs_apart
