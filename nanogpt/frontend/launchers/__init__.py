"""Hydra launchers (entry-point layer: they know Hydra). Hydra finds a launcher only inside its
`hydra_plugins` namespace package, so hydra_plugins/nanogpt_launchers/ names these classes
there; conf/hydra/launcher/{slurm,parallel}.yaml select them.

  slurm     hydra-submitit-launcher's SLURM launcher, made to answer for every point: one line
            when there is no SLURM, the scheduler's state of each job (cancelled, timed out,
            requeued), an earlier run's jobs of the same sweep dir ended before a resume
  parallel  the points of a sweep at once on this machine: one per GPU, or one per set of cores
"""
