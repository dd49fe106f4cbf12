"""What each optimizer does with each role of parameter, decided without torch.

A model's parameters fall into five roles (nanogpt/optim.py sorts them); no tensor a model can
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

The learning rate and weight decay of each role, unless optimizer.roles.<role> sets them:

  adamw, sgd, optimizer.build   nanoGPT's configure_optimizers: every role at optimizer.lr;
                                optimizer.weight_decay on the 2-D roles, none on scalars
  muon                          nanochat's setup_optimizer (nanochat/gpt.py): Muon on the
                                matrices at optimizer.lr (0.02) and optimizer.weight_decay;
                                AdamW on the rest, embeddings at 0.2 and the head at 0.004,
                                both times (n_embd / 768)^-0.5 as nanochat scales its AdamW
                                groups, decayed 0.001 and 0.01 (an embedding tied to the head,
                                as the built-in GPT's, takes the head's: it is the head too);
                                scalars at 0.005 (nanochat's residual gains: scalar_lr 0.5 x
                                0.01), not decayed (nanoGPT never decays a 1-D tensor)
  other                         under adamw, sgd and optimizer.build the matrices' lr and weight
                                decay; under muon the AdamW part's rate for a matrix, the
                                head's (nanochat steps its gates and projections with AdamW)

Below them, the optimizer's keys checked (`check_optimizer`, which validate/ runs). A sweep's
own process checks every point before it measures any: these rules import no torch, so a CPU
point is checked without it. Muon's availability is read from the installed torch's version
(torch.optim.Muon arrived in torch 2.9); an optimizer.build class is found and its arguments
read from its source, as model.build's are (targets.check_node), never imported here.
"""

from __future__ import annotations

import importlib.metadata
import re

from nanogpt.errors import ConfigError
from nanogpt.spec import OptimizerConfig, OptimizerImpl, RunSpec, Strategy
from nanogpt.targets import check_node, require_target

ROLES = ("matrices", "embeddings", "head", "scalars", "other")
ROLE_KEYS = ROLES[1:]  # optimizer.roles.<role>; the matrices' are optimizer.lr / weight_decay

# nanochat's setup_optimizer defaults for its AdamW groups at n_embd 768, and the scalars'.
NANOCHAT_LR = {"embeddings": 0.2, "head": 0.004, "scalars": 0.5 * 0.01}
NANOCHAT_WEIGHT_DECAY = {"embeddings": 0.001, "head": 0.01, "scalars": 0.0}
NANOCHAT_WIDTH = 768

MUON_SINCE = (2, 9)  # torch.optim.Muon's first release
MUON_ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn choices

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


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    """The optimizer class that steps each role: a torch.optim name or optimizer.build's
    target."""
    if opt.build and opt.build.get("_target_"):
        return dict.fromkeys(ROLES, str(opt.build["_target_"]))
    if opt.name == "muon":
        return {"matrices": "Muon", **dict.fromkeys(ROLE_KEYS, "AdamW")}
    return dict.fromkeys(ROLES, "SGD" if opt.name == "sgd" else "AdamW")


def role_settings(
    opt: OptimizerConfig, n_embd: int, tied_head: bool = False
) -> dict[str, dict[str, float]]:
    """Each role's {"lr", "weight_decay"}: optimizer.roles where set, else the defaults above.
    `tied_head`: the token embedding is also the head (the built-in GPT). Then muon's default
    for the embeddings is the head's: nanochat's embedding rate (50x the head's) would move the
    output projection too fast (on nano-1k the loss rose from 6.9 to 21 in five steps)."""
    if opt.name == "muon":
        # a model without an nn.Embedding has no width to scale by: nanochat's rates as given
        scale = (n_embd / NANOCHAT_WIDTH) ** -0.5 if n_embd else 1.0
        lr = {"embeddings": NANOCHAT_LR["embeddings"] * scale, "head": NANOCHAT_LR["head"] * scale}
        lr["scalars"] = NANOCHAT_LR["scalars"]
        decay = dict(NANOCHAT_WEIGHT_DECAY)
        lr["other"], decay["other"] = lr["head"], decay["head"]
        if tied_head:
            lr["embeddings"], decay["embeddings"] = lr["head"], decay["head"]
    else:
        lr = dict.fromkeys(ROLE_KEYS, opt.lr)
        decay = dict.fromkeys(ROLE_KEYS, opt.weight_decay) | {"scalars": 0.0}
    settings = {"matrices": {"lr": opt.lr, "weight_decay": opt.weight_decay}}
    for role in ROLE_KEYS:
        asked = getattr(opt.roles, role)
        settings[role] = {
            "lr": lr[role] if asked.lr is None else asked.lr,
            "weight_decay": decay[role] if asked.weight_decay is None else asked.weight_decay,
        }
    return settings


