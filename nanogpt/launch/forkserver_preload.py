"""Imported by the fork server (launch/forkserver.py) and by nothing else: what every point's
process needs, done once, before any fork.

- The sweep's main module (`nanogpt.run`, or the script that started the sweep). Every child
  of a multiprocessing fork server first runs its parent's main module again, as `__mp_main__`
  (multiprocessing.spawn.prepare), unless the server's own main module is that one already. Run
  here, once, it is: a child then skips it, and with it the imports of Hydra, OmegaConf and
  pandas that the entry point pulls in (1-2 s a point on 2 cores).
- torch: most of a fresh interpreter's start-up; torch.optim pulls in torch._dynamo, the next
  largest. Importing torch initialises no CUDA: checked here, and again in each child.
- wandb, when the sweep's first point logs to W&B (a second; most test sweeps do not).
- gc.freeze(): what the server made is never collected in a child. A child's collections
  (memory.release runs gc.collect after every point) then skip the server's objects instead
  of walking them and writing to their headers, which copies the pages a fork shares.

The server ignores SIGTERM: a scheduler that signals every process of a job would otherwise end
the server, and with it (PR_SET_PDEATHSIG) the measuring child before it records the point. The
child handles SIGTERM itself (faults.handle_sigterm); the server ends when the sweep's process
does (multiprocessing closes its pipe). SIGUSR2 is ignored too, here and so in every child
forked from here: under SLURM submitit asks for it before the time limit, and every process of
the job gets it; the job process's submitit handler checkpoints and requeues the point.
"""

import gc
import json
import os
import signal
from multiprocessing import spawn

from nanogpt.launch.forkserver import MAIN_ENV, WANDB_ENV

# {"init_main_from_name": ...} or {"init_main_from_path": ...}, from the sweep's process. One
# that cannot be imported here leaves each child to try, as it would without the server.
try:
    spawn.prepare(json.loads(os.environ.get(MAIN_ENV, "{}")))
except ImportError:
    pass

import torch  # noqa: E402 - after the main module, which may set up sys.path
import torch._dynamo  # noqa: E402, F401 - imported for its cost, once
import torch.optim  # noqa: E402, F401

import nanogpt.launch.worker  # noqa: E402, F401 - the children's code

if os.environ.get(WANDB_ENV) == "1":  # the first point logs to W&B: the sink's import
    try:
        import wandb  # noqa: F401
    except ImportError:
        pass

assert not torch.cuda.is_initialized(), "importing must not initialise CUDA before a fork"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
gc.freeze()
