"""optimizer=adafactor: torch.optim.Adafactor (Shazeer & Stern, 2018) on every role, at nanoGPT's
role settings. Its second moment of a matrix is factored, a row and a column vector instead of
the matrix's size, so its state is a function of each tensor's shape, not of its size alone.
optimizer.args are the class's own keyword arguments (beta2_decay, eps, d)."""

from __future__ import annotations

import math

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import OptimizerConfig, OptimizerImpl, RunSpec
from nanogpt.optimizers import ROLES, Recipe, torch_groups


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    return dict.fromkeys(ROLES, "Adafactor")


def build(groups: list[dict], opt: OptimizerConfig, flags: dict, **_):
    """Adafactor has a foreach path and a for-loop one, no fused kernel: the trainer's
    preference for fused on CUDA leaves torch's default."""
    import torch

    args = {k: tuple(v) if isinstance(v, list) else v for k, v in opt.args.items()}
    flags = {k: v for k, v in flags.items() if k != "fused"}
    return torch.optim.Adafactor(torch_groups(groups), lr=opt.lr, **args, **flags)


def state_bytes(shape: tuple, stepper: str, opt: OptimizerConfig) -> int:
    """fp32 row_var (the shape with its last dimension 1) and col_var (its second-to-last 1)
    of a tensor of 2 or more dimensions; a vector keeps its whole variance. The step counter is
    left out, as for the other classes."""
    if len(shape) < 2:
        return 4 * math.prod(shape)
    n = math.prod(shape)
    return 4 * (n // shape[-1] + n // shape[-2])


def state_rule(stepper: str, opt: OptimizerConfig) -> str:
    return f"{stepper} 4 x (rows + columns) a matrix, 4 a vector's element"


def check(spec: RunSpec) -> None:
    opt = spec.optimizer
    if opt.impl is OptimizerImpl.fused:
        raise ConfigError(
            "optimizer.impl",
            "fused is no implementation of torch.optim.Adafactor (it has foreach and for_loop)",
            "use optimizer.impl=auto, foreach or for_loop",
        )
    decay = opt.args.get("beta2_decay", -0.8)
    if not decay <= 0:
        raise ConfigError(
            "optimizer.args.beta2_decay",
            f"is {decay} but Adafactor's second-moment decay exponent must be 0 or less",
            "use e.g. -0.8 (torch's default)",
        )


RECIPE = Recipe(
    "adafactor",
    stepped_by,
    build,
    state_bytes=state_bytes,
    state_rule=state_rule,
    check=check,
    unused_keys=("betas", "momentum", "adjust_lr_fn"),  # Adafactor takes none of them
)
