"""optimizer=sgd: torch.optim.SGD with momentum on every role, nanoGPT's role settings (no
decay on scalars); optimizer.build replaces the class (optim.py)."""

from __future__ import annotations

from nanogpt.config.spec import OptimizerConfig
from nanogpt.optimizers import ROLES, Recipe, torch_groups


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    return dict.fromkeys(ROLES, "SGD")


def build(groups: list[dict], opt: OptimizerConfig, flags: dict, **_):
    import torch

    return torch.optim.SGD(torch_groups(groups), lr=opt.lr, momentum=opt.momentum, **flags)


RECIPE = Recipe("sgd", stepped_by, build)
