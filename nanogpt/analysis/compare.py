"""What a sweep table decides: speedups with their interval and verdict, the compile break-even,
and one sweep against another (a regression check).

Intervals and verdicts come from analysis/stats.py (a block bootstrap; "~" when not
significant). The tables come from analysis/table.py; this module only adds columns and builds
the comparison, it reads no files.
"""

from __future__ import annotations

import math

import pandas as pd

from nanogpt.analysis import derive, stats
from nanogpt.analysis.bottleneck import fastest_line
from nanogpt.analysis.display import number
from nanogpt.record.swept import override_key, point_key, split_overrides

COMPILE = "perf.compile"
# the keys that say how a point compiles: an eager twin is the point without them
COMPILE_KEYS = (
    COMPILE,
    "perf.compile_mode",
    "perf.compile_scope",
    "perf.compile_cache",
    "bench.cold_compile_cache",
    "sweep/compile_way",  # +sweep=compile_economics's ways of compiling (sweeps/compile_way/)
)
PLANNED_STEPS = 5000  # bench.planned_steps' default: a record older than the key has none


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


def twin_rows(table: pd.DataFrame) -> pd.Series:
    """For each ok compiled row whose eager twin (the same overrides without the compile keys,
    COMPILE_KEYS) is in the table and ok: the twin's index; NaN elsewhere."""
    ok = table[table["status"] == "ok"]
    rows = zip(ok.index, ok["overrides"], ok["compile"], strict=True)
    eager = {_without_compile(o): i for i, o, compiled in rows if not compiled}
    out = pd.Series([None] * len(table), index=table.index, dtype=object)
    for index, row in ok.iterrows():
        twin = eager.get(_without_compile(row["overrides"]))
        if row["compile"] is True and twin is not None:
            out[index] = twin
    return out


def eager_twins(table: pd.DataFrame) -> pd.Series:
    """For each ok compiled row with an eager twin in the table (`twin_rows`): the twin's median
    step (ms); NaN elsewhere."""
    twins = twin_rows(table)
    step = table["step_ms_median"].astype("float64")
    return pd.Series(
        [step[t] if t is not None else None for t in twins], index=table.index, dtype="float64"
    )


def compile_breakeven(table: pd.DataFrame) -> pd.Series:
    """compile_payoff's compile_breakeven_steps alone."""
    return compile_payoff(table)["compile_breakeven_steps"]


def compile_payoff(table: pd.DataFrame) -> pd.DataFrame:
    """Where compiling pays off, for each compiled point with an eager twin (`twin_rows`).

    A run's cumulative wall time after n steps is T(n) = time to first step + (n - 1) x step
    (the first step is in the time to first step: probes/startup.py). The compiled point's T
    drops below its twin's after
        compile_breakeven_steps = (ttfs_compiled - ttfs_eager) / (step_eager - step_compiled)
    steps (0 when the compiled point reaches its first step first), null when the compiled step
    is not faster: it never pays. Its interval (compile_breakeven_ci_low/high) takes the extremes
    of the runs' times to first step (time_to_first_step_s_per_run) and of the step times' 95 %
    intervals (step_ms_ci_low/high): conservative, wider than either alone; its high end is
    infinite where the step intervals overlap. A record without a time to first step (older
    than it) uses compile_s, the first step's excess, for the numerator, as before.
    Over the run the user plans (bench.planned_steps, each row's `planned_steps`, default
    PLANNED_STEPS): planned_saving_s = T_eager(N) - T_compiled(N) (negative: compiling costs
    time) and planned_saving_pct = its share of T_eager(N). `compile_payoff` says it in words."""
    columns = (
        "compile_breakeven_steps",
        "compile_breakeven_ci_low",
        "compile_breakeven_ci_high",
        "planned_saving_s",
        "planned_saving_pct",
    )
    out = pd.DataFrame({c: pd.Series(float("nan"), index=table.index) for c in columns})
    out["compile_payoff"] = pd.Series([None] * len(table), index=table.index, dtype=object)
    for index, twin in twin_rows(table).items():
        if twin is not None:
            for key, value in _payoff(table.loc[index], table.loc[twin]).items():
                out.at[index, key] = value
    return out


