"""optimizer=adamw: torch.optim.AdamW on every role, nanoGPT's configure_optimizers (weight decay
on the roles of 2 or more dimensions only, never on biases and gains: Loshchilov & Hutter, 2019,
decoupled decay). optimizer.build replaces the class (optim.py)."""

from __future__ import annotations

from nanogpt.config.spec import OptimizerConfig
from nanogpt.optimizers import ROLES, Recipe, torch_groups


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    return dict.fromkeys(ROLES, "AdamW")


def build(groups: list[dict], opt: OptimizerConfig, flags: dict, **_):
    import torch

    return torch.optim.AdamW(torch_groups(groups), lr=opt.lr, betas=tuple(opt.betas), **flags)


RECIPE = Recipe("adamw", stepped_by, build)
