"""Optimizers as nanoGPT configures them: weight decay only on 2-D weights (matmuls and
embeddings), never on biases and LayerNorm gains (Loshchilov & Hutter, 2019, decoupled decay)."""

from __future__ import annotations

import torch

from nanogpt.spec import OptimizerConfig, OptimizerImpl

# torch.optim's implementation switches: fused (one kernel for all params), foreach
# (multi-tensor ops), for_loop (one param at a time). auto leaves torch to choose.
IMPL_FLAGS = {
    OptimizerImpl.auto: {},
    OptimizerImpl.fused: {"fused": True},
    OptimizerImpl.foreach: {"foreach": True},
    OptimizerImpl.for_loop: {"foreach": False},
}


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(
    model: torch.nn.Module, cfg: OptimizerConfig, prefer_fused: bool = False
) -> torch.optim.Optimizer:
    """`prefer_fused`: with impl=auto, take the fused implementation. The trainer asks for it on
    CUDA, for every dtype: it is what GPU trainers run (nanoGPT's train.py), and with fp16 a
    non-fused optimizer makes GradScaler.step read found_inf to the host every step, a sync
    inside the measured loop; a fused one checks it on the device."""
    groups = param_groups(model, cfg.weight_decay)
    flags = IMPL_FLAGS[cfg.impl]
    if prefer_fused and cfg.impl is OptimizerImpl.auto:
        flags = IMPL_FLAGS[OptimizerImpl.fused]
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **flags)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **flags)


def implementation(optimizer: torch.optim.Optimizer) -> str:
    """Which implementation steps: fused, foreach or for_loop. torch decides foreach=None at
    the first step (foreach for CUDA tensors, else for_loop), as its own default does."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if defaults.get("foreach") is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        on_cuda = bool(params) and all(p.is_cuda for p in params)
        return "foreach (torch's default)" if on_cuda else "for_loop (torch's default)"
    return "foreach" if defaults["foreach"] else "for_loop"
