"""The sweep table: one row per point, from the records in a sweep dir.

`build_table` makes it (a `Sweep`: the table, the long steps table, the swept keys and which
point is the baseline); `publish` also writes DIR/summary.csv, summary.parquet, steps.parquet
and summary.md (results/tidy.py) and prints it; the entry points draw the plots
(nanogpt/reporters/plots.py). The multirun callback calls
it at the end of a sweep, `python -m nanogpt.report DIR` for any sweep dir, finished or not,
and the notebook builds the same table. Columns: the record's (results/record.py `columns()`:
every field of its dataclasses not marked json-only), one per
swept key after `overrides` (results/swept.py; a key that is already a record column, such as
`model`, is not repeated), then speedups against the baseline (results/baseline.py), break-even
and cost. Unreadable or half-written records are skipped and listed, never fatal.
`read_summary(path)` reads summary.csv back with its types.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nanogpt.faults import FAILED_STATUSES
from nanogpt.results import baseline as baseline_rule
from nanogpt.results import compare, stats, store, sweep_steps, swept, tidy
from nanogpt.results.derive import DRIFT
from nanogpt.results.labels import point_labels
from nanogpt.results.record import columns
from nanogpt.results.tidy import SUMMARY_CSV, SUMMARY_MD, read_summary  # noqa: F401 (documented)

PRINTED_COLUMNS = (
    "overrides",
    "status",
    "step_ms_median",
    "step_ms_cv",
    "steady",
    "tokens_per_s",
    "achieved_tflops",
    "mfu",
    "mfu_achievable",
    "mem_peak_rss_bytes",
    "mem_peak_allocated_bytes",
    "bottleneck",
    "speedup",
)


class ReportError(Exception):
    pass


def load_records(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Readable records, one per point (the newest ok one wins), and the unreadable files. A
    record moved aside (SWEEP_DIR/moved/: a resumed sweep whose points changed) is no row: the
    table is the sweep's current points."""
    by_point: dict[str, dict] = {}
    unreadable = []
    for path, record in store.iter_records(sweep_dir, moved=False):
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
    """A sweep's table and what goes with it."""

    table: pd.DataFrame  # one row per point: the record's columns, swept keys, speedups
    steps: pd.DataFrame  # the long steps table (results/sweep_steps.py), keyed by job_dir
    swept: list[str]  # the swept keys, one column each (results/swept.py)
    baseline: str  # which point is the speedup baseline, and why
    unreadable: list[Path] = field(default_factory=list)

    def series(self) -> list:
        """Each row's measured steps (a list per repeat), found by its job_dir."""
        return sweep_steps.series(self.steps, self.table["job_dir"])