def _payoff(compiled: pd.Series, eager: pd.Series) -> dict:
    """One compiled row against its eager twin: compile_payoff's columns."""
    ms = lambda row, key: float(row.get(key)) if pd.notna(row.get(key)) else float("nan")  # noqa: E731
    saved_s = (ms(eager, "step_ms_median") - ms(compiled, "step_ms_median")) / 1e3
    ttfs = ms(compiled, "time_to_first_step_s"), ms(eager, "time_to_first_step_s")
    late_s = ttfs[0] - ttfs[1]
    if math.isnan(late_s):  # an older record: the first step's excess alone
        late_s = ms(compiled, "compile_s")
    out = {}
    planned = ms(compiled, "planned_steps")
    planned = PLANNED_STEPS if math.isnan(planned) else int(planned)
    if not math.isnan(late_s) and not math.isnan(saved_s):
        eager_total = ttfs[1] + (planned - 1) * ms(eager, "step_ms_median") / 1e3
        out["planned_saving_s"] = (planned - 1) * saved_s - late_s
        if not math.isnan(eager_total) and eager_total > 0:
            out["planned_saving_pct"] = 100 * out["planned_saving_s"] / eager_total
    if math.isnan(saved_s) or math.isnan(late_s):
        return out
    if saved_s <= 0:
        out["compile_payoff"] = (
            f"never pays: the compiled step is not faster "
            f"({number(ms(compiled, 'step_ms_median'))} ms against eager's "
            f"{number(ms(eager, 'step_ms_median'))} ms)"
        )
        return out
    out["compile_breakeven_steps"] = max(0.0, late_s) / saved_s
    late = [r - e for r in _runs(compiled) for e in _runs(eager)] or [late_s]
    saved_low = (ms(eager, "step_ms_ci_low") - ms(compiled, "step_ms_ci_high")) / 1e3
    saved_high = (ms(eager, "step_ms_ci_high") - ms(compiled, "step_ms_ci_low")) / 1e3
    if not (math.isnan(saved_low) or math.isnan(saved_high)):
        out["compile_breakeven_ci_low"] = (
            max(0.0, min(late)) / saved_high if saved_high > 0 else math.inf
        )
        out["compile_breakeven_ci_high"] = (
            max(0.0, max(late)) / saved_low if saved_low > 0 else math.inf
        )
    steps = out["compile_breakeven_steps"]
    out["compile_payoff"] = (
        "pays from the first step" if steps == 0 else f"pays after {_steps(steps)} steps"
    )
    if "compile_breakeven_ci_low" in out:
        low, high = out["compile_breakeven_ci_low"], out["compile_breakeven_ci_high"]
        out["compile_payoff"] += f" [{_steps(low)}-{_steps(high)}]"
    return out


def _runs(row: pd.Series) -> list[float]:
    runs = row.get("time_to_first_step_s_per_run")
    return [float(r) for r in runs] if isinstance(runs, list | tuple) else []


def _steps(n: float) -> str:
    return "∞" if math.isinf(n) else f"{math.ceil(n):,}"


def payoff_line(name: str, row: pd.Series) -> str | None:
    """The console's line for a compiled point with an eager twin: "compile (perf.compile_scope=
    blocks ...) pays after 38 steps [30-52]; over 5,000 steps it saves 11 min (-21 %)"."""
    said = row.get("compile_payoff")
    if not isinstance(said, str):
        return None
    line = f"compile ({name}) {said}"
    saving, pct = row.get("planned_saving_s"), row.get("planned_saving_pct")
    if pd.notna(saving):
        planned = row.get("planned_steps")
        planned = PLANNED_STEPS if planned is None or pd.isna(planned) else int(planned)
        verb = "saves" if saving >= 0 else "costs"
        line += f"; over {planned:,} steps it {verb} {_duration(abs(saving))}"
        if pd.notna(pct):
            line += f" ({'-' if saving >= 0 else '+'}{number(abs(pct))} %)"
    return line


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{number(seconds / 3600)} h"
    if seconds >= 60:
        return f"{number(seconds / 60)} min"
    return f"{number(seconds)} s"


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


def _without_compile(overrides: str) -> str:
    """The point's key (swept.point_key) without its compile keys (COMPILE_KEYS): its eager
    twin's."""
    kept = [o for o in split_overrides(overrides) if override_key(o) not in COMPILE_KEYS]
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
    if "compile_payoff" in table:
        lines += [payoff_line(names[i], table.iloc[i]) for i in range(len(table))]
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
