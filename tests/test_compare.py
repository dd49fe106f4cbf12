"""Confidence intervals, verdicts and sweep-vs-sweep comparison: the statistics on synthetic
series with known truth, and --fail-if-slower on real sweeps, both ways."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nanogpt.analysis import compare, derive, stats, table
from nanogpt.analysis.store import read_result, write_record
from nanogpt.analysis.tidy import read_summary
from nanogpt.record import Record
from nanogpt.tune import fit, objectives

from .conftest import fail_if_slower


def ar1_steps(rng: np.random.Generator, n: int = 40, median_ms: float = 10.0) -> list[float]:
    """Autocorrelated step times: AR(1) noise (phi 0.5, 5 % of the step) around a level."""
    noise = np.zeros(n)
    for i in range(1, n):
        noise[i] = 0.5 * noise[i - 1] + rng.normal(0, 0.05 * median_ms)
    return list(median_ms + noise)


def test_the_interval_holds_the_median_and_narrows_with_more_steps():
    rng = np.random.default_rng(1)
    short, long = ar1_steps(rng, 20), ar1_steps(rng, 400)
    for steps in (short, long):
        low, high = stats.median_ci([steps])
        assert low <= np.median(steps) <= high
    width = [np.subtract(*stats.median_ci([s])[::-1]) for s in (short, long)]
    assert width[1] < width[0]


def test_same_steps_give_the_same_interval():
    steps = ar1_steps(np.random.default_rng(2))
    assert stats.median_ci([steps]) == stats.median_ci([steps])


def test_a_a_is_rarely_significant_and_a_20_percent_change_always_is():
    """Over 200 synthetic pairs each: the same point is "~" in at least 95 % of pairs, and a
    true 20 % difference is found every time."""
    rng = np.random.default_rng(3)
    same = [
        stats.verdict(
            *stats.interval(
                stats.resampled([ar1_steps(rng)], stats.SEED)
                / stats.resampled([ar1_steps(rng)], stats.SEED + 1)
            )
        )
        for _ in range(200)
    ]
    assert same.count(stats.NOT_SIGNIFICANT) / len(same) >= 0.95
    found = [
        stats.verdict(
            *stats.interval(
                stats.resampled([ar1_steps(rng)], stats.SEED)
                / stats.resampled([ar1_steps(rng, median_ms=12.0)], stats.SEED + 1)
            )
        )
        for _ in range(200)
    ]
    assert found.count("slower") == len(found)


def test_repeats_widen_the_interval_by_the_noise_between_processes():
    """Three repeats whose levels differ (9, 10, 11 ms): the hierarchical interval covers the
    spread between processes, which the pooled steps of one repeat cannot show."""
    rng = np.random.default_rng(4)
    repeats = [ar1_steps(rng, median_ms=level) for level in (9.0, 10.0, 11.0)]
    low, high = stats.median_ci(repeats)
    one_low, one_high = stats.median_ci([repeats[1]])
    assert high - low > 2 * (one_high - one_low)
    assert stats.point_figure(repeats) == pytest.approx(np.median([np.median(r) for r in repeats]))


def test_breakeven_is_compile_time_over_the_step_time_saved():
    table = pd.DataFrame(
        {
            "overrides": [
                "perf.compile=false x=1",
                "perf.compile=true x=1",
                "perf.compile=true x=2",
            ],
            "status": ["ok", "ok", "ok"],
            "compile": [False, True, True],
            "step_ms_median": [10.0, 8.0, 12.0],
            "compile_s": [None, 4.0, 3.0],
        }
    )
    breakeven = compare.compile_breakeven(table)
    assert breakeven.iloc[1] == pytest.approx(4.0 * 1e3 / 2.0)  # 2 ms saved a step
    assert pd.isna(breakeven.iloc[0]) and pd.isna(breakeven.iloc[2])  # eager; no twin


def test_overrides_name_a_point_by_one_grammar_a_bracketed_value_whole():
    """One rule for "the overrides that name a point" (swept.point_key), by Hydra's grammar: a
    value with a space in brackets is one override, whether the point comes as a list (a
    record's, a search's candidate) or as a table's cell, in any order; a `+` key is its key."""
    from nanogpt.analysis import store
    from nanogpt.record import swept

    listed = ["perf.dtype=fp32", "model.sizes=[1, 2]"]
    cell = "model.sizes=[1, 2] perf.dtype=fp32"
    assert store.point_key(listed) == swept.point_key(cell) == cell
    assert compare.point_keys(pd.DataFrame({"overrides": [cell]})) == [f"overrides: {cell}"]
    table = pd.DataFrame(
        {
            "overrides": [
                "model.sizes=[1, 2] perf.compile=false",
                "+perf.compile=true model.sizes=[1, 2]",
            ],
            "status": ["ok", "ok"],
            "compile": [False, True],
            "step_ms_median": [10.0, 8.0],
            "compile_s": [None, 4.0],
        }
    )
    assert compare.compile_breakeven(table).iloc[1] == pytest.approx(4.0 * 1e3 / 2.0)


