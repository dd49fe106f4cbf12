"""What each optimizer does with each role of parameter, decided without torch.

A model's parameters fall into five roles (nanogpt/train/optim.py sorts them); no tensor a model can
hold is refused:

  matrices    the 2-D weights inside the transformer blocks (attention and MLP projections):
              the only role Muon steps (torch.optim.Muon takes 2-D tensors only)
  embeddings  the weights of nn.Embedding modules (token, position, value embeddings); a head
              tied to the token table is this tensor, so it is an embedding, never a matrix
  head        the output projection when it is a tensor of its own: the last 2-D parameter
              outside the blocks (in named_parameters order) with at least model.vocab_size rows
              (a head padded past the vocabulary, as nanochat pads to a multiple of 64, is one)
  scalars     every parameter of fewer than 2 dimensions: LayerNorm gains and biases, biases
  other       the rest: 2-D tensors outside the blocks that are no head (a gate, a projection
              before the head) and tensors of 3 or more dimensions anywhere (stacked experts)

The learning rate and weight decay of each role, unless optimizer.roles.<role> sets them, and
what steps each role, are the optimizer's recipe's (nanogpt/optimizers/: one module an
optimizer). adamw, sgd, optimizer.build: nanoGPT's configure_optimizers, every role at
optimizer.lr, optimizer.weight_decay on every role but the scalars; muon: nanochat's
setup_optimizer (optimizers/muon.py).

Below them, the optimizer's keys checked (`check_optimizer`, which validate/ runs). A sweep's
own process checks every point before it measures any: these rules import no torch, so a CPU
point is checked without it. Muon's availability is read from the installed torch's version
(optimizers/muon.py); an optimizer.build class is found and its arguments read from its
source, as model.build's are (targets.check_node), never imported here.
"""

from __future__ import annotations

import math

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import OptimizerConfig, OptimizerImpl, RunSpec
from nanogpt.config.target_nodes import check_node, require_target
from nanogpt.optimizers import ROLE_KEYS, ROLES, STATE_SLOTS, recipe, registry, slot_state
from nanogpt.optimizers.muon import muon_missing, torch_version

__all__ = ["ROLES", "ROLE_KEYS", "STATE_SLOTS", "muon_missing", "torch_version"]


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    """The optimizer class that steps each role: the recipe's, or optimizer.build's target."""
    if opt.build and opt.build.get("_target_"):
        return dict.fromkeys(ROLES, str(opt.build["_target_"]))
    return recipe(opt.name).stepped_by(opt)


def role_settings(
    opt: OptimizerConfig, n_embd: int | None, tied_head: bool = False
) -> dict[str, dict[str, float]]:
    """Each role's {"lr", "weight_decay"}: optimizer.roles where set, else the recipe's
    defaults. `tied_head`: the token embedding is also the head (the built-in GPT)."""
    settings = recipe(opt.name).role_settings(opt, n_embd, tied_head)
    for role in ROLE_KEYS:
        asked, default = getattr(opt.roles, role), settings[role]
        settings[role] = {
            "lr": default["lr"] if asked.lr is None else asked.lr,
            "weight_decay": (
                default["weight_decay"] if asked.weight_decay is None else asked.weight_decay
            ),
        }
    return settings


def tensor_state(opt: OptimizerConfig, stepper: str, shape: tuple) -> int | None:
    """Bytes of optimizer state one tensor of `shape` stepped by `stepper` keeps: the recipe's
    rule (optimizer.build's class: the table's); None for a class it does not know."""
    if opt.build and opt.build.get("_target_"):
        return slot_state(shape, stepper, opt)
    return recipe(opt.name).state_bytes(shape, stepper, opt)


def state_bytes_per_param(opt: OptimizerConfig, stepper: str) -> int | None:
    """Bytes of optimizer state a parameter of a vector stepped by `stepper` keeps; None for a
    class this table does not know (a user's)."""
    return tensor_state(opt, stepper, (1,))


