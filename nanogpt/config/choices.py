"""The spec's choices: an Enum a key whose values are a fixed set (perf.dtype, perf.attention, ...).

Enums, not `Literal`: omegaconf 2.3 (kept by hydra-core 1.3) validates Enums only, so a value
outside the set fails at composition with the allowed ones listed.
"""

from __future__ import annotations

import enum


class Dtype(enum.Enum):
    fp32 = "fp32"  # true fp32: TF32 tensor-core math stays off
    tf32 = "tf32"  # fp32 storage, TF32 matmuls/convolutions on Ampere+
    bf16 = "bf16"  # autocast to bfloat16
    fp16 = "fp16"  # autocast to float16, with a GradScaler


class Attention(enum.Enum):
    auto = "auto"  # let scaled_dot_product_attention choose
    flash = "flash"
    efficient = "efficient"
    cudnn = "cudnn"
    math = "math"
    manual = "manual"  # the materialised softmax(QK^T)V path, as in the original GPT-2 code


class OptimizerImpl(enum.Enum):
    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    for_loop = "for_loop"


class Schedule(enum.Enum):
    """optimizer.schedule: the rate's shape over bench.max_steps (nanogpt/train/lr_schedule.py)."""

    constant = "constant"  # the base rate every step (after optimizer.warmup_steps, if any)
    cosine = "cosine"  # half a cosine from the base rate down to 0 at the horizon
    wsd = "wsd"  # warmup-stable-decay: flat, then linear to 0 over the last decay_frac


class DataKind(enum.Enum):
    synthetic = "synthetic"
    tokens = "tokens"
    text = "text"


class Tokenizer(enum.Enum):
    """data.tokenizer: how data=text turns characters into ids (nanogpt/train/tokenize.py)."""

    gpt2 = "gpt2"  # tiktoken's GPT-2 BPE (50257 ids)
    char = "char"  # one id per character: the sorted set of the text's characters (nanoGPT's
    # shakespeare_char), so a small model reaches a meaningful loss in seconds on a CPU


class Exclusive(enum.Enum):
    """bench.exclusive: what becomes of a point measured beside other processes
    (probes/contention.py)."""

    warn = "warn"  # flag it contended and say so
    fail = "fail"  # fail it (status error), its figures kept
    off = "off"  # do not look


class LoggerMode(enum.Enum):
    auto = "auto"
    online = "online"
    offline = "offline"
    disabled = "disabled"


class Fp8(enum.Enum):
    """torchao's float8 training recipes (Float8LinearRecipeName), or none."""

    none = "none"
    tensorwise = "tensorwise"  # one scale per tensor, cuBLAS kernel
    rowwise = "rowwise"  # one scale per row, CUTLASS kernel
    rowwise_with_gw_hp = "rowwise_with_gw_hp"  # rowwise, the weight gradient kept in bf16


class Loss(enum.Enum):
    full = "full"  # the whole [B*T, vocab] logits, then cross-entropy (nanoGPT)
    chunked = "chunked"  # head + cross-entropy over chunks of tokens: never the full logits


class Strategy(enum.Enum):
    ddp = "ddp"  # a whole replica per rank, gradients all-reduced
    fsdp2 = "fsdp2"  # parameters, gradients and optimizer state sharded (fully_shard)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Objective(enum.Enum):
    """What a search optimises (nanogpt/tune/objectives.py: each figure's direction and source)."""

    tokens_per_s = "tokens_per_s"  # maximised
    usd_per_1m_tokens = "usd_per_1m_tokens"  # minimised; needs cost.usd_per_hour or usd_per_kwh
    j_per_token = "j_per_token"  # minimised; needs an energy counter
    peak_memory_gib = "peak_memory_gib"  # minimised; with another: a Pareto front
    time_to_loss = "time_to_loss"  # minimised: time_to_loss_s; needs bench.target_loss


class Ac(enum.Enum):
    """perf.ac: which activations the backward recomputes instead of keeping
    (nanogpt/train/checkpoint_rules.py; docs/measurement.md, "Activation checkpointing")."""

    none = "none"  # keep every activation
    full = "full"  # every block keeps its input alone and recomputes its forward
    every = "every"  # every perf.ac_every-th block checkpointed as full, the others kept
    selective = "selective"  # every block keeps what perf.ac_policy saves, recomputes the rest
    budget = "budget"  # compiled only: Inductor's min-cut hands backward perf.ac_budget of them


# Each policy's own key: read under that perf.ac only (the record's asked part and the point's
# identity leave it out under another)
AC_KEYS = {"ac_every": Ac.every, "ac_policy": Ac.selective, "ac_budget": Ac.budget}


class AcPolicy(enum.Enum):
    """perf.ac_policy: what a block keeps under perf.ac=selective (the rest is recomputed)."""

    matmuls = "matmuls"  # the matmuls' and attention's outputs: the pointwise ops recomputed
    attention = "attention"  # attention's outputs alone: the matmuls recomputed too


class Offload(enum.Enum):
    """perf.offload: where the tensors kept for backward wait (CUDA only)."""

    none = "none"  # on the device
    cpu = "cpu"  # in pinned host memory (torch.autograd.graph.save_on_cpu), copied back in backward
