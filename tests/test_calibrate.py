"""Calibration of the achievable matmul peak (nanogpt/hardware/calibration.py) and its use by runs.

Real timing on the CPU throughout, over a tiny shape search so the tests stay fast (the CPU
ladder, matmul.CPU_SHAPES, monkeypatched here; in the processes a sweep starts, by a
sitecustomize the test puts on their PYTHONPATH). The figures are checked against what bounds
them (the CPU's own peak estimate) and against each other, never against a time.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from nanogpt import calibrate as calibrate_command
from nanogpt.analysis import derive
from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.spec import Dtype
from nanogpt.hardware import calibration as calibrate
from nanogpt.hardware import matmul
from nanogpt.hardware.cpu import cpu_peak_estimate, max_clock
from nanogpt.hardware.device_support import precision_unavailable
from nanogpt.hardware.env import device_name
from nanogpt.hardware.peaks import resolve_peak
from nanogpt.record import Rates, Record, Setup, Timing
from nanogpt.record.asked import Asked
from tests.conftest import run_cli

CPU = torch.device("cpu")
TINY = ((64, 64, 64), (128, 96, 160))
# The search where a caller gives none (the CLI, a run): one shape, large enough that the micro
# model's run stays below its rate (mfu_flag False)
LADDER = ((128, 128, 128),)
FAST = {"shapes": TINY, "budget_s": 0.3}  # a few trials per shape
# Imported first by every Python process the test starts (PYTHONPATH): it gives
# nanogpt.hardware.matmul the one-shape ladder as that module is imported, and imports nothing
# itself (a sweep's own process never imports torch).
TINY_LADDER_SITE = f"""
import importlib.abc, importlib.util, sys

class TinyLadder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "nanogpt.hardware.matmul":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.CPU_SHAPES = {LADDER!r}

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, TinyLadder())
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A calibration cache of this test's own, for in-process calls and child processes alike;
    the one-shape ladder in this process."""
    path = tmp_path / "cache" / "calibration.json"
    monkeypatch.setenv(calibrate.CACHE_ENV, str(path))
    monkeypatch.setattr(matmul, "CPU_SHAPES", LADDER)
    return path


@pytest.fixture
def tiny_ladder_everywhere(tmp_path, monkeypatch):
    """The one-shape ladder in every process the test starts (the calibration a run asks for
    runs in a fresh interpreter of its own)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TINY_LADDER_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


# No x86 core clocks above 6 GHz, boost included.
TOP_CLOCK_HZ = 6e9


def within_the_cpu(tflops: float, dtype: Dtype) -> bool:
    """A measured matmul rate no CPU can beat: at most the CPU's own peak estimate (cores x
    clock x FLOP per cycle), where this CPU has one, and a real rate (above 10 MFLOP/s). Where
    the clock is a VM's nominal one (not a max: boost exceeds it), at that estimate taken at
    the top clock any x86 core reaches."""
    peak = cpu_peak_estimate(dtype)
    clock_hz, is_max = max_clock()
    if peak is not None and not is_max:
        peak *= TOP_CLOCK_HZ / clock_hz
    return 1e-5 < tflops and (peak is None or tflops * 1e12 <= peak)


@pytest.mark.slow
def test_every_cpu_dtype_gets_a_positive_figure_and_tf32_none(cache):
    results = calibrate.calibrate(CPU, **FAST)
    assert list(results) == [d.value for d in Dtype]
    for dtype in ("fp32", "bf16", "fp16"):
        entry = results[dtype]
        assert within_the_cpu(entry["tflops"], Dtype(dtype)), entry
        # The ladder in order; a loaded machine may spend the budget on the first shape.
        assert list(entry["by_shape_tflops"]) in (["64x64x64"], ["64x64x64", "128x96x160"])
        assert entry["stopped_at"]
        assert entry["tflops"] == max(entry["by_shape_tflops"].values())
        assert entry["by_shape_tflops"][entry["shape"]] == entry["tflops"]
    # TF32 is a CUDA tensor-core mode: no CPU run can use it, so there is nothing to calibrate.
    assert results["tf32"] is None
    assert "CUDA" in precision_unavailable(CPU, Dtype.tf32)


def test_second_call_reads_the_cache_and_force_measures_again(cache):
    first = calibrate.calibrate(CPU, dtypes=("fp32",), **FAST)["fp32"]
    on_disk = json.loads(cache.read_text())
    (machine,) = on_disk["machines"].values()
    assert machine["machine"]["device_name"] == device_name(CPU)
    assert machine["dtypes"]["fp32"] == first

    again = calibrate.calibrate(CPU, dtypes=("fp32",), **FAST)["fp32"]
    assert again == first  # same timestamp and figures: read, not timed
    assert calibrate.lookup(CPU, "fp32") == first

    forced = calibrate.calibrate(CPU, dtypes=("fp32",), force=True, **FAST)["fp32"]
    assert forced["measured_at"] > first["measured_at"]
    assert calibrate.lookup(CPU, "fp32") == forced


