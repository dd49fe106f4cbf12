"""hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml): nanogpt/frontend/launchers/slurm.py.

Hydra accepts a launcher whose class is defined in a `hydra_plugins` module, so the class is
named here, its body in nanogpt. It builds on hydra-submitit-launcher (the `cluster` extra):
without it this module defines nothing, and hydra/launcher=slurm fails at composition with
compose.hydra_error_line's one line."""

try:
    from nanogpt.frontend.launchers import slurm
except ImportError as missing:  # only the cluster extra may be missing
    if "hydra_submitit_launcher" not in str(missing):
        raise
else:

    class SlurmLauncher(slurm.SlurmLauncher):
        """Every sweep point one SLURM job (an array task)."""
