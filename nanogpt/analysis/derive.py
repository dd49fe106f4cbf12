"""Derived figures, each computed in exactly one place: tokens/s, achieved FLOP/s, MFU, HFU and
mfu_achievable, for a whole point (`rates`) and for one log window (`window_rates`).

    tokens/s        = tokens_per_step / step time                  (all ranks)
    achieved FLOP/s = flops_per_token x tokens per device per step / step time   (per device)
    MFU             = achieved FLOP/s / peak FLOP/s  (Chowdhery et al. 2022, "PaLM", appendix B);
                      the peak of perf.dtype (peak_dtype); null with perf.fp8 (`FP8_NO_MFU`,
                      mfu_note: no one peak describes a step of float8 and bf16 matmuls)
    HFU             = the same with the recompute of activation checkpointing counted
    mfu_achievable  = achieved FLOP/s / the best matmul this machine measured (calibration)
    tokens/s (wall) = tokens_per_step / (windows' first start to last end / their steps)
    J per token     = energy over the measured steps / tokens the counted ranks trained in them
                      (NVML: this GPU's rank; RAPL: every rank on this host)
    tokens per kWh  = 3.6e6 J / J per token, with an interval from the counter's timing error
    power over limit: mean power above the enforced limit by more than POWER_LIMIT_SLACK
    peak memory     = the larger of warmup's and the measured steps' peaks (`peak_memory`): what
                      "fits" is judged on, everywhere
    steady          = the window was long enough and its step time did not drift (`steadiness`)

The ceilings a point is divided by are resolved once, before it is measured
(hardware/calibration.py `ceilings_for_run`), and handed in as plain values: `Ceilings`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from nanogpt.analysis import stats
from nanogpt.config.protocol import STEADY_MIN_S
from nanogpt.record import Energy, Memory, Rates, Record, Setup
from nanogpt.record.fields import PEAK

PEAK_SOURCES = ("datasheet", "cpu-estimate", "override", "calibrated", "unknown")
# A board cannot hold more than its enforced limit for long; a mean above it by more than this
# is a counter or window problem, so the figure is flagged and kept out of recommendations.
POWER_LIMIT_SLACK = 0.05


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
    matmul_emulated: str | None = None  # why the dtype's matmuls are emulated here, if they are

    def to_dict(self) -> dict:
        """As plain values, stored in the record (rates.ceilings): a pool of repeats divides by
        the ceilings its runs were divided by, read back whole (`from_dict`)."""
        return {
            "peak_flops": self.peak.flops,
            "peak_source": self.peak.source,
            "achievable_flops": self.achievable_flops,
            "calibration": self.calibration,
            "matmul_emulated": self.matmul_emulated,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Ceilings:
        peak = Peak(data.get("peak_flops"), data.get("peak_source") or "unknown")
        return cls(
            peak, data.get("achievable_flops"), data.get("calibration"), data.get("matmul_emulated")
        )


def tokens_per_s(tokens_per_step: int, step_ms: float) -> float:
    return tokens_per_step / (step_ms / 1e3)


def achieved_flops(setup: Setup, step_ms: float, flops_per_token: int | None = None) -> float:
    """FLOP/s per device: each rank processes tokens_per_step / world_size tokens a step."""
    per_token = setup.flops_per_token if flops_per_token is None else flops_per_token
    tokens_per_device = setup.tokens_per_step / setup.world_size
    return per_token * tokens_per_device / (step_ms / 1e3)


# Why a float8 point has no MFU (rates.mfu_note). torchtitan divided float8 runs by the bf16
# peak, then stopped reporting MFU under FP8/MX (components/metrics.py, PR #2451): the converted
# Linears run at float8's peak (twice bf16's on Hopper), attention and the rest at bf16's, and
# no one peak is the ceiling of that mix. The achieved FLOP/s stay the figure to compare.
FP8_NO_MFU = (
    "perf.fp8: no MFU (nor HFU): float8 and bf16 matmuls have different peaks and no one of "
    "them bounds the step, as torchtitan dropped MFU under FP8; compare achieved_tflops"
)


def window_rates(
    setup: Setup, step_ms: float, ceilings: Ceilings, fp8: bool = False
) -> dict[str, float]:
    """tokens_per_s and (when the peak is known, and not with fp8: FP8_NO_MFU) mfu of one log
    window's median step."""
    rates = {"tokens_per_s": tokens_per_s(setup.tokens_per_step, step_ms)}
    if ceilings.peak.flops and not fp8:
        rates["mfu"] = achieved_flops(setup, step_ms) / ceilings.peak.flops
    return rates


