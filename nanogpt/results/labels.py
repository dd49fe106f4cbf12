"""Short names for the points of a sweep: their swept keys (results/swept.py), as written."""

from __future__ import annotations

import pandas as pd

from nanogpt.results.swept import override_key, split_overrides, swept_keys


def point_labels(table: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """Per row, the overrides that set a swept key (minus `drop` keys): the same keys the
    table has a column for, so a label names what the sweep varies. "" for a point that sets
    none (the caller shows it as "defaults")."""
    points = [overrides_of(text) for text in table["overrides"]]
    keys = set(swept_keys(points)) - {key.lstrip("+") for key in drop}
    return [" ".join(o for o in point if override_key(o) in keys) for point in points]


def overrides_of(text) -> list[str]:
    """A table's overrides cell (space-separated; "defaults" for none) as a list."""
    return split_overrides(text)


def parse_overrides(text: str) -> dict[str, str]:
    """key -> value text of an overrides cell (keys without Hydra's `+`)."""
    pairs = (item.partition("=") for item in overrides_of(text) if "=" in item)
    return {key.lstrip("+"): value for key, _, value in pairs}
