"""FLOPs per token: the analytic formula and a counted value.

Formula (Chowdhery et al., 2022, "PaLM", appendix B; the same as nanoGPT's MFU):
    flops_per_token = 6 * N + 12 * L * H * Q * T
N = parameters that take part in matmuls: every parameter except the position embedding
(the token embedding counts once, as the tied lm_head matmul). 6N = 2N forward + 4N backward.
The second term is attention's QK^T and AV matmuls (L layers, H heads, Q head dim, T context),
counted over the full T x T square, as dense kernels compute it.

Activation checkpointing recomputes each block's forward in backward. That work is real but does
not advance the model, so MFU keeps the formula above and HFU ("hardware FLOPs", Korthikanti et
al., 2022) adds the recompute: 2 * N_blocks + 4 * L * H * Q * T per token.

The counted value runs one forward+backward under torch.utils.flop_counter.FlopCounterMode on a
copy of the model on the meta device: shapes only, no memory, no compute.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.model import GPT, GPTConfig

FORMULA = "6N + 12*L*H*Q*T (PaLM appendix B); N = params excluding position embedding"


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def recompute_flops_per_token(
    n_block_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int
) -> int:
    """Extra forward work per token when every block is recomputed (activation checkpointing)."""
    return 2 * n_block_params + 4 * n_layer * n_head * head_dim * seq_len


def model_flops(model: GPT) -> dict[str, int]:
    """Formula FLOPs per token for a model, model-FLOPs and hardware-FLOPs (with recompute)."""
    cfg = model.config
    head_dim = cfg.n_embd // cfg.n_head
    n = model.get_num_params(non_embedding=True)
    per_token = flops_per_token(n, cfg.n_layer, cfg.n_head, head_dim, cfg.block_size)
    hardware = per_token
    if cfg.activation_checkpointing:
        n_blocks = sum(p.numel() for p in model.blocks.parameters())
        hardware += recompute_flops_per_token(
            n_blocks, cfg.n_layer, cfg.n_head, head_dim, cfg.block_size
        )
    return {"n_params_flops": n, "flops_per_token": per_token, "flops_per_token_hw": hardware}


def counted_flops_per_token(config: GPTConfig) -> float:
    """FLOPs of one forward+backward per token, counted by FlopCounterMode on the meta device."""
    return _counted(config).get_total_flops() / config.block_size


def counted_head_share(config: GPTConfig) -> float:
    """The share of a forward+backward's counted FLOPs spent in the head (lm_head), the rest
    being the blocks'. GPT-2 124M at block 1024: 0.27; a model whose vocabulary dwarfs its
    width (nano: 64 wide, 50,304 tokens) spends nearly all of its step there."""
    counter = _counted(config)
    by_module = counter.get_flop_counts()
    head = sum(sum(ops.values()) for name, ops in by_module.items() if name.endswith("lm_head"))
    return head / counter.get_total_flops()


def _counted(config: GPTConfig) -> FlopCounterMode:
    """One forward+backward of a sequence, counted on a copy of the model on the meta device."""
    # Count model FLOPs: the recompute of activation checkpointing is not model work.
    config = dataclasses.replace(config, activation_checkpointing=False)
    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(1, config.block_size, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(idx, idx)
        loss.backward()
    return counter
