"""A modern GPT as a user keeps it beside their command (docs/models.md): RoPE, RMSNorm,
grouped-query attention, a squared-ReLU MLP, an untied head. benchmarks/byo_overhead.py sweeps it
as `model.build._target_=modern_gpt.GPT`; it is no part of the package."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab_size: int = 4096
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2  # grouped-query attention: two heads share each key/value head
    n_embd: int = 128


def rope(x, cos, sin):
    """Rotary position embedding (Su et al., 2021): each pair of channels turned by its angle."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.h, self.kv, self.d = c.n_head, c.n_kv_head, c.n_embd // c.n_head
        self.norm1, self.norm2 = nn.RMSNorm(c.n_embd), nn.RMSNorm(c.n_embd)
        self.q = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.kv_proj = nn.Linear(c.n_embd, 2 * self.kv * self.d, bias=False)
        self.o = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.up = nn.Linear(c.n_embd, 4 * c.n_embd, bias=False)
        self.down = nn.Linear(4 * c.n_embd, c.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.h, self.d).transpose(1, 2)
        k, v = self.kv_proj(h).view(B, T, 2, self.kv, self.d).unbind(2)
        q, k = rope(q, cos, sin), rope(k.transpose(1, 2), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.relu(self.up(self.norm2(x))).square())


class GPT(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.transformer = nn.ModuleDict({"h": blocks})  # nanoGPT's name: found by the runner
        self.norm = nn.RMSNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        d = config.n_embd // config.n_head
        inverse = 1e4 ** -(torch.arange(0, d, 2) / d)
        angles = torch.outer(torch.arange(config.block_size).float(), inverse)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        for block in self.transformer.h:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(self.norm(x)).float()
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
