"""Short names for the points of a sweep: their swept keys (record/swept.py), as written."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from nanogpt.record.swept import override_key, several_values, split_overrides, swept_keys

if TYPE_CHECKING:  # a table's type alone: the sweep's process names its runs without pandas
    import pandas as pd

MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of the multirun's config, in its sweep dir


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


def run_name(overrides: list[str], sweep_dir: Path | None, run: str | None = None) -> str:
    """A run's name on the console ([ok] and error lines): the overrides that set what its sweep
    varies, as written (interpolations unescaped), and which run of the point it is ("run
    2/3"). A fixed override (the same in every point: a model.build.* key, bench.device) is the
    sweep's, not the run's. Outside a multirun, or where the sweep's command line is not known
    (no multirun.yaml yet), every override."""
    varied = varied_keys(str(sweep_dir)) if sweep_dir else None
    named = [o for o in overrides if varied is None or override_key(o) in varied]
    if not named:  # a sweep that varies nothing (one point): what it sets, as swept_keys says
        named = overrides
    name = " ".join(named) or "defaults"
    return f"{name} (run {run})" if run else name


@functools.cache
def varied_keys(sweep_dir: str) -> frozenset[str] | None:
    """The keys a multirun sweeps: those its command line or preset (hydra.sweeper.params)
    gives several values (a comma list, a sweep function), read from Hydra's multirun.yaml;
    None when it is not there. Read once a process."""
    try:
        saved = yaml.safe_load((Path(sweep_dir) / MULTIRUN_FILE).read_text(encoding="utf-8"))
        hydra = saved["hydra"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    params = (hydra.get("sweeper") or {}).get("params") or {}
    given = [f"{k}={v}" for k, v in params.items()] + list(hydra["overrides"]["task"])
    return frozenset(
        override_key(o) for o in given if override_key(o) and several_values(o.partition("=")[2])
    )
