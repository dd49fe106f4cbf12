"""Activation checkpointing as a policy (perf.ac), without torch: its keys checked, which blocks it
checkpoints, and what each policy keeps for backward and recomputes in it. The memory estimate's
activation term (train/memory_estimate.py) and the GPT's hardware FLOPs (train/gpt.py
GPT.flops_per_token) read them here, so one table says what a policy keeps; train/checkpointing.py
applies the policy with torch.

What a policy keeps, per block, is counted in the tensors a GPT-2 block saves for backward
(Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4.1, whose 34 bytes a token and channel at 16 bits are these 32 plus two dropout masks
this GPT, without dropout, never makes): BLOCK_SAVED, in bytes a token and channel at 16 bits.
"""

from __future__ import annotations

import dataclasses

from nanogpt.config.choices import Ac, AcPolicy, Offload
from nanogpt.config.errors import ConfigError
from nanogpt.config.groups import PerfConfig

# What one pre-LN GPT block saves for backward without checkpointing (Korthikanti, section 4.1),
# bytes a token and channel at 16 bits: each tensor an op's backward reads.
BLOCK_SAVED = {
    "block input (ln_1's input)": 2,
    "ln_1's output (the qkv matmul's input)": 2,
    "q, k, v (attention's inputs)": 6,
    "attention's output (its projection's input)": 2,
    "the residual after attention (ln_2's input)": 2,
    "ln_2's output (fc's input)": 2,
    "fc's output (GELU's input)": 8,
    "GELU's output (the MLP projection's input)": 8,
}
SAVED = sum(BLOCK_SAVED.values())  # 32
# What a block keeps under perf.ac=selective, in the same units: its input (the checkpoint's),
# and the outputs of the ops the policy saves. matmuls: q, k, v (the qkv matmul's output, 6),
# attention's output (2), both projections' outputs (2 + 2: saved though only an add reads
# them) and fc's (8); the LayerNorms, GELU and the residual adds are recomputed. attention:
# attention's output alone; every matmul recomputed.
SELECTIVE_KEPT = {AcPolicy.matmuls: 2 + 6 + 2 + 2 + 8 + 2, AcPolicy.attention: 2 + 2}
SOURCES = {
    Ac.none: "every block's activations kept (the model's hook, ac off)",
    Ac.full: "each block's input kept, one block recomputed at a time (the model's hook, ac on)",
    Ac.every: "the checkpointed blocks as full, the others as none, one block recomputed",
    Ac.selective: "a block keeps {kept}/{saved} of what it saves without checkpointing "
    "(checkpoint_rules.SELECTIVE_KEPT, Korthikanti's tensors), one block's rest recomputed",
    Ac.budget: "none's, a bound: what Inductor's partitioner keeps between forward and backward "
    "is not what backward holds at its peak (over one graph of the whole model, a block's "
    "activations recomputed from the inputs are all held again as backward starts)",
}
OFFLOAD_SOURCE = (
    "offload=cpu: the kept tensors wait in host memory; the device holds the block computing"
)
OLD_KEY = "perf.activation_checkpointing"
# The stated error of the activation term (with the logits) against what a forward+backward holds,
# on a CPU in fp32 (tests/test_checkpointing.py, the allocator's peak from the profiler's memory
# events): 3-17 % above it, every policy, the built-in GPT and a nanoGPT-style user model with the
# GPT's formula as its hook. The GPT's bytes are fitted to bf16 on an H100, where 39 of them stand
# for Korthikanti's 34; fp32's exact tensors are nearer his count.
ESTIMATE_ERROR_CPU = 0.20


def normalized(perf: PerfConfig) -> tuple[PerfConfig, str | None]:
    """The policy the keys ask for, the old switch read: `perf.activation_checkpointing=true` is
    perf.ac=full (with the line that says so), and after it the switch mirrors ac=full, so a
    point asked either way is one point (record/identity.py leaves the mirror's ac out)."""
    note = None
    ac = perf.ac
    if perf.activation_checkpointing and ac is Ac.none:
        ac = Ac.full
        note = f"{OLD_KEY}=true is read as perf.ac=full; name perf.ac instead (docs/config.md)"
    elif perf.activation_checkpointing and ac is not Ac.full:
        raise ConfigError(
            OLD_KEY,
            f"is true (ac=full) beside perf.ac={ac.value}",
            f"drop {OLD_KEY} and keep perf.ac={ac.value}",
        )
    return dataclasses.replace(perf, ac=ac, activation_checkpointing=ac is Ac.full), note


