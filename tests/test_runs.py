"""Real `python -m nanogpt.run` processes on micro configs: records, table, statistics."""

from __future__ import annotations

import csv
import shutil

import pytest

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary

from .conftest import SHAKESPEARE, case_sweep, needs_shared, report_cli


def read_steps(job_dir):
    with open(job_dir / "steps.csv") as f:
        return list(csv.DictReader(f))


# Scenarios measured as the points of one sweep (conftest.case_sweep), not a single run each.
CASES = {
    "warmup": ["bench.warmup_steps=3", "bench.measure_steps=5", "perf.grad_accum=2"],
    "peak": ["hardware.peak_tflops=0.5"],
    "budget": ["bench.measure_steps=10000", "bench.time_budget_s=0.5", "bench.min_measure_steps=3"],
    "muon": ["optimizer=muon"],
    "adagrad": ["optimizer.build._target_=torch.optim.Adagrad"],
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """CASES (and tinyshakespeare's, where ../shared is beside the repo): case -> its job dir,
    with `tok`, the text case's token cache, beside them."""
    root = tmp_path_factory.mktemp("cases")
    text = {}
    if SHAKESPEARE.is_file():
        text["text"] = [
            "data=text",
            f"data.path={SHAKESPEARE}",
            "model.vocab_size=50304",
            f"data.cache_dir={root / 'tok'}",
        ]
    return {**case_sweep(root, CASES | text), "tok": root / "tok"}


def test_two_by_two_sweep_gives_four_records_and_a_four_row_table(micro_sweep):
    proc, sweep_dir = micro_sweep  # perf.batch_size=1,2 x optimizer.impl=foreach,for_loop
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep_dir.glob("*/result.json"))
    assert len(results) == 4
    table = read_summary(sweep_dir)
    assert len(table) == 4 and set(table["status"]) == {"ok"}
    # The baseline line, a blank line, then header, rule and 4 rows: the console's table, each
    # point named by what varies.
    lines = (sweep_dir / "summary.md").read_text().splitlines()
    assert lines[0].startswith("baseline: ") and lines[2].startswith("| point | status |")
    assert [line.count("|") for line in lines[4:8]] == [lines[2].count("|")] * 4
    assert lines[4].startswith("| perf.batch_size=1 optimizer.impl=foreach |")
    assert "e+0" not in "".join(lines)  # numbers for people
    # The baseline rule: the plain optimizer loop, then the smallest batch.
    (base,) = table.index[table["speedup_verdict"] == "baseline"]
    assert table.loc[base, ["optimizer_impl", "batch_size"]].tolist() == ["for_loop", 1]
    assert table.loc[base, "speedup"] == pytest.approx(1.0)
    for path in results:
        record = read_result(path)
        assert record["device"] == "cpu" and record["world_size"] == 1
        assert (path.parent / "run-1" / ".hydra" / "config.yaml").is_file()
        assert record["env"]["torch"]
    assert "tokens_per_s" in proc.stdout  # the table is printed


def test_warmup_excluded_and_tokens_per_s_matches_step_time(cases):
    run_dir = cases["warmup"]
    record = read_result(run_dir / "result.json")
    rows = read_steps(run_dir)
    # The diagnosis after the measured steps: one step the profiler warms up on, one recorded.
    assert [r["phase"] for r in rows] == ["warmup"] * 3 + ["measure"] * 5 + ["diagnose"] * 2
    measured = sorted(float(r["step_ms"]) for r in rows if r["phase"] == "measure")
    assert record["measured_steps"] == 5
    assert record["step_ms_median"] == pytest.approx(measured[2])
    assert record["first_step_ms"] == pytest.approx(float(rows[0]["step_ms"]))
    tokens_per_step = 2 * 16 * 2  # batch x block x grad_accum
    assert record["tokens_per_step"] == tokens_per_step
    assert record["tokens_per_s"] == pytest.approx(tokens_per_step / (measured[2] / 1e3))
    achieved = record["flops_per_token"] * tokens_per_step / (measured[2] / 1e3)
    assert record["achieved_tflops"] == pytest.approx(achieved / 1e12)
    assert record["step_timer"] == "perf_counter"
    assert record["loss_first"] > 0 and record["loss_last"] > 0


def test_peak_override_sets_mfu(cases):
    record = read_result(cases["peak"] / "result.json")
    assert record["peak_source"] == "override" and record["peak_tflops"] == 0.5
    assert record["mfu"] == pytest.approx(record["achieved_tflops"] / 0.5)


def test_time_budget_stops_measuring_after_min_steps(cases):
    record = read_result(cases["budget"] / "result.json")
    assert record["stopped_by_budget"] is True and 3 <= record["measured_steps"] < 10000


@needs_shared
def test_text_data_tokenizes_tinyshakespeare_and_trains(cases):
    record = read_result(cases["text"] / "result.json")
    assert record["status"] == "ok" and record["data_ms_median"] is not None
    assert record["measured_config"]["data"]["path"] == str(SHAKESPEARE)
    assert list(cases["tok"].glob("*.bin"))


def test_report_cli_rebuilds_table(micro_sweep, tmp_path):
    # The report's refusal of a dir without records (exit 2, one line naming result.json) is
    # asserted by test_faults.py::test_report_on_a_dir_without_records_is_one_line.
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(micro_sweep[1], sweep_dir)  # the shared sweep stays as it was
    (sweep_dir / "summary.csv").unlink()
    baseline = "perf.batch_size=2 optimizer.impl=foreach"
    again = report_cli(sweep_dir, "--baseline", baseline)
    assert again.returncode == 0, again.stderr
    table = read_summary(sweep_dir)
    assert table.loc[table["overrides"].str.contains(baseline), "speedup"].item() == 1.0


def test_muon_lists_its_roles_and_state_and_any_class_runs_by_its_target(cases):
    """optimizer=muon and optimizer.build._target_ measured for real (tests/test_optim.py has
    the rules)."""
    muon = read_result(cases["muon"] / "result.json")
    assert muon["status"] == "ok" and muon["optimizer_stepped"] == "Muon + AdamW"
    roles = muon["optimizer_roles"]
    assert roles["matrices"]["stepped_by"] == "Muon" and "head" not in roles  # tied: embedding
    assert roles["embeddings"]["stepped_by"] == roles["scalars"]["stepped_by"] == "AdamW"
    assert roles["matrices"]["state_bytes"] == 4 * roles["matrices"]["n_params"]
    assert muon["optimizer_state_bytes"] == sum(r["state_bytes"] for r in roles.values())
    by_role = muon["mem_estimate"]["optimizer_state_by_role"]
    assert muon["mem_estimate"]["optimizer_state"] == sum(by_role.values())
    assert muon["muon_adjust_lr_fn"] == "original" and 0 < muon["optimizer_step_frac"] < 1
    adagrad = read_result(cases["adagrad"] / "result.json")
    assert adagrad["status"] == "ok" and adagrad["optimizer"] == "torch.optim.Adagrad"
    assert adagrad["optimizer_stepped"] == "Adagrad"  # the class that stepped (optim.py)
    assert adagrad["optimizer_state_bytes"] > 0