def rates(record: Record, ceilings: Ceilings) -> Rates:
    """A point's derived figures, from its record and the ceilings it is divided by.

    The one derivation: analysis/figures.derive_point calls it on a single run's record and on
    a pool of repeats alike, so a figure cannot be derived two ways. Everything it reads is in the
    record: the step clock (Timing: median, interval, first step, wall-clock step, measured
    steps), the model (Setup), the energy, and what was asked (compile, activation
    checkpointing, dtype, fp8)."""
    setup, timing, asked, energy = record.setup, record.timing, record.asked, record.energy
    step_ms = timing.step_ms_median
    fp8 = asked.fp8 not in (None, "none")
    achieved = achieved_flops(setup, step_ms)
    peak = ceilings.peak
    out = Rates(
        tokens_per_s=tokens_per_s(setup.tokens_per_step, step_ms),
        achieved_tflops=achieved / 1e12,
        peak_tflops=peak.flops / 1e12 if peak.flops else None,
        peak_source=peak.source,
        peak_dtype=setup.matmul_dtype or asked.dtype,  # a self-casting model: the observed one
        mfu=achieved / peak.flops if peak.flops else None,
        ceilings=ceilings.to_dict(),  # what it was divided by, whole (a pool reads it)
    )
    # (a user's model has no recompute count: its hfu stays null, train/user_model.py; a
    # record of before perf.ac says its policy by the switch alone)
    policy = asked.ac or ("full" if asked.activation_checkpointing else "none")
    if peak.flops and policy != "none" and setup.flops_per_token_hw is not None:
        out.hfu = achieved_flops(setup, step_ms, setup.flops_per_token_hw) / peak.flops
    if fp8:
        out.mfu = out.hfu = None
        out.mfu_note = FP8_NO_MFU
    if asked.compile and timing.first_step_ms is not None:
        # What the first step cost beyond a steady one: compilation, autotuning, lazy init.
        out.compile_s = max(timing.first_step_ms - step_ms, 0.0) / 1e3
    if timing.step_ms_ci_low is not None and timing.step_ms_ci_high is not None:
        # a slower step bounds tokens/s from below
        out.tokens_per_s_ci_low = tokens_per_s(setup.tokens_per_step, timing.step_ms_ci_high)
        out.tokens_per_s_ci_high = tokens_per_s(setup.tokens_per_step, timing.step_ms_ci_low)
    if timing.step_ms_wall:
        out.tokens_per_s_wall = tokens_per_s(setup.tokens_per_step, timing.step_ms_wall)
    if energy.energy_j and timing.measured_steps:
        _energy_rates(out, setup, energy, timing.measured_steps)
    out.peak_memory_bytes, out.peak_memory_from = peak_memory(dataclasses.asdict(record.memory))
    if ceilings.achievable_flops:
        out.achievable_tflops = ceilings.achievable_flops / 1e12
        out.mfu_achievable = achieved / ceilings.achievable_flops
        # The calibration timed bf16 matmuls: a float8 step may beat them for real, so with
        # fp8 the figure is no bound and exceeding it flags nothing (mfu_flag stays null).
        out.mfu_flag = None if fp8 else out.mfu_achievable > 1
        out.calibration = ceilings.calibration
        if out.mfu_flag:
            warnings.warn(
                f"mfu_achievable is {out.mfu_achievable:.0%}: the run beat the best "
                f"{asked.dtype} matmul this machine measured, so the FLOP count or the timing "
                "is wrong (mfu_flag is set)",
                stacklevel=2,
            )
    return out


def _peak_fields() -> tuple[tuple[str, str, str], ...]:
    """PEAK_FIELDS, from the Memory part's marks (record/fields.py, PEAK)."""
    marked = {f.metadata[PEAK]: f.name for f in dataclasses.fields(Memory) if PEAK in f.metadata}
    kinds = dict.fromkeys(kind for kind, _ in marked)  # in the part's order: CUDA's first
    return tuple((kind, marked[kind, "measured"], marked[kind, "warmup"]) for kind in kinds)


# The peaks peak_memory weighs, CUDA's first: (kind, the measured steps' field, warmup's field)
PEAK_FIELDS = _peak_fields()


def peak_memory(fields: Mapping) -> tuple[int | None, str | None]:
    """The peak memory a point needs, and which peak that is: the one rule by which a point
    "fits" (the search's memory margin and its peak_memory_gib objective, the table's "fastest
    within N GiB", the plots and the W&B view's memory panels).

    The larger of warmup's peak and the measured steps': a first step that compiles, autotunes
    or records CUDA graphs can need more than the steps after it, and a point fits only if
    every one of its steps does. The CUDA caching allocator's peak (bytes in tensors) where the
    point has one, else the process's peak RSS. `fields`: a flat record (result.json's dict, a
    table row). Returns (bytes, "cuda measured" | "cuda warmup" | "rss measured" | "rss
    warmup"), or (None, None) when no peak was recorded."""
    for kind, measured_field, warmup_field in PEAK_FIELDS:
        measured, warmup = _bytes(fields.get(measured_field)), _bytes(fields.get(warmup_field))
        if warmup is not None and (measured is None or warmup >= measured):
            return warmup, f"{kind} warmup"
        if measured is not None:
            return measured, f"{kind} measured"
    return None, None