def estimated_state(opt: OptimizerConfig, counts: dict) -> tuple[dict[str, int], str]:
    """The optimizer state in bytes by role and the rule. `counts`: parameters by role (elements;
    optim.role_counts), whose `shapes` (each role's tensor shapes) a rule of each tensor reads
    (Adafactor's factored state); without shapes each role counts as one vector. A class the
    recipe does not know is counted as AdamW, and the rule says so (the record's counted figure
    is exact)."""
    shapes = getattr(counts, "shapes", None) or {r: [(n,)] for r, n in counts.items() if n}
    by_role, unknown = {}, set()
    for role, stepper in stepped_by(opt).items():
        total = 0
        for shape in shapes.get(role, []):
            bytes_ = tensor_state(opt, stepper, shape)
            if bytes_ is None:
                unknown.add(stepper)
                bytes_ = 4 * STATE_SLOTS["AdamW"] * math.prod(shape)
            total += bytes_
        by_role[role] = total
    known = registry().get(opt.name) if not opt.build else None
    rules = [
        known.rule(stepper, opt) if known else f"{stepper} {state_bytes_per_param(opt, stepper)}"
        for stepper in dict.fromkeys(stepped_by(opt).values())
        if stepper not in unknown
    ]
    rule = "bytes a parameter: " + ", ".join(rules)
    if unknown:
        rule += f"; {', '.join(sorted(unknown))} unknown here, counted as AdamW's 8"
    return by_role, rule


# The optimizer's keys, checked before any model is built (validate/ runs them): one
# ConfigError line each, naming the key and the fix.


def check_optimizer(spec: RunSpec) -> None:
    """The values torch.optim would reject at the first step, or that train nothing.
    Written as `not (ok)` so that NaN fails too."""
    opt = spec.optimizer
    if not opt.lr > 0:
        raise ConfigError("optimizer.lr", f"is {opt.lr} but must be positive", "use e.g. 6e-4")
    betas = list(opt.betas)
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(
            "optimizer.betas",
            f"is {betas} but must be two values in [0, 1)",
            "use e.g. [0.9,0.95]",
        )
    for key, value in {
        "optimizer.weight_decay": opt.weight_decay,
        "optimizer.momentum": opt.momentum,
        "optimizer.grad_clip": opt.grad_clip,
    }.items():
        if not value >= 0:
            raise ConfigError(key, f"is {value} but must be 0 or more", f"set {key}=0 to disable")
    for role in ROLE_KEYS:
        asked, key = getattr(opt.roles, role), f"optimizer.roles.{role}"
        if asked.lr is not None and not asked.lr > 0:
            fix = "give a positive rate, or null for the role's default"
            raise ConfigError(f"{key}.lr", f"is {asked.lr} but must be positive", fix)
        if asked.weight_decay is not None and not asked.weight_decay >= 0:
            fix = "give 0 or more, or null for the role's default"
            raise ConfigError(f"{key}.weight_decay", f"is {asked.weight_decay}, below 0", fix)
    check_build(spec)
    if opt.name in registry():  # an unknown name is validate.check_choices' line
        recipe(opt.name).check(spec)


def check_build(spec: RunSpec) -> None:
    """optimizer.build: a class to call with the parameter groups (nanogpt/train/optim.py), there
    and taking its keys (read from its source, not imported: targets.check_node; its module is
    found where model.build's is, model.code_dir), and no second optimizer beside it."""
    opt, build = spec.optimizer, spec.optimizer.build
    if not build:
        return
    require_target(build, "optimizer.build", "torch.optim.Adagrad")
    if build.get("_partial_", True) is not True:
        raise ConfigError(
            "optimizer.build._partial_",
            "must be true: the runner calls the class with the parameter groups",
            "set it to true, or leave it out",
        )
    if "_args_" in build:
        raise ConfigError(
            "optimizer.build._args_",
            "the class's first positional argument is the parameter groups, which the runner "
            "passes",
            "give the class's other arguments by name (a nested node may take _args_)",
        )
    if opt.impl is not OptimizerImpl.auto:
        raise ConfigError(
            "optimizer.impl",
            f"{opt.impl.value} is a flag of the built-in optimizers; optimizer.build gets only "
            "its own keys",
            "set optimizer.impl=auto and e.g. optimizer.build.foreach=true",
        )
    check_node(build, "optimizer.build", spec.model.code_dir)