def test_entries_are_per_machine_and_dtype(cache):
    calibrate.calibrate(CPU, dtypes=("fp16",), **FAST)
    assert calibrate.lookup(CPU, "fp32") is None  # another dtype: not calibrated yet
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # matmul speed depends on threads: another machine key
    try:
        assert calibrate.lookup(CPU, "fp16") is None
        calibrate.calibrate(CPU, dtypes=("fp16",), **FAST)
    finally:
        torch.set_num_threads(threads)
    assert calibrate.lookup(CPU, "fp16") is not None
    assert len(json.loads(cache.read_text())["machines"]) == 2


def test_an_unreadable_cache_is_warned_about_and_replaced(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("{ half a file")
    with pytest.warns(UserWarning, match="unreadable calibration cache"):
        fresh = calibrate.calibrate(CPU, dtypes=("fp32",), **FAST)["fp32"]
    assert calibrate.lookup(CPU, "fp32") == fresh  # the new file holds the new measurement


def run_rates(ceilings: Ceilings, achieved_flops: float) -> Rates:
    """A run's derived figures when it achieved `achieved_flops`: one token a step on one
    device, a step of one second, so FLOP/s = FLOPs per token."""
    setup = Setup(world_size=1, tokens_per_step=1, flops_per_token=achieved_flops)
    asked = Asked(dtype="fp32", compile=False, activation_checkpointing=False)
    timing = Timing(step_ms_median=1000.0, first_step_ms=1000.0)
    return derive.rates(Record(asked=asked, setup=setup, timing=timing), ceilings)


def test_run_figures_and_the_flag(cache):
    uncalibrated = calibrate.ceilings_for_run(CPU, Dtype.fp32, None)
    assert run_rates(uncalibrated, 1e9).mfu_achievable is None
    entry = calibrate.calibrate(CPU, dtypes=("fp32",), **FAST)["fp32"]
    achievable = entry["tflops"] * 1e12
    ceilings = calibrate.ceilings_for_run(CPU, Dtype.fp32, None)  # reads the cache once
    assert ceilings.achievable_flops == achievable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine = run_rates(ceilings, achievable / 2)
    assert fine.mfu_achievable == pytest.approx(0.5)
    assert fine.mfu_flag is False
    assert fine.calibration["measured_at"] == entry["measured_at"]
    with pytest.warns(UserWarning, match="FLOP count or the timing is wrong"):
        too_fast = run_rates(ceilings, achievable * 2)
    assert too_fast.mfu_flag is True


def test_calibrated_peak_fills_in_only_where_there_is_no_other():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "MFU will be null" warning when calibrated
        peak = resolve_peak("cuda", "Some Future GPU", "bf16", calibrated_flops=5e14)
    assert peak == Peak(5e14, "calibrated")
    datasheet = resolve_peak("cuda", "NVIDIA H100 PCIe", "bf16", calibrated_flops=5e14)
    assert datasheet.source == "datasheet"
    override = resolve_peak("cuda", "Some Future GPU", "bf16", 100, calibrated_flops=5e14)
    assert override == Peak(100e12, "override")


def test_table_compares_achievable_with_peak(cache):
    results = calibrate.calibrate(CPU, **FAST)
    # measured_since in the future: every entry reads "cached"
    table = calibrate_command.format_table(CPU, results, measured_since="9999")
    lines = table.splitlines()
    assert lines[1].split()[:2] == ["dtype", "achievable"]
    fp32 = next(line for line in lines if line.startswith("fp32"))
    assert f"{results['fp32']['tflops']:.4g}" in fp32 and "(cached)" in fp32
    assert any(line.startswith("tf32: not calibrated") for line in lines)


@pytest.mark.slow  # three dtypes timed for real, about 2 s
def test_cli_calibrates_then_reuses(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert calibrate_command.main(["bench.device=cpu"]) == 0
    done = capsys.readouterr().out
    measured = json.loads(cache.read_text())
    assert "fp32" in done and f"cache: {cache}" in done
    assert calibrate_command.main(["bench.device=cpu"]) == 0
    again = capsys.readouterr().out
    assert json.loads(cache.read_text()) == measured
    assert again.count("(cached)") == 3  # fp32, bf16, fp16
    assert not (tmp_path / "outputs").exists()  # composed, not a Hydra run: no output dir


@pytest.mark.slow
def test_cli_rejects_a_bad_override(cache, tmp_path):
    done = run_cli("hardware.calibrate=maybe", cwd=tmp_path, module="nanogpt.calibrate")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error:") and "hardware.calibrate" in done.stderr
    assert not cache.exists()


def test_run_with_calibration_carries_consistent_columns(cache, tiny_ladder_everywhere, sweep):
    proc, sweep_dir = sweep("hardware.calibrate=true")
    assert proc.returncode == 0, proc.stderr
    # The one run's record (POINT/run-R; POINT/result.json pools the point's runs).
    (record,) = [read_result(p) for p in sweep_dir.glob("*/run-*/result.json")]
    assert record["status"] == "ok"
    entry = calibrate.lookup(CPU, "fp32")  # calibrated by the run, in a process of its own
    assert list(entry["by_shape_tflops"]) == ["128x128x128"]  # the ladder that process had
    assert record["achievable_tflops"] == entry["tflops"]
    assert record["mfu_achievable"] == pytest.approx(
        record["achieved_tflops"] / record["achievable_tflops"]
    )
    assert record["mfu_flag"] is False
    assert record["calibration"]["cache"] == str(cache)
    assert record["peak_source"] in ("cpu-estimate", "calibrated")
    if record["peak_source"] == "calibrated":
        assert record["mfu"] == pytest.approx(record["mfu_achievable"])
    table = read_summary(sweep_dir)
    assert table["mfu_achievable"].iloc[0] == pytest.approx(record["mfu_achievable"])


def test_a_run_faster_than_the_achievable_peak_is_flagged(cache, sweep):
    # A cache entry far below what any run achieves: as if the calibration had been wrong.
    calibrate.calibrate(CPU, dtypes=("fp32",), **FAST)
    data = json.loads(cache.read_text())
    (machine,) = data["machines"].values()
    machine["dtypes"]["fp32"]["tflops"] = 1e-9
    cache.write_text(json.dumps(data))
    proc, sweep_dir = sweep()  # no hardware.calibrate: runs reuse what the cache holds
    assert proc.returncode == 0, proc.stderr
    # The one run's record (POINT/run-R; POINT/result.json pools the point's runs).
    (record,) = [read_result(p) for p in sweep_dir.glob("*/run-*/result.json")]
    assert record["mfu_achievable"] > 1 and record["mfu_flag"] is True
    assert "mfu_achievable" in proc.stderr
    table = read_summary(sweep_dir)
    assert bool(table["mfu_flag"].iloc[0]) is True


# bf16 TFLOP/s by shape as an H100 measured them (2026-11-23; 12288 and 16384 assumed flat):
# 6144^3 within 1 % of 4096^3, then 8192^3 about 3 % above both.
H100_BF16 = {4096: 770.0, 6144: 772.7, 8192: 798.0, 12288: 797.5, 16384: 796.0}


def test_the_ladder_climbs_past_one_flat_step_to_the_plateau():
    seen = []

    def h100(device, dtype, shape, seconds):
        seen.append(shape[0])
        return H100_BF16[shape[0]] * 1e12

    entry = matmul.measure(torch.device("cpu"), Dtype.bf16, matmul.CUDA_SHAPES, 60.0, rate=h100)
    assert entry["shape"] == "8192x8192x8192" and entry["tflops"] == pytest.approx(
        799.0 / 1.0, rel=2e-3
    )
    # 12288 and 16384 are the two flat steps in a row that end the climb, not 6144.
    assert seen == [4096, 6144, 8192, 12288, 16384]
    assert entry["stopped_at"].startswith("a plateau")


def test_two_flat_steps_in_a_row_stop_before_the_last_shape():
    rates = iter([100.0, 100.5, 100.2, 150.0])  # the 4th would be faster, but is never timed
    entry = matmul.measure(
        torch.device("cpu"),
        Dtype.fp32,
        ((64, 64, 64), (96, 96, 96), (128, 128, 128), (256, 256, 256)),
        60.0,
        rate=lambda *_: next(rates) * 1e9,
    )
    assert list(entry["by_shape_tflops"]) == ["64x64x64", "96x96x96", "128x128x128"]
    assert entry["stopped_at"].startswith("a plateau")


def test_the_real_timer_climbs_a_cpu_ladder():
    entry = matmul.measure(
        torch.device("cpu"), Dtype.fp32, ((32, 32, 32), (64, 64, 64), (128, 128, 128)), 2.0
    )
    assert entry["tflops"] > 0 and len(entry["by_shape_tflops"]) >= 1
