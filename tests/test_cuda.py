"""The CUDA paths, on a real GPU: `make test-gpu` (pytest -m cuda). Skipped without CUDA.

These assert what can only be seen on a GPU: CUDA-event step times agree with a synced wall
clock, cuda:N is the device timed, allocator peaks sit below NVML's figure for the same device
(matched by UUID), the per-backend attention and CUDA-graph checks, every CUDA preset's kind of
point finishes ok, the matmul calibration reaches the datasheet's neighbourhood, real and
injected OOMs are recorded, torchrun with NCCL gives one record, energy is counted.

They need torch, pynvml and pytest, and Hydra only for the torchrun test (a real
`python -m nanogpt.run`); not wandb or Jupyter (../shared/device/README.md).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from nanogpt.analysis.figures import derive_point
from nanogpt.analysis.store import read_result
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import (
    Ac,
    Attention,
    BenchConfig,
    Dtype,
    ModelConfig,
    Offload,
    PerfConfig,
    RunSpec,
)
from nanogpt.hardware import peaks
from nanogpt.hardware.calibration import calibrate, ceilings_for_run
from nanogpt.hardware.device_support import attention_unavailable, precision_unavailable
from nanogpt.hardware.devices import nvml_handle, resolve_device
from nanogpt.hardware.env import device_name
from nanogpt.probes.timing import StepTimer
from nanogpt.record import Record
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World
from nanogpt.validate import check

from .conftest import run_cli, with_micro

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Measured in this test process one after another, so without the diagnosis: its profiler could
# stay attached to the next test's steps (PyTorch issue 144455). test_diagnose.py profiles CUDA.
SMALL = RunSpec(
    model=ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=1024),
    perf=PerfConfig(batch_size=8),
    bench=BenchConfig(
        device="cuda", warmup_steps=3, measure_steps=20, min_measure_steps=5, diagnose=False
    ),
)


# As a run resolves bench.device=cuda: with its index (torch.cuda.set_device needs one).
GPU = resolve_device("cuda")
# Datacenter GPUs, whose matmuls reach near their datasheet peak (consumer cards' clocks and
# power limits keep them further off).
DATACENTER = {"A100 SXM", "A100 PCIe", "H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM"}
DATACENTER |= {"H200 NVL", "H800 SXM", "H800 PCIe", "GH200", "B200", "GB200"}


def spec_with(bench: dict | None = None, **perf) -> RunSpec:
    return dataclasses.replace(
        SMALL,
        perf=dataclasses.replace(SMALL.perf, **perf),
        bench=dataclasses.replace(SMALL.bench, **(bench or {})),
    )


def measured(spec: RunSpec, out_dir) -> Record:
    """Measured in this process, its figures derived as the worker derives them."""
    ceilings = ceilings_for_run(GPU, spec.perf.dtype, None)
    record = measure(spec, GPU, World(), ceilings, out_dir, [])
    return derive_point([record], spec.bench.measure_s) if record.status == "ok" else record


def timed_matmuls(device: torch.device, steps: int = 20) -> tuple[list[float], float]:
    """Event-timed steps of queued matmuls on `device`, and the synced wall clock around them."""
    x = torch.randn(2048, 2048, device=device)
    timer = StepTimer(device)
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        timer.start()
        for _ in range(8):
            x = (x @ x).tanh_()
        timer.stop()
    torch.cuda.synchronize(device)
    return timer.flush(), (time.perf_counter() - started) * 1e3


def test_event_timed_steps_agree_with_a_synced_wall_clock():
    timed_matmuls(GPU, 3)  # warm up kernels and clocks
    steps, wall_ms = timed_matmuls(GPU)
    assert sum(steps) == pytest.approx(wall_ms, rel=0.02)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_n_times_device_n_not_the_current_device():
    torch.cuda.set_device(0)
    device = torch.device("cuda:1")
    timed_matmuls(device, 3)
    steps, wall_ms = timed_matmuls(device)
    # Events on GPU 0's stream would time the host's queueing of GPU 1's work: far below wall.
    assert sum(steps) == pytest.approx(wall_ms, rel=0.02)


def test_nvml_reads_the_same_device_by_uuid():
    handle, which = nvml_handle(GPU)
    assert handle is not None, which
    import pynvml

    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    assert name == torch.cuda.get_device_name(GPU)


def test_a_point_measures_with_peaks_below_nvml_and_reset_per_point(tmp_path):
    figures = []
    for _ in range(2):
        record = measured(spec_with(dtype=Dtype.bf16), tmp_path)
        assert record.status == "ok", record.error
        memory = record.memory
        assert memory.mem_peak_allocated_bytes <= memory.mem_peak_reserved_bytes
        assert memory.mem_peak_reserved_bytes <= memory.mem_nvml_used_bytes
        assert record.timing.step_timer == "cuda-events"
        figures.append(memory.mem_peak_allocated_bytes)
    # Peaks are reset per point: the second equals the first, not their sum or a running max.
    assert figures[1] == pytest.approx(figures[0], rel=0.05)


@pytest.mark.parametrize("attention", [Attention.flash, Attention.cudnn])
def test_flash_and_cudnn_refuse_32_bit_tensors_before_the_run(attention):
    with pytest.raises(ConfigError, match="perf.attention"):
        check(spec_with(attention=attention, dtype=Dtype.fp32))


def test_bf16_on_a_gpu_without_native_bf16_is_refused():
    if torch.cuda.get_device_capability(GPU) >= (8, 0):
        assert precision_unavailable(GPU, Dtype.bf16) is None
        pytest.skip("this GPU has native bf16")
    with pytest.raises(ConfigError, match="perf.dtype"):
        check(spec_with(dtype=Dtype.bf16))


def test_cuda_graph_modes_need_enough_warmup():
    spec = spec_with(compile=True, compile_mode="reduce-overhead")
    with pytest.raises(ConfigError, match="bench.warmup_steps"):
        check(dataclasses.replace(spec, bench=dataclasses.replace(spec.bench, warmup_steps=2)))
    check(spec)  # 3 warmup steps: fine


# The kinds of point the CUDA presets (sweeps/*.yaml) run, on a small model: compile x dtype,
# each attention backend in bf16, checkpointing with each explicit backend, fp16 with the
# scaler (fused optimizer: no host sync in a step), the CUDA-graph compile mode.
POINTS = [
    *({"compile": compile, "dtype": dtype} for compile in (False, True) for dtype in Dtype),
    *({"dtype": Dtype.bf16, "attention": attention} for attention in Attention),
    *(
        {"dtype": Dtype.bf16, "attention": attention, "ac": Ac.full}
        for attention in (Attention.flash, Attention.efficient, Attention.math, Attention.manual)
    ),
    {"dtype": Dtype.bf16, "compile": True, "compile_mode": "reduce-overhead"},
    # the checkpointing policies and offload (train/checkpointing.py)
    {"dtype": Dtype.bf16, "ac": Ac.selective},
    {"dtype": Dtype.bf16, "ac": Ac.every},
    {"dtype": Dtype.bf16, "compile": True, "ac": Ac.selective},
    {"dtype": Dtype.bf16, "compile": True, "ac": Ac.budget, "ac_budget": 0.3},
    {"dtype": Dtype.bf16, "offload": Offload.cpu},
]


@pytest.mark.parametrize("perf", POINTS, ids=lambda perf: "-".join(map(str, perf.values())))
def test_gpu_points_finish_ok(perf, tmp_path):
    spec = spec_with(**perf)
    dtype, attention = spec.perf.dtype, spec.perf.attention
    why = precision_unavailable(GPU, dtype) or attention_unavailable(GPU, attention, dtype)
    if why:  # an older GPU: refused before the run, with this reason (tested above)
        pytest.skip(why)
    check(spec)
    record = measured(spec, tmp_path)
    assert record.status == "ok", record.error
    # no host sync in a step (counted under torch's sync debug mode, when diagnosed)
    assert record.setup.host_sync_in_step in (0, None), record.setup.host_sync_note
    assert record.timing.measured_steps >= spec.bench.min_measure_steps
    assert record.rates.mfu is None or 0 < record.rates.mfu < 1


def test_bf16_matmul_calibration_reaches_the_datasheet_neighbourhood(tmp_path):
    name = device_name(GPU)
    if peaks.gpu_model(name) not in DATACENTER:
        pytest.skip(f"{name} is not a datacenter GPU of the peak table")
    entry = calibrate(GPU, (Dtype.bf16,), force=True, cache=tmp_path / "calibration.json")
    datasheet = peaks.peak_flops(name, Dtype.bf16)
    assert entry["bf16"]["tflops"] * 1e12 >= 0.6 * datasheet, (entry, datasheet)
    assert entry["bf16"]["tflops"] * 1e12 <= 1.05 * datasheet  # above the datasheet: a bad clock


def test_a_batch_too_large_is_recorded_oom(tmp_path):
    free, _ = torch.cuda.mem_get_info(GPU)
    # logits alone (batch x block x vocab x 6 bytes) well past the free memory
    batch = int(free / (SMALL.model.block_size * SMALL.model.vocab_size * 6)) * 4
    record = measured(spec_with(batch_size=batch), tmp_path)
    assert record.status == "oom", record.error


def test_an_injected_oom_is_recorded_oom_with_the_snapshot_asked_for(tmp_path):
    spec = spec_with(bench={"inject_fault": "oom@4", "memory_snapshot": True}, dtype=Dtype.bf16)
    record = measured(spec, tmp_path)
    assert record.status == "oom", record.error
    assert record.memory.memory_snapshot == "memory_snapshot.pickle"
    assert (tmp_path / "memory_snapshot.pickle").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (one NCCL rank each)")
def test_torchrun_with_nccl_gives_one_record(tmp_path):
    overrides = ["dist.nproc=2", "bench.device=cuda", "perf.dtype=bf16", "logger=none"]
    run = run_cli(*with_micro(overrides), f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    records = list(tmp_path.rglob("result.json"))
    assert len(records) == 1, records
    record = read_result(records[0])
    assert record["status"] == "ok" and record["world_size"] == 2
    assert len(record["step_ms_median_per_rank"]) == 2


def test_energy_and_clocks_are_counted_over_the_measured_steps(tmp_path):
    # The CUDA default window (protocol.CUDA_BENCH): seconds of steps, so that NVML's energy
    # counter advances often enough for a mean power.
    bench = {"warmup_s": 3.0, "measure_s": 5.0, "measure_steps": 30, "time_budget_s": 30}
    record = measured(spec_with(bench=bench, dtype=Dtype.bf16), tmp_path)
    assert record.status == "ok", record.error
    energy, timing = record.energy, record.timing
    assert energy.energy_source.startswith("nvml total energy (GPU-")
    assert energy.energy_j > 0 and energy.power_limit_w > 0, energy.energy_source
    assert energy.energy_updates >= 10 and energy.energy_error_pct < 5
    assert 0 < record.rates.power_mean_w <= energy.power_limit_w * 1.05
    assert record.rates.power_over_limit is False
    clocks = record.clocks
    assert record.rates.j_per_token > 0 and clocks.sm_clock_mean_mhz > 0
    assert clocks.sm_clock_first_mhz > 0 and clocks.sm_clock_last_mhz > 0
    assert isinstance(clocks.clock_event_reasons, list)  # read: an empty list is "none seen"
    assert timing.measured_s >= 5.0 and timing.warmup_s_run >= 3.0
    assert timing.steady in (True, False) and timing.drift_pct is not None
    assert timing.diagnostics_active == ["energy-sampler"]
    # Events time each step; the wall clock of a window also holds the host's pauses.
    assert timing.step_ms_wall >= timing.step_ms_median * 0.95


@pytest.mark.parametrize("dtype", [Dtype.fp32, Dtype.bf16, Dtype.fp16])
def test_every_dtype_steps_the_fused_optimizer_on_cuda(dtype, tmp_path):
    # The points of a compile x dtype sweep differ only in what it sweeps: optimizer.impl=auto
    # is fused AdamW for every dtype on CUDA.
    record = measured(spec_with(dtype=dtype), tmp_path)
    assert record.status == "ok", record.error
    assert record.setup.optimizer_impl_used == "fused"
    if dtype is Dtype.fp16:
        assert record.timing.scaler_settled is True
        assert record.timing.scaler_skipped_steps is not None


def test_diagnostics_run_outside_the_measured_steps(tmp_path):
    spec = spec_with(bench={"profile": True, "memory_snapshot": True}, dtype=Dtype.bf16)
    record = measured(spec, tmp_path)
    assert record.status == "ok", record.error
    phases = [row["phase"] for row in record.steps]
    assert phases[-spec.bench.profile_steps :] == ["profile"] * spec.bench.profile_steps
    assert record.timing.diagnostics_active == ["energy-sampler"]
