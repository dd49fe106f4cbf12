"""What a sweep table decides: speedups with their interval and verdict, the compile break-even,
and one sweep against another (a regression check).

Intervals and verdicts come from results/stats.py (a block bootstrap; "~" when not
significant). The tables come from results/table.py; this module only adds columns and builds
the comparison, it reads no files.
"""

from __future__ import annotations

import pandas as pd

from nanogpt.results import stats

COMPILE = "perf.compile="


def add_speedups(table: pd.DataFrame, steps: list, base: int | None) -> None:
    """speedup (tokens/s over the baseline row's), its 95 % interval and its verdict, in place.
    `steps[i]` is row i's measured steps, a list per repeat; `base` the baseline's position."""
    n = len(table)
    columns = {"speedup": [None] * n, "speedup_ci_low": [None] * n, "speedup_ci_high": [None] * n}
    verdicts: list[str | None] = [None] * n
    if base is not None and steps[base]:
        base_draws = stats.resampled(steps[base], stats.SEED)
        base_tokens = table["tokens_per_step"].iloc[base]
        for i in range(n):
            if table["status"].iloc[i] != "ok" or not steps[i]:
                continue
            # tokens/s ratio = (tokens a step ratio) x (base step time / this step time)
            scale = table["tokens_per_step"].iloc[i] / base_tokens
            figure = stats.point_figure(steps[base]) / stats.point_figure(steps[i])
            low, high = stats.interval(base_draws / stats.resampled(steps[i], stats.SEED + 1))
            columns["speedup"][i] = scale * figure
            columns["speedup_ci_low"][i], columns["speedup_ci_high"][i] = scale * low, scale * high
            verdicts[i] = "baseline" if i == base else stats.verdict(scale * low, scale * high)
    for name, values in columns.items():
        table[name] = pd.Series(values, index=table.index, dtype="float64")
    table["speedup_verdict"] = verdicts


def compile_breakeven(table: pd.DataFrame) -> pd.Series:
    """For a compiled point whose eager twin (the same overrides but perf.compile) is in the
    table: compile_s / (eager step - compiled step), the steps after which compiling has paid
    for itself. Null when compiling does not make steps faster, or there is no twin."""
    ok = table[table["status"] == "ok"]
    eager = {_without_compile(o): ms for o, c, ms in _compile_rows(ok) if not c}
    out = pd.Series([None] * len(table), index=table.index, dtype="float64")
    for index, row in ok.iterrows():
        twin = eager.get(_without_compile(row["overrides"]))
        if row["compile"] is True and twin is not None and row["compile_s"] is not None:
            saved_ms = twin - row["step_ms_median"]
            if saved_ms > 0:
                out[index] = row["compile_s"] * 1e3 / saved_ms
    return out


def _compile_rows(table: pd.DataFrame):
    return zip(table["overrides"], table["compile"], table["step_ms_median"], strict=True)


def _without_compile(overrides: str) -> str:
    return " ".join(sorted(o for o in overrides.split() if not o.startswith(COMPILE)))


def compare_sweeps(old: pd.DataFrame, new: pd.DataFrame, steps: str) -> pd.DataFrame:
    """Per point (matched by its overrides, in any order) old vs new tokens/s, the change, its
    95 % interval and verdict; points in one sweep only are listed with `only_in`. Each table
    carries its rows' measured steps in .attrs[steps]."""
    old_steps, new_steps = old.attrs[steps], new.attrs[steps]
    old_at = {_key(o): i for i, o in enumerate(old["overrides"])}
    new_at = {_key(o): i for i, o in enumerate(new["overrides"])}
    rows = []
    for key in [*new_at, *(k for k in old_at if k not in new_at)]:
        i, j = old_at.get(key), new_at.get(key)
        row = {"point": key, "only_in": None, "old_tokens_per_s": None, "new_tokens_per_s": None}
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


def _change(row: dict, old, old_steps, i: int, new, new_steps, j: int) -> None:
    scale = new["tokens_per_step"].iloc[j] / old["tokens_per_step"].iloc[i]
    figure = stats.point_figure(old_steps) / stats.point_figure(new_steps)
    draws = stats.resampled(old_steps, stats.SEED) / stats.resampled(new_steps, stats.SEED + 1)
    low, high = stats.interval(draws)
    row["change_pct"] = (scale * figure - 1) * 100
    row["change_ci_low"], row["change_ci_high"] = (scale * low - 1) * 100, (scale * high - 1) * 100
    row["verdict"] = stats.verdict(scale * low, scale * high)


def _key(overrides: str) -> str:
    return " ".join(sorted(overrides.split()))


def significantly_slower(comparison: pd.DataFrame, pct: float) -> pd.DataFrame:
    """The points whose new tokens/s is significantly lower than the old by more than pct %."""
    slower = comparison["verdict"] == "slower"
    return comparison[slower & (comparison["change_pct"] < -pct)]
