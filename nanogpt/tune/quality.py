"""A speed knob that changes training is no win: the quality guard.

Every leader and the baseline configuration train over the same seeded tokens (real data, the
same seed, the same tokens per optimizer step and the same number of steps, the loss read every
step). A leader's loss is the mean of its last `window` steps' losses. The noise floor is the
baseline's own spread over two seeds (its loss at seed A against seed B), never less than
`min_rel` of the baseline's loss (two seeds can agree by chance). A leader whose loss departs
from the baseline's at the same seed by more than the floor is flagged and not recommended.

With synthetic data (random tokens: nothing to learn) there is no loss to compare: the answer
says "quality not checked".

This is the throughput scenario's guard (scenarios/throughput/guard.py runs its points). Where a
target is set (bench.target_loss), the guard is that measurement instead: the time-to-loss
scenario's (scenarios/time_to_loss/guard.py). A short loss comparison would judge what the
target already does.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

REAL_DATA = ("text", "tokens")
NOT_CHECKED = "quality not checked: synthetic data (use data=text or data=tokens)"


def final_loss(steps_csv: Path, window: int) -> float | None:
    """Mean loss over the last `window` steps that read one (steps.csv of a point)."""
    if not steps_csv.is_file():
        return None
    with steps_csv.open(encoding="utf-8") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f) if row.get("loss")]
    tail = losses[-window:]
    return sum(tail) / len(tail) if tail else None


def noise_floor(baseline: list[float], min_rel: float) -> float:
    """The baseline's spread over its seeds, at least min_rel of its loss."""
    return max(max(baseline) - min(baseline), min_rel * abs(baseline[0]))


def verdict(baseline: list[float], leader: float, min_rel: float) -> dict:
    """{loss, baseline_loss, delta, floor, flagged}: delta is leader - baseline at the same
    seed (baseline[0]); flagged when |delta| > floor."""
    floor = noise_floor(baseline, min_rel)
    delta = leader - baseline[0]
    return {
        "loss": leader,
        "baseline_loss": baseline[0],
        "baseline_losses": list(baseline),
        "delta": delta,
        "floor": floor,
        "flagged": abs(delta) > floor,
    }


def protocol(steps: int) -> list[str]:
    """The overrides every guarded run gets: `steps` measured steps, each logging its loss, no
    warmup window, diagnosis or repeats to spend time on."""
    return [
        "bench.warmup_steps=1",
        "bench.warmup_s=0",
        f"bench.measure_steps={steps}",
        f"bench.min_measure_steps={steps}",
        "bench.measure_s=0",
        "bench.time_budget_s=1000000",
        "bench.diagnose=false",
        "bench.repeats=1",
        "logger.log_interval=1",
    ]


def check(
    settings: dict,
    data_kind: str,
    baseline: list[str],
    finalists: list,
    losses_of: Callable[[list[tuple[list[str], int]]], list[float | None]],
) -> dict:
    """The guard's answer for the finalists (entries with .key and .overrides): the baseline
    trained at every seed of `settings` (hydra.sweeper.quality), each finalist at the first one.
    `losses_of([(params, seed), ...])` runs those points, all in one batch (side by side on the
    launcher's slots), and returns each one's final_loss in order (None: it did not run)."""
    if data_kind not in REAL_DATA:
        return {"checked": False, "note": NOT_CHECKED}
    seeds = list(settings.get("seeds", [1337, 1338]))
    runs = [(baseline, seed) for seed in seeds] + [(e.overrides, seeds[0]) for e in finalists]
    losses = losses_of(runs)
    base, leaders = losses[: len(seeds)], losses[len(seeds) :]
    if any(b is None for b in base):
        return {"checked": False, "note": "quality not checked: the baseline did not run"}
    verdicts = {
        entry.key: (
            {"flagged": True, "note": "did not train"}
            if leader is None
            else verdict(base, leader, float(settings.get("min_rel", 0.005)))
        )
        for entry, leader in zip(finalists, leaders, strict=True)
    }
    return {
        "checked": True,
        "steps": int(settings.get("steps", 30)),
        "seeds": seeds,
        "verdicts": verdicts,
        "baseline": baseline,
    }