def check(perf: PerfConfig) -> None:
    """The policy's keys, each refusal one line naming the key."""
    if perf.ac_every < 1:
        raise ConfigError(
            "perf.ac_every",
            f"is {perf.ac_every}, but a block in every n must be n >= 1",
            "set perf.ac_every=2 (every other block), or 1 for all of them",
        )
    if not 0.0 <= perf.ac_budget <= 1.0:
        raise ConfigError(
            "perf.ac_budget",
            f"is {perf.ac_budget}, outside 0-1 (the share of the activations kept)",
            "set e.g. perf.ac_budget=0.5",
        )
    if perf.ac is Ac.budget and not perf.compile:
        raise ConfigError(
            "perf.ac",
            "budget is Inductor's min-cut over a compiled graph, and perf.compile=false",
            "set perf.compile=true, or use perf.ac=selective or every eagerly",
        )


def check_offload(perf: PerfConfig, device_type: str) -> None:
    """perf.offload=cpu moves what backward keeps to pinned host memory: a GPU's answer."""
    if perf.offload is Offload.cpu and device_type != "cuda":
        raise ConfigError(
            "perf.offload",
            f"cpu copies kept tensors from a GPU to host memory, and this point trains on "
            f"{device_type}",
            "use perf.offload=none off CUDA",
        )


def needs_blocks(perf) -> bool:
    """Whether the policy wraps the model's blocks (budget acts on the compiled graph)."""
    return Ac(perf.ac) in (Ac.full, Ac.every, Ac.selective)


def checkpointed_blocks(n_blocks: int, perf) -> list[int]:
    """The blocks wrapped in a checkpoint: every one for full and selective; for every, blocks
    0, n, 2n, ... (torchtitan's ac_freq counts the same way), so n=1 is full. `perf`: the
    PerfConfig, or anything with its ac keys (the GPT's GPTConfig, as plain strings)."""
    ac = Ac(perf.ac)
    if ac in (Ac.full, Ac.selective):
        return list(range(n_blocks))
    if ac is Ac.every:
        return list(range(0, n_blocks, perf.ac_every))
    return []


def activations(n_layer: int, none_bytes: int, full_bytes: int, perf) -> tuple[int, str]:
    """The activation term under the policy, and its source, from the model's own two
    (hook: activation_checkpointing false, true): none = L*p, full = L*i + p, p a block's
    activations and i its input. Returns (bytes, source)."""
    n_layer = max(n_layer, 1)
    per_block = none_bytes / n_layer
    per_input = max(full_bytes - per_block, 0) / n_layer
    ac = Ac(perf.ac)
    if ac is Ac.none:
        kept, source = none_bytes, SOURCES[ac]
    elif ac is Ac.full:
        kept, source = full_bytes, SOURCES[ac]
    elif ac is Ac.every:
        chosen = set(checkpointed_blocks(n_layer, perf))
        kept = peak_kept(
            [per_input if i in chosen else per_block for i in range(n_layer)], chosen, per_block
        )
        source = f"{SOURCES[ac]} ({len(chosen)} of {n_layer} checkpointed)"
    elif ac is Ac.selective:
        saved = SELECTIVE_KEPT[AcPolicy(perf.ac_policy)]
        kept = peak_kept([saved / SAVED * per_block] * n_layer, set(range(n_layer)), per_block)
        source = SOURCES[ac].format(kept=saved, saved=SAVED)
    else:  # budget: measured, 0.0 and 1.0 hold the same peak (docs/measurement.md)
        kept = none_bytes
        source = SOURCES[ac]
    if Offload(getattr(perf, "offload", Offload.none)) is Offload.cpu:
        kept, source = min(kept, per_block), f"{source}; {OFFLOAD_SOURCE}"
    return int(round(kept)), source


def peak_kept(kept: list[float], checkpointed: set[int], per_block: float) -> float:
    """The most a backward holds of what the blocks kept: at its start, all of it; then, block
    by block from the last, what the earlier blocks kept, plus this block's activations whole
    where it is recomputed (its kept part counted in them). Full's L*i + p and selective's
    (L - 1)*s*p + p are its cases; for every, a last block kept whole is freed before the first
    recompute."""
    peak = sum(kept)
    for j in checkpointed:
        peak = max(peak, sum(kept[:j]) + per_block)
    return peak


def recomputed_share(n_layer: int, perf) -> tuple[float, float] | None:
    """The share of the blocks' forward recomputed in backward, as (matmuls', attention's): what
    HFU adds beside MFU. None for budget: Inductor's min-cut chooses, and its choice is not
    counted."""
    ac = Ac(perf.ac)
    if ac is Ac.budget:
        return None
    if ac is Ac.selective:
        # matmuls: every matmul and attention saved, only pointwise ops recomputed (no FLOPs
        # counted); attention: attention saved, the blocks' matmuls recomputed
        return (0.0, 0.0) if AcPolicy(perf.ac_policy) is AcPolicy.matmuls else (1.0, 0.0)
    share = len(checkpointed_blocks(n_layer, perf)) / max(n_layer, 1)
    return share, share
