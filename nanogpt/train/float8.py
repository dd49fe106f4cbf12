"""perf.fp8: float8 training through torchao (the `fp8` extra), as torchtitan applies it.

torchao's `convert_to_float8_training` swaps `nn.Linear` modules for `Float8Linear`: each matmul
of forward and backward casts its operands to float8 (e4m3) with dynamic scales (one per tensor
for `tensorwise`, one per row for the `rowwise` recipes) and runs on the float8 tensor cores of
compute capability 8.9+ (Ada, Hopper). Everything else stays in the autocast dtype, bf16.

Which Linears are converted (`fp8_filter`):
- not the output head: its weight is tied to the token embedding, and the logits feed the
  softmax of the loss, where float8's 3 mantissa bits cost the most accuracy (torchtitan leaves
  `output` out too, by default);
- not one whose in or out features are not multiples of 16: the float8 matmul
  (`torch._scaled_mm`) requires it (torchao's own filter says the same).
`convert` returns the list of both, with the reason each kept layer stayed, for the record.

MFU with fp8 is null (analysis/derive.py, FP8_NO_MFU): the converted matmuls run at float8's
peak and the rest at bf16's, so no one peak bounds the step; torchtitan stopped reporting MFU
under FP8/MX for that reason (docs/measurement.md, "No MFU under `perf.fp8`").
"""

from __future__ import annotations

import contextlib
import logging

import torch.nn as nn

from nanogpt.config.spec import Fp8

HEAD = "lm_head"
FP8_DIM_MULTIPLE = 16


# Loggers whose warnings torchao's import sets off and that say nothing about the point: torch's
# pytree deprecation of register_constant() on its Enums (torchao 0.18 on torch 2.13, twice), and
# torchao's own "Failed to load" of kernels built for another Python or GPU.
TORCHAO_IMPORT_NOISE = ("torch.utils._pytree", "torchao")


@contextlib.contextmanager
def _quiet_torchao_import():
    """torchao imported with TORCHAO_IMPORT_NOISE's loggers at ERROR, then as they were: a user
    reads those lines as the runner's. The project imports torchao here alone, under perf.fp8."""
    loggers = [logging.getLogger(name) for name in TORCHAO_IMPORT_NOISE]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def torchao_missing() -> str | None:
    """Why torchao's float8 training cannot be imported here; None when it can."""
    try:
        with _quiet_torchao_import():
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: F401
    except ImportError as exc:
        return f"torchao is not installed ({exc.__class__.__name__}: {exc})"
    return None


def kept_reason(module: nn.Module, fqn: str) -> str | None:
    """Why the Linear at `fqn` stays in bf16; None when it converts to float8."""
    if fqn == HEAD or fqn.endswith("." + HEAD):
        return "output head (tied to the embedding; logits feed the softmax)"
    dims = (module.in_features, module.out_features)
    if any(d % FP8_DIM_MULTIPLE for d in dims):
        return f"in/out features {dims} not multiples of {FP8_DIM_MULTIPLE}"
    return None


def fp8_filter(module: nn.Module, fqn: str) -> bool:
    """torchao's module_filter_fn: True for the Linears to convert."""
    return isinstance(module, nn.Linear) and kept_reason(module, fqn) is None


def plan(model: nn.Module) -> dict[str, list]:
    """The Linears that would convert and those that stay, with why (the record's fp8_layers)."""
    converted, kept = [], []
    for fqn, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        reason = kept_reason(module, fqn)
        if reason is None:
            converted.append(fqn)
        else:
            kept.append({"layer": fqn, "reason": reason})
    return {"converted": converted, "kept": kept}


def convert(model: nn.Module, recipe: Fp8) -> dict[str, list]:
    """Swap the model's eligible Linears for torchao's Float8Linear, in place; returns `plan`."""
    with _quiet_torchao_import():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    layers = plan(model)
    config = Float8LinearConfig.from_recipe_name(recipe.value)
    convert_to_float8_training(model, module_filter_fn=fp8_filter, config=config)
    return layers
