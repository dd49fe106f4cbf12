"""The figures of a user's own model (model.build, docs/models.md) that the built-in GPT gets
from its formulas (measure/flops.py, measure/estimate.py), which describe that GPT alone.

FLOPs per token of one forward+backward: from the model's hook (`flops_per_token(seq_len)`,
nanochat's `estimate_flops()`), else counted by torch's FlopCounterMode on a copy built on the
meta device (shapes only: attention counted as the SDPA call's matmuls), else 6N with attention
not counted; `flops_source` says which. The memory estimate: parameters, gradients and optimizer
state exact from the model's own tensors, the activations null with the reason, so no total.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.measure.byo import UserModel
from nanogpt.optim import role_counts
from nanogpt.optim_rules import STATE_SLOTS, estimated_state
from nanogpt.spec import RunSpec
from nanogpt.targets import instantiate


def flops_of(spec: RunSpec, model: UserModel) -> dict:
    """FLOPs per token of one forward+backward and where the figure came from."""
    inner, seq = model.inner, spec.model.block_size
    counted, source = None, None
    try:
        counted = _counted(spec)
    except Exception as err:  # noqa: BLE001 - a model that cannot run on meta: say so, go on
        counted_note = f"not counted on meta ({type(err).__name__}: {str(err)[:120]})"
    else:
        counted_note = None
    if callable(getattr(inner, "flops_per_token", None)):
        per_token, source = inner.flops_per_token(seq), "hook: flops_per_token(seq_len)"
    elif callable(getattr(inner, "estimate_flops", None)):
        per_token, source = inner.estimate_flops(), "hook: estimate_flops()"
    elif counted:
        per_token, source = counted, "counted: FlopCounterMode, one step on a meta copy"
    else:
        per_token = 6 * model.get_num_params()
        source = "6N, N = every parameter; attention not counted"
        if counted_note:
            source += f"; {counted_note}"
    return {
        "n_params_flops": model.get_num_params(),
        "flops_per_token": int(round(per_token)),
        "flops_per_token_counted": counted,
        "flops_source": source,
    }


def meta_copy(spec: RunSpec) -> tuple[UserModel, torch.Tensor]:
    """The user's model built on the meta device (shapes and dtypes only: no memory, no
    compute, no weights initialised) and one sequence of token ids for it."""
    with torch.device("meta"):
        copy = UserModel(
            instantiate(spec.model.build, "model.build", spec.model.code_dir),
            spec.model.vocab_size,
            str(spec.model.build["_target_"]),
        )
        # A transformers model without a cache reads its position ids on the host (are
        # several sequences packed in a row?), which a meta tensor cannot answer; with its
        # default cache it does not (byo.UserModel), and the cache adds no FLOPs.
        copy.hf_cache = True
        idx = torch.zeros(1, spec.model.block_size, dtype=torch.long)
    return copy, idx


def _counted(spec: RunSpec) -> float | None:
    """One forward+backward of a sequence, counted on a meta copy."""
    copy, idx = meta_copy(spec)
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = copy(idx, idx)
        loss.backward()
    total = counter.get_total_flops()
    return total / idx.shape[1] if total else None


def memory_of(
    spec: RunSpec, model: UserModel, world_size: int, strategy: str, optimizer=None
) -> dict:
    """Parameters, gradients and optimizer state, exact from the model's own tensors (this
    rank's share under FSDP2); activations unknown, so no total. optimizer=from_model: the
    state from the classes the model's method made (`optimizer`), null for a class unknown."""
    shards = world_size if strategy == "fsdp2" else 1
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if spec.optimizer.name == "from_model":
        state, rule = _own_state(optimizer)
        by_role = {}
    else:
        by_role, rule = estimated_state(spec.optimizer, role_counts(model, spec.model.vocab_size))
        state = sum(by_role.values())
    return {
        "weights": weights // shards,
        "gradients": grads // shards,
        "optimizer_state": None if state is None else state // shards,
        "optimizer_state_rule": rule,
        "activations": None,
        "total": None,
        "optimizer_state_by_role": {role: b // shards for role, b in by_role.items()},
        "note": (
            f"activations not estimated: {model.target} is not the built-in GPT, whose formula "
            "does not apply; the total is unknown (the measured peak is in the record's memory)"
        ),
    }


def _own_state(optimizer) -> tuple[int | None, str]:
    """The state bytes the model's own optimizer(s) will keep, from each part's class
    (optim_rules.STATE_SLOTS: fp32 slots a parameter); None when a class is not in the table."""
    parts = getattr(optimizer, "parts", [optimizer])
    total, rules = 0, []
    for part in parts:
        name = type(part).__name__
        slots = STATE_SLOTS.get(name)
        if name == "SGD":
            slots = int(any(g.get("momentum") for g in part.param_groups))
        if slots is None:
            return None, f"{name} is not in the table of optimizer state (optim_rules.py)"
        rules.append(f"{name} {4 * slots}")
        total += sum(4 * slots * p.numel() for g in part.param_groups for p in g["params"])
    return total, "bytes a parameter: " + ", ".join(dict.fromkeys(rules))
