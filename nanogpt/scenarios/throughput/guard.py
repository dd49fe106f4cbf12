"""Throughput in the search (hydra/sweeper=tune, docs/tune.md): its objectives, read from a
point's flat record, and its quality guard: a speed knob that changes training is no win, so
each finalist's loss after a few seeded steps is held against the baseline's (tune/quality.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanogpt.analysis import derive
from nanogpt.analysis.store import STEPS_FILE
from nanogpt.record.swept import point_key
from nanogpt.tune import objectives
from nanogpt.tune import quality as short_runs

if TYPE_CHECKING:
    from nanogpt.scenarios.base import Searching

OBJECTIVES = {  # tune.objective's names (config/choices.Objective) -> direction
    "tokens_per_s": "maximize",
    "usd_per_1m_tokens": "minimize",
    "j_per_token": "minimize",
    "peak_memory_gib": "minimize",
}
# the search's names -> a flat record's fields (tune/objectives.record_fields takes them in)
RECORD_FIELDS = {
    "tokens_per_s": "tokens_per_s",
    "tokens_per_s_ci_low": "tokens_per_s_ci_low",
    "tokens_per_s_ci_high": "tokens_per_s_ci_high",
    "j_per_token": "j_per_token",
}


def value(
    record: Mapping[str, Any],
    name: str,
    usd_per_hour: float | None,
    usd_per_kwh: float | None,
) -> float | None:
    tokens_per_s, j_per_token = record.get("tokens_per_s"), record.get("j_per_token")
    if name == "tokens_per_s":
        out = tokens_per_s
    elif name == "j_per_token":
        out = j_per_token
    elif name == "peak_memory_gib":
        out = objectives.peak_memory_gib(record)
    elif name == "usd_per_1m_tokens":  # as the table prices a point
        out = derive.usd_per_1m_tokens(tokens_per_s, j_per_token, usd_per_hour, usd_per_kwh)
    else:
        raise KeyError(name)
    return None if out is None or not math.isfinite(out) else float(out)


def needs(
    name: str, usd_per_hour: float | None, usd_per_kwh: float | None, asked: bool
) -> str | None:
    del asked  # its objectives read any run's record (one to a target has no tokens/s: null)
    if name == "usd_per_1m_tokens" and usd_per_hour is None and usd_per_kwh is None:
        return "cost.usd_per_hour: usd_per_1m_tokens needs the machine's price; set it"
    return None


def interval(record: Mapping[str, Any]) -> str | None:
    """The point's tokens/s interval, where both ends are known."""
    low, high = record.get("tokens_per_s_ci_low"), record.get("tokens_per_s_ci_high")
    return None if None in (low, high) else f"tokens/s [{low:,.0f}, {high:,.0f}]"


def quality(finalists: list, search: Searching) -> dict:
    """The baseline trained at every seed of hydra.sweeper.quality, each finalist at the first,
    `steps` steps each with the short protocol (tune/quality.protocol), all in one batch; a
    run's loss is the mean of its last `window` steps' (its steps.csv). Synthetic data: none."""
    settings = search.settings
    steps, window = int(settings.get("steps", 30)), int(settings.get("window", 5))
    kind = getattr(search.config.data.kind, "value", str(search.config.data.kind))

    def losses(runs: list[tuple[list[str], int]]) -> list[float | None]:
        """The baseline's and the finalists' guarded runs, one batch (a key twice: once)."""
        records = search.launch(
            [
                (
                    [*params, *short_runs.protocol(steps), f"bench.seed={seed}"],
                    f"quality seed={seed} {point_key(params)}",
                )
                for params, seed in runs
            ]
        )
        return [
            short_runs.final_loss(Path(rec["job_dir"]) / STEPS_FILE, window)
            if rec.get("status") == "ok"
            else None
            for rec in records
        ]

    return short_runs.check(settings, kind, search.baseline, finalists, losses)
