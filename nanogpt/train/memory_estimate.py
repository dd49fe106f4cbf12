"""The analytic memory estimate of a point, for every model by one path (`estimate_of`), so a user
can see where memory goes and what batch size fits, beside what probes/memory.py's probes saw.

Two halves:
- what the runner knows of any model, exact from its tensors and the point's settings
  (`runner_parts`): weights, gradients, optimizer state (by role: optim_rules; or, with
  optimizer=from_model, from the classes the model's method made), DDP's buckets, and under FSDP2
  each rank's shards, the parameters gathered for compute and the gradients kept unsharded
  while accumulating;
- what only the model knows, the bytes one micro-batch keeps for backward, from the model's hook
  `activation_memory(batch_size, seq_len, dtype, activation_checkpointing, compiled)`
  (docs/models.md), asked without and with checkpointing, the point's policy (perf.ac) made of
  the two by train/checkpoint_rules.py (`policy_activations`, its source in
  "activations_rule"). The built-in GPT has one (nanogpt/train/gpt.py: Korthikanti's formula,
  fitted to an H100's peaks; a compiled point away from the fitted depth says so in the
  estimate's note, gpt.away_from_fit); a model without one has its activations null with the
  reason, and so no total. The GPT's formula is never applied to another model.
"""

from __future__ import annotations

import torch

from nanogpt.config.protocol import CUDA_GRAPH_MODES
from nanogpt.config.spec import Ac, RunSpec
from nanogpt.hardware.devices import AUTOCAST_DTYPES
from nanogpt.train.checkpoint_rules import activations
from nanogpt.train.gpt import GPT, activation_memory_of, away_from_fit
from nanogpt.train.optim import role_counts
from nanogpt.train.optim_rules import STATE_SLOTS, estimated_state

HOOK = "activation_memory(batch_size, seq_len, dtype, activation_checkpointing, compiled)"


def estimate_of(
    spec: RunSpec,
    model,
    world_size: int,
    strategy: str,
    groups: list[dict] | None = None,
    optimizer=None,
) -> dict:
    """The estimate of a point, by component, for any model: the built-in GPT (possibly on the
    meta device) or a user's (byo.UserModel). `groups`: the trainer's role groups, where there
    are some; `optimizer`: the optimizer the model's own method made (optimizer=from_model). The
    one place a spec becomes the estimate: the measured point (probes/setup.py) and the
    search's pruning (tune/fit.py)."""
    perf = spec.perf
    params = list(model.parameters())
    if spec.optimizer.name == "from_model":
        state, rule = _own_state(optimizer)
        by_role = {}
    else:
        counts = role_counts(model, spec.model.vocab_size, groups)
        by_role, rule = estimated_state(spec.optimizer, counts)
        state = sum(by_role.values())
    dtype = AUTOCAST_DTYPES.get(perf.dtype, torch.float32)  # what activations are computed in
    parts = runner_parts(
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        grad_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        state_bytes=state,
        n_params=sum(p.numel() for p in params),
        n_block_params=sum(p.numel() for p in model.blocks.parameters()),
        n_blocks=len(model.blocks),
        act_bytes=dtype.itemsize,
        world_size=world_size,
        strategy=strategy,
        reshard_after_forward=spec.dist.reshard_after_forward,
        grad_accum=perf.grad_accum,
    )
    inner = getattr(model, "inner", model)  # a user's model inside byo.UserModel
    note = None
    activations_rule = None
    if callable(getattr(inner, "activation_memory", None)):
        parts |= policy_activations(inner, perf, spec.model.block_size, dtype, len(model.blocks))
        activations_rule = parts.pop("activations_rule")
        if isinstance(inner, GPT):  # the built-in GPT's fit: is this point where it was fitted?
            off = away_from_fit(inner.config.n_layer, perf.compile, graph_mode(spec))
            note = off[1] if off else None
    else:
        parts["activations"] = None
        note = (
            f"activations not estimated: {getattr(model, 'target', type(inner).__name__)} has "
            f"no hook {HOOK} (docs/models.md); the total is unknown (the measured peak is in the "
            "record's memory)"
        )
    whole = _whole(parts, by_role, shards(world_size, strategy), rule, note)
    if activations_rule is not None:
        whole["activations_rule"] = activations_rule
    return whole


def policy_activations(inner, perf, seq_len: int, dtype, n_blocks: int) -> dict:
    """The model's hook asked twice, without checkpointing and with every block checkpointed,
    and the activation term of the point's policy made of the two (perf.ac, perf.offload:
    checkpoint_rules.activations, which says its source in "activations_rule")."""

    def hook(checkpointed: bool) -> dict:
        return inner.activation_memory(
            perf.batch_size,
            seq_len,
            dtype=dtype,
            activation_checkpointing=checkpointed,
            compiled=perf.compile,
        )

    parts = hook(False)
    full = hook(True)["activations"] if perf.ac is not Ac.none else parts["activations"]
    kept, source = activations(n_blocks, parts["activations"], full, perf)
    return parts | {"activations": kept, "activations_rule": source}


def graph_mode(spec: RunSpec) -> bool:
    """Whether the point's compile mode records CUDA graphs (the fit's error differs there)."""
    return spec.perf.compile and spec.perf.compile_mode in CUDA_GRAPH_MODES


