"""How a field of the record (results/record/) is marked: the metadata that decides where it
goes. One place for the markers, so that every part's dataclass, wherever it lives, uses them."""

from __future__ import annotations

import dataclasses
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
# How a point's runs (bench.repeats) pool a field, said on it (analysis/repeats.py): LARGEST,
# the largest of any run's (a peak; null where none has one); TOTAL, the runs' sum (a count over
# the measured steps; null unless every run counted it). Unmarked, the first run's, unless its
# part says more in a `pool_runs(parts)` of its own (Timing's steps, Energy's joules).
POOL = "pool"
LARGEST = "largest"
TOTAL = "total"
# A peak of memory that peak_memory weighs (analysis/derive.py): (its kind, "cuda" or "rss", and
# its window, "measured" or "warmup"); the kinds in the part's order, CUDA's first.
PEAK = "peak"


def json_only(**kwargs):
    """A record field kept out of summary.csv (`columns()`): result.json and W&B only; marks as
    `marked`'s (`json_only(pool=LARGEST)`)."""
    kwargs.setdefault("default", None)
    marks = {key: kwargs.pop(key) for key in _MARKS if key in kwargs}
    return field(metadata={JSON_ONLY: True, **_marks(**marks)}, **kwargs)


def config_key(path: str, **kwargs):
    """An asked field holding the config key at `path` (its summary.parquet column); marks as
    `marked`'s (`config_key("model.name", headline=91)`)."""
    kwargs.setdefault("default", None)
    marks = {key: kwargs.pop(key) for key in _MARKS if key in kwargs}
    return field(metadata={CONFIG: path, **_marks(**marks)}, **kwargs)


def marked(
    default=None,
    *,
    default_factory=None,
    headline: int | None = None,
    shown: tuple | None = None,
    pool: str | None = None,
    peak: tuple | None = None,
):
    """A record field with the rules its part gives it: its place among summary.csv's headline
    columns (`headline`), in the console's table (`shown`: place, header, format name), how
    runs pool it (`pool`: LARGEST or TOTAL) and which peak of memory it is (`peak`). A
    mutable default comes from `default_factory`, as dataclasses.field's."""
    metadata = _marks(headline, shown, pool, peak)
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


_MARKS = ("headline", "shown", "pool", "peak")


def _marks(headline=None, shown=None, pool=None, peak=None) -> dict:
    marks = {HEADLINE: headline, SHOWN: shown, POOL: pool, PEAK: peak}
    return {key: value for key, value in marks.items() if value is not None}


def pool_by_marks(parts: list):
    """A part of a point's runs pooled field by field as each field's mark says (POOL): the
    largest of any run's (a peak), the runs' total (a count; null unless every run counted
    it), else the first run's. The rule of every part without a `pool_runs` of its own."""
    pooled = dataclasses.replace(parts[0])
    for f in dataclasses.fields(pooled):
        values = [getattr(part, f.name) for part in parts]
        if f.metadata.get(POOL) == LARGEST:  # a run that measured 0 (a step that held no
            present = [v for v in values if v is not None]  # new bytes) measured something
            setattr(pooled, f.name, max(present) if present else None)
        elif f.metadata.get(POOL) == TOTAL:
            setattr(pooled, f.name, None if None in values else sum(values))
    return pooled


def pool_part(parts: list):
    """A part of a point's runs pooled by its own rule: its class's `pool_runs` where it has
    one (a rule the marks cannot say), else its fields' marks."""
    return getattr(type(parts[0]), "pool_runs", pool_by_marks)(parts)
