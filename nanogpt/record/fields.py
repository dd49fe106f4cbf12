"""How a field of the record (results/record/) is marked: the metadata that decides where it
goes. One place for the markers, so that every part's dataclass, wherever it lives, uses them."""

from __future__ import annotations

from dataclasses import field

# Field metadata: a field marked json_only stays in result.json (and the W&B summary) and is no
# column of summary.csv: nested values (dicts, per-step lists) and text the table repeats.
JSON_ONLY = "json_only"
STEPS = "steps"  # marks Record.steps: steps.csv's rows, no field of result.json
# An asked field that is a config key: its column in summary.parquet is the key's path
# (`perf.dtype`), the name a user types and a sweep's swept column carries (analysis/tidy.py).
CONFIG = "config"


def json_only(**kwargs):
    """A record field kept out of summary.csv (`columns()`): result.json and W&B only."""
    kwargs.setdefault("default", None)
    return field(metadata={JSON_ONLY: True}, **kwargs)


def config_key(path: str, **kwargs):
    """An asked field holding the config key at `path` (its summary.parquet column)."""
    kwargs.setdefault("default", None)
    return field(metadata={CONFIG: path}, **kwargs)
