"""Short names for the points of a sweep: the overrides that differ between them."""

from __future__ import annotations

import pandas as pd


def point_labels(table: pd.DataFrame, drop: tuple[str, ...] = ()) -> list[str]:
    """Per row, the overrides whose value is not the same in every row (minus `drop` keys)."""
    parsed = [parse_overrides(text) for text in table["overrides"]]
    keys = dict.fromkeys(key for point in parsed for key in point)
    varying = [
        key for key in keys if key not in drop and len({point.get(key) for point in parsed}) > 1
    ]
    return [" ".join(f"{k}={point[k]}" for k in varying if k in point) for point in parsed]


def parse_overrides(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in str(text).split() if "=" in item)
    return {key: value for key, _, value in pairs}
