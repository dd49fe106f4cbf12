"""Imported by the fork server (launch/forkserver.py) and by nothing else: what every point's
process needs, done once, before any fork.

- The sweep's main module's name (`nanogpt.run`, or the path of the script that started the
  sweep), given to this process's `__main__` without running the module. Every child of a
  multiprocessing fork server first runs its parent's main module again, as `__mp_main__`
  (multiprocessing.spawn.prepare), unless the server's own `__main__` already bears that name
  (or path): with the name given here, a child skips it, and with it the imports of Hydra,
  OmegaConf and pandas that the entry point pulls in (1-2 s a point on 2 cores). Nothing a
  child is sent refers to the main module (its target is named in launch/forkserver.py), so
  the server need not run it either: that saves each sweep's server a third of a second of CPU
  on 2 cores (Hydra and OmegaConf, which no point uses).
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
import sys
import types
from importlib.machinery import ModuleSpec

import torch
import torch._dynamo  # noqa: F401 - imported for its cost, once
import torch.optim  # noqa: F401

import nanogpt.launch.worker  # noqa: F401 - the children's code
from nanogpt.launch.forkserver import MAIN_ENV, WANDB_ENV


def name_the_main_module(found: dict[str, str]) -> None:
    """Make this process's `__main__` a module that bears the sweep's main module's name
    ({"init_main_from_name": ...}, `python -m`) or path ({"init_main_from_path": ...}, a
    script), as the sweep's process reported it, without running it: multiprocessing's child
    set-up (spawn._fixup_main_from_name / _from_path) then sees it is there and skips it."""
    if not found:
        return
    main = types.ModuleType("__mp_main__")
    if "init_main_from_name" in found:
        main.__spec__ = ModuleSpec(found["init_main_from_name"], None)
    if "init_main_from_path" in found:
        main.__file__ = found["init_main_from_path"]
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main


name_the_main_module(json.loads(os.environ.get(MAIN_ENV, "{}")))

if os.environ.get(WANDB_ENV) == "1":  # the first point logs to W&B: the sink's import
    try:
        import wandb  # noqa: F401
    except ImportError:
        pass

assert not torch.cuda.is_initialized(), "importing must not initialise CUDA before a fork"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
gc.freeze()