def test_the_gate_gives_no_verdict_on_points_measured_once_or_on_sweeps_that_share_none(
    micro_sweep, wandb_sweep
):
    """No verdict (exit 5, not passed, not failed) where it cannot judge, whatever the figures:
    a compared point measured in one process (the session's micro sweep against itself: every
    point joins, each measured once), and two sweeps that share no point (the session's micro
    and W&B sweeps: the W&B sweep's warmup steps and log interval, which the loop measures
    with, make other points, conftest.WANDB).
    A real slowdown gated both ways: tests/test_alone.py."""
    _, once = micro_sweep
    no_verdict = fail_if_slower(once, once)
    assert no_verdict.returncode == 5, no_verdict.stdout + no_verdict.stderr
    assert "no verdict" in no_verdict.stderr and "bench.repeats=" in no_verdict.stderr
    _, other = wandb_sweep
    nothing = fail_if_slower(once, other)
    assert nothing.returncode == 5, nothing.stdout + nothing.stderr
    assert "no point is in both sweeps" in nothing.stderr


def test_repeats_are_measured_apart_and_pooled(single):
    proc, run_dir = single("bench.repeats=3", "bench.measure_steps=8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = read_result(run_dir / "result.json")
    medians = record["step_ms_median_per_repeat"]
    assert record["repeats"] == 3 and len(medians) == 3 and record["measured_steps"] == 24
    assert record["step_ms_median"] == pytest.approx(np.median(medians))
    assert record["step_ms_ci_low"] <= record["step_ms_median"] <= record["step_ms_ci_high"]
    assert record["tokens_per_s"] == pytest.approx(
        record["tokens_per_step"] / record["step_ms_median"] * 1e3
    )
    steps = pd.read_csv(run_dir / "steps.csv")
    assert sorted(steps["repeat"].unique()) == [1, 2, 3]
    per_repeat = steps[steps["phase"] == "measure"].groupby("repeat")["step_ms"].median()
    assert list(per_repeat) == pytest.approx(medians)  # each repeat's own steps


def test_the_recommendation_names_the_best_points_and_their_leads(micro_sweep):
    # perf.batch_size=1,2 x optimizer.impl=foreach,for_loop, report.memory_budget_gib=64 and
    # cost.usd_per_hour=3.6 (tests/conftest.py MICRO_SWEEP)
    proc, sweep_dir = micro_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = read_summary(sweep_dir)
    fastest = table.loc[table["tokens_per_s"].idxmax()]
    # $3.6 an hour is $0.001 a second: a million tokens cost 1000 / (tokens/s) dollars
    assert table["usd_per_1m_tokens"].tolist() == pytest.approx(
        (1000 / table["tokens_per_s"]).tolist()
    )
    lines = proc.stdout.splitlines()
    batch = fastest["overrides"].split("perf.batch_size=")[1].split()[0]
    assert any(line.startswith(f"fastest: perf.batch_size={batch} ") for line in lines)
    assert any(line.startswith("fastest within 64 GiB: ") for line in lines)
    assert any(line.startswith(f"cheapest: perf.batch_size={batch} ") for line in lines)
    assert any("significant" in line for line in lines)


def _cuda_record(batch: int, step_ms: float, measured_gib: float, warmup_gib: float) -> Record:
    """An ok CUDA point's record, its rates derived by the one function the loop calls."""
    gib = 2**30
    record = Record(status="ok")
    record.asked.overrides = [f"perf.batch_size={batch}"]
    record.asked.compile, record.asked.dtype, record.asked.batch_size = True, "bf16", batch
    record.setup.tokens_per_step, record.setup.world_size = 1024 * batch, 1
    record.setup.flops_per_token = 10**9
    record.timing.step_ms_median = step_ms
    record.steps = [
        {"step": i + 1, "phase": "measure", "step_ms_job": step_ms * (1 + i / 100)}
        for i in range(8)
    ]
    record.memory.mem_peak_allocated_bytes = int(measured_gib * gib)
    record.memory.mem_warmup_peak_allocated_bytes = int(warmup_gib * gib)
    record.rates = derive.rates(record, derive.Ceilings(derive.Peak(None, "unknown")))
    return record


def test_fits_are_judged_on_the_larger_of_the_warmup_and_measured_peaks(tmp_path):
    # Batch 16 is the faster and its measured steps need 6 GiB, but its first step needed 12:
    # with 10 GiB it does not fit. Batch 8 needs 7 GiB in both.
    records = {16: _cuda_record(16, 50.0, 6, 12), 8: _cuda_record(8, 30.0, 7, 7)}
    for batch, record in records.items():
        write_record(tmp_path / str(batch), record)
    sweep = table.build_table(tmp_path)
    names = [f"perf.batch_size={b}" for b in sweep.table["batch_size"]]
    lines = compare.recommend(sweep.table, sweep.series(), names, memory_budget_gib=10)
    [within] = [line for line in lines if line.startswith("fastest within 10 GiB: ")]
    assert within.startswith("fastest within 10 GiB: perf.batch_size=8 ("), lines
    # The search reads the same peak: its objective and the footprint its margin rule holds
    # against the budget; the W&B view's peak panels read the record's peak_memory_bytes.
    big = read_result(tmp_path / "16" / "result.json")
    assert objectives.peak_memory_gib(big) == 12.0
    budget = fit.Budget(10 * 2**30, "bench.max_batch_memory_gib")
    assert not fit.within_margin(objectives.footprint_bytes(big), budget, margin=0.1)
    assert (big["peak_memory_bytes"], big["peak_memory_from"]) == (12 * 2**30, "cuda warmup")


def test_the_gate_names_points_measured_in_one_process_only():
    """--fail-if-slower's verdict needs the noise between processes: a compared point that
    either sweep measured once is named (report._measured_once); a point in one sweep only is
    not compared, so not named."""
    from nanogpt.report import _measured_once

    figures = {"status": ["ok"] * 3, "tokens_per_s": [1.0] * 3, "tokens_per_step": [8] * 3}
    old = pd.DataFrame({"overrides": ["a=1 b=2", "a=2", "a=3"], "repeats": [3, 1, None]})
    new = pd.DataFrame({"overrides": ["b=2 a=1", "a=2", "a=4"], "repeats": [2, 3, 3]})
    old, new = old.assign(**figures), new.assign(**figures)
    comparison = compare.compare_sweeps(old, [[], [], []], new, [[], [], []])
    assert _measured_once(comparison, old, new) == ["a=2"]  # named by its overrides


def test_sweeps_are_compared_point_by_point_id():
    """report --compare joins on point_id (what a point measures), whatever its overrides'
    text; overrides (order-free) only where a record has no id."""
    rng = np.random.default_rng(1)

    def table(rows):
        frame = pd.DataFrame(rows, columns=["point_id", "overrides", "status", "tokens_per_s"])
        return frame.assign(step_ms_median=10.0, tokens_per_step=1000)

    old = table(
        [
            ("a1", "perf.dtype=fp32 perf.compile=false", "ok", 100.0),
            ("b2", "perf.batch_size=4", "ok", 100.0),  # a default changed since: another id
            (None, "x=1 y=2", "ok", 100.0),  # written before point_id existed
        ]
    )
    new = table(
        [
            ("a1", "perf.compile=false perf.dtype=fp32", "ok", 100.0),
            ("c3", "perf.batch_size=4", "ok", 100.0),
            (None, "y=2 x=1", "ok", 100.0),
        ]
    )
    steps = [[ar1_steps(rng)] for _ in range(3)]
    comparison = compare.compare_sweeps(old, steps, new, steps)
    by_id = comparison.set_index("point_id")
    only_in = {k: v if isinstance(v, str) else None for k, v in by_id["only_in"].items()}
    assert only_in == {"a1": None, "c3": "new", "overrides: x=1 y=2": None, "b2": "old"}
    assert by_id.loc["a1", "verdict"] == stats.NOT_SIGNIFICANT  # the same steps both sides
