"""The measurement protocol (issue gpu-protocol): device-dependent windows, warmup fitted to the
mode, drift and steadiness, energy from a counter that advances in steps, the power-over-limit
flag, whose tokens RAPL's joules cover, the fp16 scaler's skipped steps, and diagnostics kept
out of the measured steps."""

from __future__ import annotations

import csv
import dataclasses
import math
import time

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from nanogpt.analysis import compare, derive
from nanogpt.analysis.store import read_result
from nanogpt.config import protocol
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import BenchConfig, Dtype, PerfConfig, RunSpec
from nanogpt.frontend.compose import CONF_DIR
from nanogpt.hardware import matmul
from nanogpt.probes.counters import CounterSampler
from nanogpt.probes.energy import EnergyProbe
from nanogpt.record import Energy, Record, Setup, Timing
from nanogpt.record.asked import Asked
from nanogpt.scenarios.loop import measure, steps_after
from nanogpt.train.distributed import World
from nanogpt.train.trainer import Trainer
from nanogpt.validate import check_cuda_graph_warmup

from .conftest import MICRO, case_sweep

CPU = torch.device("cpu")


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


def test_a_gpu_point_gets_a_time_based_window_and_a_cpu_point_a_quick_one():
    # Composed only: this machine may have no GPU.
    cpu, gpu = composed("bench.device=cpu").bench, composed("bench.device=cuda").bench
    for key, value in protocol.CPU_BENCH.items():
        assert getattr(cpu, key) == value
    for key, value in protocol.CUDA_BENCH.items():
        assert getattr(gpu, key) == value
    assert gpu.warmup_s > 0 and gpu.measure_s > 0 and cpu.measure_s == 0
    assert cpu.warmup_steps is None and gpu.warmup_steps is None  # auto: by compile mode
    # Any key the user sets wins over the device's default.
    assert composed("bench.device=cuda", "bench.measure_s=60").bench.measure_s == 60


def test_warmup_is_chosen_by_mode_and_an_explicit_number_too_low_is_refused():
    assert protocol.warmup_steps(None, None, on_cuda=True) == protocol.WARMUP_STEPS
    assert protocol.warmup_steps(None, "default", on_cuda=True) == protocol.WARMUP_STEPS
    for mode in protocol.CUDA_GRAPH_MODES:
        assert protocol.warmup_steps(None, mode, on_cuda=True) == protocol.CUDA_GRAPH_WARMUP
        assert protocol.warmup_steps(None, mode, on_cuda=False) == protocol.WARMUP_STEPS
    assert protocol.warmup_steps(7, "reduce-overhead", on_cuda=True) == 7
    # The check needs no GPU: it reads the device's type.
    graphs = RunSpec(perf=PerfConfig(compile=True, compile_mode="reduce-overhead"))
    check_cuda_graph_warmup(graphs, torch.device("cuda:0"))  # auto: fine
    low = dataclasses.replace(graphs, bench=BenchConfig(warmup_steps=2))
    with pytest.raises(ConfigError, match=r"bench.warmup_steps.*set bench.warmup_steps=3"):
        check_cuda_graph_warmup(low, torch.device("cuda:0"))


