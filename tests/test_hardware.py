"""Peak FLOP/s lookups, the CPU estimate and the environment record (nanogpt/hardware/)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from nanogpt.config import Dtype
from nanogpt.errors import ConfigError
from nanogpt.hardware import cpu, env, peaks
from nanogpt.results.derive import Peak

# (the string torch.cuda.get_device_name() returns, the table row it must map to)
DEVICE_NAMES = [
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
]


@pytest.mark.parametrize(("name", "model"), DEVICE_NAMES)
def test_device_name_maps_to_its_own_row(name, model):
    assert peaks.gpu_model(name) == model


# Dense bf16 (fp16 where the GPU has no bf16) in TFLOP/s, checked by hand against the
# datasheet comments in hardware/peaks.py: sparsity figures are halved.
DENSE_16BIT_TFLOPS = [
    ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
    ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA H100 NVL", "bf16", 835.5),
    ("NVIDIA H200", "bf16", 989.5),
    ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA L4", "bf16", 121),
    ("NVIDIA L40S", "bf16", 362.05),
    ("NVIDIA L40", "bf16", 181.05),
    ("NVIDIA A10", "bf16", 125),
    ("NVIDIA A10G", "bf16", 70),
    ("Tesla V100-SXM2-16GB", "fp16", 125),
    ("Tesla V100-PCIE-32GB", "fp16", 112),
    ("Tesla T4", "fp16", 65),
    ("NVIDIA GeForce RTX 3090", "bf16", 71),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
]


@pytest.mark.parametrize(("name", "dtype", "tflops"), DENSE_16BIT_TFLOPS)
def test_peak_flops_is_the_dense_datasheet_figure_in_flops(name, dtype, tflops):
    assert peaks.peak_flops(name, dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
        ("NVIDIA L4", "NVIDIA L40S"),
        ("NVIDIA L4", "NVIDIA L40"),
        ("NVIDIA L40", "NVIDIA L40S"),
        ("NVIDIA A10", "NVIDIA A10G"),
        ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB"),
    ],
)
def test_look_alike_names_get_different_peaks(a, b):
    assert peaks.peak_flops(a, "fp16") != peaks.peak_flops(b, "fp16")


def test_a100_form_factors_share_the_datasheet_peak():
    # Different rows (the name says which), but NVIDIA prints the same figures for both.
    for dtype in tuple(Dtype):
        sxm = peaks.peak_flops("NVIDIA A100-SXM4-40GB", dtype)
        assert sxm == peaks.peak_flops("NVIDIA A100 80GB PCIe", dtype)


def test_lookup_is_case_insensitive():
    assert peaks.peak_flops("nvidia l40s", "bf16") == peaks.peak_flops("NVIDIA L40S", "bf16")


def test_h100_fp32_is_the_cuda_core_rate_and_tf32_is_half_of_bf16():
    name = "NVIDIA H100 80GB HBM3"
    assert peaks.peak_flops(name, "fp32") == pytest.approx(67e12)
    assert peaks.peak_flops(name, "tf32") == pytest.approx(494.5e12)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce GTX 1080",
        "AMD Instinct MI300X",
        "Intel(R) Xeon(R) Platinum 8480+",
        "NVIDIA GeForce RTX 3090 Ti",  # a different chip configuration from the 3090
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA GH200 480GB",  # not "H200"
        "NVIDIA H100",  # SXM, PCIe or NVL? Too different to guess.
        "",
    ],
)
def test_unknown_names_have_no_peak(name):
    assert peaks.gpu_model(name) is None
    for dtype in tuple(Dtype):
        assert peaks.peak_flops(name, dtype) is None


@pytest.mark.parametrize("name", ["Tesla V100-SXM2-16GB", "Tesla T4"])
@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_dtypes_without_hardware_support_have_no_peak(name, dtype):
    assert peaks.peak_flops(name, dtype) is None


def test_unknown_dtype_is_an_error():
    with pytest.raises(ValueError, match="Dtype"):
        peaks.peak_flops("NVIDIA L4", "fp8")


def test_override_wins_and_converts_tflops():
    peak = peaks.resolve_peak("cuda", "NVIDIA H100 PCIe", "bf16", override_tflops=500)
    assert peak == Peak(500e12, "override")


def test_override_must_be_positive():
    with pytest.raises(ConfigError, match="hardware.peak_tflops"):
        peaks.resolve_peak("cuda", "NVIDIA L4", "bf16", override_tflops=0)


def test_cuda_uses_the_datasheet():
    peak = peaks.resolve_peak("cuda", "NVIDIA A100-SXM4-80GB", "bf16")
    assert peak == Peak(312e12, "datasheet")


@pytest.mark.parametrize(
    ("device_type", "name"),
    [("cuda", "NVIDIA GeForce GTX 1080"), ("mps", "Apple MPS (Apple M2)"), ("xpu", "xpu")],
)
def test_unknown_peak_warns_and_is_none(device_type, name):
    with pytest.warns(UserWarning, match=r"MFU will be null.*hardware\.peak_tflops="):
        peak = peaks.resolve_peak(device_type, name, "bf16")
    assert peak == Peak(None, "unknown")


def test_peak_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="source"):
        Peak(1.0, "guess")


# The arithmetic of the CPU estimate, on flag sets of known CPUs (no machine needed).
HASWELL = {"sse", "sse2", "avx", "avx2", "fma"}
SKYLAKE_SP = HASWELL | {"avx512f"}
COOPER_LAKE = SKYLAKE_SP | {"avx512_bf16"}
SAPPHIRE_RAPIDS = COOPER_LAKE | {"avx512_fp16", "amx_bf16", "amx_tile"}


@pytest.mark.parametrize(
    ("flags", "dtype", "expected"),
    [
        ({"sse", "sse2"}, "fp32", 4),  # 4 lanes, no FMA, one unit assumed
        (HASWELL, "fp32", 32),  # 8 lanes x 2 (FMA) x 2 units
        (SKYLAKE_SP, "fp32", 64),  # 16 lanes x 2 x 2
        (SKYLAKE_SP, "bf16", None),  # no native bf16: autocast is emulated
        (COOPER_LAKE, "bf16", 128),  # VDPBF16PS: twice the fp32 rate
        (COOPER_LAKE, "fp16", None),
        (SAPPHIRE_RAPIDS, "bf16", 1024),  # AMX tiles
        (SAPPHIRE_RAPIDS, "fp16", 128),  # AVX512_FP16 (no amx_fp16 on this part)
        (SAPPHIRE_RAPIDS, "tf32", None),  # a CUDA-only mode
        (set(), "fp32", None),  # no x86 SIMD flags: nothing to estimate from
    ],
)
def test_cpu_flop_per_cycle(flags, dtype, expected):
    assert cpu.cpu_flop_per_cycle(flags, dtype) == expected


has_cpuinfo = pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux")


@has_cpuinfo
def test_cpu_estimate_for_this_machine():
    fp32 = cpu.cpu_peak_estimate("fp32")
    assert fp32 is not None and fp32 > 0
    assert cpu.cpu_peak_estimate("tf32") is None


@has_cpuinfo
def test_resolve_peak_on_cpu_is_the_estimate():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a known CPU must not warn
        peak = peaks.resolve_peak("cpu", cpu.cpu_model_name(), "fp32")
    assert peak == Peak(cpu.cpu_peak_estimate("fp32"), "cpu-estimate")


def test_cpu_model_name_is_a_non_empty_string():
    name = cpu.cpu_model_name()
    assert isinstance(name, str) and name


def test_device_name_for_cpu_is_the_cpu_model():
    import torch

    assert env.device_name(torch.device("cpu")) == cpu.cpu_model_name()


ENV_KEYS = {
    "torch",
    "cuda",
    "cudnn",
    "nvidia_driver",
    "device_count",
    "gpu_names",
    "cpu_model",
    "cpu_logical_cores",
    "cpu_physical_cores",
    "torch_threads",
    "python",
    "platform",
    "hostname",
    "git_commit",
    "git_dirty",
}


def test_environment_has_the_expected_keys_and_is_json():
    record = env.environment()
    assert set(record) == ENV_KEYS
    assert json.loads(json.dumps(record)) == record
    assert record["torch_threads"] >= 1
    assert isinstance(record["gpu_names"], list)
    assert record["git_dirty"] in (True, False, None)