def state_bytes_per_param(opt: OptimizerConfig, stepper: str) -> int | None:
    """Bytes of optimizer state a parameter stepped by `stepper` keeps; None for a class this
    table does not know (a user's)."""
    name = stepper.rpartition(".")[2]
    if name == "SGD":
        momentum = opt.momentum if not opt.build else opt.build.get("momentum", 0)
        return 4 if momentum else 0
    slots = STATE_SLOTS.get(name)
    return None if slots is None else 4 * slots


def estimated_state(opt: OptimizerConfig, counts: dict[str, int]) -> tuple[dict[str, int], str]:
    """The optimizer state in bytes by role, for `counts` (parameters by role), and the rule:
    AdamW 8 bytes a parameter, Muon 4, SGD 4 with momentum; a class the table does not know is
    counted as AdamW, and the rule says so (the record's counted figure is exact)."""
    by_role, unknown = {}, set()
    for role, stepper in stepped_by(opt).items():
        per_param = state_bytes_per_param(opt, stepper)
        if per_param is None:
            unknown.add(stepper)
            per_param = 4 * STATE_SLOTS["AdamW"]
        by_role[role] = per_param * counts.get(role, 0)
    rule = "bytes a parameter: " + ", ".join(
        f"{stepper} {state_bytes_per_param(opt, stepper)}"
        for stepper in dict.fromkeys(stepped_by(opt).values())
        if stepper not in unknown
    )
    if unknown:
        rule += f"; {', '.join(sorted(unknown))} unknown here, counted as AdamW's 8"
    return by_role, rule


def torch_version() -> str:
    """The installed torch's version, from its package metadata: torch is not imported."""
    return importlib.metadata.version("torch")


def muon_missing(version: str | None = None) -> str | None:
    """Why a torch of `version` (default: the installed one) has no torch.optim.Muon; None
    when it has."""
    version = version or torch_version()
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if numbers < MUON_SINCE:
        return f"torch {version} has no torch.optim.Muon (it arrived in torch 2.9)"
    return None


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
    check_muon(spec)
    check_from_model(spec)


def check_from_model(spec: RunSpec) -> None:
    """optimizer=from_model: a model of the user's (the built-in GPT has no optimizer method of
    its own), a method named, and none of the built-in optimizers' keys beside it. Whether the
    model has the method is known only where it is built (the point's process)."""
    opt = spec.optimizer
    if opt.name != "from_model":
        return
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


def check_build(spec: RunSpec) -> None:
    """optimizer.build: a class to call with the parameter groups (nanogpt/optim.py), there and
    taking its keys (read from its source, not imported: targets.check_node; its module is
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
    if opt.name == "muon":
        raise ConfigError(
            "optimizer.build",
            "replaces the optimizer, and optimizer=muon is two (Muon and AdamW)",
            "use it with optimizer=adamw or sgd, or leave optimizer.build out",
        )
    if opt.impl is not OptimizerImpl.auto:
        raise ConfigError(
            "optimizer.impl",
            f"{opt.impl.value} is a flag of the built-in optimizers; optimizer.build gets only "
            "its own keys",
            "set optimizer.impl=auto and e.g. optimizer.build.foreach=true",
        )
    check_node(build, "optimizer.build", spec.model.code_dir)


def check_muon(spec: RunSpec) -> None:
    """optimizer=muon: a torch with torch.optim.Muon, whole matrices (no FSDP2 shards), one of
    Muon's learning-rate adjustments."""
    opt = spec.optimizer
    if opt.name != "muon":
        return
    missing = muon_missing()
    if missing:
        raise ConfigError("optimizer", missing, "install torch 2.9 or newer, or use adamw")
    if spec.dist.strategy is Strategy.fsdp2:
        raise ConfigError(
            "dist.strategy",
            "fsdp2 shards every matrix over the ranks, and Muon's Newton-Schulz step needs "
            "whole matrices",
            "use dist.strategy=ddp with optimizer=muon",
        )
    if opt.adjust_lr_fn not in MUON_ADJUST_LR:
        raise ConfigError(
            "optimizer.adjust_lr_fn",
            f"'{opt.adjust_lr_fn}' is not one of torch.optim.Muon's",
            f"use {' or '.join(MUON_ADJUST_LR)}",
        )
