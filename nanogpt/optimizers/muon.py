"""optimizer=muon: torch.optim.Muon (torch 2.9+) on the block matrices, AdamW on the other roles,
stepped as one optimizer (`Combined`): the GradScaler, clipping and the diagnosis see one step.
The other roles' rates are nanochat's setup_optimizer's (nanochat/gpt.py)."""

from __future__ import annotations

import importlib.metadata
import re

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import OptimizerConfig, RunSpec, Strategy
from nanogpt.optimizers import ROLE_KEYS, Recipe, torch_groups

# nanochat's setup_optimizer defaults for its AdamW groups at n_embd 768, and the scalars'.
NANOCHAT_LR = {"embeddings": 0.2, "head": 0.004, "scalars": 0.5 * 0.01}
NANOCHAT_WEIGHT_DECAY = {"embeddings": 0.001, "head": 0.01, "scalars": 0.0}
NANOCHAT_WIDTH = 768

MUON_SINCE = (2, 9)  # torch.optim.Muon's first release
MUON_ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn choices


def stepped_by(opt: OptimizerConfig) -> dict[str, str]:
    return {"matrices": "Muon", **dict.fromkeys(ROLE_KEYS, "AdamW")}


def role_settings(opt: OptimizerConfig, n_embd: int | None, tied_head: bool) -> dict:
    """Muon on the matrices at optimizer.lr (0.02) and optimizer.weight_decay; AdamW on the
    rest: embeddings at 0.2 and the head at 0.004, both times (n_embd / 768)^-0.5 as nanochat
    scales its AdamW groups, decayed 0.001 and 0.01; scalars at 0.005 (nanochat's residual gains:
    scalar_lr 0.5 x 0.01), not decayed; `other` at the head's (nanochat steps its gates with
    AdamW). `tied_head`: the token embedding is also the head (the built-in GPT); then the
    embeddings take the head's: nanochat's embedding rate (50x the head's) would move the output
    projection too fast (on nano-1k the loss rose from 6.9 to 21 in five steps). A model without
    an nn.Embedding has no width to scale by: nanochat's rates as given."""
    scale = (n_embd / NANOCHAT_WIDTH) ** -0.5 if n_embd else 1.0
    lr = {"embeddings": NANOCHAT_LR["embeddings"] * scale, "head": NANOCHAT_LR["head"] * scale}
    lr["scalars"] = NANOCHAT_LR["scalars"]
    decay = dict(NANOCHAT_WEIGHT_DECAY)
    lr["other"], decay["other"] = lr["head"], decay["head"]
    if tied_head:
        lr["embeddings"], decay["embeddings"] = lr["head"], decay["head"]
    settings = {"matrices": {"lr": opt.lr, "weight_decay": opt.weight_decay}}
    return settings | {role: {"lr": lr[role], "weight_decay": decay[role]} for role in ROLE_KEYS}


def build(groups: list[dict], opt: OptimizerConfig, flags: dict, **_):
    """Muon's matrices and AdamW's rest as one optimizer. The flags (optimizer.impl) are the
    AdamW part's: torch.optim.Muon has one implementation, a tensor at a time."""
    import torch

    from nanogpt.optimizers.combined import Combined

    muon = torch.optim.Muon(
        torch_groups(groups, "Muon"),
        lr=opt.lr,
        momentum=opt.momentum,
        adjust_lr_fn=opt.adjust_lr_fn,
    )
    adamw = torch_groups(groups, "AdamW")
    if not adamw:
        return muon
    return Combined([muon, torch.optim.AdamW(adamw, betas=tuple(opt.betas), **flags)])


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


def check(spec: RunSpec) -> None:
    """A torch with torch.optim.Muon, whole matrices (no FSDP2 shards), one of Muon's
    learning-rate adjustments, and no optimizer.build (it would replace two optimizers)."""
    opt = spec.optimizer
    if opt.build:
        raise ConfigError(
            "optimizer.build",
            "replaces the optimizer, and optimizer=muon is two (Muon and AdamW)",
            "use it with optimizer=adamw or sgd, or leave optimizer.build out",
        )
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


RECIPE = Recipe("muon", stepped_by, build, role_settings=role_settings, check=check)