def usd_per_1m_tokens(
    tokens_per_s: float | None,
    j_per_token: float | None,
    usd_per_hour: float | None,
    usd_per_kwh: float | None,
) -> float | None:
    """What a million tokens cost: the machine's time at the point's tokens/s (`usd_per_hour`),
    plus their energy where both it and its price are known (`usd_per_kwh`; 3.6e6 J a kWh).
    None without a price or a figure to price. The table's column and the search's objective
    both come from here."""
    out = None
    if usd_per_hour is not None and tokens_per_s and math.isfinite(tokens_per_s):
        out = usd_per_hour / 3600 / tokens_per_s * 1e6
    if usd_per_kwh is not None and j_per_token is not None and math.isfinite(j_per_token):
        energy = j_per_token * 1e6 / 3.6e6 * usd_per_kwh
        out = energy if out is None else out + energy
    return out


def _bytes(value) -> int | None:
    """A byte count from a record or a table cell (a missing one: None, NaN or pandas' NA)."""
    try:
        count = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(count) else int(count)


def _energy_rates(out: Rates, setup: Setup, energy: Energy, measured_steps: int) -> None:
    ranks = min(energy.energy_ranks or 1, setup.world_size)
    tokens_counted = setup.tokens_per_step / setup.world_size * ranks * measured_steps
    out.j_per_step = energy.energy_j / measured_steps
    out.j_per_token = energy.energy_j / tokens_counted
    out.tokens_per_kwh = 3.6e6 / out.j_per_token
    if energy.energy_error_pct is not None:
        error = energy.energy_error_pct / 100
        out.tokens_per_kwh_ci_low = out.tokens_per_kwh / (1 + error)
        out.tokens_per_kwh_ci_high = out.tokens_per_kwh / max(1 - error, 1e-9)
    out.power_mean_w = energy.energy_j / energy.energy_s
    if energy.power_limit_w:
        out.power_over_limit = out.power_mean_w > energy.power_limit_w * (1 + POWER_LIMIT_SLACK)


# Why a window is not steady, as codes the table reads (Timing.unsteady_reasons)
SHORT = "short"  # shorter than asked (bench.measure_s), or than a GPU's clocks take to settle
DRIFT = "drift"  # the last third's step time differs significantly from the first third's
RECOMPILE = "recompile"  # torch.compile compiled again during the measured steps


@dataclass(frozen=True)
class Steadiness:
    """Whether a measured window reads the steady state: the reason codes (none: steady), the
    same in words, and the drift (pct, ci_low, ci_high) when the window had six steps or more."""

    reasons: tuple[str, ...]
    note: str | None
    drift: tuple[float, float, float] | None

    @property
    def steady(self) -> bool:
        return not self.reasons


def steadiness(
    steps: list[float],
    measured_s: float,
    floor_s: float,
    on_accelerator: bool,
    recompiles: int | None = None,
) -> Steadiness:
    """Whether a measured window reads the steady state (`Steadiness`).

    drift: the last third's median step over the first third's, as (pct, ci_low, ci_high) with
    the 95 % interval of stats.speedup. Unsteady when the window was shorter than asked
    (`floor_s`) or, on an accelerator, than STEADY_MIN_S (SHORT); or when the drift is
    significant (its whole interval beyond stats.NOISE): clocks or caches still changing
    (DRIFT); or when torch.compile recompiled during the window (`recompiles`, the compile
    part's recompiles_in_window): a timed step held a compile (RECOMPILE)."""
    reasons, notes = [], []
    if measured_s < floor_s:
        reasons.append(SHORT)
        notes.append(f"measured {measured_s:.2f} s, less than bench.measure_s={floor_s:g}")
    elif on_accelerator and measured_s < STEADY_MIN_S:
        reasons.append(SHORT)
        notes.append(f"measured {measured_s:.2f} s: a GPU's clocks take seconds to settle")
    drift = None
    third = len(steps) // 3
    if third >= 2:
        # stats.speedup(base, other) is base / other in tokens/s terms: slower last third < 1.
        ratio, low, high = stats.speedup([steps[:third]], [steps[-third:]])
        drift = ((1 / ratio - 1) * 100, (1 / high - 1) * 100, (1 / low - 1) * 100)
        if stats.verdict(low, high) != stats.NOT_SIGNIFICANT:
            way = "slower" if drift[0] > 0 else "faster"
            reasons.append(DRIFT)
            notes.append(f"the last third of the steps ran {abs(drift[0]):.1f} % {way}")
    if recompiles:
        reasons.append(RECOMPILE)
        notes.append(f"{recompiles} recompile(s) during the measured steps")
    return Steadiness(tuple(reasons), "; ".join(notes) or None, drift)


def optimizer_step_frac(diagnosis) -> float | None:
    """The optimizer's share of a diagnosed step's wall time: the device's share of the step
    times the optimizer's share of device time (on CPU, operator self time inside
    `Optimizer.step`). Null where the diagnosis has no split (its diag_error says why)."""
    device, optimizer = diagnosis.diag_step_device_frac, diagnosis.diag_device_time_optimizer_frac
    if device is None or optimizer is None:
        return None
    return device * optimizer
