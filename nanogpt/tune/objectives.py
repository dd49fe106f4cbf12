"""The figures a search can optimise, read from a point's record (result.json, flat).

Each scenario answers its own objectives (its guard: scenarios/base.Guard): throughput's
tokens/s, $ per 1M tokens, J per token and peak memory (scenarios/throughput/guard.py), time to
loss's time_to_loss (scenarios/time_to_loss/guard.py). This module asks the one whose name it is
and holds what every search reads besides (RECORD_FIELDS: status, peaks, the bottleneck). Each
objective has a direction; a figure the record cannot give is None (the trial then has no value:
infeasible for the search, with the reason).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from nanogpt.config.errors import ConfigError
from nanogpt.scenarios import base as scenarios

if TYPE_CHECKING:
    from nanogpt.config.spec import RunSpec

GIB = 2**30

# The record's fields every search reads (nanogpt/record/), besides its scenarios' own
# (record_fields).
RECORD_FIELDS = {
    "status": "status",
    "error": "error",
    "peak": "peak_memory_bytes",  # the memory the point needs (analysis/derive.peak_memory)
    "peak_from": "peak_memory_from",  # which peak that is: "cuda ...", "rss ..."
    "estimate": "mem_estimate_bytes",
    "bottleneck": "bottleneck",
    "hint": "bottleneck_hint",
    "point_id": "point_id",
    "repeats": "repeats",
    "device": "device",
}


@functools.cache
def record_fields() -> dict[str, str]:
    """The search's names -> a flat record's fields: RECORD_FIELDS and every scenario's (its
    guard's RECORD_FIELDS), asked when first read (a guard reads this module's helpers)."""
    return {
        **RECORD_FIELDS,
        **{k: v for s in scenarios.ALL for k, v in s.guard.RECORD_FIELDS.items()},
    }


@functools.cache
def directions() -> dict[str, str]:
    """Every objective's name -> "maximize" | "minimize", from each scenario's guard."""
    return {name: d for s in scenarios.ALL for name, d in s.guard.OBJECTIVES.items()}


def field(record: dict, name: str):
    """A record's figure by the search's name for it (record_fields)."""
    return record.get(record_fields()[name])


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
    """The objective `name` of an ok record, as its scenario's guard reads it; None where
    unknown."""
    if field(record, "status") not in ("ok", "skipped"):
        return None
    return scenarios.of_objective(name).guard.value(record, name, usd_per_hour, usd_per_kwh)


def values(record: dict, names: list[str], **prices) -> list[float | None]:
    return [value(record, name, **prices) for name in names]


def worst(name: str) -> float:
    """The value an infeasible trial is told: the worst there is, so a sampler never prefers it
    (its constraint says why)."""
    return 0.0 if directions()[name] == "maximize" else math.inf


def needs(
    name: str,
    usd_per_hour: float | None,
    usd_per_kwh: float | None,
    searched: scenarios.Scenario = scenarios.DEFAULT,
) -> str | None:
    """Why an objective cannot be computed with these settings (the key to set), or None;
    `searched`: the scenario the search's runs are (scenarios.of_spec of its config)."""
    scenario = scenarios.of_objective(name)
    return scenario.guard.needs(name, usd_per_hour, usd_per_kwh, scenario is searched)


def check(names: list[str], prices: dict, searched: scenarios.Scenario) -> None:
    """Every objective computable with these settings, else a ConfigError naming the key."""
    for name in names:
        why = needs(name, **prices, searched=searched)
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
