"""The sweep table as people read it: the console's table, which summary.md also is.

summary.csv and summary.parquet keep the numbers as numbers (analysis/tidy.py); this module turns
a few headline columns into text for a reader: thousands separated (30,822 tok/s), three
significant figures (16.6 ms), shares in percent (8.2 %), bytes in MiB, never an exponent. The
columns shown are `SHOWN` (each a record column, the label it is shown under and its format),
each field's place, label and format said on the field by its part (record/fields.py, SHOWN);
each point is named by what the sweep varies (analysis/labels.py), not by every override.
"""

from __future__ import annotations

import math

import pandas as pd

from nanogpt.analysis import stats
from nanogpt.analysis.derive import DRIFT
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.stats import ONE_PROCESS
from nanogpt.record import flat_fields
from nanogpt.record.fields import SHOWN as SHOWN_MARK
from nanogpt.scenarios import base as scenarios

MIB = 2**20


def number(value, digits: int = 3) -> str:
    """A number for a reader: `digits` significant figures, thousands separated, no exponent
    (30822.4 -> "30,822", 16.61 -> "16.6", 0.000123 -> "0.000123"); "-" for none."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "-"
    value = float(value)
    if value == 0 or math.isinf(value):
        return f"{value:g}"
    whole_digits = math.floor(math.log10(abs(value))) + 1
    return f"{value:,.{max(0, digits - whole_digits)}f}"


def percent(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{number(100 * float(value), 2)} %"


def mebibytes(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{float(value) / MIB:,.0f}"


# A field's format by the name its part gives it (record/fields.py, SHOWN)
FORMATS = {"text": str, "number": number, "percent": percent, "mebibytes": mebibytes}


def _shown() -> tuple[tuple, ...]:
    """SHOWN: every field marked with a place in the console's table (record/fields.py, SHOWN:
    `marked(shown=(20, "step_ms", "number"))` on Timing.step_ms_median), and every scenario's
    comparison columns that it shows (its part's COMPARED_SHOWN: time to loss's p-value and
    verdict), by place."""
    fields = [
        (name, f.metadata[SHOWN_MARK]) for name, _, f in flat_fields() if SHOWN_MARK in f.metadata
    ]
    compared = [(n, m) for s in scenarios.ALL for n, m in s.part.COMPARED_SHOWN.items()]
    places: dict[int, tuple] = {}
    for name, (place, header, fmt) in fields + compared:
        if place in places:
            raise ValueError(f"console place {place} taken by {places[place][0]} and {name}")
        places[place] = (name, header, FORMATS[fmt])
    return tuple(places[p] for p in sorted(places))


# (record column, shown as, format): the console's and summary.md's columns, after `point`.
SHOWN = _shown()


def shown(table: pd.DataFrame, names: list[str] | None = None) -> pd.DataFrame:
    """The table as text cells: the point (`names`, else what the sweep varies), the SHOWN
    columns that any row fills, how many points ran beside it (when any did: the parallel
    launcher), steadiness and the speedup (when any row has them)."""
    out = pd.DataFrame(index=table.index)
    out["point"] = [label or "defaults" for label in names or point_labels(table)]
    for column, label, fmt in SHOWN:
        if column in table and table[column].notna().any():
            out[label] = [fmt(v) if pd.notna(v) else "-" for v in table[column]]
    # a checkpointing or offload policy against its twin that keeps everything
    # (analysis/memory_time.py): MiB saved a percent of step time paid
    if "ac_mib_per_pct" in table and table["ac_memory_saved_bytes"].notna().any():
        out[MEMORY_FOR_TIME] = [
            memory_for_time_text(s, r)
            for s, r in zip(table["ac_memory_saved_bytes"], table["ac_mib_per_pct"], strict=True)
        ]
    rows = [row for _, row in table.iterrows()]
    steady = [steady_text(row) + contended_text(row) for row in rows]
    if "co_running" in table and table["co_running"].map(lambda v: bool(v)).any():
        beside = [len(v) if isinstance(v, list) else "-" for v in table["co_running"]]
        out.insert(2, "beside", beside)  # the parallel launcher ran points side by side
    speedup = [speedup_text(row) for row in rows]
    for label, cells in (("steady", steady), ("speedup", speedup)):
        if any(cell != "-" for cell in cells):  # a time-to-loss sweep has neither
            out[label] = cells
    return out


MEMORY_FOR_TIME = "memory saved ÷ time paid"


def memory_for_time_text(saved, ratio) -> str:
    """MiB a percent of step time, "free" where the saving cost no measured time."""
    if saved is None or pd.isna(saved):
        return "-"
    if ratio is None or pd.isna(ratio):
        return "free" if saved > 0 else "-"
    return f"{number(ratio, 3)} MiB/%"


def console(table: pd.DataFrame, names: list[str] | None = None) -> str:
    """The table the console prints, with a note under it when a verdict rests on one process."""
    text = shown(table, names).to_string(index=False)
    return text + "".join(f"\n{line}" for line in notes(table))


def markdown(table: pd.DataFrame) -> str:
    """The same table in GitHub-flavoured markdown (summary.md)."""
    return to_markdown(shown(table)) + "".join(f"\n{line}\n" for line in notes(table))


def notes(table: pd.DataFrame) -> list[str]:
    if "speedup_verdict" not in table:
        return []
    verdicts = table["speedup_verdict"].dropna().astype(str)
    if not verdicts.str.endswith(ONE_PROCESS).any():
        return []
    return [
        "* within one process a point: a machine's speed drifts between processes more than "
        "within one; measure with bench.repeats=3 to judge on the noise between processes"
    ]


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
        return number(value, 4)
    return str(value).replace("|", "\\|")


def steady_text(row: pd.Series) -> str:
    """ "yes", or why the window may not read the steady state, from the record's reason codes
    (analysis/derive.py): "short" (cut or under a GPU's settling time), "drift+3.1%" (the
    last third of the steps against the first), "recompile" (torch.compile compiled during the
    measured steps)."""
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
    """E.g. "1.31 [1.27-1.35]", "~1.02 [0.97-1.07]" when the difference is not significant
    (benchstat's "~"), a trailing "*" when the verdict holds within one process only; "-"
    where there is no speedup."""
    if pd.isna(row["speedup"]):
        return "-"
    verdict = str(row["speedup_verdict"])
    if verdict == "baseline":
        return "1 (baseline)"
    mark = "~" if verdict == stats.NOT_SIGNIFICANT else ""
    low, high = row["speedup_ci_low"], row["speedup_ci_high"]
    interval = f" [{number(low)}-{number(high)}]" if pd.notna(low) else ""
    star = "*" if verdict.endswith(ONE_PROCESS) else ""
    return f"{mark}{number(row['speedup'])}{interval}{star}"
