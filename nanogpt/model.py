"""A GPT-2 style decoder, with nanoGPT's interface.

The architecture is GPT-2's (Radford et al., 2019): learned token and position embeddings,
pre-LayerNorm transformer blocks (causal self-attention, then a 4x GELU MLP), a final LayerNorm
and a language-model head whose weight is tied to the token embedding (Press & Wolf, 2017).
Interface as nanoGPT: `GPTConfig`, `GPT(config)`, `forward(idx, targets) -> (logits, loss)`,
`get_num_params(non_embedding=True)`.

Performance knobs the sweep varies live here too: which attention kernel runs (`attention`)
and whether block activations are recomputed in the backward pass (`activation_checkpointing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from nanogpt.chunked_loss import chunked_cross_entropy


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    # "manual" materialises softmax(QK^T/sqrt(d))V; anything else calls
    # F.scaled_dot_product_attention and leaves the kernel choice to sdpa_kernel().
    attention: str = "auto"
    activation_checkpointing: bool = False
    # "full": the [B*T, vocab] logits, then F.cross_entropy (nanoGPT). "chunked": the head and
    # the loss over `loss_chunk` tokens at a time (nanogpt/chunked_loss.py); no logits returned.
    loss: str = "full"
    loss_chunk: int = 2048


class LayerNorm(nn.Module):
    """LayerNorm whose bias can be switched off (torch's can only since 2.1, via a flag)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.manual = config.attention == "manual"
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_out = True  # scaled at init, see GPT._init_weights
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        if self.manual:
            causal = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
            self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # One matmul makes queries, keys and values; split heads to (B, n_head, T, head_dim).
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.manual:
            y = self._manual_attention(q, k, v, T)
        else:
            drop = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.proj(y))

    def _manual_attention(self, q, k, v, T: int) -> torch.Tensor:
        # Scaled dot-product attention (Vaswani et al., 2017) with the T x T score matrix
        # kept in memory: the baseline that fused kernels (FlashAttention) avoid.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        return att @ v


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.proj.residual_out = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, config.bias)
        self.mlp = MLP(config)
        # Activation checkpointing inside the block's own call: `block.compile()` (FSDP2,
        # nanogpt/sharding.py) then compiles the checkpointed block, as torchtitan wraps, then
        # compiles; a checkpoint around the compiled block would recompute a compiled call.
        self.checkpointed = config.activation_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and self.training:
            # Keep only the block's input; recompute its activations in backward.
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd, config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # GPT-2 init: N(0, 0.02); projections that write into the residual stream are scaled
        # by 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_out", False):
                std /= math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count. The tied wte/lm_head weight counts once. With non_embedding,
        position embeddings are left out: they cost no matmul FLOPs (nanoGPT's convention)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)  # checkpointed inside, with perf.activation_checkpointing
        x = self.ln_f(x)
        if targets is None:
            # Inference: only the last position's logits are needed.
            return self.lm_head(x[:, [-1], :]), None
        if self.config.loss == "chunked":
            flat = x.view(-1, x.size(-1))
            chunk = self.config.loss_chunk
            return None, chunked_cross_entropy(flat, self.lm_head.weight, targets.view(-1), chunk)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss
