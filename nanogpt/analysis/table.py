"""The sweep table: one row per point, from the records in a sweep dir.

`build_table` makes it (a `Sweep`: the table, the long steps table, the swept keys and which
point is the baseline); `publish` also writes DIR/summary.csv, summary.parquet, steps.parquet
and summary.md (analysis/tidy.py) and prints it; the entry points draw the plots
(nanogpt/publish/plots.py). The multirun callback calls
it at the end of a sweep, `python -m nanogpt.report DIR` for any sweep dir, finished or not,
and the notebook builds the same table. Columns: the record's (results/record/ `columns()`:
every field of its dataclasses not marked json-only), one per
swept key after `overrides` (record/swept.py; a key that is already a record column, such as
`model`, is not repeated), then speedups against the baseline (analysis/baseline.py), break-even
and cost. Unreadable or half-written records are skipped and listed, never fatal.
`read_summary(path)` reads summary.csv back with its types.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nanogpt.analysis import baseline as baseline_rule
from nanogpt.analysis import compare, display, memory_time, store, sweep_steps, tidy, versions
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.tidy import SUMMARY_CSV, SUMMARY_MD, read_summary  # noqa: F401 (documented)
from nanogpt.record import columns, swept
from nanogpt.record.faults import FAILED_STATUSES
from nanogpt.scenarios import base as scenarios


class ReportError(Exception):
    pass


def load_records(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Readable records, one per point (the newest ok one wins), and the unreadable files. Each
    point's runs are pooled first (store.pool_sweep: POINT/result.json); a point pooled now is
    kept as pooled, its steps with it (`steps`: steps.csv's rows), not read back. A record moved
    aside (SWEEP_DIR/moved/: a resumed sweep whose points changed) is no row: the table is the
    sweep's current points."""
    pooled = {
        where: record.to_dict(steps=True) for where, record in store.pool_sweep(sweep_dir).items()
    }
    by_point: dict[str, dict] = {}
    unreadable = []
    for path, record in store.iter_records(sweep_dir, moved=False, known=pooled):
        if record is None:
            unreadable.append(path)
            continue
        record["job_dir"] = str(path.parent.resolve())
        record["_mtime"] = path.stat().st_mtime
        key = record.get("point_id") or store.point_key(record.get("overrides") or [])
        if _better(record, by_point.get(key)):
            by_point[key] = record
    rows = sorted(by_point.values(), key=lambda r: _natural(r["job_dir"]))
    return rows, unreadable


def _better(new: dict, old: dict | None) -> bool:
    if old is None:
        return True
    new_ok, old_ok = new["status"] == "ok", old["status"] == "ok"
    return new_ok > old_ok or (new_ok == old_ok and new["_mtime"] >= old["_mtime"])


def _natural(text: str) -> list:
    """Sort key that puts job 10 after job 9."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclass
class Sweep:
    """A sweep as every output takes it (summary files, console, plots, loss curves, the W&B
    table and view, a search's answer, compare), built once by `build_table`: no output reads a
    record file again."""

    table: pd.DataFrame  # one row per point: the record's columns, swept keys, speedups
    steps: pd.DataFrame  # the long steps table (analysis/sweep_steps.py), keyed by job_dir
    swept: list[str]  # the swept keys, one column each (record/swept.py)
    baseline: str  # which point is the speedup baseline, and why
    unreadable: list[Path] = field(default_factory=list)
    # the points' records (flat, with job_dir; the table's rows in its order): their json-only
    # fields too (mem_estimate, ttl_evals, ...), which the table has no column for
    points: list[dict] = field(default_factory=list)

    def point(self, job_dir) -> dict:
        """The record of the point measured at `job_dir` (a table row's), {} if none."""
        wanted = str(job_dir)
        return next((p for p in self.points if p.get("job_dir") == wanted), {})

    def series(self) -> list:
        """Each row's measured steps (a list per repeat), found by its job_dir."""
        return sweep_steps.series(self.steps, self.table["job_dir"])


def build_table(
    sweep_dir: Path,
    baseline: str | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
    ttl_alpha: float | None = None,
) -> Sweep:
    """The table of a sweep dir; `baseline` is text of the baseline point's overrides (None:
    the rule of analysis/baseline.py); `ttl_alpha` the time-to-loss verdict's threshold
    (report.ttl_alpha; None: scenarios/time_to_loss/pool.ALPHA). Raises ReportError when nothing is
    readable or the baseline names no ok point."""
    rows, unreadable = load_records(sweep_dir)
    if not rows:
        raise ReportError(
            f"no readable result.json below {sweep_dir}; point the report at a sweep dir "
            "such as multirun/DATE/TIME"
        )
    names = columns()  # the record's own (results/record/): its fields not json-only
    table = pd.DataFrame([{col: row.get(col) for col in names} for row in rows], columns=names)
    table["overrides"] = [" ".join(row.get("overrides") or []) or "defaults" for row in rows]
    points = [row.get("overrides") or [] for row in rows]
    keys = [key for key in swept.swept_keys(points) if key not in table.columns]
    values = [swept.point_values(point) for point in points]
    at = table.columns.get_loc("overrides") + 1
    for offset, key in enumerate(keys):
        table.insert(at + offset, key, pd.Series([v.get(key) for v in values], dtype=object))
    steps = sweep_steps.build(rows)
    try:
        choice = baseline_rule.choose(table, baseline)
    except baseline_rule.BaselineError as err:
        raise ReportError(str(err)) from None
    sweep = Sweep(table, steps, keys, "", unreadable, rows)
    for scenario in scenarios.ALL:  # each its comparison: throughput's speedups, time to loss's
        scenario.pool.compare(sweep, choice.position, ttl_alpha)
    table["compile_breakeven_steps"] = compare.compile_breakeven(table)
    reasons = [row.get("graph_break_reasons") for row in rows]  # json-only: from the records
    table["compile_verdict"] = compare.compile_verdict(table, reasons)
    compare.add_costs(table, usd_per_hour, usd_per_kwh)
    memory_time.add_columns(table)  # a policy's memory saved and step time paid
    if choice.position is None:
        sweep.baseline = f"baseline: none ({choice.reason})"
    else:
        name = point_labels(table)[choice.position] or "defaults"
        sweep.baseline = f"baseline: {name} ({choice.reason})"
    return sweep


def write_summary(sweep_dir: Path, sweep: Sweep) -> None:
    """summary.csv, summary.parquet, steps.parquet and summary.md (which names the baseline)."""
    markdown = f"{sweep.baseline}\n\n{display.markdown(sweep.table)}"
    footer = versions.footer(sweep.points)
    markdown += f"\n{footer}\n" if footer else ""
    tidy.write(sweep_dir, sweep.table, sweep.swept, sweep.steps, markdown)


def failed_points(table: pd.DataFrame) -> list[str]:
    failed = table[table["status"].isin(FAILED_STATUSES)]
    return [f"{row.overrides} ({row.error})" for row in failed.itertuples()]


def publish(
    sweep_dir: Path,
    baseline: str | None = None,
    memory_budget_gib: float | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
    ttl_alpha: float | None = None,
    only: dict[str, str] | None = None,
) -> Sweep:
    """Build, write and print the table of a sweep dir, and the recommendation under it (the
    plots are the entry points' to draw: nanogpt/publish/plots.py). `only`: the job dirs to
    print (-> the name each is shown by), compared with each other alone (a search prints its
    finalists, `within`; the files keep every point), with no recommendation (the search's
    answer is its own)."""
    sweep = build_table(sweep_dir, baseline, usd_per_hour, usd_per_kwh, ttl_alpha)
    table = sweep.table
    write_summary(sweep_dir, sweep)
    if only is not None:
        rows = within(sweep, list(only))
        names = {str(Path(d).resolve()): name for d, name in only.items()}
        print(display.console(rows, [names[str(d)] for d in rows["job_dir"]]))
        print(f"table: {sweep_dir / SUMMARY_CSV} ({len(table)} points, every rung's)")
        return sweep
    print(display.console(table))
    print(sweep.baseline)
    print(f"table: {sweep_dir / SUMMARY_CSV} ({len(table)} points)")
    footer = versions.footer(sweep.points)
    if footer:
        print(footer)
    names = [label or "defaults" for label in point_labels(table)]
    for line in compare.recommend(table, sweep.series(), names, memory_budget_gib):
        print(line)
    line = memory_time.best_line(table, names, sweep.series())
    if line:
        print(line)
    for path in sweep.unreadable:
        print(f"skipped unreadable record: {path}", file=sys.stderr)
    return sweep


def within(sweep: Sweep, job_dirs: list[str]) -> pd.DataFrame:
    """The rows measured at `job_dirs`, their speedups against their own baseline (the rule's):
    points one rung of a search measured, compared with each other only."""
    wanted = {str(Path(d).resolve()) for d in job_dirs}
    keep = [i for i, d in enumerate(sweep.table["job_dir"]) if str(d) in wanted]
    rows = sweep.table.iloc[keep].reset_index(drop=True).copy()
    series = sweep.series()
    choice = baseline_rule.choose(rows) if len(rows) else None
    compare.add_speedups(rows, [series[i] for i in keep], choice and choice.position)
    return rows
