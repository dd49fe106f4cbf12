"""One record from a point measured several times (bench.repeats), each in a fresh process.

A process hides part of the noise: its allocator state, its compiled code, the clocks it ran
at. Repeats show it. The pooled record keeps each repeat's median (step_ms_median_per_repeat)
and its measured steps (step_ms_measured, a list per repeat); its step time is the median of
the repeats' medians, with a hierarchical bootstrap interval (results/stats.py), and every
derived figure is recomputed from the pooled record by the one function the loop calls,
results/derive.rates(record, ceilings), with the ceilings the first repeat stored
(rates.ceilings: the peak, the calibration, matmul_emulated, as the measuring child resolved
them). The wall-clock step is the repeats' windows' wall time
over their steps. Peaks of memory are the largest of any repeat; energy is summed over all
measured steps; a point is `contended` if any repeat was, and steady only if every repeat was
(the drift shown is the repeat's that drifted most). The rest (the model's figures, the first
step, the profile, the diagnosis) is the first repeat's. steps.csv keeps every repeat's rows,
numbered.
"""

from __future__ import annotations

import dataclasses

from nanogpt.results import derive, stats, time_to_loss
from nanogpt.results.record import Record


def pool(records: list[Record]) -> Record:
    first = records[0]
    if first.time_to_loss.ttl_target_loss is not None:  # runs to a target: no step series
        return time_to_loss.pool(records)
    pooled = dataclasses.replace(first, steps=[])
    for number, record in enumerate(records, 1):
        pooled.steps += [{**row, "repeat": number} for row in record.steps]
    series = [steps for record in records for steps in record.timing.step_ms_measured or []]
    timing = dataclasses.replace(first.timing, repeats=len(records), step_ms_measured=series)
    timing.set_stats(stats.summarize([ms for steps in series for ms in steps]))
    timing.step_ms_median = stats.point_figure(series)  # the median of the repeats' medians
    timing.step_ms_median_per_repeat = [r.timing.step_ms_median for r in records]
    timing.step_ms_ci_low, timing.step_ms_ci_high = stats.median_ci(series)
    timing.measured_steps = sum(r.timing.measured_steps or 0 for r in records)
    timing.loss_last = records[-1].timing.loss_last
    _any_contended(timing, records)
    _steady_in_every_repeat(timing, records)
    walls = [(r.timing.step_ms_wall, r.timing.measured_steps) for r in records]
    if all(wall and steps for wall, steps in walls):  # the windows' wall time over their steps
        timing.step_ms_wall = sum(w * n for w, n in walls) / sum(n for _, n in walls)
    pooled.timing = timing
    pooled.memory = _largest_peaks(records)
    pooled.energy = _summed_energy(records)
    pooled.compile = _compile_of(records)
    pooled.rates = derive.rates(pooled, _ceilings(first))
    return pooled


def _ceilings(record: Record) -> derive.Ceilings:
    """The ceilings every repeat was divided by, as the measuring child resolved and stored them
    (rates.ceilings); a record without them (written before they were stored, or by hand): its
    peak alone, as its rates name it."""
    if record.rates.ceilings:
        return derive.Ceilings.from_dict(record.rates.ceilings)
    tflops = record.rates.peak_tflops
    peak = {"peak_flops": tflops * 1e12 if tflops else None}
    return derive.Ceilings.from_dict({**peak, "peak_source": record.rates.peak_source})


def _compile_of(records: list[Record]):
    """The first repeat's compile part (each repeat compiles the same model alike; the first
    with the coldest cache), with the recompiles inside every repeat's measured steps summed."""
    part = dataclasses.replace(records[0].compile)
    in_window = [r.compile.recompiles_in_window for r in records]
    if None not in in_window:
        part.recompiles_in_window = sum(in_window)
    return part


def _largest_peaks(records: list[Record]):
    memory = dataclasses.replace(records[0].memory)
    for field in (
        "mem_peak_allocated_bytes",
        "mem_peak_reserved_bytes",
        "mem_nvml_used_bytes",
        "mem_warmup_peak_allocated_bytes",
        "mem_warmup_peak_reserved_bytes",
        "mem_warmup_peak_rss_bytes",
    ):
        values = [getattr(r.memory, field) for r in records if getattr(r.memory, field)]
        setattr(memory, field, max(values) if values else None)
    memory.mem_peak_rss_bytes = max(r.memory.mem_peak_rss_bytes or 0 for r in records) or None
    # which window the largest allocated peak came from (measured, or warmup's CUDA graphs)
    top = max(records, key=lambda r: r.memory.mem_peak_allocated_bytes or 0)
    memory.mem_peak_allocated_from = top.memory.mem_peak_allocated_from
    return memory


def _steady_in_every_repeat(timing, records: list[Record]) -> None:
    """Steady only when every repeat was (null when any could not tell); every repeat's reasons;
    the drift of the repeat that drifted most, with its interval and note: a drift in repeat 3
    shows as one in repeat 1 does."""
    flags = [r.timing.steady for r in records]
    timing.steady = None if any(flag is None for flag in flags) else all(flags)
    reasons = [code for r in records for code in r.timing.unsteady_reasons or []]
    timing.unsteady_reasons = list(dict.fromkeys(reasons)) or records[0].timing.unsteady_reasons
    drifted = [r.timing for r in records if r.timing.drift_pct is not None]
    if drifted:
        worst = max(drifted, key=lambda t: abs(t.drift_pct))
        timing.drift_pct, timing.drift_ci_low = worst.drift_pct, worst.drift_ci_low
        timing.drift_ci_high = worst.drift_ci_high
    notes = [r.timing.steady_note for r in records if r.timing.steady is False]
    timing.steady_note = notes[0] if notes else records[0].timing.steady_note


def _any_contended(timing, records: list[Record]) -> None:
    """Contended when any repeat shared the device (measure/contention.py); what each saw."""
    seen = [
        f"repeat {i + 1} of {len(records)}: {r.timing.contention}"
        for i, r in enumerate(records)
        if r.timing.contended
    ]
    if seen:
        timing.contended, timing.contention = True, "; ".join(seen)


def _summed_energy(records: list[Record]):
    energy = dataclasses.replace(records[0].energy)
    if all(r.energy.energy_j for r in records):
        energy.energy_j = sum(r.energy.energy_j for r in records)
        energy.energy_s = sum(r.energy.energy_s for r in records)
    else:
        energy.energy_j = None
    return energy
