"""A GPT-2 style decoder, with nanoGPT's interface.

The architecture is GPT-2's (Radford et al., 2019): learned token and position embeddings,
pre-LayerNorm transformer blocks (causal self-attention, then a 4x GELU MLP), a final LayerNorm
and a language-model head whose weight is tied to the token embedding (Press & Wolf, 2017).
Interface as nanoGPT: `GPTConfig`, `GPT(config)`, `forward(idx, targets) -> (logits, loss)`,
`get_num_params(non_embedding=True)`.

Performance knobs the sweep varies live here too: which attention kernel runs (`attention`)
and which block activations are recomputed in the backward pass (`ac`: train/checkpointing.py).

The GPT keeps the contract the runner asks of a user's model (docs/models.md): its FLOPs and its
activation memory are its own hooks, `flops_per_token(seq_len)` and `activation_memory(...)`,
which train/flops.py and train/memory_estimate.py call for every model alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanogpt.train.checkpoint_rules import recomputed_share
from nanogpt.train.checkpointing import block_options, run_checkpointed
from nanogpt.train.chunked_loss import chunked_cross_entropy

FLOPS_FORMULA = "6N + 12*L*H*Q*T (PaLM appendix B); N = params excluding position embedding"

# The estimate's terms, each apart with where its coefficient comes from (`MemoryFit`):
#   peak = the runner's parts (weights, gradients, optimizer state: train/memory_estimate.py,
#          exact from the tensors)
#        + per_layer  x tokens x n_embd x n_layer (x act_bytes / 2)   "activations"
#        + (act_bytes + per_logit) x tokens x vocab                    "logits"
#        + constant                                                   "fit_constant" (when not 0)
# The eager coefficients were fitted together to the peaks one H100 80GB measured on 2026-11-23
# (torch 2.11; ../shared/device/h100-2026-11-23.md, summarised in docs/benchmarks.md) at GPT-2
# 124M, block 1024, batch 12, bf16, AdamW, flash attention: eager 11.31 GiB, eager with
# activation checkpointing 7.76 GiB, compiled 9.08 GiB. Eager and checkpointed share the logits
# and differ by 11 layers' activations: those two fix the activations (38.9 bytes: a slope in
# depth, so it holds at any depth) and the eager logits (9.30 bytes a logit, 2 of them bf16).
# The compiled point alone fixes nothing in depth: its activations were taken to be eager's and
# its logits (5.43) solved from its 12-layer peak. So the compiled fit holds at 12 layers only:
# the H200 of 2026-11-28 read a 2-layer compiled point -14.3 % and a 4-layer reduce-overhead one
# -19.5 % (`AWAY_FROM_FIT`), and the 12-layer and 2-layer peaks together give about 27 bytes a
# token x channel x layer and 7.5 a logit compiled: the two errors cancel at 12 layers only.
# benchmarks/memory_refit.py refits the compiled terms from a GPU check's records (compiled,
# default mode, the same model at 2, 4 and 12 layers: gpu_check.sh's `memory_fit` part); until
# a GPU has run it, a compiled estimate away from 12 layers says so in its note and the search
# keeps the error's margin free (tune/fit.py). These are effective bytes: at the peak (the start
# of backward) the gradients are not allocated yet while autocast's weight copies and
# Inductor's buffers are, and the fit absorbs that.


@dataclass(frozen=True)
class MemoryFit:
    """The coefficients of one kind of step's estimate (eager, or compiled), each with its
    source. `fitted_layers`: the depths the fit was measured at, where its terms are known to
    hold; None where a term was fitted as a slope in depth (it holds at any)."""

    per_layer: float  # bytes a token, a channel, a layer (16-bit activations; fp32 doubles it)
    per_layer_source: str
    per_logit: float  # bytes a logit beyond its compute-dtype copy
    per_logit_source: str
    constant: int  # bytes whatever the shape (not yet fitted: 0)
    constant_source: str
    fitted_layers: tuple[int, ...] | None


EAGER_FIT = MemoryFit(
    per_layer=39,  # Korthikanti's 34, plus the residual stream, fp32 under autocast, saved at
    #                both LayerNorms
    per_layer_source="H100 2026-11-23: eager 11.31 GiB less checkpointed 7.76 GiB, 11 layers apart",
    per_logit=7.3,  # log_softmax's fp32 output and its fp32 gradient, nearly two fp32 copies
    per_logit_source="H100 2026-11-23: the eager 12-layer peak, 11.31 GiB, less the rest",
    constant=0,
    constant_source="none: the fit has no constant term",
    fitted_layers=None,
)
COMPILED_FIT = MemoryFit(
    per_layer=39,
    per_layer_source="assumed eager's: no compiled point of another depth was measured",
    per_logit=3.4,  # Inductor fuses the upcast into the loss kernels: less than one fp32 copy
    per_logit_source="H100 2026-11-23: the compiled 12-layer peak, 9.08 GiB, less the rest",
    constant=0,
    constant_source="none: the fit has no constant term",
    fitted_layers=(12,),
)
FITS = {False: EAGER_FIT, True: COMPILED_FIT}  # by `compiled`
ACTIVATION_BYTES = EAGER_FIT.per_layer
LOGITS_EXTRA_BYTES = {compiled: fit.per_logit for compiled, fit in FITS.items()}

# A compiled estimate's error where a GPU measured it away from the fitted depth: (layers,
# compile mode, estimate / peak - 1, where). The CUDA-graph point's peak then held warmup's
# one-time bytes too (probes/memory.py now leaves them out), so its figure is an upper bound.
AWAY_FROM_FIT = (
    (2, "default", -0.143, "H200 2026-11-28, the 2-layer compiled test model"),
    (4, "reduce-overhead", -0.195, "H200 2026-11-28, gpu_check's reduce_overhead, 4 layers"),
)


def away_from_fit(n_layer: int, compiled: bool, cuda_graphs: bool) -> tuple[float, str] | None:
    """Where the estimate is off its fit: the fraction of a budget its error needs kept free
    (the largest error a GPU measured at such a point, read low) and the note that says so; None
    at the fitted depth, or eager (fitted in depth)."""
    fit = FITS[compiled]
    if fit.fitted_layers is None or n_layer in fit.fitted_layers:
        return None
    measured = [a for a in AWAY_FROM_FIT if (a[1] != "default") == cuda_graphs] or AWAY_FROM_FIT
    layers, mode, error, where = min(measured, key=lambda a: a[2])
    depths = ", ".join(map(str, fit.fitted_layers))
    note = (
        f"compiled estimate fitted at {depths} layers, here {n_layer}: likely low (a {layers}-layer"
        f" {mode} point read {error:+.1%}, {where}) until a GPU refits it "
        "(benchmarks/memory_refit.py)"
    )
    return -error, note


def chunk_bytes(act_bytes: int, compiled: bool) -> int:
    """Bytes a logit of one chunk holds at the chunk's peak (nanogpt/train/chunked_loss.py's
    forward).
    Eager: the fp32 upcast z beside torch.logsumexp's temporary of its input, which ATen
    allocates whole (logsumexp_out_impl computes exp(z - max) into a new tensor before summing):
    4 + 4 whatever the compute dtype (the 16-bit product is freed once upcast). Compiled:
    Inductor fuses the reduction and holds the product and its fp32 upcast, act_bytes + 4."""
    return act_bytes + 4 if compiled else 8


def activation_memory_of(
    *,
    n_layer: int,
    n_head: int,
    n_embd: int,
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    act_bytes: int,
    attention: str,
    activation_checkpointing: bool,
    loss: str = "full",
    loss_chunk: int = 2048,
    compiled: bool = False,
) -> dict[str, int]:
    """The bytes a GPT of this shape keeps for backward, by part: "activations" and "logits".

    Activations per layer follow Korthikanti et al. (2022), "Reducing Activation Recomputation
    in Large Transformer Models", section 4.1: s*b*h*(34 + 5*a*s/h) bytes with 16-bit
    activations, the fit's per_layer (MemoryFit, above) for its 34; the 5*a*s/h term is the
    materialised attention matrix, which fused (flash / memory-efficient) kernels never store.
    fp32 activations (act_bytes 4) double the 16-bit parts. With checkpointing each layer keeps
    only its input, plus one layer being recomputed.
    Logits (b*s*vocab) take their compute dtype's bytes plus the fit's per_logit (fitted,
    above): eager, log_softmax's fp32 output and its fp32 gradient; compiled, Inductor fuses
    the upcast into the loss kernels and holds less. With loss=chunked
    (nanogpt/train/chunked_loss.py) only one chunk's logits exist at a time, at `chunk_bytes` a
    logit (eager 8: the fp32 logits and logsumexp's fp32 temporary; compiled, the compute dtype and
    fp32), plus what it keeps whole: dx (b*s*n_embd) and dW (vocab*n_embd), both fp32, and
    under autocast the head's weight in the compute dtype. (So compiled, at GPT-2's width, the
    chunked loss can hold more than the full one.) tests/test_memory_estimate.py holds the
    chunked term to the allocator's peak on a CPU.
    """
    tokens = batch_size * seq_len
    fit = FITS[compiled]
    per_layer = round(tokens * n_embd * fit.per_layer * act_bytes / 2)
    if attention in ("manual", "math"):
        per_layer += 5 * n_head * seq_len * tokens * act_bytes // 2
    if activation_checkpointing:
        activations = n_layer * tokens * n_embd * act_bytes + per_layer
    else:
        activations = n_layer * per_layer
    if loss == "chunked":
        chunk = min(loss_chunk, tokens)
        logits = (
            chunk * vocab_size * chunk_bytes(act_bytes, compiled)
            + 4 * tokens * n_embd  # dx, whole
            + 4 * vocab_size * n_embd  # dW, fp32, whole
            + (act_bytes * vocab_size * n_embd if act_bytes < 4 else 0)  # the head's 16-bit copy
        )
    else:
        logits = round(tokens * vocab_size * (act_bytes + fit.per_logit))
    parts = {"activations": activations, "logits": logits}
    if fit.constant:
        parts["fit_constant"] = fit.constant
    return parts


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
    # Activation checkpointing's policy (perf.ac: none | full | every | selective; budget acts
    # on the compiled graph, not here) and its keys (nanogpt/train/checkpoint_rules.py)
    ac: str = "none"
    ac_every: int = 2
    ac_policy: str = "matmuls"
    # "full": the [B*T, vocab] logits, then F.cross_entropy (nanoGPT). "chunked": the head and
    # the loss over `loss_chunk` tokens at a time (nanogpt/train/chunked_loss.py); no logits
    # returned.
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
        # nanogpt/train/sharding.py) then compiles the checkpointed block, as torchtitan wraps, then
        # compiles; a checkpoint around the compiled block would recompute a compiled call.
        # None: not checkpointed; else the checkpoint's options (GPT sets them by the policy).
        self.checkpoint_options: dict | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_options is not None and self.training:
            # Keep the block's input (and, selective, what the policy saves); recompute the
            # rest of its activations in backward.
            return run_checkpointed(self._forward, x, self.checkpoint_options)
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
        for block, options in zip(self.blocks, block_options(config.n_layer, config), strict=True):
            block.checkpoint_options = options
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

    # The runner's hooks (docs/models.md), as a user's model may have them.

    def flops_per_token(self, seq_len: int) -> dict:
        """FLOPs of one forward+backward per token at `seq_len` (FLOPS_FORMULA, Chowdhery et
        al., 2022, "PaLM", appendix B; nanoGPT's MFU): "model" = 6N + 12*L*H*Q*T, N the
        parameters that take part in matmuls (all but the position embedding; the tied head
        once), 6N = 2N forward + 4N backward, the second term attention's QK^T and AV over the
        full T x T square, as dense kernels compute it. "hardware" adds the recompute of
        activation checkpointing, the share of the blocks' forward run again in backward
        (2 N_blocks + 4 L H Q T whole, less the MLP's output projection, which torch's
        checkpoint never reruns; checkpoint_rules.recomputed_share: full all of it, every its
        blocks' share, selective what its policy does not save): real work that does not
        advance the model, so MFU leaves it out and HFU (Korthikanti et al., 2022) counts it.
        perf.ac=budget: null, Inductor's min-cut chooses what it recomputes."""
        cfg = self.config
        attention = cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * seq_len
        model = 6 * self.get_num_params(non_embedding=True) + 12 * attention
        share = recomputed_share(cfg.n_layer, cfg)
        hardware = None
        if share is not None:
            matmuls, attended = share
            # torch's checkpoint stops recomputing once the last tensor backward needs is back
            # (early stop): the MLP's output projection, whose output no backward reads, never
            # runs again (tests/test_checkpointing.py counts it on meta)
            last = sum(p.numel() for block in self.blocks for p in block.mlp.proj.parameters())
            block_matmuls = 2 * (sum(p.numel() for p in self.blocks.parameters()) - last)
            hardware = model + matmuls * block_matmuls + attended * 4 * attention
        return {"model": model, "hardware": hardware, "formula": FLOPS_FORMULA}

    def activation_memory(
        self,
        batch_size: int,
        seq_len: int,
        dtype: torch.dtype,
        activation_checkpointing: bool = False,
        compiled: bool = False,
    ) -> dict[str, int]:
        """The bytes one micro-batch keeps for backward, by part (activation_memory_of): what
        the runner cannot know of a model; it counts weights, gradients, optimizer state and
        the parallelism's buffers itself (train/memory_estimate.py)."""
        cfg = self.config
        return activation_memory_of(
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
            vocab_size=cfg.vocab_size,
            batch_size=batch_size,
            seq_len=seq_len,
            act_bytes=dtype.itemsize,
            attention=cfg.attention,
            activation_checkpointing=activation_checkpointing,
            loss=cfg.loss,
            loss_chunk=cfg.loss_chunk,
            compiled=compiled,
        )

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)  # checkpointed inside, as perf.ac chose
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
