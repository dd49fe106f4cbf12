"""optimizer=from_model: the model's own factory (nanoGPT's configure_optimizers, nanochat's
setup_optimizer), `model.<optimizer.method>(**optimizer.args)`, the device type given as
`optimizer.device_arg` when named. No roles: the groups are the model's. A list it returns is
stepped as one (`Combined`)."""

from __future__ import annotations

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import OptimizerConfig, OptimizerImpl, RunSpec
from nanogpt.optimizers import ROLE_KEYS, Recipe

# the keys of the runner's own optimizers, which the model's method never receives (it gets
# optimizer.args): left out of its points' identity; grad_clip and the schedule stay (the trainer
# applies them)
UNUSED = ("betas", "weight_decay", "momentum", "adjust_lr_fn", "roles", "impl")


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    return {}  # the model's groups, not roles


def build(model, opt: OptimizerConfig, device_type: str, **_):
    """The user's model (train/user_model.py's UserModel) is asked, not its wrapper. One optimizer,
    or a list of them stepped as one: what is not one is one line."""
    import torch

    from nanogpt.optimizers.combined import Combined

    inner, target = getattr(model, "inner", model), getattr(model, "target", "the model")
    method = getattr(inner, opt.method, None)
    if not callable(method):
        raise ConfigError(
            "optimizer.method",
            f"{target} has no method {opt.method}()",
            "name the model's optimizer factory, or use optimizer=adamw, sgd or muon",
        )
    # a list from the config (Hydra's betas: [0.9, 0.95]) is the tuple the forks pass
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in opt.args.items()}
    if opt.device_arg:
        kwargs[opt.device_arg] = device_type
    call = f"{target}.{opt.method}({', '.join(kwargs)})"
    try:
        made = method(**kwargs)
    except TypeError as err:
        fix = "give optimizer.args the method's own arguments"
        raise ConfigError("optimizer.args", f"{call} refused its arguments: {err}", fix) from None
    parts = list(made) if isinstance(made, list | tuple) else [made]
    if not parts or not all(isinstance(p, torch.optim.Optimizer) for p in parts):
        kinds = ", ".join(type(p).__name__ for p in parts) or "an empty list"
        raise ConfigError(
            "optimizer.method",
            f"{call} returned {kinds}, not a torch.optim.Optimizer or a list of them",
            "return the optimizer(s) the model trains with",
        )
    return parts[0] if len(parts) == 1 else Combined(parts)


def check(spec: RunSpec) -> None:
    """A model of the user's (the built-in GPT has no optimizer method of its own), a method
    named, and none of the built-in optimizers' keys beside it. Whether the model has the method
    is known only where it is built (the point's process)."""
    opt = spec.optimizer
    if not spec.model.build:
        raise ConfigError(
            "optimizer",
            "from_model calls the model's own optimizer method, and the built-in GPT has none",
            "use optimizer=adamw, sgd or muon, or set model.build (docs/models.md)",
        )
    if not opt.method:
        raise ConfigError(
            "optimizer.method", "is not set", "name the model's method: configure_optimizers"
        )
    asked_roles = [r for r in ROLE_KEYS if getattr(opt.roles, r).lr is not None]
    asked_roles += [r for r in ROLE_KEYS if getattr(opt.roles, r).weight_decay is not None]
    for key, asked in (
        ("optimizer.impl", opt.impl is not OptimizerImpl.auto),
        ("optimizer.build", bool(opt.build)),
        (f"optimizer.roles.{asked_roles[0] if asked_roles else ''}", bool(asked_roles)),
    ):
        if asked:
            raise ConfigError(
                key,
                "is a setting of the runner's own optimizers; from_model's optimizer is the "
                "model's, made by its own method",
                "leave it out, or pass the model's own argument in optimizer.args",
            )


RECIPE = Recipe("from_model", stepped_by, build, check=check, own_groups=True, unused_keys=UNUSED)
