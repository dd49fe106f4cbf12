"""dist.strategy=fsdp2: parameters, gradients and optimizer state sharded over the ranks.

FSDP2 (`torch.distributed.fsdp.fully_shard`) turns each parameter into a DTensor sharded on
dim 0 across the ranks, so a rank holds 1/N of the weights, of their gradients and (since the
optimizer is built on the sharded parameters) of AdamW's moments. Around each module's forward
and backward it all-gathers that module's parameters and, after backward, reduce-scatters the
gradients. The unit of gathering is what `fully_shard` was called on: here each transformer
block, then the root (the embeddings, the tied head and the final LayerNorm), the layout
torchtitan uses. `reshard_after_forward=True` frees a block's gathered parameters after its
forward and gathers them again in backward (less memory, one more all-gather per block);
False keeps them from forward to backward (ZeRO-2-like). Neither the root nor the last block
is resharded after forward (torchtitan's rule): backward starts with them, so freeing them
would only gather them again at once (one needless all-gather a step each).

Mixed precision is FSDP2's own policy: parameters gathered in the compute dtype (bf16 for
perf.dtype=bf16), gradients reduced in fp32, the sharded master weights and the optimizer in
fp32. (fp16 would also need a sharded gradient scaler; validate/ refuses it with fsdp2.)

Order with the other transformations, the one torchtitan documents for its parallelize
functions (float8, then activation checkpointing, then torch.compile, then FSDP):
  1. float8 conversion (nanogpt/train/float8.py) on the whole, unsharded model, so FSDP2 shards the
     Float8Linear weights like any other;
  2. activation checkpointing, inside each block's own forward (`Block.checkpointed`,
     model.py), so that
  3. torch.compile per block (`block.compile()`) compiles the checkpointed block (Dynamo
     traces torch.utils.checkpoint as one region it recomputes in backward); each compiled
     graph is one FSDP unit and the all-gathers and reduce-scatters run between graphs, where
     FSDP2's hooks can overlap them with compute. CUDA-graph compile modes are refused with
     fsdp2 (validate/): a graph replays fixed addresses, FSDP2 gathers into fresh buffers;
  4. fully_shard on each block, then on the root.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def apply_fsdp2(
    model: nn.Module,
    blocks: nn.ModuleList,
    *,
    param_dtype: torch.dtype | None,
    reshard_after_forward: bool,
) -> None:
    """Shard `model` in place: each of `blocks`, then the root. param_dtype None keeps fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        reshard = reshard_after_forward and i < last  # backward starts with the last block
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """FSDP2's no_sync: with sync False, backward accumulates unsharded gradients locally and
    skips the reduce-scatter (all but the last micro-step of gradient accumulation)."""
    model.set_requires_gradient_sync(sync)
