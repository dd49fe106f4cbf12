"""Memory for time: what a checkpointing or offload policy (perf.ac, perf.offload) saved in memory
against its twin that keeps every activation on the device (the same overrides, perf.ac=none and
perf.offload=none), and what it paid in step time; the table's columns, and the console's line
naming the policy that buys the most memory a percent of step time (+sweep=memory_time).

The memory compared is what a step holds (`step_memory`): on CUDA the point's peak (the
allocator's), on a CPU the RSS a measured step held above what the steps started at
(mem_step_rss_bytes), since the measuring processes' own RSS differ by MiBs that are no step's.
"""

from __future__ import annotations

import math

import pandas as pd

from nanogpt.analysis import stats
from nanogpt.analysis.compare import comparable, measured_peak, speedup
from nanogpt.analysis.display import number
from nanogpt.record.swept import override_key, point_key, split_overrides

MIB = 2**20
# The keys that choose a policy: a point without them is its policy's twin
POLICY_KEYS = {
    "perf.ac",
    "perf.ac_every",
    "perf.ac_policy",
    "perf.ac_budget",
    "perf.offload",
    "perf.activation_checkpointing",
}
COLUMNS = ("ac_memory_saved_bytes", "ac_time_paid_pct", "ac_mib_per_pct")


def step_memory(table: pd.DataFrame) -> tuple[pd.Series, str]:
    """Bytes a step holds, per row, and what they are: the CUDA allocator's peak where the sweep
    has one, else the RSS above the measured steps' start (a peak RSS where a record lacks it)."""
    peak, name = measured_peak(table)
    if name.startswith("peak CUDA") or "mem_step_rss_bytes" not in table:
        return peak, name
    step = pd.to_numeric(table["mem_step_rss_bytes"], errors="coerce").astype("float64")
    return step.fillna(peak), "RSS a step holds above its start"


def _keeps_all(row: pd.Series) -> bool:
    return row.get("ac") == "none" and row.get("offload") in (None, "none")


def add_columns(table: pd.DataFrame) -> None:
    """In place, for each ok point with a policy whose twin is ok in the table:
    ac_memory_saved_bytes (the twin's step memory less its own), ac_time_paid_pct (its median
    step over the twin's, less 1, in percent) and ac_mib_per_pct ("memory saved ÷ time paid":
    MiB saved a percent of step time; null where no time was paid: the saving was free)."""
    memory, _ = step_memory(table)
    values = {name: pd.Series(math.nan, index=table.index, dtype="float64") for name in COLUMNS}
    for index, twin in twins(table).items():
        row = table.loc[index]
        saved = memory[twin] - memory[index]
        paid = 100 * (row["step_ms_median"] / table.at[twin, "step_ms_median"] - 1)
        values["ac_memory_saved_bytes"][index] = saved
        values["ac_time_paid_pct"][index] = paid
        if paid > 0:
            values["ac_mib_per_pct"][index] = saved / MIB / paid
    for name, series in values.items():
        table[name] = series


def twins(table: pd.DataFrame) -> dict:
    """Each ok point with a policy -> its twin that keeps everything, where that is ok in the
    table (row labels)."""
    keeps = {}
    for index, row in table.iterrows():
        if row["status"] == "ok" and _keeps_all(row):
            keeps[_twin_key(row["overrides"])] = index
    found = {}
    for index, row in table.iterrows():
        twin = keeps.get(_twin_key(row["overrides"]))
        if twin is not None and twin != index and row["status"] == "ok" and row.get("ac"):
            found[index] = twin
    return found


def best_line(table: pd.DataFrame, names: list[str], steps: list) -> str | None:
    """The console's line: the policy that bought the most memory a percent of step time (one
    that saved memory at no measured time cost first), with what it saved and paid, and its
    tokens/s against its twin's with the interval and verdict (analysis/stats.py: `~` where
    the step times cannot tell them apart); None where no point has a twin to compare with.
    `steps[i]`: row i's measured steps."""
    if "ac_memory_saved_bytes" not in table or table["ac_memory_saved_bytes"].isna().all():
        return None
    saved, paid = table["ac_memory_saved_bytes"], table["ac_time_paid_pct"]
    free = [i for i in range(len(table)) if saved.iloc[i] > 0 and paid.iloc[i] <= 0]
    if free:
        best = max(free, key=lambda i: saved.iloc[i])
        rate = "at no measured cost in step time"
    else:
        ratio = table["ac_mib_per_pct"]
        if ratio.isna().all() or ratio.max() <= 0:
            return "most memory a percent of step time: no policy saved memory"
        best = int(ratio.reset_index(drop=True).idxmax())  # NaN skipped
        rate = (
            f"for {number(paid.iloc[best], 3)} % more step time: "
            f"{number(ratio.iloc[best], 3)} MiB a percent"
        )
    line = (
        f"most memory a percent of step time: {names[best]} (saves "
        f"{number(saved.iloc[best] / MIB, 3)} MiB {rate})"
    )
    twin = table.index.get_loc(twins(table)[table.index[best]])
    if comparable(table, steps, best) and comparable(table, steps, twin):
        ratio, low, high, verdict = speedup(table, steps, twin, best)
        sure = "not significant (~)" if verdict == stats.NOT_SIGNIFICANT else "significant"
        line += f"; {ratio:.3g}x the tokens/s of {names[twin]} [{low:.3g}-{high:.3g}], {sure}"
    return line


def _twin_key(overrides) -> str:
    """The point's key (swept.point_key) without its policy's overrides: its twin's."""
    kept = [o for o in split_overrides(overrides) if override_key(o) not in POLICY_KEYS]
    return point_key(kept)
