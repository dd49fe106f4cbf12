"""Activation checkpointing's policies applied with torch (perf.ac, perf.offload); which blocks and
what each keeps: train/checkpoint_rules.py.

- full, every: a checkpointed block keeps its input alone and runs its forward again in backward
  (torch.utils.checkpoint, non-reentrant);
- selective: the same checkpoint, with a policy (torch's create_selective_checkpoint_contexts,
  as torchtitan's selective "op" checkpointing) that keeps the outputs of the ops it names
  (`SAVED_OPS`) and recomputes the rest: the cheap pointwise ops run twice, the matmuls once;
- budget: no block wrapped; Inductor's partitioner, over the compiled joint graph, keeps the
  activations a min-cut chooses within `torch._functorch.config.activation_memory_budget` of what
  it would keep otherwise (1.0 keeps all, 0.0 recomputes all it can), set around each step;
- offload=cpu: torch.autograd.graph.save_on_cpu(pin_memory=True) around forward and backward:
  each tensor autograd keeps is copied to pinned host memory, and back when backward needs it.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from nanogpt.config.choices import Ac, AcPolicy, Offload
from nanogpt.train.checkpoint_rules import checkpointed_blocks

aten = torch.ops.aten
# Attention's fused kernels (CUDA's three, the CPU's flash): their output and logsumexp kept.
ATTENTION_OPS = {
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}
# A Linear on a 3-D input dispatches to mm (addmm with a bias) on its 2-D view
MATMUL_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
SAVED_OPS = {AcPolicy.matmuls: MATMUL_OPS | ATTENTION_OPS, AcPolicy.attention: ATTENTION_OPS}


def checkpoint_options(perf) -> dict:
    """torch.utils.checkpoint's keywords for a checkpointed block under the policy: non-reentrant
    (the variant torch recommends, which composes with compile and FSDP2), and for selective the
    context that keeps `SAVED_OPS[perf.ac_policy]`."""
    options = {"use_reentrant": False}
    if Ac(perf.ac) is Ac.selective:
        saved = SAVED_OPS[AcPolicy(perf.ac_policy)]

        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    return options


def block_options(n_blocks: int, perf) -> list[dict | None]:
    """For each block, its checkpoint's keywords, or None where the block is not checkpointed."""
    chosen = set(checkpointed_blocks(n_blocks, perf))
    return [checkpoint_options(perf) if i in chosen else None for i in range(n_blocks)]


def run_checkpointed(forward, x: torch.Tensor, options: dict) -> torch.Tensor:
    """`forward(x)`, its activations recomputed in backward as `options` say."""
    return checkpoint(forward, x, **options)


def step_context(perf):
    """What surrounds a step's forward and backward under the policy: the activation budget of
    Inductor's partitioner (read when a graph compiles, which is inside the first steps), and
    the offload of kept tensors to pinned host memory."""
    stack = contextlib.ExitStack()
    if Ac(perf.ac) is Ac.budget:
        import torch._functorch.config as functorch_config

        stack.enter_context(functorch_config.patch(activation_memory_budget=perf.ac_budget))
    if Offload(perf.offload) is Offload.cpu:
        stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
    return stack
