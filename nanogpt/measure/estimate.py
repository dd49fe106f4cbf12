"""The analytic memory estimate of a point of the built-in GPT: weights, gradients, optimizer
state (by role: optim_rules), activations and logits, so a user can see where memory goes and
what batch size fits, beside what measure/memory.py's probes saw. Its coefficients are fitted
to an H100's measured peaks (below). A user's model (model.build) gets its own, exact parts
only (measure/byo_figures.py): this formula describes this GPT alone.
"""

from __future__ import annotations

from nanogpt.optim import role_counts
from nanogpt.optim_rules import estimated_state
from nanogpt.spec import RunSpec


def estimate_of(
    spec: RunSpec, model, world_size: int, strategy: str, groups: list[dict] | None = None
) -> dict:
    """estimate_memory for a point: its spec's shapes and settings, `model` (a GPT, possibly on
    the meta device) for the exact parameter counts (by role: `groups`, the trainer's role
    groups, where there are some). The one place a spec becomes the estimate's arguments: the
    measured point (measure/setup.py) and the search's pruning (tune/fit.py)."""
    perf = spec.perf
    return estimate_memory(
        n_params=model.get_num_params(non_embedding=False),
        n_layer=spec.model.n_layer,
        n_head=spec.model.n_head,
        n_embd=spec.model.n_embd,
        block_size=spec.model.block_size,
        vocab_size=spec.model.vocab_size,
        batch_size=perf.batch_size,
        optimizer=spec.optimizer.name,
        optimizer_state_by_role=estimated_state(
            spec.optimizer, role_counts(model, spec.model.vocab_size, groups)
        )[0],
        dtype=perf.dtype.value,
        attention=perf.attention.value,
        activation_checkpointing=perf.activation_checkpointing,
        loss=perf.loss.value,
        loss_chunk=perf.loss_chunk,
        world_size=world_size,
        strategy=strategy,
        reshard_after_forward=spec.dist.reshard_after_forward,
        n_block_params=sum(p.numel() for p in model.blocks.parameters()),
        grad_accum=perf.grad_accum,
        compiled=perf.compile,
    )


# The activation and logits terms' coefficients, fitted together to the peaks one H100 80GB
# measured on 2026-11-23 (torch 2.11; ../shared/device/h100-2026-11-23.md, summarised in
# docs/benchmarks.md) at GPT-2 124M, block 1024, batch 12, bf16, AdamW, flash attention:
#   eager 11.31 GiB, eager with activation checkpointing 7.76 GiB, compiled 9.08 GiB.
# Eager and checkpointed share the logits and differ by 11 layers' activations: those two fix
# the activations (38.9 bytes) and the eager logits (9.30 bytes a logit, 2 of them bf16); the
# compiled point, its activations assumed the same, fixes the compiled logits (5.43). Rounded,
# the estimate is within 0.1 % of all three (tests/test_model_flops.py holds it to 5 %). These
# are effective bytes: at the peak (the start of backward) the gradients are not allocated yet
# while autocast's weight copies and Inductor's buffers are, and the fit absorbs that.
ACTIVATION_BYTES = 39  # a layer, a token, a channel, 16-bit: Korthikanti's 34, plus the
#                        residual stream, fp32 under autocast, saved at both LayerNorms
LOGITS_EXTRA_BYTES = {False: 7.3, True: 3.4}  # a logit beyond its compute-dtype copy, eager
#   (log_softmax's fp32 output and its fp32 gradient, nearly two fp32 copies) and compiled
#   (Inductor fuses the upcast into the loss kernels: less than one)


def chunk_bytes(act_bytes: int, compiled: bool) -> int:
    """Bytes a logit of one chunk holds at the chunk's peak (nanogpt/chunked_loss.py's forward).
    Eager: the fp32 upcast z beside torch.logsumexp's temporary of its input, which ATen
    allocates whole (logsumexp_out_impl computes exp(z - max) into a new tensor before summing):
    4 + 4 whatever the compute dtype (the 16-bit product is freed once upcast). Compiled:
    Inductor fuses the reduction and holds the product and its fp32 upcast, act_bytes + 4."""
    return act_bytes + 4 if compiled else 8


