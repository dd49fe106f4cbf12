"""The sweep table: one row per point, from the records in a sweep dir.

`publish` builds it, writes DIR/summary.csv and DIR/summary.md, prints it and draws the plots;
the multirun callback calls it at the end of a sweep, `python -m nanogpt.report DIR` for any
sweep dir, finished or not. Unreadable or half-written records are skipped and listed, never
fatal. The speedup baseline has one rule (`baseline_row`), which the notebook uses too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from nanogpt.faults import FAILED_STATUSES
from nanogpt.files import write_atomic
from nanogpt.results import compare, stats, store
from nanogpt.results.labels import point_labels
from nanogpt.results.record import RESULT_COLUMNS

SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
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


BASELINE_OVERRIDE = "report.baseline="
STEPS = "step_ms_measured"


class ReportError(Exception):
    pass


def load_records(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Readable records, one per point (the newest ok one wins), and the unreadable files."""
    by_point: dict[str, dict] = {}
    unreadable = []
    for path, record in store.iter_records(sweep_dir):
        if record is None:
            unreadable.append(path)
            continue
        record["job_dir"] = str(path.parent.resolve())
        record["_mtime"] = path.stat().st_mtime
        key = store.point_key(record.get("overrides") or [])
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


def build_table(
    sweep_dir: Path,
    baseline: str | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
) -> tuple[pd.DataFrame, list[Path]]:
    rows, unreadable = load_records(sweep_dir)
    if not rows:
        raise ReportError(
            f"no readable result.json below {sweep_dir}; point the report at a sweep dir "
            "such as multirun/DATE/TIME"
        )
    table = pd.DataFrame(
        [{col: row.get(col) for col in RESULT_COLUMNS} for row in rows],
        columns=list(RESULT_COLUMNS),
    )
    table["overrides"] = [" ".join(row.get("overrides") or []) or "defaults" for row in rows]
    # Each row's measured steps (a list per repeat), for intervals: kept beside the columns.
    table.attrs[STEPS] = [row.get("step_ms_measured") for row in rows]
    base = baseline_row(table, baseline)
    position = None if base is None else table.index.get_loc(base.name)
    compare.add_speedups(table, table.attrs[STEPS], position)
    table["compile_breakeven_steps"] = compare.compile_breakeven(table)
    compare.add_costs(table, usd_per_hour, usd_per_kwh)
    return table, unreadable


def baseline_row(table: pd.DataFrame, baseline: str | None = None) -> pd.Series | None:
    """The row speedups are measured against: the first ok point whose overrides contain
    `baseline` when it is given, else the first eager fp32 point, else the first ok point;
    None when no point is ok."""
    ok = table[table["status"] == "ok"]
    if baseline:
        ok = ok[[names_baseline(text, baseline) for text in ok["overrides"]]]
        if ok.empty:
            raise ReportError(
                f"report.baseline='{baseline}' matches no ok point; use text from one of the "
                "overrides in the table"
            )
    eager_fp32 = ok[(ok["compile"].astype(str) == "False") & (ok["dtype"] == "fp32")]
    rows = eager_fp32 if not eager_fp32.empty else ok
    return None if rows.empty else rows.iloc[0]


def names_baseline(overrides: str, baseline: str) -> bool:
    """Whether a point's override string contains the baseline text, not counting the
    report.baseline override itself (given on the command line, every point carries it)."""
    kept = [o for o in overrides.split() if not o.startswith(BASELINE_OVERRIDE)]
    return baseline in " ".join(kept)


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


def write_summary(sweep_dir: Path, table: pd.DataFrame) -> None:
    write_atomic(sweep_dir / SUMMARY_CSV, table.to_csv(index=False))
    write_atomic(sweep_dir / SUMMARY_MD, to_markdown(table))


def failed_points(table: pd.DataFrame) -> list[str]:
    failed = table[table["status"].isin(FAILED_STATUSES)]
    return [f"{row.overrides} ({row.error})" for row in failed.itertuples()]


def printable(table: pd.DataFrame) -> str:
    shown = table[list(PRINTED_COLUMNS)].fillna(float("nan"))  # None prints as "-" too
    shown["speedup"] = [speedup_text(row) for _, row in table.iterrows()]
    shown["steady"] = [steady_text(row) for _, row in table.iterrows()]
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
    """ "yes", or why the window may not read the steady state: "short" (cut or under a GPU's
    settling time) and/or "drift+3.1%" (the last third of the steps against the first)."""
    if row["steady"] is None or pd.isna(row["steady"]):
        return "-"
    if bool(row["steady"]):
        return "yes"
    note, marks = row["steady_note"] or "", []
    if "measured" in note:
        marks.append("short")
    if "third" in note and pd.notna(row["drift_pct"]):
        marks.append(f"drift{row['drift_pct']:+.1f}%")
    return ",".join(marks) or "no"


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
    plots: bool = False,
    memory_budget_gib: float | None = None,
    usd_per_hour: float | None = None,
    usd_per_kwh: float | None = None,
) -> pd.DataFrame:
    """Build, write and print the table of a sweep dir, and the recommendation under it."""
    table, unreadable = build_table(sweep_dir, baseline, usd_per_hour, usd_per_kwh)
    write_summary(sweep_dir, table)
    print(printable(table))
    print(f"table: {sweep_dir / SUMMARY_CSV} ({len(table)} points)")
    names = [label or "defaults" for label in point_labels(table)]
    for line in compare.recommend(table, table.attrs[STEPS], names, memory_budget_gib):
        print(line)
    for path in unreadable:
        print(f"skipped unreadable record: {path}", file=sys.stderr)
    if plots:
        from nanogpt.results.plots import write_plots  # matplotlib only when asked for

        for path in write_plots(sweep_dir, table):
            print(f"plot: {path}")
    return table
