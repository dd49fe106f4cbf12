"""Imported by the fork server (runner/forkserver.py) and by nothing else: what every point's
process needs, done once, before any fork.

- torch: most of a fresh interpreter's start-up; torch.optim pulls in torch._dynamo, the next
  largest. Importing torch initialises no CUDA: checked here, and again in each child.
- wandb, when the sweep's first point logs to W&B (a second; most test sweeps do not).
- The imports run with the collector paused, then what they made is frozen
  (process.collector_paused): a fifth of their CPU, and what the server made is never
  collected in a child. A child's collections (memory.release runs gc.collect after every
  point) then skip the server's objects instead of walking them and writing to their headers,
  which copies the pages a fork shares.

A parallel launcher's slots are children of this server too (forkserver.slot_context: the
launcher's module is preloaded with it), and a CPU slot forks its points itself
(forkserver.fork_here).

The server ignores SIGTERM: a scheduler that signals every process of a job would otherwise end
the server, and with it (PR_SET_PDEATHSIG) the measuring child before it records the point. The
child handles SIGTERM itself (faults.handle_sigterm); the server ends when the sweep's process
does (multiprocessing closes its pipe). SIGUSR2 is ignored too, here and so in every child
forked from here: under SLURM submitit asks for it before the time limit, and every process of
the job gets it; the job process's submitit handler checkpoints and requeues the point.
"""

import os
import signal

from nanogpt.runner.forkserver import WANDB_ENV
from nanogpt.runner.process import collector_paused

with collector_paused():
    import torch
    import torch._dynamo  # noqa: F401 - imported for its cost, once
    import torch.optim  # noqa: F401

    import nanogpt.runner.worker  # noqa: F401 - the children's code

    if os.environ.get(WANDB_ENV) == "1":  # the first point logs to W&B: the sink's import
        try:
            import wandb  # noqa: F401
        except ImportError:
            pass

assert not torch.cuda.is_initialized(), "importing must not initialise CUDA before a fork"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
# Every child starts with SIGINT held, until it can handle it: a point's child first thing
# (forkserver._forked_main), a parallel launcher's slot once its handlers are set (a Ctrl-C as
# it starts is then raised where it stops cleanly, not as a traceback from its unpickling)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
