"""The CUDA paths, on a real GPU: `make test-gpu` (pytest -m cuda). Skipped without CUDA.

These assert what can only be seen on a GPU: CUDA-event step times agree with a synced wall
clock, cuda:N is the device timed, allocator peaks sit below NVML's figure for the same device
(matched by UUID), the per-backend attention and CUDA-graph checks, real OOMs are recorded.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from nanogpt.config import Attention, BenchConfig, Dtype, ModelConfig, PerfConfig, RunSpec
from nanogpt.devices import nvml_handle, precision_unavailable
from nanogpt.distributed import World
from nanogpt.errors import ConfigError
from nanogpt.hardware.calibration import ceilings_for_run
from nanogpt.measure.loop import measure
from nanogpt.measure.timing import StepTimer
from nanogpt.validate import check

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SMALL = RunSpec(
    model=ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=1024),
    perf=PerfConfig(batch_size=8),
    bench=BenchConfig(device="cuda", warmup_steps=3, measure_steps=20, min_measure_steps=5),
)


def spec_with(**perf) -> RunSpec:
    return dataclasses.replace(SMALL, perf=dataclasses.replace(SMALL.perf, **perf))


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
    device = torch.device("cuda")
    timed_matmuls(device, 3)  # warm up kernels and clocks
    steps, wall_ms = timed_matmuls(device)
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
    handle, which = nvml_handle(torch.device("cuda"))
    assert handle is not None, which
    import pynvml

    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    assert name == torch.cuda.get_device_name(torch.device("cuda"))


def test_a_point_measures_with_peaks_below_nvml_and_reset_per_point(tmp_path):
    device = torch.device("cuda")
    ceilings = ceilings_for_run(device, Dtype.bf16, None)
    figures = []
    for _ in range(2):
        record = measure(spec_with(dtype=Dtype.bf16), device, World(), ceilings, tmp_path, [])
        assert record.status == "ok", record.error
        memory = record.memory
        assert memory.mem_peak_allocated_bytes <= memory.mem_peak_reserved_bytes
        assert memory.mem_peak_reserved_bytes <= memory.mem_nvml_used_bytes
        assert record.timing.clock == "cuda-events"
        figures.append(memory.mem_peak_allocated_bytes)
    # Peaks are reset per point: the second equals the first, not their sum or a running max.
    assert figures[1] == pytest.approx(figures[0], rel=0.05)


@pytest.mark.parametrize("attention", [Attention.flash, Attention.cudnn])
def test_flash_and_cudnn_refuse_32_bit_tensors_before_the_run(attention):
    with pytest.raises(ConfigError, match="perf.attention"):
        check(spec_with(attention=attention, dtype=Dtype.fp32))


def test_bf16_on_a_gpu_without_native_bf16_is_refused():
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) >= (8, 0):
        assert precision_unavailable(device, Dtype.bf16) is None
        pytest.skip("this GPU has native bf16")
    with pytest.raises(ConfigError, match="perf.dtype"):
        check(spec_with(dtype=Dtype.bf16))


def test_cuda_graph_modes_need_enough_warmup():
    spec = spec_with(compile=True, compile_mode="reduce-overhead")
    with pytest.raises(ConfigError, match="bench.warmup_steps"):
        check(dataclasses.replace(spec, bench=dataclasses.replace(spec.bench, warmup_steps=2)))
    check(spec)  # 3 warmup steps: fine


@pytest.mark.parametrize(
    "perf",
    [
        {"dtype": Dtype.fp16},  # GradScaler with the fused optimizer: no host sync in a step
        {"dtype": Dtype.bf16, "attention": Attention.flash, "activation_checkpointing": True},
        {"dtype": Dtype.bf16, "compile": True},
    ],
)
def test_gpu_points_finish_ok(perf, tmp_path):
    device = torch.device("cuda")
    ceilings = ceilings_for_run(device, perf["dtype"], None)
    record = measure(spec_with(**perf), device, World(), ceilings, tmp_path, [])
    assert record.status == "ok", record.error
    assert record.setup.host_sync_in_step is False
    assert record.rates.mfu is None or 0 < record.rates.mfu < 1


def test_a_batch_too_large_is_recorded_oom(tmp_path):
    device = torch.device("cuda")
    free, _ = torch.cuda.mem_get_info(device)
    # logits alone (batch x block x vocab x 6 bytes) well past the free memory
    batch = int(free / (SMALL.model.block_size * SMALL.model.vocab_size * 6)) * 4
    spec = spec_with(batch_size=batch)
    record = measure(
        spec, device, World(), ceilings_for_run(device, Dtype.fp32, None), tmp_path, []
    )
    assert record.status == "oom", record.error


def test_energy_and_clocks_are_counted_over_the_measured_steps(tmp_path):
    device = torch.device("cuda")
    spec = dataclasses.replace(
        spec_with(dtype=Dtype.bf16),
        bench=dataclasses.replace(SMALL.bench, measure_steps=300, time_budget_s=60),
    )
    record = measure(
        spec, device, World(), ceilings_for_run(device, Dtype.bf16, None), tmp_path, []
    )
    assert record.status == "ok", record.error
    energy = record.energy
    assert energy.energy_source.startswith("nvml total energy (GPU-")
    assert energy.energy_j > 0 and energy.power_limit_w > 0
    assert 0 < record.rates.power_mean_w <= energy.power_limit_w * 1.1
    assert record.rates.j_per_token > 0 and energy.sm_clock_mean_mhz > 0
    assert isinstance(energy.clock_event_reasons, list)
