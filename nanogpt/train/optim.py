"""Optimizers by role: each parameter of the model belongs to one role (matrices, embeddings,
head, scalars, other; nanogpt/train/optim_rules.py says which), a param group per role, and one
object the trainer steps, made by the optimizer's recipe (nanogpt/optimizers/: one module an
optimizer: adamw, sgd, muon, from_model).

- optimizer.build: any class, named as Hydra names it ({_target_: torch.optim.Adagrad,
  _partial_: true, ...}), called with the role groups and its other keys. The spec carries the
  node as plain values (library code imports no Hydra); it is built as model.build is
  (targets.instantiate: nested _target_ nodes first, their _args_, the module found in
  model.code_dir), here only, in the measuring process.
"""

from __future__ import annotations

import torch

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import OptimizerConfig, OptimizerImpl
from nanogpt.config.target_nodes import TargetError, instantiate
from nanogpt.optimizers import recipe, torch_groups
from nanogpt.optimizers.combined import Combined
from nanogpt.train.optim_rules import ROLES, role_settings, stepped_by

__all__ = ["Combined"]

# torch.optim's implementation switches: fused (one kernel for all params), foreach
# (multi-tensor ops), for_loop (one param at a time). auto leaves torch to choose.
IMPL_FLAGS = {
    OptimizerImpl.auto: {},
    OptimizerImpl.fused: {"fused": True},
    OptimizerImpl.foreach: {"foreach": True},
    OptimizerImpl.for_loop: {"foreach": False},
}


def parameter_roles(model: torch.nn.Module, vocab_size: int) -> dict[str, list]:
    """The model's trainable parameters by role (optim_rules.ROLES), each once; every tensor a
    model can hold has one. `model.blocks` holds the transformer blocks (nanoGPT's
    transformer.h). An embedding's weight is an embedding wherever else it is used: a head tied
    to it is no second tensor. The head is the last 2-D parameter outside the blocks with at
    least vocab_size rows (padded past the vocabulary, as nanochat's, it is still the head)."""
    embedded = {
        id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)
    }
    in_blocks = {id(p) for p in model.blocks.parameters()}
    trained = [p for _, p in model.named_parameters() if p.requires_grad]  # shared: named once
    heads = [
        p
        for p in trained
        if p.dim() == 2 and id(p) not in embedded | in_blocks and p.shape[0] >= vocab_size
    ]
    head = heads[-1] if heads else None
    roles: dict[str, list] = {role: [] for role in ROLES}
    for p in trained:
        if p.dim() < 2:
            roles["scalars"].append(p)
        elif id(p) in embedded:
            roles["embeddings"].append(p)
        elif p is head:
            roles["head"].append(p)
        elif p.dim() == 2 and id(p) in in_blocks:
            roles["matrices"].append(p)
        else:  # a gate or a projection outside the blocks, a tensor of 3+ dimensions
            roles["other"].append(p)
    return roles


def role_groups(model: torch.nn.Module, cfg: OptimizerConfig, vocab_size: int) -> list[dict]:
    """One param group per role that has parameters: {"role", "params", "lr",
    "weight_decay", "stepped_by"}."""
    roles = parameter_roles(model, vocab_size)
    settings = role_settings(cfg, model.config.n_embd, tied_head=not roles["head"])
    steppers = stepped_by(cfg)
    return [
        {"role": role, "params": params, **settings[role], "stepped_by": steppers[role]}
        for role, params in roles.items()
        if params
    ]


