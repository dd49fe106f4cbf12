"""Throughput in the search (hydra/sweeper=tune, docs/tune.md): its objectives, read from a
point's flat record. Its quality guard is the search's default (tune/quality.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nanogpt.analysis import derive
from nanogpt.tune import objectives

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
    name: str, usd_per_hour: float | None, usd_per_kwh: float | None, target: float | None
) -> str | None:
    del target
    if name == "usd_per_1m_tokens" and usd_per_hour is None and usd_per_kwh is None:
        return "cost.usd_per_hour: usd_per_1m_tokens needs the machine's price; set it"
    return None
