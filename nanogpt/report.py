"""The sweep table: one row per point, from the records in a sweep dir.

`python -m nanogpt.report DIR [--baseline TEXT] [--plots]` (re)builds it for any sweep dir,
finished or not; a multirun builds it at its end. Writes DIR/summary.csv and DIR/summary.md.
Unreadable or half-written records are skipped and listed, never fatal.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from nanogpt import records

SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
FAILED_STATUSES = ("error", "interrupted")
PRINTED_COLUMNS = (
    "overrides",
    "status",
    "step_ms_median",
    "step_ms_cv",
    "tokens_per_s",
    "achieved_tflops",
    "mfu",
    "mfu_achievable",
    "mem_peak_rss_bytes",
    "mem_peak_allocated_bytes",
    "speedup",
)


class ReportError(Exception):
    pass


def load_records(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Readable records, one per point (the newest ok one wins), and the unreadable files."""
    by_point: dict[str, dict] = {}
    unreadable = []
    for path, record in records.iter_records(sweep_dir):
        if record is None:
            unreadable.append(path)
            continue
        record["job_dir"] = str(path.parent.resolve())
        record["_mtime"] = path.stat().st_mtime
        key = records.point_key(record.get("overrides") or [])
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


def build_table(sweep_dir: Path, baseline: str | None = None) -> tuple[pd.DataFrame, list[Path]]:
    rows, unreadable = load_records(sweep_dir)
    if not rows:
        raise ReportError(
            f"no readable result.json below {sweep_dir}; point the report at a sweep dir "
            "such as multirun/DATE/TIME"
        )
    table = pd.DataFrame(
        [{col: row.get(col) for col in records.RESULT_COLUMNS} for row in rows],
        columns=list(records.RESULT_COLUMNS),
    )
    table["overrides"] = [" ".join(row.get("overrides") or []) or "defaults" for row in rows]
    table["speedup"] = _speedup(table, baseline)
    return table, unreadable


def _speedup(table: pd.DataFrame, baseline: str | None) -> pd.Series:
    """tokens/s relative to the baseline row: the first ok point, or the first whose overrides
    contain `baseline`."""
    candidates = table[table["status"] == "ok"]
    if baseline is not None:
        candidates = candidates[candidates["overrides"].str.contains(baseline, regex=False)]
        if candidates.empty:
            raise ReportError(
                f"report.baseline='{baseline}' matches no ok point; use text from one of the "
                "overrides in the table"
            )
    if candidates.empty:
        return pd.Series([None] * len(table), index=table.index, dtype="float64")
    base = candidates["tokens_per_s"].iloc[0]
    return table["tokens_per_s"].astype("float64") / base


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
    records.write_atomic(sweep_dir / SUMMARY_CSV, table.to_csv(index=False))
    records.write_atomic(sweep_dir / SUMMARY_MD, to_markdown(table))


def failed_points(table: pd.DataFrame) -> list[str]:
    failed = table[table["status"].isin(FAILED_STATUSES)]
    return [f"{row.overrides} ({row.error})" for row in failed.itertuples()]


def printable(table: pd.DataFrame) -> str:
    shown = table[list(PRINTED_COLUMNS)].fillna(float("nan"))  # None prints as "-" too
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


def report(sweep_dir: Path, baseline: str | None = None, plots: bool = False) -> pd.DataFrame:
    """Build, write and print the table of a sweep dir."""
    table, unreadable = build_table(sweep_dir, baseline)
    write_summary(sweep_dir, table)
    print(printable(table))
    print(f"table: {sweep_dir / SUMMARY_CSV} ({len(table)} points)")
    for path in unreadable:
        print(f"skipped unreadable record: {path}", file=sys.stderr)
    if plots:
        from nanogpt.plots import write_plots

        for path in write_plots(sweep_dir, table):
            print(f"plot: {path}")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanogpt.report", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir, e.g. multirun/DATE/TIME")
    parser.add_argument("--baseline", help="text of the overrides of the speedup baseline row")
    parser.add_argument("--plots", action="store_true", help="also write PNG plots")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(
            f"error: sweep_dir: {args.sweep_dir} is not a directory; give a sweep dir "
            "such as multirun/DATE/TIME.",
            file=sys.stderr,
        )
        return 2
    try:
        report(args.sweep_dir, args.baseline, args.plots)
    except ReportError as err:
        print(f"error: {err}.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
