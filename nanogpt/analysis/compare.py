"""What a sweep table decides: speedups with their interval and verdict, the compile break-even,
and one sweep against another (a regression check).

Intervals and verdicts come from analysis/stats.py (a block bootstrap; "~" when not
significant). The tables come from analysis/table.py; this module only adds columns and builds
the comparison, it reads no files.
"""

from __future__ import annotations

import pandas as pd

from nanogpt.analysis import derive, stats
from nanogpt.analysis.bottleneck import fastest_line
from nanogpt.analysis.display import number
from nanogpt.record.swept import override_key, point_key, split_overrides

COMPILE = "perf.compile"


def speedup(table: pd.DataFrame, steps: list, base: int, other: int, base_draws=None) -> tuple:
    """tokens/s of row `other` over row `base`, its 95 % interval and its verdict. `steps[i]`
    is row i's measured steps, a list per repeat. tokens/s ratio = tokens-a-step ratio x base
    step time / other step time. `base_draws`: the base's resamples, when already drawn (the
    same draws: they are seeded)."""
    scale = table["tokens_per_step"].iloc[other] / table["tokens_per_step"].iloc[base]
    figure = stats.point_figure(steps[base]) / stats.point_figure(steps[other])
    if base_draws is None:
        base_draws = stats.resampled(steps[base], stats.SEED)
    draws = base_draws / stats.resampled(steps[other], stats.SEED + 1)
    low, high = stats.interval(draws)
    low, high = scale * low, scale * high
    verdict = stats.verdict(low, high)
    if verdict != stats.NOT_SIGNIFICANT and min(len(steps[base]), len(steps[other])) < 2:
        verdict = f"{verdict}, {stats.ONE_PROCESS}"  # the basis it rests on (analysis/stats.py)
    return scale * figure, low, high, verdict


def comparable(table: pd.DataFrame, steps: list, i: int) -> bool:
    return table["status"].iloc[i] == "ok" and bool(steps[i])


def add_speedups(table: pd.DataFrame, steps: list, base: int | None) -> None:
    """speedup (tokens/s over the baseline row's), its 95 % interval and its verdict, in place;
    `base` is the baseline's position."""
    n = len(table)
    values = [(None, None, None, None)] * n
    if base is not None and comparable(table, steps, base):
        base_draws = stats.resampled(steps[base], stats.SEED)  # once, not once a row
        for i in range(n):
            if comparable(table, steps, i):
                ratio, low, high, verdict = speedup(table, steps, base, i, base_draws)
                values[i] = (ratio, low, high, "baseline" if i == base else verdict)
    for k, name in enumerate(("speedup", "speedup_ci_low", "speedup_ci_high")):
        table[name] = pd.Series([v[k] for v in values], index=table.index, dtype="float64")
    table["speedup_verdict"] = [v[3] for v in values]


def eager_twins(table: pd.DataFrame) -> pd.Series:
    """For each ok compiled row whose eager twin (the same overrides but perf.compile) is in the
    table and ok: the twin's median step (ms); NaN elsewhere."""
    ok = table[table["status"] == "ok"]
    eager = {_without_compile(o): ms for o, c, ms in _compile_rows(ok) if not c}
    out = pd.Series([None] * len(table), index=table.index, dtype="float64")
    for index, row in ok.iterrows():
        twin = eager.get(_without_compile(row["overrides"]))
        if row["compile"] is True and twin is not None:
            out[index] = twin
    return out


def compile_breakeven(table: pd.DataFrame) -> pd.Series:
    """For a compiled point whose eager twin is in the table (`eager_twins`): compile_s /
    (eager step - compiled step), the steps after which compiling has paid for itself. Null
    when compiling does not make steps faster, or there is no twin."""
    saved_ms = eager_twins(table) - table["step_ms_median"].astype("float64")
    compile_s = table["compile_s"].astype("float64")
    return (compile_s * 1e3 / saved_ms).where(saved_ms > 0)


def compile_verdict(table: pd.DataFrame, break_reasons: list) -> pd.Series:
    """For a compiled point whose eager twin is in the table: what compile bought, eager step /
    compiled step, with the graph breaks (the compile part's counters) in the words: "compile
    bought 1.02x: 7 graph breaks, the first at <reason>". `break_reasons[i]`: row i's
    graph_break_reasons (json-only, so read from the records). None elsewhere."""
    bought = eager_twins(table) / table["step_ms_median"].astype("float64")
    out = pd.Series([None] * len(table), index=table.index, dtype=object)
    for i, (index, ratio) in enumerate(bought.items()):
        if pd.isna(ratio):
            continue
        row = table.loc[index]
        words = f"compile bought {number(ratio)}×"
        breaks = row.get("graph_breaks")
        if breaks is None or pd.isna(breaks):
            words += " (graph breaks not counted)"
        elif breaks == 0:
            words += ": no graph breaks"
        else:
            words += f": {int(breaks)} graph break{'s' if breaks > 1 else ''}"
            reasons = break_reasons[i] or []
            words += f", the first at {reasons[0]}" if reasons else ""
        recompiles = row.get("recompiles")
        if recompiles is not None and pd.notna(recompiles) and recompiles > 0:
            words += f"; {int(recompiles)} recompile{'s' if recompiles > 1 else ''}"
        out[index] = words
    return out