def build_optimizer(
    model: torch.nn.Module,
    cfg: OptimizerConfig,
    prefer_fused: bool = False,
    vocab_size: int | None = None,
    device_type: str = "cpu",
    code_dir: str | None = None,
    groups: list[dict] | None = None,
):
    """`prefer_fused`: with impl=auto, take the fused implementation. The trainer asks for it on
    CUDA, for every dtype: it is what GPU trainers run (nanoGPT's train.py), and with fp16 a
    non-fused optimizer makes GradScaler.step read found_inf to the host every step, a sync
    inside the measured loop; a fused one checks it on the device. A recipe without a fused
    path drops the flag (muon's flags are its AdamW part's). `groups`: the role groups
    (role_groups), when the caller has them already; `code_dir`: where optimizer.build's module
    is found (model.code_dir)."""
    made = recipe(cfg.name)
    if made.own_groups:
        return made.build(model=model, opt=cfg, device_type=device_type)
    if groups is None:
        groups = role_groups(model, cfg, vocab_size or model.config.vocab_size)
    flags = IMPL_FLAGS[cfg.impl]
    if prefer_fused and cfg.impl is OptimizerImpl.auto:
        flags = IMPL_FLAGS[OptimizerImpl.fused]
    if cfg.build and cfg.build.get("_target_"):
        return _built(cfg.build, torch_groups(groups), code_dir)
    return made.build(groups=groups, opt=cfg, flags=flags, device_type=device_type)


def _built(build: dict, groups: list[dict], code_dir: str | None):
    """optimizer.build made as Hydra would make it (a partial: its nested nodes built first),
    then called with the parameter groups; what fails is one line naming the key."""
    target = build["_target_"]
    try:
        made = instantiate({**build, "_partial_": True}, "optimizer.build", code_dir)
        return made(groups)
    except TargetError as err:
        raise ConfigError(err.key, err.problem, "see docs/models.md") from None
    except TypeError as err:
        fix = "give optimizer.build the class's own arguments"
        problem = f"{target}(...) refused its arguments: {err}"
        raise ConfigError("optimizer.build", problem, fix) from None


def stepped_classes(optimizer) -> str:
    """The classes that step, e.g. "Muon + AdamW" (a Combined's parts in order)."""
    parts = optimizer.parts if isinstance(optimizer, Combined) else [optimizer]
    return " + ".join(dict.fromkeys(type(p).__name__ for p in parts))


def implementation(optimizer) -> str:
    """Which implementation steps: fused, foreach or for_loop. torch decides foreach=None at
    the first step (foreach for CUDA tensors, else for_loop), as its own default does. Muon
    has one: a tensor at a time."""
    if isinstance(optimizer, Combined):
        return ", ".join(f"{type(p).__name__} {implementation(p)}" for p in optimizer.parts)
    if isinstance(optimizer, getattr(torch.optim, "Muon", ())):
        return "for_loop (Muon's only)"
    defaults = optimizer.defaults
    if "foreach" not in defaults and "fused" not in defaults:  # a class of the user's
        return f"{type(optimizer).__name__}'s own"
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach") is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        on_cuda = bool(params) and all(p.is_cuda for p in params)
        return "foreach (torch's default)" if on_cuda else "for_loop (torch's default)"
    return "foreach" if defaults["foreach"] else "for_loop"


def state_bytes(optimizer, params: list) -> int:
    """Bytes of the optimizer's state tensors for `params`, counted (after a step: torch
    creates the state at the first one). Step counters count too (a scalar tensor each)."""
    state = optimizer.state
    tensors = [t for p in params for t in state.get(p, {}).values() if isinstance(t, torch.Tensor)]
    # FSDP2's state is sharded (DTensor): this rank's shard is what it holds
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


class RoleCounts(dict):
    """Parameters by role (elements), with each role's tensor shapes (`shapes`): what the
    memory estimate counts state for, a tensor at a time (optim_rules.estimated_state)."""

    def __init__(self, params_by_role: dict[str, list]):
        super().__init__({r: sum(p.numel() for p in ps) for r, ps in params_by_role.items()})
        self.shapes = {r: [tuple(p.shape) for p in ps] for r, ps in params_by_role.items()}


def role_counts(
    model: torch.nn.Module, vocab_size: int, groups: list[dict] | None = None
) -> RoleCounts:
    """Parameters by role (elements, not tensors, and their shapes). `groups`: the role groups
    already made (the trainer's), read instead of sorting again."""
    if groups is not None:
        return RoleCounts({g["role"]: g["params"] for g in groups})
    return RoleCounts(parameter_roles(model, vocab_size))
