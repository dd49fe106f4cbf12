"""hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml): every sweep point a SLURM job (its body:
nanogpt/frontend/launchers/slurm.py).

Hydra imports every module of its `hydra_plugins` namespace at every start and takes a launcher
only from a class defined there: this one imports the launcher's body when Hydra builds it for a
multirun, not before (tests/test_plugins.py). It builds on hydra-submitit-launcher (the
`cluster` extra, whose `submitit_slurm` config slurm.yaml extends): without it this module
defines nothing, and hydra/launcher=slurm fails at composition with one line
(frontend/compose.hydra_error_line)."""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf  # the cluster extra
except ImportError:
    pass
else:

    @dataclass
    class NanogptSlurmConf(SlurmQueueConf):
        """submitit_slurm's keys and this launcher's own (conf/hydra/launcher/slurm.yaml says
        what each is for)."""

        pending_timeout_s: float = 300.0

    ConfigStore.instance().store(
        group="hydra/launcher",
        name="nanogpt_slurm_schema",
        node=NanogptSlurmConf,
        provider="nanogpt",
    )

    class SlurmLauncher(Launcher):
        """Every sweep point one SLURM job (an array task)."""

        runs_elsewhere = True  # its points run on the cluster's nodes, not checked here
        jobs_apart = True  # each job runs in a process of its own: the sweep's says when to stop

        def __init__(self, **settings: Any) -> None:
            from nanogpt.frontend.launchers.slurm import SlurmLauncher as Body

            self.body = Body(**settings)

        def setup(self, *, hydra_context, task_function, config) -> None:
            self.body.setup(hydra_context=hydra_context, task_function=task_function, config=config)

        def launch(self, job_overrides, initial_job_idx):
            return self.body.launch(job_overrides, initial_job_idx)