def _compile_rows(table: pd.DataFrame):
    return zip(table["overrides"], table["compile"], table["step_ms_median"], strict=True)


def _without_compile(overrides: str) -> str:
    """The point's key (swept.point_key) without its perf.compile override: its eager twin's."""
    kept = [o for o in split_overrides(overrides) if override_key(o) != COMPILE]
    return point_key(kept)


def compare_sweeps(
    old: pd.DataFrame, old_steps: list, new: pd.DataFrame, new_steps: list
) -> pd.DataFrame:
    """Per point (matched by its point_id, what it measures: record/identity.py; by its
    overrides, in any order, only where a record has no id) old vs new tokens/s, the change, its
    95 % interval and verdict; points in one sweep only are listed with `only_in`. `*_steps[i]`
    is row i's measured steps, a list per repeat (table.Sweep.series)."""
    old_at = {key: i for i, key in enumerate(point_keys(old))}
    new_at = {key: i for i, key in enumerate(point_keys(new))}
    rows = []
    for key in [*new_at, *(k for k in old_at if k not in new_at)]:
        i, j = old_at.get(key), new_at.get(key)
        shown = new if j is not None else old
        row = {"point": shown["overrides"].iloc[j if j is not None else i], "point_id": key}
        row.update(only_in=None, old_tokens_per_s=None, new_tokens_per_s=None)
        row.update(change_pct=None, change_ci_low=None, change_ci_high=None, verdict=None)
        if i is None or j is None:
            row["only_in"] = "new" if i is None else "old"
        if i is not None:
            row["old_tokens_per_s"] = old["tokens_per_s"].iloc[i]
        if j is not None:
            row["new_tokens_per_s"] = new["tokens_per_s"].iloc[j]
        both_ok = i is not None and j is not None and old_steps[i] and new_steps[j]
        if both_ok and old["status"].iloc[i] == new["status"].iloc[j] == "ok":
            _change(row, old, old_steps[i], i, new, new_steps[j], j)
        rows.append(row)
    return pd.DataFrame(rows)


def point_keys(table: pd.DataFrame) -> list[str]:
    """Each row's identity: its point_id, else (a record written before point_id existed) its
    overrides, order-free."""
    ids = table["point_id"] if "point_id" in table else [None] * len(table)
    return [
        pid if isinstance(pid, str) and pid else "overrides: " + point_key(overrides)
        for pid, overrides in zip(ids, table["overrides"], strict=True)
    ]


def _change(row: dict, old, old_steps, i: int, new, new_steps, j: int) -> None:
    both = pd.concat([old.iloc[[i]], new.iloc[[j]]], ignore_index=True)
    ratio, low, high, verdict = speedup(both, [old_steps, new_steps], 0, 1)
    row["change_pct"] = (ratio - 1) * 100
    row["change_ci_low"], row["change_ci_high"] = (low - 1) * 100, (high - 1) * 100
    row["verdict"] = verdict


def significantly_slower(comparison: pd.DataFrame, pct: float) -> pd.DataFrame:
    """The points whose new tokens/s is significantly lower than the old by more than pct %."""
    slower = comparison["verdict"] == "slower"
    return comparison[slower & (comparison["change_pct"] < -pct)]


def add_costs(table: pd.DataFrame, usd_per_hour: float | None, usd_per_kwh: float | None) -> None:
    """usd_per_1m_tokens for each row (derive.usd_per_1m_tokens). Null without a price."""
    table["usd_per_1m_tokens"] = pd.Series(
        [
            derive.usd_per_1m_tokens(_float(tps), _float(jpt), usd_per_hour, usd_per_kwh)
            for tps, jpt in zip(table["tokens_per_s"], table["j_per_token"], strict=True)
        ],
        index=table.index,
        dtype="float64",
    )