def build_table(
    sweep_dir: Path,
    baseline: str | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
) -> Sweep:
    """The table of a sweep dir; `baseline` is text of the baseline point's overrides (None:
    the rule of results/baseline.py). Raises ReportError when nothing is readable or the
    baseline names no ok point."""
    rows, unreadable = load_records(sweep_dir)
    if not rows:
        raise ReportError(
            f"no readable result.json below {sweep_dir}; point the report at a sweep dir "
            "such as multirun/DATE/TIME"
        )
    names = columns()  # the record's own (results/record.py): its fields not json-only
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
    sweep = Sweep(table, steps, keys, "", unreadable)
    compare.add_speedups(table, sweep.series(), choice.position)
    table["compile_breakeven_steps"] = compare.compile_breakeven(table)
    compare.add_costs(table, usd_per_hour, usd_per_kwh)
    if choice.position is None:
        sweep.baseline = f"baseline: none ({choice.reason})"
    else:
        name = point_labels(table)[choice.position] or "defaults"
        sweep.baseline = f"baseline: {name} ({choice.reason})"
    return sweep


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (no extra dependency)."""
    cells = table.map(_cell)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def write_summary(sweep_dir: Path, sweep: Sweep) -> None:
    """summary.csv, summary.parquet, steps.parquet and summary.md (which names the baseline)."""
    markdown = f"{sweep.baseline}\n\n{to_markdown(sweep.table)}"
    tidy.write(sweep_dir, sweep.table, sweep.steps, markdown)


def failed_points(table: pd.DataFrame) -> list[str]:
    failed = table[table["status"].isin(FAILED_STATUSES)]
    return [f"{row.overrides} ({row.error})" for row in failed.itertuples()]


def printable(table: pd.DataFrame) -> str:
    shown = table[list(PRINTED_COLUMNS)].fillna(float("nan"))  # None prints as "-" too
    shown["speedup"] = [speedup_text(row) for _, row in table.iterrows()]
    shown["steady"] = [steady_text(row) + contended_text(row) for _, row in table.iterrows()]
    if "co_running" in table and table["co_running"].map(lambda v: isinstance(v, list)).any():
        # points run side by side (hydra/launcher=parallel): how many ran beside each
        beside = [len(v) if isinstance(v, list) else "-" for v in table["co_running"]]
        shown.insert(2, "beside", beside)
    for col in ("mem_peak_rss_bytes", "mem_peak_allocated_bytes"):
        shown[col] = shown[col].astype("float64") / 2**20
    shown = shown.rename(
        columns={
            "mem_peak_rss_bytes": "rss_MiB",
            "mem_peak_allocated_bytes": "cuda_alloc_MiB",
            "step_ms_median": "step_ms",
        }
    )
    return shown.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-")


def steady_text(row: pd.Series) -> str:
    """ "yes", or why the window may not read the steady state, from the record's reason codes
    (results/derive.py): "short" (cut or under a GPU's settling time) and/or "drift+3.1%" (the
    last third of the steps against the first)."""
    if row["steady"] is None or pd.isna(row["steady"]):
        return "-"
    if bool(row["steady"]):
        return "yes"
    reasons = row.get("unsteady_reasons")
    marks = []
    for reason in reasons if isinstance(reasons, list) else []:
        if reason == DRIFT and pd.notna(row["drift_pct"]):
            marks.append(f"drift{row['drift_pct']:+.1f}%")
        else:
            marks.append(reason)
    return ",".join(marks) or "no"


def contended_text(row: pd.Series) -> str:
    """ ",contended" when another process used the device in the measured window, else ""."""
    flag = row.get("contended")
    return ",contended" if flag is not None and not pd.isna(flag) and bool(flag) else ""


def speedup_text(row: pd.Series) -> str:
    """E.g. "1.31 [1.27-1.35]", or "~1.02 [0.97-1.07]" when the difference is not significant
    (benchstat's "~"); "-" where there is no speedup."""
    if pd.isna(row["speedup"]):
        return "-"
    if row["speedup_verdict"] == "baseline":
        return "1 (baseline)"
    mark = "~" if row["speedup_verdict"] == stats.NOT_SIGNIFICANT else ""
    interval = f" [{row['speedup_ci_low']:.3g}-{row['speedup_ci_high']:.3g}]"
    return f"{mark}{row['speedup']:.3g}{interval if pd.notna(row['speedup_ci_low']) else ''}"


def publish(
    sweep_dir: Path,
    baseline: str | None = None,
    memory_budget_gib: float | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
) -> Sweep:
    """Build, write and print the table of a sweep dir, and the recommendation under it (the
    plots are the entry points' to draw: nanogpt/reporters/plots.py)."""
    sweep = build_table(sweep_dir, baseline, usd_per_hour, usd_per_kwh)
    table = sweep.table
    write_summary(sweep_dir, sweep)
    print(printable(table))
    print(sweep.baseline)
    print(f"table: {sweep_dir / SUMMARY_CSV} ({len(table)} points)")
    names = [label or "defaults" for label in point_labels(table)]
    for line in compare.recommend(table, sweep.series(), names, memory_budget_gib):
        print(line)
    for path in sweep.unreadable:
        print(f"skipped unreadable record: {path}", file=sys.stderr)
    return sweep
