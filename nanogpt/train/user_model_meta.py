"""A user's own model (model.build, docs/models.md) built again on the meta device: shapes and
dtypes only, no memory, no compute, no weights initialised. Its FLOPs are counted on it
(train/flops.py) and its first step observed on it (probes/observe.py). The figures of every
model, a user's and the built-in GPT alike, take one path: train/flops.py flops_of (FLOPs) and
train/memory_estimate.py estimate_of (memory).
"""

from __future__ import annotations

import torch

from nanogpt.config.spec import RunSpec
from nanogpt.config.target_nodes import instantiate
from nanogpt.train.user_model import UserModel


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
