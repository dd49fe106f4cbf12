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
# Where a field is shown, said on the field so that a part owns it (a field added with a mark is
# a column there with no other edit): HEADLINE, its place among summary.csv's headline columns
# (analysis/tidy.py sorts by it); SHOWN, (its place, its header, its format: "text", "number",
# "percent" or "mebibytes") among the console's and summary.md's columns (analysis/display.py).
# A place is a number, unique in its list (the table's own figures have theirs: tidy.py,
# display.py).
HEADLINE = "headline"
SHOWN = "shown"


def json_only(**kwargs):
    """A record field kept out of summary.csv (`columns()`): result.json and W&B only."""
    kwargs.setdefault("default", None)
    return field(metadata={JSON_ONLY: True}, **kwargs)


def config_key(path: str, headline: int | None = None, **kwargs):
    """An asked field holding the config key at `path` (its summary.parquet column); `headline`
    as `shown_at`'s."""
    kwargs.setdefault("default", None)
    return field(metadata={CONFIG: path, **_places(headline, None)}, **kwargs)


def shown_at(default=None, *, headline: int | None = None, shown: tuple | None = None):
    """A record field with its place among summary.csv's headline columns (`headline`) and in
    the console's table (`shown`: place, header, format name); see HEADLINE and SHOWN."""
    return field(default=default, metadata=_places(headline, shown))


def _places(headline: int | None, shown: tuple | None) -> dict:
    return {
        **({HEADLINE: headline} if headline is not None else {}),
        **({SHOWN: shown} if shown is not None else {}),
    }
