"""The figures a search can optimise, read from a point's record (result.json, flat).

One place names the record fields used (RECORD_FIELDS), so a renamed field is one line here.
Each objective has a direction; a figure the record cannot give is None (the trial then has no
value: infeasible for the search, with the reason).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from nanogpt.analysis import derive
from nanogpt.config.errors import ConfigError
from nanogpt.scenarios.time_to_loss import guard as ttl_guard

if TYPE_CHECKING:
    from nanogpt.config.spec import RunSpec

GIB = 2**30

# The record's fields the search reads (nanogpt/record/).
RECORD_FIELDS = {
    "status": "status",
    "error": "error",
    "tokens_per_s": "tokens_per_s",
    "tokens_per_s_ci_low": "tokens_per_s_ci_low",
    "tokens_per_s_ci_high": "tokens_per_s_ci_high",
    "j_per_token": "j_per_token",
    "peak": "peak_memory_bytes",  # the memory the point needs (analysis/derive.peak_memory)
    "peak_from": "peak_memory_from",  # which peak that is: "cuda ...", "rss ..."
    "estimate": "mem_estimate_bytes",
    "bottleneck": "bottleneck",
    "hint": "bottleneck_hint",
    "point_id": "point_id",
    "repeats": "repeats",
    "device": "device",
    **ttl_guard.RECORD_FIELDS,  # time to loss's (scenarios/time_to_loss/guard.py)
}

# name -> "maximize" | "minimize"
DIRECTIONS = {
    "tokens_per_s": "maximize",
    "usd_per_1m_tokens": "minimize",
    "j_per_token": "minimize",
    "peak_memory_gib": "minimize",
    ttl_guard.NAME: ttl_guard.DIRECTION,
}


def field(record: dict, name: str):
    """A record's figure by the search's name for it (RECORD_FIELDS)."""
    return record.get(RECORD_FIELDS[name])


def peak_memory_gib(record: dict) -> float | None:
    """The peak memory the point needs, as its record stores it (derive.peak_memory's rule,
    applied once when the record was made: the larger of warmup's and the measured steps'
    peaks; the CUDA allocator's where there is one, else the RSS)."""
    peak = field(record, "peak")
    return None if peak is None else peak / GIB


def footprint_bytes(record: dict) -> int | None:
    """What the point's training takes, to hold against a memory budget: the CUDA peak it
    needs (its stored peak_memory_bytes) where there is one, else the analytic estimate (a CPU
    process's RSS also holds the interpreter and torch, which no batch size changes)."""
    peak, which = field(record, "peak"), field(record, "peak_from")
    return peak if which and which.startswith("cuda") else field(record, "estimate")


def value(
    record: dict, name: str, usd_per_hour: float | None = None, usd_per_kwh: float | None = None
) -> float | None:
    """The objective `name` of an ok record; None where unknown."""
    if field(record, "status") not in ("ok", "skipped"):
        return None
    tokens_per_s = field(record, "tokens_per_s")
    j_per_token = field(record, "j_per_token")
    if name == "tokens_per_s":
        out = tokens_per_s
    elif name == "j_per_token":
        out = j_per_token
    elif name == "peak_memory_gib":
        out = peak_memory_gib(record)
    elif name == ttl_guard.NAME:  # the olympic mean of the runs (scenarios/time_to_loss/pool.py)
        out = field(record, ttl_guard.NAME)
    elif name == "usd_per_1m_tokens":  # as the table prices a point
        out = derive.usd_per_1m_tokens(tokens_per_s, j_per_token, usd_per_hour, usd_per_kwh)
    else:
        raise KeyError(name)
    return None if out is None or not math.isfinite(out) else float(out)


def values(record: dict, names: list[str], **prices) -> list[float | None]:
    return [value(record, name, **prices) for name in names]


def worst(name: str) -> float:
    """The value an infeasible trial is told: the worst there is, so a sampler never prefers it
    (its constraint says why)."""
    return 0.0 if DIRECTIONS[name] == "maximize" else math.inf


def needs(
    name: str,
    usd_per_hour: float | None,
    usd_per_kwh: float | None,
    target: float | None = None,
) -> str | None:
    """Why an objective cannot be computed with these settings (the key to set), or None."""
    if name == "usd_per_1m_tokens" and usd_per_hour is None and usd_per_kwh is None:
        return "cost.usd_per_hour: usd_per_1m_tokens needs the machine's price; set it"
    if name == ttl_guard.NAME:
        return ttl_guard.needs(target)
    return None


def check(names: list[str], prices: dict, target: float | None) -> None:
    """Every objective computable with these settings, else a ConfigError naming the key."""
    for name in names:
        why = needs(name, **prices, target=target)
        if why:
            raise ConfigError("tune.objective", f"{name} cannot be computed", why)


def objective_of(spec: RunSpec, record: dict) -> float | tuple[float, ...]:
    """The run's tune.objective from its record (flat; a kept run: its recorded figures): a
    float, or a tuple for several; NaN where the run failed or the figure is unknown, which
    Hydra's sweepers (Optuna's, Nevergrad's) take as a failed trial."""
    prices = {"usd_per_hour": spec.cost.usd_per_hour, "usd_per_kwh": spec.cost.usd_per_kwh}
    names = [o.value for o in spec.tune.objective]
    found = [value(record, name, **prices) for name in names]
    figures = tuple(math.nan if v is None else v for v in found)
    return figures[0] if len(figures) == 1 else figures
