"""hydra/launcher=parallel (conf/hydra/launcher/parallel.yaml):
nanogpt/frontend/launchers/parallel.py.
Hydra accepts a launcher whose class is defined in a `hydra_plugins` module: it is named here,
its body lives in nanogpt."""

from nanogpt.frontend.launchers import parallel


class ParallelLauncher(parallel.ParallelLauncher):
    """A sweep's points side by side: one per GPU, or one per set of cores."""