def estimate_memory(
    *,
    n_params: int,
    n_layer: int,
    n_head: int,
    n_embd: int,
    block_size: int,
    vocab_size: int,
    batch_size: int,
    optimizer: str,
    dtype: str,
    attention: str,
    activation_checkpointing: bool,
    loss: str = "full",
    loss_chunk: int = 2048,
    world_size: int = 1,
    strategy: str = "ddp",
    reshard_after_forward: bool = True,
    n_block_params: int = 0,
    grad_accum: int = 1,
    compiled: bool = False,
    cuda_graphs: bool = False,
    optimizer_state_by_role: dict[str, int] | None = None,
) -> dict:
    """The same estimate for a built-in GPT given by its shapes (no model built): the runner's
    parts (`runner_parts`) with fp32 parameters and gradients, plus the GPT's activation parts
    (model.activation_memory_of). The optimizer state is `optimizer_state_by_role` when given
    (optim_rules.estimated_state: AdamW 8 bytes a parameter, Muon 4), else AdamW's two fp32
    moments or SGD's one."""
    act_bytes = 2 if dtype in ("bf16", "fp16") else 4
    states = {"adamw": 2, "sgd": 1}.get(optimizer, 2)
    by_role = optimizer_state_by_role
    parts = runner_parts(
        param_bytes=4 * n_params,
        grad_bytes=4 * n_params,
        state_bytes=sum(by_role.values()) if by_role is not None else 4 * states * n_params,
        n_params=n_params,
        n_block_params=n_block_params,
        n_blocks=n_layer,
        act_bytes=act_bytes,
        world_size=world_size,
        strategy=strategy,
        reshard_after_forward=reshard_after_forward,
        grad_accum=grad_accum,
    )
    parts |= activation_memory_of(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        vocab_size=vocab_size,
        batch_size=batch_size,
        seq_len=block_size,
        act_bytes=act_bytes,
        attention=attention,
        activation_checkpointing=activation_checkpointing,
        loss=loss,
        loss_chunk=loss_chunk,
        compiled=compiled,
    )
    off = away_from_fit(n_layer, compiled, cuda_graphs)
    return _whole(parts, by_role, shards(world_size, strategy), note=off[1] if off else None)


def shards(world_size: int, strategy: str) -> int:
    """What weights, gradients and optimizer state are divided by on a rank: FSDP2's ranks."""
    return world_size if strategy == "fsdp2" else 1


def runner_parts(
    *,
    param_bytes: int,
    grad_bytes: int,
    state_bytes: int | None,
    n_params: int,
    n_block_params: int,
    n_blocks: int,
    act_bytes: int,
    world_size: int,
    strategy: str,
    reshard_after_forward: bool,
    grad_accum: int,
) -> dict:
    """What a rank holds beside the activations, in bytes, for any model.

    Parameters stay fp32 under autocast; gradients match them. With strategy=ddp over two ranks
    or more, each rank holds DDP's buckets beside its gradients ("ddp_buckets", `ddp_buckets`).
    With strategy=fsdp2 over world_size ranks, weights, gradients and optimizer state are
    sharded (1/world_size each), and the parameters gathered for compute are added as
    "gathered_params" in the compute dtype (`act_bytes`): with reshard_after_forward, the
    root's (embeddings, final LayerNorm) plus two blocks' (the one computing and the one
    prefetched); without it, all of them, held from forward to backward. With grad_accum > 1,
    FSDP2 skips the reduce-scatter on all but the last micro-step and keeps each parameter's
    gradient unsharded, in fp32 (its reduce dtype), across them: "unsharded_gradients".
    `state_bytes` None: a class the state table lacks (counted after the first step instead).
    """
    split = shards(world_size, strategy)
    parts = {
        "weights": param_bytes // split,
        "gradients": grad_bytes // split,
        "optimizer_state": None if state_bytes is None else state_bytes // split,
    }
    buckets = ddp_buckets(parts["gradients"], world_size, strategy)
    if buckets is not None:
        parts["ddp_buckets"] = buckets
    if strategy == "fsdp2":
        per_block = n_block_params // max(n_blocks, 1)
        gathered = n_params
        if reshard_after_forward:
            gathered = n_params - n_block_params + 2 * min(per_block, n_block_params)
        parts["gathered_params"] = act_bytes * gathered
        if grad_accum > 1:
            parts["unsharded_gradients"] = 4 * n_params
    return parts


def ddp_buckets(gradient_bytes: int, world_size: int, strategy: str) -> int | None:
    """What DistributedDataParallel's reducer holds beside the gradients, or None where no DDP
    wraps the model (one process, or FSDP2): its buckets, flat buffers as big as every gradient
    together, allocated when the model is wrapped and held for the run. train/distributed.py wraps
    with gradient_as_bucket_view off (torch's default), so the gradients are copied into the
    buckets for the all-reduce and back, never views of them. Every rank holds all of them."""
    if strategy != "ddp" or world_size < 2:
        return None
    return gradient_bytes


def _whole(
    parts: dict,
    by_role: dict[str, int] | None,
    split: int,
    rule: str | None = None,
    note: str | None = None,
) -> dict:
    """The parts with their total (null when any part is unknown) and, outside the total's
    sum, the optimizer state by role ("optimizer_state_by_role"), its rule and a note."""
    known = None not in parts.values()
    parts["total"] = sum(parts.values()) if known else None
    if by_role is not None:
        parts["optimizer_state_by_role"] = {role: b // split for role, b in by_role.items()}
    if rule is not None:
        parts["optimizer_state_rule"] = rule
    if note is not None:
        parts["note"] = note
    return parts


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
            return None, f"{name} is not in the table of optimizer state (train/optim_rules.py)"
        rules.append(f"{name} {4 * slots}")
        total += sum(4 * slots * p.numel() for g in part.param_groups for p in g["params"])
    return total, "bytes a parameter: " + ", ".join(dict.fromkeys(rules))
