"""The optimizers `optimizer=NAME` picks, one module each (the registry): a module of this
package that defines `RECIPE` is `optimizer=<its name>`, with conf/optimizer/<name>.yaml beside
it. Nothing else lists them: the name check (validate/), the roles (train/optim_rules.py), the build
(optim.py), the state estimate and the point's identity read the recipe.

A recipe says, without importing torch at import (a sweep's process checks points without it):

  stepped_by    the optimizer class that steps each role of parameter (optim_rules.ROLES)
  role_settings each role's lr and weight decay (default: nanoGPT's, `uniform_settings`)
  build         the optimizer, from the role groups (or, own_groups, the model's own method);
                torch is imported there
  state_bytes   the state bytes one parameter tensor of a shape keeps (a function of each tensor:
                Adafactor keeps a row and a column factor of a matrix, not its size); None for a
                class it does not know
  state_rule    that rule in words, for the record
  check         its own keys checked before any point runs (one ConfigError line each)
  unused_keys   optimizer.* keys it never receives: left out of its points' identity

Adding an optimizer: a module here with its RECIPE, its YAML, its test and its docs
(ARCHITECTURE.md's recipe; optimizers/adafactor.py is one).
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanogpt.config.spec import OptimizerConfig, RunSpec

ROLES = ("matrices", "embeddings", "head", "scalars", "other")
ROLE_KEYS = ROLES[1:]  # optimizer.roles.<role>; the matrices' are optimizer.lr / weight_decay

# fp32 slots a parameter keeps in each torch.optim class's state (its `state[p]` tensors the
# size of p; step counters are left out): 4 bytes each.
STATE_SLOTS = {
    "AdamW": 2,  # exp_avg, exp_avg_sq
    "Adam": 2,
    "Adamax": 2,  # exp_avg, exp_inf
    "NAdam": 2,
    "RAdam": 2,
    "Adadelta": 2,  # square_avg, acc_delta
    "Rprop": 2,  # prev, step_size
    "Adagrad": 1,  # sum
    "RMSprop": 1,  # square_avg (plus momentum_buffer / grad_avg when asked)
    "ASGD": 1,  # ax
    "Muon": 1,  # momentum_buffer
}


def uniform_settings(opt: OptimizerConfig, n_embd: int | None, tied_head: bool) -> dict:
    """nanoGPT's configure_optimizers: every role at optimizer.lr, optimizer.weight_decay on the
    roles of 2 or more dimensions, none on scalars."""
    del n_embd, tied_head  # the same for every width and head
    return {
        role: {"lr": opt.lr, "weight_decay": 0.0 if role == "scalars" else opt.weight_decay}
        for role in ROLES
    }


def slot_state(shape: tuple, stepper: str, opt: OptimizerConfig) -> int | None:
    """A tensor's state bytes for a class of STATE_SLOTS (fp32 slots of the tensor's size; SGD
    one with momentum); None for a class the table lacks."""
    name = stepper.rpartition(".")[2]
    if name == "SGD":
        momentum = opt.momentum if not opt.build else opt.build.get("momentum", 0)
        slots = 1 if momentum else 0
    else:
        slots = STATE_SLOTS.get(name)
    return None if slots is None else 4 * slots * math.prod(shape)


def no_check(spec: RunSpec) -> None:
    """An optimizer with no keys of its own to check."""


@dataclass(frozen=True)
class Recipe:
    name: str
    stepped_by: Callable[[OptimizerConfig], dict[str, str]]
    build: Callable[..., Any]
    role_settings: Callable[[OptimizerConfig, int | None, bool], dict] = uniform_settings
    state_bytes: Callable[[tuple, str, OptimizerConfig], int | None] = slot_state
    state_rule: Callable[[str, OptimizerConfig], str] | None = None
    check: Callable[[RunSpec], None] = no_check
    own_groups: bool = False  # the model's own method makes the optimizer and its groups
    unused_keys: tuple[str, ...] = ()

    def rule(self, stepper: str, opt: OptimizerConfig) -> str:
        """How a parameter stepped by `stepper` is counted, in words ("AdamW 8")."""
        if self.state_rule is not None:
            return self.state_rule(stepper, opt)
        return f"{stepper} {self.state_bytes((1,), stepper, opt)}"


@functools.cache
def registry() -> dict[str, Recipe]:
    """Every module of this package with a RECIPE, by its name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        recipe = getattr(module, "RECIPE", None)
        if isinstance(recipe, Recipe):
            found[recipe.name] = recipe
    return found


def names() -> list[str]:
    return sorted(registry())


def recipe(name: str) -> Recipe:
    """The recipe of optimizer=NAME (validate/ refused an unknown name before)."""
    return registry()[name]


def torch_groups(groups: list[dict], stepper: str | None = None) -> list[dict]:
    """The role groups as torch.optim takes them (params, lr, weight_decay; no bookkeeping
    keys), those stepped by `stepper` only when given."""
    return [
        {k: g[k] for k in ("params", "lr", "weight_decay")}
        for g in groups
        if stepper is None or g["stepped_by"] == stepper
    ]
