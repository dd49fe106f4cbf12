"""The record's fields as the W&B run summary keys them: namespaced by the part each belongs to,
as torchtitan names its metrics ("timing/step_ms_median", "rates/tokens_per_s", "point/status").
summary.csv and result.json keep the flat names (results/record/)."""

from __future__ import annotations

from typing import Any

from nanogpt.record import flat_fields


def part_of(name: str) -> str:
    """The part a flat field belongs to ("timing" for step_ms_median; TOP for status)."""
    for field_name, part, _ in flat_fields():
        if field_name == name:
            return part
    raise KeyError(name)


def summary_key(name: str) -> str:
    """A flat field's key in the W&B run summary, namespaced by its part as torchtitan names
    its metrics: "timing/step_ms_median", "rates/tokens_per_s", "point/status"."""
    return f"{part_of(name)}/{name}"


def namespaced(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat record (or part of one) keyed by summary_key; keys the record has not, as given."""
    parts = {name: part for name, part, _ in flat_fields()}
    return {f"{parts[k]}/{k}" if k in parts else k: v for k, v in flat.items()}
