"""The typed record, the derived figures, the baseline rule and the trainer's build, on real
torch and pandas (no processes: these are unit-level)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pandas as pd
import pytest
import torch

from nanogpt.analysis import derive, store
from nanogpt.analysis.baseline import BaselineError, choose
from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.config.spec import (
    Ac,
    Attention,
    BenchConfig,
    Dtype,
    ModelConfig,
    OptimizerConfig,
    OptimizerImpl,
    PerfConfig,
    RunSpec,
)
from nanogpt.probes.energy import EnergyProbe
from nanogpt.record import PARTS, Energy, Rates, Record, Setup, Timing, columns
from nanogpt.record.asked import Asked
from nanogpt.record.summary_keys import namespaced, summary_key
from nanogpt.train.distributed import World
from nanogpt.train.trainer import FaultyTrainer, Trainer, build_trainer

TINY = RunSpec(
    model=ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=256),
    perf=PerfConfig(batch_size=2),
    bench=BenchConfig(device="cpu"),
)
CPU = torch.device("cpu")


def test_every_column_is_a_field_of_one_part_and_field_names_are_unique():
    names = [f.name for part in PARTS.values() for f in dataclasses.fields(part)]
    names += ["status", "error", "env", "wall_s", "finished_at"]
    assert len(names) == len(set(names))  # one flat namespace: no name in two parts
    assert set(columns()) <= set(names) and set(Record().to_dict()) == set(names)


def test_the_columns_are_the_fields_not_marked_json_only():
    # Every field is a column unless its metadata says json-only; a nested value (a dict) never
    # is one, so a part's new dict field must be marked (json_only()) to stay out of the CSV.
    for part in PARTS.values():
        for f in dataclasses.fields(part):
            is_column = f.name in columns()
            assert is_column != bool(f.metadata.get("json_only")), f.name
            assert not (is_column and "dict" in str(f.type)), f"{f.name}: mark it json_only()"
    assert {"point_id", "status", "tokens_per_s", "sm_clock_mean_mhz", "loss_kind"} <= set(
        columns()
    )
    assert not {"env", "measured_config", "step_ms_per_rank", "steps"} & set(columns())
    # A field a part gains becomes a column with no other edit.
    extra = dataclasses.make_dataclass(
        "TimingPlus", [("job_node", str | None, None)], bases=(Timing,)
    )
    try:
        PARTS["timing"] = extra
        assert "job_node" in columns() and summary_key("job_node") == "timing/job_node"
    finally:
        PARTS["timing"] = Timing


def test_the_wandb_summary_is_namespaced_by_part():
    flat = Record(status="ok").to_dict()
    keys = namespaced(flat)
    assert len(keys) == len(flat)
    assert {"point/status", "timing/step_ms_median", "rates/tokens_per_s"} <= set(keys)
    assert {"clocks/sm_clock_mean_mhz", "asked/loss_kind", "asked/point_id"} <= set(keys)
    assert summary_key("diag_step_host_frac") == "diagnosis/diag_step_host_frac"


def test_record_round_trips_through_its_flat_dict():
    record = Record(
        status="oom",
        error="OutOfMemoryError: no",
        asked=Asked.of(TINY, ["perf.batch_size=2"], "/tmp/job"),
        setup=Setup(device="cpu", tokens_per_step=32, world_size=1),
        timing=Timing(step_ms_median=3.5, step_ms_per_rank=[[3.5]]),
        wall_s=1.5,
        steps=[{"step": 1, "phase": "warmup", "step_ms": 9.0, "data_ms": 0.1, "loss": 5.0}],
    )
    flat = record.to_dict(steps=True)
    assert list(flat)[: len(columns())] == list(columns())
    assert flat["dtype"] == "fp32" and flat["overrides_str"] == "perf.batch_size=2"
    assert Record.from_dict(flat) == record
    assert "steps" not in record.to_dict()  # result.json: the steps go to steps.csv


def test_result_json_is_nested_by_part_and_an_earlier_flat_one_still_reads(tmp_path):
    record = Record(
        status="ok",
        asked=Asked.of(TINY, ["perf.batch_size=2"], "/tmp/job"),
        timing=Timing(step_ms_median=3.5),
        wall_s=1.5,
    )
    record.asked.optimizer = "adamw"  # an asked name that is also a part's name
    store.write_record(tmp_path / "new", record)
    written = json.loads((tmp_path / "new" / store.RESULT_FILE).read_text())
    assert written["status"] == "ok" and written["wall_s"] == 1.5  # the record's own fields
    assert written["timing"]["step_ms_median"] == 3.5 and "step_ms_median" not in written
    assert written["asked"]["dtype"] == "fp32" and written["asked"]["optimizer"] == "adamw"
    assert set(written) - {"status", "error", "env", "wall_s", "finished_at"} <= set(PARTS)
    # Every reader gets the flat namespace, from the nested file and from a flat one alike.
    flat = record.to_dict()
    assert store.read_result(tmp_path / "new" / store.RESULT_FILE) == flat
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / store.RESULT_FILE).write_text(json.dumps(flat))
    assert store.read_result(tmp_path / "old" / store.RESULT_FILE) == flat
    assert Record.from_dict(store.read_result(tmp_path / "old" / store.RESULT_FILE)) == record


def point(setup: Setup, step_ms: float, first_ms: float | None = None, **asked) -> Record:
    """A record measured at `step_ms` a step: an eager fp32 point unless `asked` says else."""
    asked = {"dtype": "fp32", "compile": False, "activation_checkpointing": False, **asked}
    first_ms = step_ms if first_ms is None else first_ms
    timing = Timing(step_ms_median=step_ms, first_step_ms=first_ms)
    return Record(asked=Asked(**asked), setup=setup, timing=timing)


def uncompiled_rates(
    setup: Setup, step_ms: float, energy: Energy | None = None, measured_steps=None, **asked
) -> Rates:
    """The derived figures of an eager fp32 point with an unknown peak."""
    record = point(setup, step_ms, **asked)
    record.energy, record.timing.measured_steps = energy or Energy(), measured_steps
    return derive.rates(record, Ceilings(Peak(None, "unknown")))


def test_point_and_window_rates_share_one_formula():
    setup = Setup(
        world_size=2, tokens_per_step=4096, flops_per_token=1_000_000, flops_per_token_hw=1_500_000
    )
    ceilings = Ceilings(Peak(1e12, "override"), achievable_flops=5e11, calibration={"op": "x"})
    rates = derive.rates(
        point(setup, 8.0, 20.0, compile=True, activation_checkpointing=True), ceilings
    )
    window = derive.window_rates(setup, 8.0, ceilings)
    assert rates.tokens_per_s == window["tokens_per_s"] == pytest.approx(4096 / 0.008)
    # per device: half the tokens of a step on each of the 2 ranks
    assert rates.achieved_tflops == pytest.approx(1e6 * 2048 / 0.008 / 1e12)
    assert rates.mfu == window["mfu"] == pytest.approx(rates.achieved_tflops / 1.0)
    assert rates.hfu == pytest.approx(rates.mfu * 1.5)
    assert rates.mfu_achievable == pytest.approx(rates.mfu * 2)
    assert rates.compile_s == pytest.approx(0.012)
    unknown = uncompiled_rates(setup, 8.0, activation_checkpointing=True)
    assert unknown.mfu is None and unknown.hfu is None and unknown.peak_source == "unknown"
    assert "mfu" not in derive.window_rates(setup, 8.0, Ceilings(Peak(None, "unknown")))


def table_of(rows: list[tuple[str, str, bool, str, float]]) -> pd.DataFrame:
    columns = ["overrides", "status", "compile", "dtype", "tokens_per_s"]
    return pd.DataFrame(rows, columns=columns)


def test_baseline_is_the_given_point_else_the_reference_point_among_the_ok_ones():
    table = table_of(
        [
            ("perf.compile=true perf.dtype=bf16", "ok", True, "bf16", 300.0),
            ("perf.compile=false perf.dtype=bf16", "error", False, "bf16", None),
            ("perf.compile=false perf.dtype=fp32", "ok", False, "fp32", 100.0),
        ]
    )

    def baseline_row(table: pd.DataFrame, text: str | None = None):
        position = choose(table, text).position
        return None if position is None else table.iloc[position]

    assert baseline_row(table)["tokens_per_s"] == 100.0  # eager fp32, though not first
    assert baseline_row(table, "perf.dtype=bf16")["tokens_per_s"] == 300.0  # given, and ok
    without_fp32 = table[table["dtype"] != "fp32"]
    assert baseline_row(without_fp32)["tokens_per_s"] == 300.0  # the only ok point
    assert baseline_row(table[table["status"] != "ok"]) is None
    with pytest.raises(BaselineError, match="report.baseline"):
        baseline_row(table, "model=gpt2")


def test_the_fault_knob_is_chosen_when_the_trainer_is_built():
    assert type(build_trainer(TINY, CPU, World())) is Trainer
    faulty = dataclasses.replace(TINY, bench=BenchConfig(device="cpu", inject_fault="nan@2"))
    trainer = build_trainer(faulty, CPU, World())
    assert isinstance(trainer, FaultyTrainer)
    assert torch.isfinite(trainer.step())
    assert torch.isnan(trainer.step())  # the real loss, poisoned at its step


@pytest.mark.parametrize("attention", [Attention.math, Attention.flash])
def test_checkpointing_recomputes_with_the_attention_kernel_asked_for(attention):
    # The recompute in backward runs under the same sdpa_kernel as the forward: outside it, it
    # picked another kernel and torch.utils.checkpoint raised CheckpointError.
    perf = PerfConfig(batch_size=2, attention=attention, ac=Ac.full)
    trainer = build_trainer(dataclasses.replace(TINY, perf=perf), CPU, World())
    losses = [trainer.step().item() for _ in range(2)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_the_record_says_when_a_host_sync_stays_in_the_step():
    # GradScaler.step reads found_inf to the host each step unless the optimizer is fused.
    cases = {
        (Dtype.fp32, OptimizerImpl.auto): False,  # no scaler
        (Dtype.fp16, OptimizerImpl.auto): True,  # on CPU auto stays non-fused
        (Dtype.fp16, OptimizerImpl.fused): False,
    }
    for (dtype, impl), syncs in cases.items():
        spec = dataclasses.replace(
            TINY,
            perf=PerfConfig(batch_size=2, dtype=dtype),
            optimizer=OptimizerConfig(impl=impl),
        )
        trainer = build_trainer(spec, CPU, World())
        assert trainer.host_sync_in_step is syncs, (dtype, impl)
        assert trainer.model_wrapping == "model"
    compiled = dataclasses.replace(TINY, perf=PerfConfig(batch_size=2, compile=True))
    assert build_trainer(compiled, CPU, World()).model_wrapping == "compile(model)"


def fake_rapl(root, domains: dict[str, tuple[str, int, int]]) -> None:
    """A powercap tree: domain -> (name, energy_uj, max_energy_range_uj)."""
    for domain, (name, energy_uj, range_uj) in domains.items():
        path = root / domain
        path.mkdir(parents=True, exist_ok=True)
        (path / "name").write_text(name + "\n")
        (path / "energy_uj").write_text(f"{energy_uj}\n")
        (path / "max_energy_range_uj").write_text(f"{range_uj}\n")


def test_rapl_energy_sums_the_packages_and_unwraps_the_counters(tmp_path):
    fake_rapl(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", 999_000_000, 1_000_000_000),
            "intel-rapl:1": ("package-1", 5_000_000, 1_000_000_000),
            "intel-rapl:0:0": ("core", 1, 1_000_000_000),  # a sub-domain: inside package-0
        },
    )
    probe = EnergyProbe(CPU, powercap=tmp_path)
    assert probe.energy.energy_source.startswith("rapl (package-0, package-1")
    counter = probe._sampler.counter  # the RAPL running total the sampler polls
    assert counter.read() == 0.0
    fake_rapl(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", 2_000_000, 1_000_000_000),  # wrapped: +3 J
            "intel-rapl:1": ("package-1", 9_000_000, 1_000_000_000),  # +4 J
            "intel-rapl:0:0": ("core", 500_000_000, 1_000_000_000),
        },
    )
    assert counter.read() == pytest.approx(7.0)
    energy = Energy(energy_j=7.0, energy_s=2.0, energy_ranks=1)
    setup = Setup(world_size=1, tokens_per_step=1000, flops_per_token=1)
    rates = uncompiled_rates(setup, 10.0, energy=energy, measured_steps=7)
    assert rates.j_per_step == pytest.approx(1.0)
    assert rates.j_per_token == pytest.approx(1e-3)
    assert rates.tokens_per_kwh == pytest.approx(3.6e9)
    assert rates.power_mean_w == pytest.approx(3.5)


def test_no_counter_is_null_energy_with_the_reason(tmp_path):
    probe = EnergyProbe(CPU, powercap=tmp_path)  # no RAPL domain
    probe.start()
    energy = probe.stop()
    assert energy.energy_j is None
    assert energy.energy_source.startswith("none: no RAPL")
    fake_rapl(tmp_path, {"intel-rapl:0": ("package-0", 10, 1000)})
    probe = EnergyProbe(CPU, powercap=tmp_path)
    probe.start()
    assert probe.stop().energy_j is None  # the counter did not advance: unknown, not 0
    assert "advanced 0 times" in probe.energy.energy_source


def test_a_peak_of_zero_pools_to_zero_not_to_null():
    """A step that held no bytes above the window's floor (mem_step_rss_bytes 0: its tensors
    reused freed memory) measured 0; its point's pool says 0, as the largest of the runs'
    peaks, and null only where no run measured it (make test once saw null for a micro point)."""
    from nanogpt.record.fields import pool_by_marks
    from nanogpt.record.measured import Memory

    def run(step_rss):
        return Memory(mem_step_rss_bytes=step_rss, mem_peak_rss_bytes=1 << 20)

    assert pool_by_marks([run(0), run(0)]).mem_step_rss_bytes == 0
    assert pool_by_marks([run(0), run(4096)]).mem_step_rss_bytes == 4096
    assert pool_by_marks([run(None), run(0)]).mem_step_rss_bytes == 0
    assert pool_by_marks([run(None), run(None)]).mem_step_rss_bytes is None


def test_a_pooled_point_is_steady_only_if_every_repeat_was_and_shows_the_worst_drift():
    """Steadiness is judged run by run on each run's own steps (figures.derive_point): a drift
    inside the third run alone makes the point unsteady, and shows as that run's."""
    from nanogpt.analysis.figures import derive_point

    def run(last_third_ms: float) -> Record:
        steps = [10.0 + 0.01 * (i % 3) for i in range(20)] + [last_third_ms] * 10
        timing = Timing(measured_steps=len(steps), measured_s=30.0)
        setup = Setup(device="cpu", tokens_per_step=32, world_size=1, flops_per_token=1000)
        rows = [{"phase": "measure", "step_ms_job": ms} for ms in steps]
        return Record(
            status="ok", asked=Asked(dtype="fp32"), setup=setup, timing=timing, steps=rows
        )

    pooled = derive_point([run(10.01), run(10.01), run(11.0)], floor_s=1.0)
    timing = pooled.timing
    assert timing.steady is False and timing.unsteady_reasons == ["drift"]
    assert 9 < timing.drift_pct < 11 and timing.drift_ci_low > 0
    assert timing.steady_note.startswith("run 3 of 3: the last third")
    assert len(timing.step_ms_median_per_repeat) == 3 and timing.repeats == 3
    steady = derive_point([run(10.01), run(10.01)], floor_s=1.0).timing
    assert steady.steady is True and steady.unsteady_reasons == []
    # the same window judged alone is what a single run's record says
    assert derive_point([run(11.0)], floor_s=1.0).timing.steady_note.startswith("the last")


