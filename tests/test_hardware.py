"""Peak FLOP/s lookups, the CPU estimate and the environment record (nanogpt/hardware/)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from nanogpt.analysis.derive import Peak
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Dtype
from nanogpt.hardware import cpu, env, peaks

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
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA B300 SXM6 AC", "B300"),
    ("NVIDIA GB300", "GB300"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI250X", "MI250X GCD"),
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
    ("NVIDIA GH200 480GB", "bf16", 989.5),
    ("NVIDIA H800", "bf16", 989.5),
    ("NVIDIA H800 PCIe", "bf16", 756.5),
    ("NVIDIA H20", "bf16", 148),
    ("NVIDIA A40", "bf16", 149.7),
    ("NVIDIA A30", "bf16", 165),
    ("NVIDIA B200", "bf16", 2250),
    ("NVIDIA GB200", "bf16", 2500),
    ("NVIDIA B300 SXM6 AC", "bf16", 2250),
    ("NVIDIA GB300", "bf16", 2500),
    ("AMD Instinct MI325X", "bf16", 1307.4),
    ("NVIDIA GeForce RTX 5090", "bf16", 209.5),
    ("AMD Instinct MI300X", "bf16", 1307.4),
    ("AMD Instinct MI250X", "bf16", 191.5),
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
        "AMD Instinct MI355X",  # not in the table: no sourced dense 16-bit figure
        "Intel(R) Xeon(R) Platinum 8480+",
        "NVIDIA GeForce RTX 3090 Ti",  # a different chip configuration from the 3090
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA GeForce RTX 5090 D",  # the China variant: fewer SMs
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


def test_gh200_is_not_an_h200_and_h20_is_not_either():
    assert peaks.gpu_model("NVIDIA GH200 480GB") == "GH200"
    assert peaks.gpu_model("NVIDIA H20") == "H20"
    assert peaks.peak_flops("NVIDIA H20", "bf16") < peaks.peak_flops("NVIDIA H200", "bf16") / 6
    assert peaks.peak_flops("AMD Instinct MI300X", "tf32") is None  # ROCm: no tf32 matmuls


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
    "nccl",
    "triton",
    "torchao",
    "transformers",
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


@pytest.mark.slow  # environment() asks git for the commit: a process
def test_environment_has_the_expected_keys_and_is_json():
    record = env.environment()
    assert set(record) == ENV_KEYS
    assert json.loads(json.dumps(record)) == record
    assert record["torch_threads"] >= 1
    assert isinstance(record["gpu_names"], list)
    assert record["git_dirty"] in (True, False, None)


def test_zen4_avx512_counts_at_256_bit_width():
    flags = {"avx512f", "avx2", "fma", "avx512_bf16"}
    assert cpu.cpu_flop_per_cycle(flags, Dtype.fp32) == 64  # Intel: two 512-bit FMA units
    assert cpu.cpu_flop_per_cycle(flags, Dtype.fp32, avx512_on_256_bit_units=True) == 32
    assert cpu.cpu_flop_per_cycle(flags, Dtype.bf16, avx512_on_256_bit_units=True) == 64
    avx2_only = {"avx2", "fma"}
    assert cpu.cpu_flop_per_cycle(avx2_only, Dtype.fp32, avx512_on_256_bit_units=True) == 32
    assert cpu._splits_avx512({"vendor_id": "AuthenticAMD", "cpu family": "25"})  # Zen 4
    assert not cpu._splits_avx512({"vendor_id": "AuthenticAMD", "cpu family": "26"})  # Zen 5
    assert not cpu._splits_avx512({"vendor_id": "GenuineIntel", "cpu family": "6"})


def test_cgroup_quota_counts_in_cpus(tmp_path):
    assert cpu._cgroup_cpus(tmp_path) is None  # no cgroup files: unknown
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu._cgroup_cpus(tmp_path) is None  # unlimited
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu._cgroup_cpus(tmp_path) == 2  # 1.5 CPUs: a second core is partly usable
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu._cgroup_cpus(tmp_path) == 1  # cgroup v1


def test_cpu_estimate_counts_only_the_threads_torch_computes_with():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cpu.usable_cores() == 1
        one = cpu.cpu_peak_estimate(Dtype.fp32)
    finally:
        torch.set_num_threads(threads)
    everything = cpu.cpu_peak_estimate(Dtype.fp32)
    if one is not None:
        assert everything == pytest.approx(one * cpu.usable_cores())


def test_a_mig_slice_never_gets_the_whole_gpus_peak():
    name = "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert peaks.peak_flops(name, Dtype.bf16) is not None  # the table would match the parent
    with pytest.warns(UserWarning, match="MIG slice"):
        assert peaks.resolve_peak("cuda", name, Dtype.bf16) == Peak(None, "unknown")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a measured figure for the slice is fine, silently
        calibrated = peaks.resolve_peak("cuda", name, Dtype.bf16, calibrated_flops=4e13)
    assert calibrated == Peak(4e13, "calibrated")