def ddp_buckets(gradient_bytes: int, world_size: int, strategy: str) -> int | None:
    """What DistributedDataParallel's reducer holds beside the gradients, or None where no DDP
    wraps the model (one process, or FSDP2): its buckets, flat buffers as big as every gradient
    together, allocated when the model is wrapped and held for the run. distributed.py wraps
    with gradient_as_bucket_view off (torch's default), so the gradients are copied into the
    buckets for the all-reduce and back, never views of them. Every rank holds all of them."""
    if strategy != "ddp" or world_size < 2:
        return None
    return gradient_bytes


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
    optimizer_state_by_role: dict[str, int] | None = None,
) -> dict:
    """Analytic training memory in bytes, by component.

    Parameters stay fp32 under autocast; gradients match them. AdamW keeps two fp32 moments,
    SGD with momentum one. `optimizer_state_by_role` (bytes by role of parameter, from
    optim_rules.estimated_state: AdamW 8 a parameter, Muon 4) replaces that count when given,
    and the estimate lists it by role ("optimizer_state_by_role", outside the total's parts).
    Activations per layer follow Korthikanti et al. (2022), "Reducing
    Activation Recomputation in Large Transformer Models", section 4.1: s*b*h*(34 + 5*a*s/h)
    bytes with 16-bit activations, ACTIVATION_BYTES (fitted, above) for its 34; the 5*a*s/h term
    is the materialised attention matrix, which fused (flash / memory-efficient) kernels never
    store. fp32 activations double the 16-bit
    parts. With checkpointing each layer keeps only its input, plus one layer being recomputed.
    Logits (b*s*vocab) take their compute dtype's bytes plus LOGITS_EXTRA_BYTES (fitted,
    above): eager, log_softmax's fp32 output and its fp32 gradient; compiled, Inductor fuses
    the upcast into the loss kernels and holds less. With
    loss=chunked (nanogpt/chunked_loss.py) only one chunk's logits exist at a time, at
    `chunk_bytes` a logit (eager 8: the fp32 logits and logsumexp's fp32 temporary; compiled,
    the compute dtype and fp32), plus what it keeps whole: dx (b*s*n_embd) and dW
    (vocab*n_embd), both fp32, and under autocast the head's weight in the compute dtype.
    (So compiled, at GPT-2's width, the chunked loss can hold more than the full one.)
    tests/test_memory_estimate.py holds the chunked term to the allocator's peak on a CPU.

    With strategy=ddp over two ranks or more, each rank holds DDP's buckets beside its
    gradients ("ddp_buckets", `ddp_buckets`: as big as the gradients; tested on torch's reducer).

    With strategy=fsdp2 over world_size ranks, the figures are per rank: weights, gradients and
    optimizer state are sharded (1/world_size each), and the parameters gathered for compute
    are added as "gathered_params" in the compute dtype: with reshard_after_forward, the
    root's (embeddings, final LayerNorm) plus two blocks' (the one computing and the one
    prefetched); without it, all of them, held from forward to backward. With grad_accum > 1,
    FSDP2 skips the reduce-scatter on all but the last micro-step and keeps each parameter's
    gradient unsharded, in fp32 (its reduce dtype), across them: "unsharded_gradients".
    """
    act_bytes = 2 if dtype in ("bf16", "fp16") else 4
    tokens = batch_size * block_size
    per_layer = tokens * n_embd * ACTIVATION_BYTES * act_bytes // 2
    if attention in ("manual", "math"):
        per_layer += 5 * n_head * block_size * tokens * act_bytes // 2
    if activation_checkpointing:
        activations = n_layer * tokens * n_embd * act_bytes + per_layer
    else:
        activations = n_layer * per_layer
    states = {"adamw": 2, "sgd": 1}.get(optimizer, 2)
    if loss == "chunked":
        chunk = min(loss_chunk, tokens)
        logits = (
            chunk * vocab_size * chunk_bytes(act_bytes, compiled)
            + 4 * tokens * n_embd  # dx, whole
            + 4 * vocab_size * n_embd  # dW, fp32, whole
            + (act_bytes * vocab_size * n_embd if act_bytes < 4 else 0)  # the head's 16-bit copy
        )
    else:
        logits = round(tokens * vocab_size * (act_bytes + LOGITS_EXTRA_BYTES[compiled]))
    shards = world_size if strategy == "fsdp2" else 1
    parts = {
        "weights": 4 * n_params // shards,
        "gradients": 4 * n_params // shards,
        "optimizer_state": 4 * states * n_params // shards,
        "activations": activations,
        "logits": logits,
    }
    buckets = ddp_buckets(parts["gradients"], world_size, strategy)
    if buckets is not None:
        parts["ddp_buckets"] = buckets
    if strategy == "fsdp2":
        per_block = n_block_params // max(n_layer, 1)
        gathered = n_params
        if reshard_after_forward:
            gathered = n_params - n_block_params + 2 * min(per_block, n_block_params)
        parts["gathered_params"] = act_bytes * gathered
        if grad_accum > 1:
            parts["unsharded_gradients"] = 4 * n_params
    if optimizer_state_by_role is not None:
        parts["optimizer_state"] = sum(optimizer_state_by_role.values()) // shards
    parts["total"] = sum(parts.values())
    if optimizer_state_by_role is not None:
        by_role = optimizer_state_by_role.items()
        parts["optimizer_state_by_role"] = {role: b // shards for role, b in by_role}
    return parts
