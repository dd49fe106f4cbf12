"""hydra/launcher=parallel: a sweep's points side by side on this machine (its body:
nanogpt/frontend/launchers/parallel.py).

Hydra imports every module of its `hydra_plugins` namespace at every start, to list its plugins,
and takes a launcher only from a class defined there. So this module is what every start pays
for, and holds only the launcher's face: its typed config, registered for Hydra as
`hydra/launcher=parallel` (a bad value fails at composition, in Hydra's words:
`hydra.launcher.slots=x`), and a class that imports the launcher's body when Hydra builds it
for a multirun, not before (tests/test_plugins.py)."""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class ParallelLauncherConf:
    """The points of a sweep at once. CUDA points: one per GPU (a MIG instance counts as one),
    each seeing only its own (CUDA_VISIBLE_DEVICES), with a share of the cores. CPU points, GPUs
    or not: one per set of cores (pinned, as many torch threads as cores). Co-running points
    share memory bandwidth, PCIe and the host: each record lists its neighbours (co_running) and
    the table counts them (beside); for figures free of neighbours, sweep with the default
    launcher."""

    _target_: str = "hydra_plugins.nanogpt_launchers.parallel.ParallelLauncher"
    slots: int | None = None  # points at once (1 or more); null: one per GPU, else one per core set
    cores_per_slot: int | None = None  # cores of each CPU slot (1 or more); null: split evenly
    gpus: bool = True  # false: CPU slots even for CUDA points


ConfigStore.instance().store(
    group="hydra/launcher", name="parallel", node=ParallelLauncherConf, provider="nanogpt"
)


class ParallelLauncher(Launcher):
    """A sweep's points side by side: one per GPU, or one per set of cores."""

    runs_elsewhere = False  # its points run on this machine: checked against its devices
    jobs_apart = True  # each job runs in a slot's process: the sweep's process says when to stop

    def __init__(self, **settings: Any) -> None:
        from nanogpt.frontend.launchers.parallel import ParallelLauncher as Body

        self.body = Body(**settings)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.body.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides, initial_job_idx):
        return self.body.launch(job_overrides, initial_job_idx)

    def start_slots(self, jobs: int) -> None:
        """The slots of a first launch of `jobs` points, started before it (the search calls
        it while it makes its first batch)."""
        self.body.start_slots(jobs)
