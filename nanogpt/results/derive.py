"""Derived figures, each computed in exactly one place: tokens/s, achieved FLOP/s, MFU, HFU and
mfu_achievable, for a whole point (`rates`) and for one log window (`window_rates`).

    tokens/s        = tokens_per_step / step time                  (all ranks)
    achieved FLOP/s = flops_per_token x tokens per device per step / step time   (per device)
    MFU             = achieved FLOP/s / peak FLOP/s  (Chowdhery et al. 2022, "PaLM", appendix B);
                      the peak of perf.dtype (peak_dtype): with perf.fp8 that is bf16, the
                      dtype of the work left unconverted, as torchtitan divides float8 runs
                      by the bf16 peak
    HFU             = the same with the recompute of activation checkpointing counted
    mfu_achievable  = achieved FLOP/s / the best matmul this machine measured (calibration)
    J per token     = energy over the measured steps / tokens this device trained in them
    tokens per kWh  = 3.6e6 J / J per token

The ceilings a point is divided by are resolved once, before it is measured
(hardware/calibration.py `ceilings_for_run`), and handed in as plain values: `Ceilings`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from nanogpt.results.record import Energy, Rates, Setup

PEAK_SOURCES = ("datasheet", "cpu-estimate", "override", "calibrated", "unknown")


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU divides by, and where that number came from (one of PEAK_SOURCES)."""

    flops: float | None
    source: str

    def __post_init__(self):
        if self.source not in PEAK_SOURCES:
            raise ValueError(f"Peak.source must be one of {PEAK_SOURCES}, got {self.source!r}")


@dataclass(frozen=True)
class Ceilings:
    """What a point's FLOP/s are divided by: the peak (spec sheet or stand-in) and, when this
    machine was calibrated, the achievable matmul FLOP/s with the calibration's provenance."""

    peak: Peak
    achievable_flops: float | None = None
    calibration: dict | None = None


def tokens_per_s(tokens_per_step: int, step_ms: float) -> float:
    return tokens_per_step / (step_ms / 1e3)


def achieved_flops(setup: Setup, step_ms: float, flops_per_token: int | None = None) -> float:
    """FLOP/s per device: each rank processes tokens_per_step / world_size tokens a step."""
    per_token = setup.flops_per_token if flops_per_token is None else flops_per_token
    tokens_per_device = setup.tokens_per_step / setup.world_size
    return per_token * tokens_per_device / (step_ms / 1e3)


def window_rates(setup: Setup, step_ms: float, ceilings: Ceilings) -> dict[str, float]:
    """tokens_per_s and (when the peak is known) mfu of one log window's median step."""
    rates = {"tokens_per_s": tokens_per_s(setup.tokens_per_step, step_ms)}
    if ceilings.peak.flops:
        rates["mfu"] = achieved_flops(setup, step_ms) / ceilings.peak.flops
    return rates


def rates(
    setup: Setup,
    step_ms_median: float,
    first_step_ms: float,
    ceilings: Ceilings,
    *,
    step_ms_ci: tuple[float, float] | None = None,
    compiled: bool,
    checkpointing: bool,
    dtype: str,
    energy: Energy | None = None,
    measured_steps: int | None = None,
    fp8: bool = False,
) -> Rates:
    """A point's derived figures from its median step time (and energy, when counted)."""
    achieved = achieved_flops(setup, step_ms_median)
    peak = ceilings.peak
    out = Rates(
        tokens_per_s=tokens_per_s(setup.tokens_per_step, step_ms_median),
        achieved_tflops=achieved / 1e12,
        peak_tflops=peak.flops / 1e12 if peak.flops else None,
        peak_source=peak.source,
        peak_dtype=dtype,
        mfu=achieved / peak.flops if peak.flops else None,
    )
    if peak.flops and checkpointing:
        out.hfu = achieved_flops(setup, step_ms_median, setup.flops_per_token_hw) / peak.flops
    if compiled:
        # What the first step cost beyond a steady one: compilation, autotuning, lazy init.
        out.compile_s = max(first_step_ms - step_ms_median, 0.0) / 1e3
    if step_ms_ci is not None:  # a slower step bounds tokens/s from below
        out.tokens_per_s_ci_low = tokens_per_s(setup.tokens_per_step, step_ms_ci[1])
        out.tokens_per_s_ci_high = tokens_per_s(setup.tokens_per_step, step_ms_ci[0])
    if energy is not None and energy.energy_j and measured_steps:
        tokens_per_device = setup.tokens_per_step / setup.world_size * measured_steps
        out.j_per_step = energy.energy_j / measured_steps
        out.j_per_token = energy.energy_j / tokens_per_device
        out.tokens_per_kwh = 3.6e6 / out.j_per_token
        out.power_mean_w = energy.energy_j / energy.energy_s
    if ceilings.achievable_flops:
        out.achievable_tflops = ceilings.achievable_flops / 1e12
        out.mfu_achievable = achieved / ceilings.achievable_flops
        # The calibration timed bf16 matmuls: a float8 step may beat them for real, so with
        # fp8 the figure is no bound and exceeding it flags nothing (mfu_flag stays null).
        out.mfu_flag = None if fp8 else out.mfu_achievable > 1
        out.calibration = ceilings.calibration
        if out.mfu_flag:
            warnings.warn(
                f"mfu_achievable is {out.mfu_achievable:.0%}: the run beat the best {dtype} "
                "matmul this machine measured, so the FLOP count or the timing is wrong "
                "(mfu_flag is set)",
                stacklevel=2,
            )
    return out
