"""What a point is before its first step: parameter and FLOP counts, tokens per step, the
wrapping, the optimizer implementation and the memory estimate (the record's `Setup`)."""

from __future__ import annotations

import os
from pathlib import Path

from nanogpt.measure import flops, memory
from nanogpt.measure.trainer import Trainer
from nanogpt.results.record import Setup
from nanogpt.spec import RunSpec


def describe_setup(spec: RunSpec, trainer: Trainer) -> Setup:
    model, perf = trainer.raw_model, spec.perf
    formula = flops.model_flops(model)
    strategy = "fsdp2" if trainer.fsdp else "ddp"
    estimate = memory.estimate_of(spec, model, trainer.world.size, strategy)
    fp8 = trainer.fp8_layers
    return Setup(
        device=str(trainer.device),
        world_size=trainer.world.size,
        n_params=model.get_num_params(non_embedding=False),
        n_params_flops=formula["n_params_flops"],
        flops_per_token=formula["flops_per_token"],
        flops_per_token_counted=flops.counted_flops_per_token(model.config),
        flops_per_token_hw=formula["flops_per_token_hw"],
        flops_formula=flops.FORMULA,
        tokens_per_step=trainer.tokens_per_step,
        model_wrapping=trainer.model_wrapping,
        fp8_converted=len(fp8["converted"]) if fp8 is not None else None,
        fp8_layers=fp8,
        optimizer_impl_used=trainer.optimizer_impl_used,
        host_sync_in_step=trainer.host_sync_in_step,
        inductor_cache=_inductor_cache_state() if perf.compile else None,
        mem_estimate_bytes=estimate["total"],
        mem_estimate=estimate,
    )


def _inductor_cache_state() -> str:
    """'warm' when Inductor's on-disk cache already holds entries, else 'cold'. The dir is the
    one Inductor itself uses: TORCHINDUCTOR_CACHE_DIR, else its per-user default ('unknown'
    where this torch does not say which that is)."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        except ImportError:  # torch releases before this module: not asked, so not guessed
            return "unknown"
        cache = default_cache_dir()
    return "warm" if Path(cache).is_dir() and any(Path(cache).iterdir()) else "cold"
