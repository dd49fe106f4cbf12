"""Optimizers by role: each parameter of the model belongs to one role (matrices, embeddings,
head, scalars, other; nanogpt/optim_rules.py says which and what each role's defaults are), a param
group per role, and one object the trainer steps.

- adamw, sgd: nanoGPT's configure_optimizers: weight decay on the 2-D roles only, never on
  biases and LayerNorm gains (Loshchilov & Hutter, 2019, decoupled decay).
- muon: torch.optim.Muon on the block matrices, AdamW on the rest, stepped as one optimizer
  (`Combined`): the GradScaler, clipping and the diagnosis see one step.
- from_model: the model's own factory (nanoGPT's configure_optimizers, nanochat's
  setup_optimizer), called with optimizer.args; a list it returns is stepped as one (`Combined`).
- optimizer.build: any class, named as Hydra names it ({_target_: torch.optim.Adagrad,
  _partial_: true, ...}), called with the role groups and its other keys. The spec carries the
  node as plain values (library code imports no Hydra); it is built as model.build is
  (targets.instantiate: nested _target_ nodes first, their _args_, the module found in
  model.code_dir), here only, in the measuring process.
"""

from __future__ import annotations

import torch

from nanogpt.errors import ConfigError
from nanogpt.optim_rules import ROLES, role_settings, stepped_by
from nanogpt.spec import OptimizerConfig, OptimizerImpl
from nanogpt.targets import TargetError, instantiate

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
    inside the measured loop; a fused one checks it on the device. With optimizer=muon the
    flags are the AdamW part's: torch.optim.Muon has one implementation, a tensor at a time.
    `groups`: the role groups (role_groups), when the caller has them already; `code_dir`:
    where optimizer.build's module is found (model.code_dir)."""
    if cfg.name == "from_model":
        return from_model(model, cfg, device_type)
    if groups is None:
        groups = role_groups(model, cfg, vocab_size or model.config.vocab_size)
    flags = IMPL_FLAGS[cfg.impl]
    if prefer_fused and cfg.impl is OptimizerImpl.auto:
        flags = IMPL_FLAGS[OptimizerImpl.fused]
    if cfg.build and cfg.build.get("_target_"):
        return _built(cfg.build, _torch_groups(groups), code_dir)
    if cfg.name == "sgd":
        return torch.optim.SGD(_torch_groups(groups), lr=cfg.lr, momentum=cfg.momentum, **flags)
    adamw = [g for g in groups if g["stepped_by"] == "AdamW"]
    betas = tuple(cfg.betas)
    if cfg.name != "muon":
        return torch.optim.AdamW(_torch_groups(adamw), lr=cfg.lr, betas=betas, **flags)
    muon = torch.optim.Muon(
        _torch_groups([g for g in groups if g["stepped_by"] == "Muon"]),
        lr=cfg.lr,
        momentum=cfg.momentum,
        adjust_lr_fn=cfg.adjust_lr_fn,
    )
    if not adamw:
        return muon
    return Combined([muon, torch.optim.AdamW(_torch_groups(adamw), betas=betas, **flags)])


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


def from_model(model: torch.nn.Module, cfg: OptimizerConfig, device_type: str):
    """optimizer=from_model: `model.<optimizer.method>(**optimizer.args)`, the device type
    given as `optimizer.device_arg` when named. The user's model (measure/byo.py's UserModel)
    is asked, not its wrapper. One optimizer, or a list of them stepped as one (`Combined`, as
    nanochat's setup_optimizer returns Muon and AdamW): what is not one is one line."""
    inner, target = getattr(model, "inner", model), getattr(model, "target", "the model")
    method = getattr(inner, cfg.method, None)
    if not callable(method):
        raise ConfigError(
            "optimizer.method",
            f"{target} has no method {cfg.method}()",
            "name the model's optimizer factory, or use optimizer=adamw, sgd or muon",
        )
    # a list from the config (Hydra's betas: [0.9, 0.95]) is the tuple the forks pass
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.args.items()}
    if cfg.device_arg:
        kwargs[cfg.device_arg] = device_type
    call = f"{target}.{cfg.method}({', '.join(kwargs)})"
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


def stepped_classes(optimizer) -> str:
    """The classes that step, e.g. "Muon + AdamW" (a Combined's parts in order)."""
    parts = optimizer.parts if isinstance(optimizer, Combined) else [optimizer]
    return " + ".join(dict.fromkeys(type(p).__name__ for p in parts))


def _torch_groups(groups: list[dict]) -> list[dict]:
    """The groups as torch.optim takes them: params, lr, weight_decay (no bookkeeping keys)."""
    return [{k: g[k] for k in ("params", "lr", "weight_decay")} for g in groups]


class Combined:
    """Several optimizers stepped as one, as nanochat's MuonAdamW steps Muon and AdamW: one
    `step`, `zero_grad` and `state_dict`, and `param_groups` that are the parts' own groups
    (the same dicts), so GradScaler.unscale_ unscales every part's gradients and GradScaler.step
    steps all parts or, after an inf, none. Each part's step keeps its own profiler range
    (`Optimizer.step#Muon.step`), which the diagnosis counts as optimizer time."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts
        self.param_groups = [group for part in parts for group in part.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for part in self.parts for p, s in part.state.items()}

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        for part, own in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(own)


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


def role_counts(
    model: torch.nn.Module, vocab_size: int, groups: list[dict] | None = None
) -> dict[str, int]:
    """Parameters by role (elements, not tensors): what the memory estimate counts state for.
    `groups`: the role groups already made (the trainer's), read instead of sorting again."""
    if groups is not None:
        return {g["role"]: sum(p.numel() for p in g["params"]) for g in groups}
    return {
        role: sum(p.numel() for p in params)
        for role, params in parameter_roles(model, vocab_size).items()
    }