def _float(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def recommend(
    table: pd.DataFrame, steps: list, names: list[str], memory_budget_gib: float | None
) -> list[str]:
    """A few lines under the table: the fastest point, and its bottleneck with what to try
    (analysis/bottleneck.py); the fastest within the memory budget;
    the most tokens per kWh; the cheapest per 1M tokens. Each says whether its lead over the
    runner-up is significant. Then, for each compiled point with an eager twin, what compile
    bought (`compile_verdict`)."""
    ok = [i for i in range(len(table)) if comparable(table, steps, i)]

    def best(rows: list[int], title: str, column: str, larger: bool = True) -> str | None:
        return _best(table, steps, names, rows, title, column, larger)

    lines = [best(ok, "fastest", "tokens_per_s")]
    timed = [i for i in ok if pd.notna(table["tokens_per_s"].iloc[i])]
    if timed:  # why the fastest point is as fast as it is, and what to try next
        top = max(timed, key=lambda i: table["tokens_per_s"].iloc[i])
        row = table.iloc[top]
        lines.append(fastest_line(row.get("bottleneck"), row.get("bottleneck_hint"), names[top]))
    if memory_budget_gib is not None:
        peak, _ = measured_peak(table)
        within = [i for i in ok if peak.iloc[i] <= memory_budget_gib * 2**30]
        title = f"fastest within {memory_budget_gib:g} GiB"
        lines.append(best(within, title, "tokens_per_s"))
    if table["tokens_per_kwh"].notna().any():
        # A mean power over the board's limit is a counter or window problem: not a figure
        # to recommend on (derive.POWER_LIMIT_SLACK).
        flagged = table["power_over_limit"].map(lambda v: bool(v) if pd.notna(v) else False)
        trusted = [i for i in ok if not flagged.iloc[i]]
        lines.append(best(trusted, "most tokens per kWh", "tokens_per_kwh"))
    if table["usd_per_1m_tokens"].notna().any():
        lines.append(best(ok, "cheapest", "usd_per_1m_tokens", larger=False))
    verdicts = table["compile_verdict"] if "compile_verdict" in table else []
    lines += [f"{names[i]}: {v}" for i, v in enumerate(verdicts) if isinstance(v, str)]
    return [line for line in lines if line]


def measured_peak(table: pd.DataFrame) -> tuple[pd.Series, str]:
    """Peak bytes per row, the memory each point needs as its record stores it
    (`peak_memory_bytes`, `peak_memory_from`: analysis/derive.peak_memory's rule, applied once
    when the record was made: the larger of warmup's and the measured steps' peaks, the CUDA
    allocator's, else the process's RSS), and what they are. NaN where a record has none."""
    missing = pd.Series(None, index=table.index, dtype=object)
    peak = pd.to_numeric(table.get("peak_memory_bytes", missing), errors="coerce")
    which = table.get("peak_memory_from", missing)
    if any(isinstance(w, str) and w.startswith("cuda") for w in which):
        return peak.astype("float64"), "peak CUDA allocated"
    # RSS also holds the interpreter, PyTorch's libraries and freed-but-cached heap pages.
    return peak.astype("float64"), "peak RSS"


def _best(
    table, steps, names, rows: list[int], title: str, column: str, larger: bool
) -> str | None:
    ranked = sorted(
        (i for i in rows if pd.notna(table[column].iloc[i])),
        key=lambda i: table[column].iloc[i],
        reverse=larger,
    )
    if not ranked:
        return f"{title}: no ok point" if title.startswith("fastest within") else None
    best = ranked[0]
    line = f"{title}: {names[best]} ({column} {number(table[column].iloc[best], 4)})"
    line += _contended_note(table, best)
    if len(ranked) == 1:
        return line + "; no runner-up"
    second = ranked[1]
    if column == "tokens_per_kwh":
        return line + _energy_lead(table, best, second, names[second])
    ratio, low, high, verdict = speedup(table, steps, second, best)
    lead = "not significant (~)" if verdict == stats.NOT_SIGNIFICANT else "significant"
    lead += f" {stats.ONE_PROCESS}" if verdict.endswith(stats.ONE_PROCESS) else ""
    return line + f"; {ratio:.3g}x the tokens/s of {names[second]} [{low:.3g}-{high:.3g}], {lead}"


def _contended_note(table: pd.DataFrame, i: int) -> str:
    """A point measured beside another process (probes/contention.py) says so."""
    if "contended" not in table or not _true(table["contended"].iloc[i]):
        return ""
    return " [contended: another process used the device while it was measured]"


def _true(value) -> bool:
    return value is not None and not pd.isna(value) and bool(value)


def _energy_lead(table: pd.DataFrame, best: int, second: int, name: str) -> str:
    """The energy lead, judged by the two points' tokens/kWh intervals (analysis/derive.py: from the
    counter's timing error): significant only when they do not overlap."""
    low = table["tokens_per_kwh_ci_low"].iloc[best]
    high = table["tokens_per_kwh_ci_high"].iloc[second]
    ratio = table["tokens_per_kwh"].iloc[best] / table["tokens_per_kwh"].iloc[second]
    if pd.isna(low) or pd.isna(high):
        return f"; {ratio:.3g}x {name}, not tested (no interval on the energy)"
    lead = "significant" if low > high else "not significant (~: the intervals overlap)"
    return f"; {ratio:.3g}x the tokens/kWh of {name}, {lead}"
