"""A sweep's table as every entry point shows it: the multirun's end (frontend/callback.py),
`python -m nanogpt.report DIR` and a search's Ctrl-C (frontend/tune_sweeper.py) call this one
sequence,
so what one prints the others print: analysis/table.publish with the sweep's report and cost
settings (a search's answer, tune.json, shows its finalists alone), the plots when
report.plots asks, then a search's closing lines."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanogpt.analysis import table as sweep_table

# The sweep's settings its table is built with: (config section, key) -> publish's argument name
SETTINGS = {
    ("report", "baseline"): "baseline",
    ("report", "plots"): "plots",
    ("report", "memory_budget_gib"): "memory_budget_gib",
    ("report", "ttl_alpha"): "ttl_alpha",
    ("cost", "usd_per_hour"): "usd_per_hour",
    ("cost", "usd_per_kwh"): "usd_per_kwh",
}


def settings_of(config) -> dict:
    """SETTINGS read from a sweep's composed config (its sections read as attributes)."""
    return {
        name: getattr(getattr(config, section), key) for (section, key), name in SETTINGS.items()
    }


def publish(sweep_dir: Path, settings: dict, notes: list[str] = ()) -> sweep_table.Sweep:
    """Build, write and print the sweep's table (`settings`: SETTINGS' names; an empty baseline
    is the baseline rule's), draw its plots if settings["plots"], print `notes`, then a search's
    closing lines. Raises analysis/table.ReportError as table.publish does."""
    # pandas and the table's code, imported here: a sweep refused before it runs never builds
    # a table, and its process never imports them (a third of a second on 2 cores)
    from nanogpt.analysis import table as sweep_table
    from nanogpt.publish import tune_answer as answer

    settings = dict(settings)
    plots = settings.pop("plots", False)
    settings["baseline"] = settings.get("baseline") or None
    search = answer.read(sweep_dir)  # hydra/sweeper=tune: its finalists, then its answer
    only = answer.finalists(search) if search else None
    sweep = sweep_table.publish(sweep_dir, **settings, only=only)
    if plots:
        from nanogpt.publish.plots import write_plots  # matplotlib only when asked for

        for path in write_plots(sweep_dir, sweep):
            print(f"plot: {path}")
    for line in [*notes, *(answer.closing_lines(search) if search else [])]:
        print(line)  # a search closes with its answer
    return sweep
