"""A point's figures, derived once from the raw parts of its record.

The measured loop (scenarios/loop.py) fills only what it measured: every step's time (the record's
steps, each measured row's `step_ms_job`: the slowest rank's), the measured window's length, the
memory peaks, the energy counter, the compile counters, the diagnosis' shares, and the ceilings it
was told to divide by (`rates.ceilings`, as the worker resolved them). Everything that follows
from those is derived here, by `derive_point`, in one pass and by one function a figure
(analysis/derive.py, analysis/stats.py):

  the step statistics   median, mean, p10/p90, std, cv over every measured step; the point's
                        step (the median of its runs' medians) and its 95 % interval
  steadiness            judged run by run (derive.steadiness): steady only when every run was,
                        every run's reasons, the drift of the run that drifted most
  the rates             tokens/s, FLOP/s, MFU, energy per token, peak memory (derive.rates)
  the optimizer's share of a step (derive.optimizer_step_frac)

For one run it is called where the record is completed, in the measuring process (whose W&B run
gets the figures); for `bench.repeats` runs, by the job process on the pool of their raw parts
(analysis/repeats.py aggregates each part), so a pooled figure is derived exactly as one run's is.
Which figures a point has is its scenario's (scenarios/base.py): `derive_point` pools the runs and
derives through the scenario's pool face. Throughput's are `throughput_figures`, here; a run to a
target loss has no step series: its figures are scenarios/time_to_loss/pool.py's.
"""

from __future__ import annotations

from nanogpt.analysis import derive, stats
from nanogpt.record import Record, Timing
from nanogpt.scenarios import base as scenarios


def derive_point(runs: list[Record], floor_s: float) -> Record:
    """The point's record, every figure derived: `runs` are its measurements (one, or each
    repeat's), ok; `floor_s` is bench.measure_s (a shorter window is unsteady). The runs'
    scenario pools them and derives the point's figures from the pool."""
    scenario = scenarios.of_record(runs[0])
    record = runs[0] if len(runs) == 1 else scenario.pool.pool(runs)
    return scenario.pool.derive(record, runs, floor_s)


def throughput_figures(record: Record, runs: list[Record], floor_s: float) -> Record:
    """The throughput scenario's figures (scenarios/throughput/pool.py) of a run's record, or of
    the pool of `runs` (repeats.pool): the step statistics, steadiness, the rates and the
    optimizer's share."""
    timing = record.timing
    series = record.step_series()  # a list per run: its measured steps' times
    timing.repeats = len(runs)
    timing.set_stats(stats.summarize([ms for steps in series for ms in steps]))
    timing.step_ms_median = stats.point_figure(series)  # one run: its median
    timing.step_ms_ci_low, timing.step_ms_ci_high = stats.median_ci(series)
    timing.ci_method = stats.METHOD
    timing.step_ms_median_per_repeat = [stats.summarize(steps)["median"] for steps in series]
    _steadiness(timing, runs, floor_s)
    record.rates = derive.rates(record, _ceilings(record))
    record.optimizer.optimizer_step_frac = derive.optimizer_step_frac(record.diagnosis)
    return record


def _steadiness(timing: Timing, runs: list[Record], floor_s: float) -> None:
    """Each run's window judged on its own steps (a drift inside run 3 shows as one in run 1
    does); the point is steady only when every run was, with every run's reasons, the drift of
    the run that drifted most, and the first unsteady run's note."""
    judged = []
    for run in runs:
        steps = (run.step_series() or [[]])[0]
        on_accelerator = not str(run.setup.device or "cpu").startswith("cpu")
        judged.append(
            derive.steadiness(
                steps,
                run.timing.measured_s or 0.0,
                floor_s,
                on_accelerator,
                run.compile.recompiles_in_window,
            )
        )
    timing.steady = all(j.steady for j in judged)
    timing.unsteady_reasons = list(dict.fromkeys(code for j in judged for code in j.reasons))
    notes = [j.note for j in judged if not j.steady]
    prefix = len(runs) > 1
    timing.steady_note = (
        next(
            (f"run {i + 1} of {len(runs)}: {j.note}" if prefix else j.note)
            for i, j in enumerate(judged)
            if not j.steady
        )
        if notes
        else None
    )
    drifts = [j.drift for j in judged if j.drift is not None]
    if drifts:
        timing.drift_pct, timing.drift_ci_low, timing.drift_ci_high = max(
            drifts, key=lambda d: abs(d[0])
        )


def _ceilings(record: Record) -> derive.Ceilings:
    """The ceilings the measuring process resolved and stored whole (rates.ceilings); a record
    written before they were stored: its peak alone, as its rates name it."""
    if record.rates.ceilings:
        return derive.Ceilings.from_dict(record.rates.ceilings)
    tflops = record.rates.peak_tflops
    peak = {"peak_flops": tflops * 1e12 if tflops else None}
    return derive.Ceilings.from_dict({**peak, "peak_source": record.rates.peak_source})
