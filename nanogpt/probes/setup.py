"""What a point is before its first step: parameter and FLOP counts, tokens per step, the
wrapping, the optimizer implementation and the memory estimate (the record's `Setup`); its
parameters by role and what steps each (the record's `OptimizerPart`, whose state bytes are
counted after the measured steps: `count_optimizer_state`)."""

from __future__ import annotations

import os
from pathlib import Path

from nanogpt.config.spec import RunSpec
from nanogpt.record import Setup
from nanogpt.record.optimizer import OptimizerPart
from nanogpt.train import flops
from nanogpt.train.memory_estimate import estimate_of
from nanogpt.train.optim import state_bytes, stepped_classes
from nanogpt.train.optim_rules import estimated_state
from nanogpt.train.trainer import Trainer


def describe_setup(spec: RunSpec, trainer: Trainer) -> Setup:
    model, perf = trainer.raw_model, spec.perf
    strategy = "fsdp2" if trainer.fsdp else "ddp"
    # Every model's figures by one path, the built-in GPT's from its own hooks (model.py)
    counts = flops.flops_of(spec, model)
    estimate = estimate_of(
        spec, model, trainer.world.size, strategy, trainer.role_groups, trainer.optimizer
    )
    fp8 = trainer.fp8_layers
    return Setup(
        device=str(trainer.device),
        world_size=trainer.world.size,
        n_params=model.get_num_params(non_embedding=False),
        **counts,
        tokens_per_step=trainer.tokens_per_step,
        model_wrapping=trainer.model_wrapping,
        fp8_converted=len(fp8["converted"]) if fp8 is not None else None,
        fp8_layers=fp8,
        optimizer_impl_used=trainer.optimizer_impl_used,
        inductor_cache=_inductor_cache_state() if perf.compile else None,
        mem_estimate_bytes=estimate["total"],
        mem_estimate=estimate,
    )


def describe_optimizer(spec: RunSpec, trainer: Trainer, estimate: dict) -> OptimizerPart:
    """Each role's parameters, learning rate, weight decay, what steps it and the state the
    memory estimate (`estimate`, train/memory_estimate.py) gives it."""
    opt = spec.optimizer
    if opt.name == "from_model":  # the model's own: its classes and groups, no roles of ours
        return OptimizerPart(
            optimizer_stepped=stepped_classes(trainer.optimizer),
            optimizer_state_rule=estimate.get("optimizer_state_rule"),
            optimizer_note=(
                f"the model's own {opt.method}({', '.join(opt.args)}"
                f"{', ' + opt.device_arg if opt.device_arg else ''}): "
                f"{len(trainer.optimizer.param_groups)} param groups"
            ),
        )
    groups = trainer.role_groups
    by_role = estimate.get("optimizer_state_by_role", {})
    roles = {
        g["role"]: {
            "n_params": sum(p.numel() for p in g["params"]),
            "tensors": len(g["params"]),
            "lr": g["lr"],
            "weight_decay": g["weight_decay"],
            "stepped_by": g["stepped_by"],
            "state_bytes_est": by_role.get(g["role"]),
            "state_bytes": None,  # counted after the measured steps
        }
        for g in groups
    }
    muon = "Muon" in {g["stepped_by"] for g in groups}
    note = None
    if muon:
        note = (
            "Muon steps one matrix at a time (torch.optim.Muon has no foreach or fused path); "
            f"optimizer.impl={opt.impl.value} applies to the AdamW part"
        )
    return OptimizerPart(
        optimizer_stepped=stepped_classes(trainer.optimizer),
        optimizer_roles=roles,
        optimizer_state_rule=estimated_state(opt, {})[1],
        muon_adjust_lr_fn=opt.adjust_lr_fn if muon else None,
        optimizer_note=note,
    )


def count_optimizer_state(spec: RunSpec, trainer: Trainer, part: OptimizerPart) -> None:
    """The state the optimizer holds, counted from its tensors by role (after the measured
    steps: torch creates it at the first step); this rank's share under FSDP2."""
    if spec.optimizer.name == "from_model":  # no roles: the model's optimizer, whole
        params = list(trainer.raw_model.parameters())
        part.optimizer_state_bytes = state_bytes(trainer.optimizer, params)
        return
    total = 0
    for g in trainer.role_groups:
        counted = state_bytes(trainer.optimizer, g["params"])
        part.optimizer_roles[g["role"]]["state_bytes"] = counted
        total += counted
    part.optimizer_state_bytes = total


def count_unknown_state(trainer: Trainer, setup: Setup) -> None:
    """After the first step (torch's optimizers create their state there): an optimizer class
    the state table lacks (optim_rules.STATE_SLOTS), whose estimate is null, has its state
    counted from its own `optimizer.state`, with no extra step."""
    estimate = setup.mem_estimate
    if not estimate or estimate.get("optimizer_state") is not None:
        return
    # this rank's share under FSDP2 (state_bytes counts the local shards)
    estimate["optimizer_state"] = state_bytes(
        trainer.optimizer, list(trainer.raw_model.parameters())
    )
    estimate["optimizer_state_rule"] = (
        f"counted from optimizer.state after the first warmup step "
        f"({estimate.get('optimizer_state_rule') or 'a class the table lacks'})"
    )


def _inductor_cache_state() -> str:
    """'warm' when Inductor's on-disk cache already holds entries, else 'cold'. The dir is the
    one Inductor itself uses: TORCHINDUCTOR_CACHE_DIR, else its per-user default ('unknown'
    where this torch does not say which that is)."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        except ImportError:  # torch releases before this module: not asked, so not guessed
            return "unknown"
        cache = default_cache_dir()
    return "warm" if Path(cache).is_dir() and any(Path(cache).iterdir()) else "cold"