@pytest.mark.slow  # finish_record's environment() asks git for the commit
def test_a_pooled_point_derives_every_figure_as_one_run_does(tmp_path):
    """bench.repeats=2 on real records: two measurements of a micro point by the real loop,
    pooled by the real code. Every derived figure is derive.rates of the pooled record, and no
    figure a single run fills is null in the pool (tokens_per_s_wall and mfu_flag once were)."""
    from hydra import compose, initialize_config_dir

    from nanogpt.analysis.figures import derive_point
    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.runner.handoff import Handoff, Job
    from nanogpt.runner.worker import finish_record
    from nanogpt.scenarios.loop import measure

    from .conftest import with_micro

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        spec = to_spec(compose("config", overrides=with_micro(["bench.diagnose=false"])))
    handoff = Handoff("point", spec, Job(tmp_path, overrides=["perf.batch_size=2"]))
    on_cpu = (spec, torch.device("cpu"), World.from_env())
    # a known peak and an achievable matmul this micro model cannot reach: mfu_flag is False;
    # matmul_emulated as a CPU without native bf16 matmuls resolves it (hardware/cpu.py)
    emulated = "bf16 matmuls are emulated on this CPU (no avx512_bf16/amx_bf16)"
    ceilings = Ceilings(
        Peak(1e12, "override"), 1e12, calibration={"op": "mm"}, matmul_emulated=emulated
    )

    def measured() -> Record:  # as the job process reads it back from the measuring child
        record = finish_record(measure(*on_cpu, ceilings, tmp_path, []), handoff)
        record = derive_point([record], spec.bench.measure_s)  # as the worker does
        return Record.from_dict(json.loads(json.dumps(record.to_dict(steps=True))))

    runs = [measured() for _ in range(2)]
    assert all(run.status == "ok" for run in runs)
    pooled = derive_point(runs, spec.bench.measure_s)  # as the job process does
    # the pool divides by the ceilings the runs stored, whole: matmul_emulated included
    assert Ceilings.from_dict(pooled.rates.ceilings) == ceilings
    assert pooled.rates.ceilings["matmul_emulated"] == emulated
    # The pooled step is the median of the repeats' medians, and each figure follows from it
    # by its formula (worked out here, not by derive.rates), against the ceilings of the runs.
    step_s = statistics.median(run.timing.step_ms_median for run in runs) / 1e3
    assert pooled.timing.step_ms_median == pytest.approx(step_s * 1e3)
    tokens = pooled.setup.tokens_per_step
    assert pooled.rates.tokens_per_s == pytest.approx(tokens / step_s)
    flops = pooled.setup.flops_per_token * tokens / step_s  # one rank: world_size 1
    assert pooled.rates.achieved_tflops == pytest.approx(flops / 1e12)
    assert pooled.rates.mfu == pytest.approx(flops / 1e12)  # peak 1e12 FLOP/s
    assert pooled.rates.mfu_achievable == pytest.approx(flops / 1e12)  # achievable 1e12 too
    assert pooled.rates.mfu_flag is False and pooled.rates.peak_source == "override"
    # the wall-clock step: both windows' wall time over both windows' steps
    walls = [(run.timing.step_ms_wall, run.timing.measured_steps) for run in runs]
    wall_s = sum(ms * n for ms, n in walls) / sum(n for _, n in walls) / 1e3
    assert pooled.rates.tokens_per_s_wall == pytest.approx(tokens / wall_s)
    assert pooled.timing.measured_steps == sum(n for _, n in walls)
    for part in ("setup", "timing", "memory", "energy", "rates"):
        for f in dataclasses.fields(getattr(pooled, part)):
            filled = [getattr(getattr(run, part), f.name) is not None for run in runs]
            if all(filled):
                assert getattr(getattr(pooled, part), f.name) is not None, f"{part}.{f.name}"
