"""hardware/device_support.py and validate.check_device on CUDA, checked on this CPU machine:
torch.cuda's
answers (availability, count, compute capability, name) are faked, as for hardware this
machine lacks; the rules that read them are the real code. On a GPU, tests/test_cuda.py asks
the real device."""

from __future__ import annotations

import pytest
import torch

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Attention, Dtype
from nanogpt.hardware.device_support import (
    Place,
    attention_unavailable,
    parse_device,
    precision_unavailable,
)
from nanogpt.validate import check_device, check_gpus_per_point


@pytest.fixture
def gpus(monkeypatch):
    """Two fake CUDA devices of a given compute capability; records which index was asked."""
    asked = []

    def _install(capability: tuple[int, int], name: str = "Fake GPU"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

        def get_capability(index=None):
            asked.append(index)
            return capability

        monkeypatch.setattr(torch.cuda, "get_device_capability", get_capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
        return asked

    return _install


def test_device_names_parse_as_torch_reads_them():
    assert parse_device("cpu") == Place("cpu", None)
    assert parse_device("cuda:1") == Place("cuda", 1)
    assert parse_device("mps") == Place("mps", None)
    for name in ("cpux", "cuda:", "CUDA", "cuda:1:2", "xla"):
        assert parse_device(name) is None


def test_a_pre_ampere_gpu_has_no_native_bf16_and_no_flash_kernel(gpus):
    asked = gpus((7, 5), "Tesla T4")
    gpu = check_device("cuda")
    assert gpu == Place("cuda", 0)  # a bare cuda is cuda:0, as the run resolves it
    why = precision_unavailable(gpu, Dtype.bf16)
    assert "Tesla T4 (compute capability 7.5)" in why and "Ampere" in why
    assert precision_unavailable(gpu, Dtype.fp16) is None
    flash = attention_unavailable(gpu, Attention.flash, Dtype.fp16)
    assert "8.0 (Ampere) or newer, not 7.5" in flash
    assert asked and set(asked) == {0}  # torch was asked about the point's own GPU, by index


def test_an_ampere_gpu_runs_bf16_and_flash_in_16_bits_only(gpus):
    gpus((8, 0))
    gpu = check_device("cuda:1")
    assert gpu == Place("cuda", 1)
    assert precision_unavailable(gpu, Dtype.bf16) is None
    assert precision_unavailable(gpu, Dtype.tf32) is None
    assert attention_unavailable(gpu, Attention.flash, Dtype.bf16) is None
    assert "takes bf16/fp16 tensors, not fp32" in attention_unavailable(
        gpu, Attention.flash, Dtype.fp32
    )


def test_cuda_indices_and_ranks_are_checked_against_the_visible_gpus(gpus):
    gpus((9, 0))
    with pytest.raises(ConfigError, match="cuda:2 does not exist \\(2 CUDA devices\\)"):
        check_device("cuda:2")
    check_gpus_per_point(2, Place("cuda", 0))
    with pytest.raises(ConfigError, match="3 ranks but only 2 CUDA devices"):
        check_gpus_per_point(3, Place("cuda", 0))


def test_the_cpu_is_checked_without_asking_torch_cuda(monkeypatch):
    def no_cuda(*args):
        raise AssertionError("torch.cuda asked about a CPU point")

    for name in ("is_available", "device_count", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    cpu = check_device("cpu")
    assert cpu == Place("cpu", None)
    assert "not available on cpu" in precision_unavailable(cpu, Dtype.tf32)
    assert "exists only on CUDA" in attention_unavailable(cpu, Attention.cudnn, Dtype.bf16)
    check_gpus_per_point(4, cpu)
    with pytest.raises(ConfigError, match="'cpux' is not a device"):
        check_device("cpux")
