"""Confidence intervals and verdicts for step times: is a difference real, or noise?

Step times are autocorrelated (a slow step tends to follow a slow step: clocks, caches, other
load), so resampling single steps would understate the noise. We resample blocks of consecutive
steps instead, the moving-block bootstrap (Künsch 1989, "The jackknife and the bootstrap for
general stationary observations", Ann. Statist. 17), with blocks of about n^(1/3) steps (the
order Hall, Horowitz & Jing 1995 show is optimal for this estimator), and take the 95 %
percentile interval of the resampled medians (Efron & Tibshirani 1993, ch. 13).

A point measured several times (bench.repeats, each in a fresh process) has a second level of
noise that one process hides: allocator state, compilation, clocks. Its figure is the median of
its repeats' medians, and its bootstrap resamples the repeats too (a hierarchical bootstrap,
Davison & Hinkley 1997, section 3.8): each resample draws repeats with replacement, then blocks
within each drawn repeat. With a single repeat the interval covers within-process noise only.

A speedup's interval is the distribution of base / other over independent resamples of the two
points. The verdict is "faster" or "slower" when the whole 95 % interval lies beyond a noise
threshold of ±2 % around 1 (so p < 0.05 against any change within the noise, the way
criterion.rs's noise threshold works), and "~" otherwise, as Go's benchstat prints. The
threshold matters: on a shared machine step times drift between processes, and on short series
the percentile interval of a median is a little narrow; with it, same-point comparisons of
autocorrelated series (AR(1), phi 0.5, 20-40 steps) come out "~" in over 95 % of cases and a 20 %
difference is found every time (tests/test_compare.py).

The resampling is seeded by a constant: the same steps always give the same interval.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20260101
METHOD = (
    "moving-block bootstrap of the median, blocks of n^(1/3) steps, repeats resampled first "
    f"(hierarchical); {RESAMPLES} resamples, {CONFIDENCE:.0%} percentile interval"
)
NOT_SIGNIFICANT = "~"
NOISE = 0.02  # a speedup within 1 ± NOISE is never called significant


def block_length(n: int) -> int:
    return max(1, round(n ** (1 / 3)))


def _block_medians(steps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES medians of moving-block resamples of one repeat's steps."""
    n = len(steps)
    length = block_length(n)
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n - length + 1, size=(RESAMPLES, blocks))
    index = (starts[:, :, None] + np.arange(length)).reshape(RESAMPLES, -1)[:, :n]
    return np.median(steps[index], axis=1)


def resampled(repeats: list[list[float]], seed: int = SEED) -> np.ndarray:
    """RESAMPLES bootstrap values of a point's figure: the median of its repeats' medians."""
    rng = np.random.default_rng(seed)
    repeats = [np.asarray(r, dtype=float) for r in repeats if len(r)]
    if not repeats:
        raise ValueError("no measured steps to resample")
    per_repeat = np.stack([_block_medians(r, rng) for r in repeats])  # (repeats, RESAMPLES)
    if len(repeats) == 1:
        return per_repeat[0]
    drawn = rng.integers(0, len(repeats), size=(RESAMPLES, len(repeats)))
    return np.median(per_repeat[drawn, np.arange(RESAMPLES)[:, None]], axis=1)


def point_figure(repeats: list[list[float]]) -> float:
    """A point's step time: the median of its repeats' median steps."""
    return float(np.median([np.median(r) for r in repeats if len(r)]))


def interval(values: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def median_ci(repeats: list[list[float]]) -> tuple[float, float]:
    """The 95 % interval of a point's median step time."""
    return interval(resampled(repeats))


def speedup(base: list[list[float]], other: list[list[float]]) -> tuple[float, float, float]:
    """How many times faster `other` steps than `base` (base time / other time), with its 95 %
    interval. The two are resampled independently (different seeds)."""
    ratio = point_figure(base) / point_figure(other)
    low, high = interval(resampled(base, SEED) / resampled(other, SEED + 1))
    return ratio, low, high


# A verdict's basis when either point ran in one process (bench.repeats=1): its interval is the
# noise within that process, and a machine's speed drifts between processes more than that.
ONE_PROCESS = "within one process"


def verdict(low: float, high: float) -> str:
    """'faster' / 'slower' when the speedup's whole interval lies beyond 1 ± NOISE, else '~'."""
    if low > 1 + NOISE:
        return "faster"
    if high < 1 - NOISE:
        return "slower"
    return NOT_SIGNIFICANT


def summarize(ms: list[float]) -> dict[str, float | None]:
    """Median, mean, p10, p90, std and coefficient of variation (std / mean) of step times."""
    if not ms:
        return dict.fromkeys(("median", "mean", "p10", "p90", "std", "cv"))
    mean = statistics.fmean(ms)
    std = statistics.pstdev(ms)
    return {
        "median": statistics.median(ms),
        "mean": mean,
        "p10": _percentile(ms, 10),
        "p90": _percentile(ms, 90),
        "std": std,
        "cv": std / mean if mean else None,
    }


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
