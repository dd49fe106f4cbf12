"""Throughput's checks: the scenario of a run no other asks for. Its keys (bench.warmup_*,
bench.measure_*) are checked with the spec's own (validate/), so there is none here."""

from __future__ import annotations

from nanogpt.config.spec import RunSpec

RUN_KEYS: tuple[str, ...] = ()  # a point's runs are bench.repeats' alone


def asked(spec: RunSpec) -> bool:
    """Every run can be a throughput run; scenarios/base.of_spec asks it last (DEFAULT)."""
    del spec
    return True


def check(spec: RunSpec) -> None:
    """Nothing beyond the spec's own checks."""


def reads_held_out(spec: RunSpec) -> bool:
    """Its steps train on the training split only."""
    del spec
    return False


def run_spec(spec: RunSpec, number: int) -> RunSpec:
    """Every run of a point keeps its seed: repeats show the process's noise, not a seed's."""
    del number
    return spec
