"""FLOPs per token of one forward+backward, for every model by one path (`flops_of`).

In order, the first that answers (`flops_source` says which):
- the model's hook `flops_per_token(seq_len)` (docs/models.md): a number, or a dict with
  "model" (what MFU divides), optionally "hardware" (with the recompute of activation
  checkpointing: flops_per_token_hw and HFU) and "formula" (flops_formula). The built-in GPT has
  one: PaLM's formula (nanogpt/train/gpt.py GPT.flops_per_token, FLOPS_FORMULA);
- nanochat's `estimate_flops()`, the same figure;
- one forward+backward counted by torch's FlopCounterMode on a copy of the model built on the
  meta device (shapes only: no memory, no compute; attention counted as the SDPA call's
  matmuls, which on CPU a counter on real tensors would miss);
- else 6N over every parameter, attention not counted, with the reason.
The counted figure is recorded beside the hook's (flops_per_token_counted), as a check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.config.spec import RunSpec
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.user_model_meta import meta_copy

COUNTED = "counted: FlopCounterMode, one step on a meta copy"


def flops_of(spec: RunSpec, model) -> dict:
    """The FLOPs figures of the model a point trains (`model`: the built-in GPT or a user's,
    byo.UserModel) and where they came from: Setup's n_params_flops, flops_per_token,
    flops_per_token_hw, flops_per_token_counted, flops_formula, flops_source."""
    inner, seq = getattr(model, "inner", model), spec.model.block_size
    counted, counted_note = None, None
    try:
        counted = counted_per_token(spec, model)
    except Exception as err:  # noqa: BLE001 - a model that cannot run on meta: say so, go on
        counted_note = f"not counted on meta ({type(err).__name__}: {str(err)[:120]})"
    hardware, formula = None, None
    if callable(getattr(inner, "flops_per_token", None)):
        figure, source = inner.flops_per_token(seq), "hook: flops_per_token(seq_len)"
        if isinstance(figure, Mapping):  # model FLOPs, and hardware FLOPs and the formula
            figure, hardware, formula = (
                figure["model"],
                figure.get("hardware"),
                figure.get("formula"),
            )
    elif callable(getattr(inner, "estimate_flops", None)):
        figure, source = inner.estimate_flops(), "hook: estimate_flops()"
    elif counted:
        figure, source = counted, COUNTED
    else:
        figure = 6 * model.get_num_params()
        source = "6N, N = every parameter; attention not counted"
        if counted_note:
            source += f"; {counted_note}"
    return {
        "n_params_flops": model.get_num_params(),  # the GPT's: without the position embedding
        "flops_per_token": int(round(figure)),
        "flops_per_token_hw": None if hardware is None else int(round(hardware)),
        "flops_per_token_counted": counted,
        "flops_formula": formula,
        "flops_source": source,
    }


def counted_per_token(spec: RunSpec, model) -> float | None:
    """One forward+backward of a sequence counted on a copy built on the meta device: the
    user's model from model.build (user_model_meta.meta_copy), the GPT from its config."""
    if spec.model.build:
        copy, idx = meta_copy(spec)
        total = _count(copy, idx).get_total_flops()
        return total / idx.shape[1] if total else None
    return counted_flops_per_token(model.config)


def counted_flops_per_token(config: GPTConfig) -> float:
    """FLOPs of one forward+backward per token of a GPT, counted on the meta device."""
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
    """One forward+backward of a sequence, counted on a copy of the GPT on the meta device."""
    # Count model FLOPs: the recompute of activation checkpointing is not model work.
    config = dataclasses.replace(config, ac="none")
    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(1, config.block_size, dtype=torch.long)
    return _count(model, idx)


def _count(model, idx: torch.Tensor) -> FlopCounterMode:
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(idx, idx)
        loss.backward()
    return counter
