"""Time to loss across runs: a point's figure from its runs, and a point against the baseline.

A run's time to a target loss varies with its seed (the initialisation, the batches drawn), so
a point is several runs (bench.repeats, 5 by default with a target), each a fresh process with
its own seed, and its figures are statistics over them (docs/time_to_loss.md):

- `time_to_loss_s`: the olympic mean of the runs' times (from 5 runs on, the fastest and the
  slowest dropped, as MLPerf Training scores its runs), when every run reached the target; null
  otherwise, with "k of N reached" in ttl_note: a mean over the runs that happened to reach it
  would flatter the point;
- its interval (`ttl_ci_low`, `ttl_ci_high`), from MIN_RUNS runs on: a seeded 95 % percentile
  bootstrap of the olympic mean (scipy.stats.bootstrap, METHOD). Every resample's mean is a
  mean of the runs' own times, so the interval lies between the fastest and the slowest run:
  its low end is positive by the method, never clamped (a t-interval of 2 runs, one degree of
  freedom, gave -60.3 s for a 7.7 s mean). Below MIN_RUNS, no interval, and ttl_ci_method says
  why;
- against the baseline, at table level only (`add_comparison`): `ttl_p_value`, a one-sided
  Welch t-test that this point's runs reach the target sooner than the baseline's
  (scipy.stats.ttest_ind, equal_var=False, alternative="less"), as modded-nanogpt's records
  ask for p < 0.01; "faster to target" below report.ttl_alpha, "~" otherwise, and no verdict
  unless both points have at least MIN_RUNS runs that reached; `ttl_ratio`, this point's mean
  time over the baseline's, with a seeded bootstrap interval over the runs;
- whether the two points' runs alternated (`ttl_run_order`), judged from each run's wall-clock
  span (ttl_run_times): run r of both started before run r + 1 of either. Where they did not, a
  drift of the machine's speed over the sweep falls on one side only, and the verdict says so
  ("runs blocked (each point's runs back to back)", BLOCKED).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING

import numpy as np

from nanogpt.analysis.stats import CONFIDENCE, NOT_SIGNIFICANT, RESAMPLES, SEED
from nanogpt.record import Record, TimeToLoss

if TYPE_CHECKING:  # the table's type; pandas and scipy are imported where a table is compared
    import pandas as pd

    from nanogpt.analysis.table import Sweep

ALPHA = 0.01  # report.ttl_alpha's default: modded-nanogpt's records ask for p < 0.01
METHOD = (
    "percentile bootstrap of the olympic mean of the runs' times (scipy.stats.bootstrap, "
    "seeded), 95 %"
)
OLYMPIC_FROM = 5  # runs from which the fastest and the slowest are dropped
MIN_RUNS = 3  # runs that reached, on each side, before a verdict or an interval
FASTER = "faster to target"
ALTERNATED, BLOCKED = "alternated", "runs blocked (each point's runs back to back)"
UNKNOWN_ORDER = "run order unknown"  # a record written before ttl_run_times


def olympic_mean(times: list[float]) -> float:
    """The mean, without the fastest and the slowest from OLYMPIC_FROM runs on."""
    return float(_olympic(np.asarray(times, float), axis=-1))


def _olympic(times: np.ndarray, axis: int = -1) -> np.ndarray:
    """olympic_mean along `axis` (vectorised, for the bootstrap's resamples)."""
    ordered = np.sort(times, axis=axis)
    if ordered.shape[axis] >= OLYMPIC_FROM:
        ordered = np.take(ordered, np.arange(1, ordered.shape[axis] - 1), axis=axis)
    return ordered.mean(axis=axis)


def no_interval(n: int) -> str | None:
    """Why `n` runs have no interval; None from MIN_RUNS on."""
    if n >= MIN_RUNS:
        return None
    return f"no interval: {n} run{'s' if n != 1 else ''} (an interval needs {MIN_RUNS} or more)"


def olympic_interval(times: list[float]) -> tuple[float | None, float | None]:
    """The CONFIDENCE interval of the olympic mean of `times` (METHOD); nulls below MIN_RUNS
    runs (no_interval says why)."""
    if no_interval(len(times)):
        return None, None
    values = np.asarray(times, float)
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    from scipy import stats as sps  # here: a job process pools without scipy

    found = sps.bootstrap(
        (values,),
        _olympic,
        vectorized=True,
        n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        random_state=SEED,
    ).confidence_interval
    return float(found.low), float(found.high)


def p_value(base: list[float], other: list[float]) -> float | None:
    """One-sided Welch t-test: the p-value of "other's times are shorter than base's"; null
    with fewer than two runs on a side (no variance to test against)."""
    if len(base) < 2 or len(other) < 2:
        return None
    if np.var(base) == 0 and np.var(other) == 0:  # the t statistic is undefined
        return 0.0 if statistics.fmean(other) < statistics.fmean(base) else 1.0
    from scipy import stats as sps

    result = sps.ttest_ind(other, base, equal_var=False, alternative="less")
    return float(result.pvalue)


def verdict(base: list[float], other: list[float], alpha: float) -> str | None:
    """FASTER when the p-value is below alpha, NOT_SIGNIFICANT otherwise; None (no verdict)
    unless both sides have MIN_RUNS runs that reached."""
    if min(len(base), len(other)) < MIN_RUNS:
        return None
    p = p_value(base, other)
    return FASTER if p is not None and p < alpha else NOT_SIGNIFICANT


def alternated(base: list | None, other: list | None) -> bool | None:
    """Whether two points' runs alternated, from their wall-clock spans ([start, end] a run,
    ttl_run_times): round r (each point's r-th run to start) all started before any run of
    round r + 1, so run r of every point ran before run r + 1 (side by side counts: parallel
    slots). None where a side's times are unknown or a side has a single run."""
    if not base or not other or any(t is None for t in [*base, *other]):
        return None
    a, b = sorted(t[0] for t in base), sorted(t[0] for t in other)
    rounds = min(len(a), len(b))
    if rounds < 2:
        return None
    return all(max(a[r], b[r]) < min(a[r + 1], b[r + 1]) for r in range(rounds - 1))


def run_order(base: list | None, other: list | None) -> str:
    """ALTERNATED, BLOCKED or UNKNOWN_ORDER: what `alternated` read from the runs' times."""
    order = alternated(base, other)
    return UNKNOWN_ORDER if order is None else ALTERNATED if order else BLOCKED


def ratio(base: list[float], other: list[float]) -> tuple[float, float | None, float | None]:
    """other's mean time over base's, with a seeded 95 % percentile bootstrap interval over
    the runs (scipy.stats.bootstrap, each side's runs resampled on their own); no interval
    with fewer than two runs on a side (nothing to resample)."""
    from scipy import stats as sps  # here: a job process pools without scipy

    b, o = np.asarray(base, float), np.asarray(other, float)
    if len(b) < 2 or len(o) < 2:
        return float(o.mean() / b.mean()), None, None
    found = sps.bootstrap(
        (o, b),
        lambda o, b, axis: o.mean(axis=axis) / b.mean(axis=axis),
        paired=False,
        vectorized=True,
        n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        random_state=SEED,
    ).confidence_interval
    return float(o.mean() / b.mean()), float(found.low), float(found.high)


def pool(records: list[Record]) -> Record:
    """A point's record from its runs: the first run's record, its time_to_loss part pooled."""
    parts = [r.time_to_loss for r in records]
    per_run = [p.ttl_s_per_run[0] if p.ttl_s_per_run else None for p in parts]
    reached = [t for t in per_run if t is not None]
    n = len(parts)
    steps = [p.ttl_steps for p in parts if p.ttl_steps is not None]
    pooled = TimeToLoss(
        ttl_target_loss=parts[0].ttl_target_loss,
        ttl_eval_every=parts[0].ttl_eval_every,
        ttl_runs=n,
        ttl_reached_runs=len(reached),
        ttl_reached=len(reached) == n,
        ttl_ci_method=no_interval(len(reached)) or METHOD,
        ttl_steps=int(statistics.median(steps)) if steps else None,
        ttl_best_loss=min(p.ttl_best_loss for p in parts),
        ttl_compile_s=statistics.fmean(p.ttl_compile_s for p in parts),
        ttl_eval_s=statistics.fmean(p.ttl_eval_s for p in parts),
        ttl_s_per_run=per_run,
        ttl_steps_per_run=[p.ttl_steps for p in parts],
        ttl_best_loss_per_run=[p.ttl_best_loss for p in parts],
        ttl_evals=[p.ttl_evals for p in parts],
        ttl_run_times=[(p.ttl_run_times or [None])[0] for p in parts],
    )
    if pooled.ttl_steps is not None and records[0].setup.tokens_per_step:
        pooled.ttl_tokens = pooled.ttl_steps * records[0].setup.tokens_per_step
    if pooled.ttl_reached:
        pooled.time_to_loss_s = olympic_mean(reached)
        pooled.ttl_ci_low, pooled.ttl_ci_high = olympic_interval(reached)
        pooled.ttl_note = f"{n} of {n} reached"
        if no_interval(n):
            pooled.ttl_note += f"; {no_interval(n)}"
    else:
        pooled.ttl_note = f"{len(reached)} of {n} reached; best loss {pooled.ttl_best_loss:.4f}"
    out = dataclasses.replace(records[0], time_to_loss=pooled)
    out.timing = dataclasses.replace(records[0].timing, repeats=n)
    out.timing.loss_last = records[-1].timing.loss_last
    return out


def derive(record: Record, runs: list[Record], floor_s: float) -> Record:
    """A point's figures are its pool's (`pool`): a run to a target has no step series."""
    del runs, floor_s
    return record


def compare(sweep: Sweep, base: int | None, alpha: float | None) -> None:
    """The table's comparison against the baseline (`add_comparison`), the runs' spans read
    from the points' records."""
    add_comparison(sweep.table, base, alpha, run_times(sweep.points))


def _reached(value) -> list[float]:
    return [t for t in (value if isinstance(value, list) else []) if t is not None]


def run_times(rows: list[dict]) -> list:
    """Each row's runs' wall-clock spans (ttl_run_times: json-only, so read from the records,
    not the table), for add_comparison."""
    return [row.get("ttl_run_times") for row in rows]


def same_target(table: pd.DataFrame, base: int, i: int) -> bool:
    """Times to two different losses are no comparison."""
    return table["ttl_target_loss"].iloc[base] == table["ttl_target_loss"].iloc[i]


def add_comparison(
    table: pd.DataFrame, base: int | None, alpha: float, run_times: list | None = None
) -> None:
    """ttl_ratio (with its interval), ttl_p_value, ttl_run_order and ttl_verdict of each row
    against the baseline row's runs (to the same target), in place; nothing when no row has a
    target. `run_times`: each row's ttl_run_times (json-only: from the records); a verdict
    whose runs did not alternate says so ("~; runs blocked (...)")."""
    import pandas as pd  # the table's process reads tables; a job process does not

    if "ttl_s_per_run" not in table or table["ttl_target_loss"].isna().all():
        return
    alpha = ALPHA if alpha is None else alpha  # a sweep saved before report.ttl_alpha
    n = len(table)
    ratios, lows, highs = [None] * n, [None] * n, [None] * n
    pvalues, verdicts, orders = [None] * n, [None] * n, [None] * n
    times = run_times or [None] * n
    ok = table["status"] == "ok"
    if base is not None and ok.iloc[base]:
        runs_base = _reached(table["ttl_s_per_run"].iloc[base])
        for i in range(n):
            runs = _reached(table["ttl_s_per_run"].iloc[i])
            if i == base:
                verdicts[i] = "baseline"
            elif ok.iloc[i] and same_target(table, base, i):
                orders[i] = run_order(times[base], times[i])
                if not (runs and runs_base):
                    continue
                ratios[i], lows[i], highs[i] = ratio(runs_base, runs)
                pvalues[i] = p_value(runs_base, runs)
                verdicts[i] = verdict(runs_base, runs, alpha)
                if verdicts[i] is not None and orders[i] != ALTERNATED:
                    verdicts[i] = f"{verdicts[i]}; {orders[i]}"
    for name, values in (
        ("ttl_ratio", ratios),
        ("ttl_ratio_ci_low", lows),
        ("ttl_ratio_ci_high", highs),
        ("ttl_p_value", pvalues),
    ):
        table[name] = pd.Series(values, index=table.index, dtype="float64")
    table["ttl_run_order"] = orders
    table["ttl_verdict"] = verdicts