# Scenarios measured as the points of one sweep (conftest.case_sweep), not a single run each.
CASES = {
    "window": [
        "bench.warmup_s=0.3",
        "bench.measure_s=0.8",
        "bench.measure_steps=6",
        "logger.log_interval=2",
    ],
    "fp16": ["perf.dtype=fp16"],
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return case_sweep(tmp_path_factory.mktemp("cases"), CASES)


def test_the_window_lasts_its_time_floor_and_says_how_it_went(cases):
    run_dir = cases["window"]
    record = read_result(run_dir / "result.json")
    assert record["warmup_s_run"] >= 0.3 and record["warmup_steps_run"] >= 2
    assert record["measured_s"] >= 0.8 and record["measured_steps"] >= 6
    assert record["stopped_by_budget"] is False
    assert record["diagnostics_active"] == []  # no counter on this machine, no W&B
    with open(run_dir / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    phases = [row["phase"] for row in rows]
    assert phases.count("measure") == record["measured_steps"]
    assert phases.count("warmup") == record["warmup_steps_run"]
    # Steadiness and drift are the window's own steps judged (derive.steadiness): 6 steps or
    # more give a drift, and the verdict is the one those steps and the time floor give.
    measured = [float(row["step_ms"]) for row in rows if row["phase"] == "measure"]
    judged = derive.steadiness(measured, record["measured_s"], 0.8, on_accelerator=False)
    assert judged.drift is not None and record["steady"] is judged.steady
    assert record["drift_pct"] == pytest.approx(judged.drift[0], rel=1e-6)
    # Beside the median of the timed steps, the wall-clock throughput: the windows' first start
    # to last end over the steps, so host pauses between steps count and it is never faster.
    assert record["step_ms_wall"] >= 0.99 * sum(measured) / len(measured)
    wall_rate = record["tokens_per_step"] * 1e3 / record["step_ms_wall"]
    assert record["tokens_per_s_wall"] == pytest.approx(wall_rate, rel=1e-6)


def test_a_window_that_drifts_or_is_cut_short_is_not_steady():
    gen = torch.Generator().manual_seed(0)
    flat = (30 + torch.randn(60, generator=gen) * 0.2).tolist()
    found = derive.steadiness(flat, 5.0, 5.0, on_accelerator=True)
    assert found.steady and found.note is None and abs(found.drift[0]) < 2
    # The clock drops a third of the way in: the last third is 8 % slower.
    slowing = flat[:20] + [t * 1.08 for t in flat[20:]]
    found = derive.steadiness(slowing, 5.0, 5.0, on_accelerator=True)
    assert found.reasons == (derive.DRIFT,) and "8." in found.note
    assert 6 < found.drift[0] < 10 and found.drift[1] > 2
    # Long enough on a CPU, too short for a GPU's clocks.
    assert derive.steadiness(flat, 0.5, 0.0, on_accelerator=False).steady
    found = derive.steadiness(flat, 0.5, 0.0, on_accelerator=True)
    assert found.reasons == (derive.SHORT,) and "settle" in found.note
    # Cut by the time budget below the asked floor.
    found = derive.steadiness(flat, 3.0, 5.0, on_accelerator=False)
    assert found.reasons == (derive.SHORT,) and "bench.measure_s=5" in found.note


class SteppedCounter:
    """An energy counter like NVML's on a machine without one: a constant power, published
    only every `period_s`."""

    def __init__(self, watts: float, period_s: float):
        self.watts, self.period_s, self.t0 = watts, period_s, time.perf_counter()

    def read(self) -> float:
        published = (time.perf_counter() - self.t0) // self.period_s * self.period_s
        return self.watts * published


def _sampled(counter, seconds: float):
    sampler = CounterSampler(counter)
    sampler.start()
    time.sleep(seconds)
    return sampler.stop()


def test_energy_from_a_stepped_counter_is_null_when_short_and_right_when_long():
    short = _sampled(SteppedCounter(700, 0.1), 0.35)
    assert short.energy_j is None and short.updates < 10 and "measure longer" in short.note
    long = _sampled(SteppedCounter(700, 0.1), 1.6)
    assert long.updates >= 10 and 80 < long.update_ms < 120
    power = long.energy_j / long.window_s
    # Read at the two ends only, this window would be off by up to a whole update (6 %).
    assert abs(power - 700) / 700 < 0.03 and long.error_pct < 5


def test_the_probe_says_why_energy_is_null():
    probe = EnergyProbe(CPU, counter=SteppedCounter(100, 0.5))
    assert probe.sampling
    probe.start()
    time.sleep(0.2)
    energy = probe.stop()
    assert energy.energy_j is None and "advanced" in energy.energy_source


def _setup(world_size: int = 1) -> Setup:
    return Setup(
        n_params=1, flops_per_token=6, tokens_per_step=1000 * world_size, world_size=world_size
    )


def _rates(energy: Energy, world_size: int = 1, steps: int = 10):
    ceilings = derive.Ceilings(derive.Peak(None, "unknown"))
    record = Record(
        asked=Asked(dtype="fp32", compile=False, activation_checkpointing=False),
        setup=_setup(world_size),
        timing=Timing(step_ms_median=10.0, first_step_ms=10.0, measured_steps=steps),
        energy=energy,
    )
    return derive.rates(record, ceilings)


def test_a_mean_power_over_the_limit_is_flagged():
    over = _rates(Energy(energy_j=750.0, energy_s=1.0, power_limit_w=700.0))
    within = _rates(Energy(energy_j=691.0, energy_s=1.0, power_limit_w=700.0))
    assert over.power_over_limit is True and within.power_over_limit is False


def test_rapl_joules_are_divided_by_every_rank_on_the_host(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert EnergyProbe(CPU, counter=SteppedCounter(1, 1)).energy.energy_ranks == 2
    one_rank = _rates(Energy(energy_j=100.0, energy_s=1.0, energy_ranks=1), world_size=2)
    both = _rates(Energy(energy_j=100.0, energy_s=1.0, energy_ranks=2), world_size=2)
    assert both.j_per_token == pytest.approx(one_rank.j_per_token / 2)
    assert both.j_per_token == pytest.approx(100.0 / (2000 * 10))


def _energy_table(rows):
    table = pd.DataFrame(rows)
    for col in ("tokens_per_s", "mem_peak_allocated_bytes", "mem_peak_rss_bytes"):
        table[col] = 1.0
    table["tokens_per_step"] = 1000
    table["usd_per_1m_tokens"] = None
    return table


def test_the_energy_recommendation_compares_intervals_and_skips_flagged_points():
    rows = [
        {"status": "ok", "tokens_per_kwh": 1e9, "tokens_per_kwh_ci_low": 0.97e9,
         "tokens_per_kwh_ci_high": 1.03e9, "power_over_limit": False},
        {"status": "ok", "tokens_per_kwh": 1.02e9, "tokens_per_kwh_ci_low": 0.99e9,
         "tokens_per_kwh_ci_high": 1.05e9, "power_over_limit": False},
        {"status": "ok", "tokens_per_kwh": 2e9, "tokens_per_kwh_ci_low": 1.9e9,
         "tokens_per_kwh_ci_high": 2.1e9, "power_over_limit": True},
    ]  # fmt: skip
    steps = [[[10.0] * 10]] * 3
    lines = compare.recommend(_energy_table(rows), steps, ["a", "b", "c"], None)
    energy = next(line for line in lines if "kWh" in line)
    assert energy.startswith("most tokens per kWh: b") and "not significant" in energy
    rows[0]["tokens_per_kwh_ci_high"] = 0.98e9  # now apart
    rows[1]["tokens_per_kwh_ci_low"] = 1.0e9
    lines = compare.recommend(_energy_table(rows), steps, ["a", "b", "c"], None)
    energy = next(line for line in lines if "kWh" in line)
    assert "b" in energy and ", significant" in energy


def _fp16_trainer(init_scale: float) -> Trainer:
    spec = RunSpec(perf=PerfConfig(dtype=Dtype.fp16, batch_size=2))
    # A micro vocabulary: this CPU emulates fp16, and GPT-2's 50,304-wide head took seconds.
    micro = dict(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=256)
    spec.model = dataclasses.replace(spec.model, **micro)
    trainer = Trainer(spec, CPU, World(rank=0, size=1, local_rank=0))
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return trainer


def test_the_scaler_s_skipped_steps_are_counted_on_the_device():
    trainer = _fp16_trainer(2.0**120)  # far too high: fp16 gradients overflow, steps skipped
    scales = []
    for _ in range(6):
        trainer.step()
        scales.append(trainer.scaler.get_scale())
    skipped = sum(b < a for a, b in zip([2.0**120, *scales], scales, strict=False))
    assert skipped >= 1 and int(trainer.skipped_steps.item()) == skipped
    calm = _fp16_trainer(1.0)  # a sane scale: the step is taken, the scale kept
    loss = calm.step()
    # the mean loss of a fresh micro GPT (weights near zero): about ln(256), the vocabulary's
    assert torch.isfinite(loss) and abs(loss.item() - math.log(256)) < 0.5
    assert int(calm.skipped_steps.item()) == 0 and calm.scaler.get_scale() == 1.0


def test_fp16_warmup_ends_on_a_settled_scale_and_counts_measured_skips(cases):
    record = read_result(cases["fp16"] / "result.json")
    # The micro model's fp16 gradients never overflow the default scale (2**16): warmup settles
    # on its one step, and a measured step counts as skipped only when the scaler lowers the
    # scale, so none of the 4 does (a scale too high to settle at once: the test above).
    assert record["scaler_settled"] is True and record["warmup_steps_run"] == 1
    assert record["measured_steps"] == 4 and record["scaler_skipped_steps"] == 0


def test_calibration_stops_climbing_at_a_plateau():
    # Tiny matmuls are far slower: two of them in a row are a plateau (matmul.PATIENCE), and
    # the shape after them is never timed.
    shapes = ((256, 256, 256), (4, 4, 4), (8, 8, 8), (512, 512, 512))
    entry = matmul.measure(CPU, Dtype.fp32, shapes, budget_s=2.0)
    assert list(entry["by_shape_tflops"]) == ["256x256x256", "4x4x4", "8x8x8"]
    assert entry["stopped_at"].startswith("a plateau") and entry["shape"] == "256x256x256"


def test_micro_defaults_still_measure_quickly():
    # The tests' micro point is a CPU point: no time floors (the suite stays fast).
    bench = composed(*MICRO).bench
    assert bench.warmup_s == 0 and bench.measure_s == 0


def test_the_time_budget_is_the_points_warmup_and_diagnosis_included(tmp_path):
    """Warmup spends the budget first and the diagnosis's steps are set aside from it: the
    measured steps get what is left (3 s - 1 s of warmup - the diagnosis), not 3 s."""
    spec = composed(
        *MICRO,
        "bench.warmup_s=1.0",
        "bench.time_budget_s=3.0",
        "bench.measure_steps=100000",
        "bench.min_measure_steps=1",
        "logger.log_interval=1",  # windows end at every step: warmup stops on time
    )
    ceilings = derive.Ceilings(derive.Peak(None, "unknown"))
    record = measure(spec, CPU, World(), ceilings, tmp_path, [])
    assert record.status == "ok" and record.timing.stopped_by_budget
    timing, steps = record.timing, [r for r in record.steps if r["phase"] == "measure"]
    slowest_s = max(r["step_ms"] for r in steps) / 1e3
    mean_s = timing.measured_s / timing.measured_steps
    left_s = spec.bench.time_budget_s - timing.warmup_s_run - steps_after(spec.bench) * mean_s
    assert timing.warmup_s_run >= 1.0
    # stopped within a step or two of what was left (at least one step: min_measure_steps)
    assert timing.measured_s <= max(left_s, 0) + 2 * slowest_s
    assert [r["phase"] for r in record.steps].count("diagnose") == steps_after(spec.bench)
