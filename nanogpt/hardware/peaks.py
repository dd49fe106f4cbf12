"""The peak FLOP/s that MFU divides by.

MFU (model FLOPs utilisation) is achieved FLOP/s over peak FLOP/s, so the peak has to be the right
one for the device *and* the math mode. A peak comes from one of these sources (`Peak.source`):

- "datasheet": a table of NVIDIA's published figures, looked up by the exact string that
  `torch.cuda.get_device_name()` returns;
- "cpu-estimate": cores x clock x FLOP per cycle, worked out from the CPU's SIMD flags
  (hardware/cpu.py);
- "override": `hardware.peak_tflops=...` given by the user, which always wins;
- "calibrated": the achievable matmul peak measured on this machine (hardware/calibration.py),
  used as `peak_tflops` only when none of the above exists (an unknown GPU, a CPU without an
  estimate, MPS): then `mfu` and `mfu_achievable` are the same number;
- "unknown": none of the above; MFU is then recorded as null rather than guessed.

`peak_source` always describes `peak_tflops`. The calibrated figure also appears on its own, as
`achievable_tflops` beside it, whatever `peak_source` says.

Every figure here is DENSE. NVIDIA prints most tensor-core rates "with sparsity" (2:4 structured
sparsity, which doubles the rate); dense training never gets that factor, so those prints are
halved. A table entry that lacks a dtype means the GPU has no hardware path for it (V100 and T4
have no bf16 or tf32 tensor cores) and the lookup answers None instead of inventing a rate.
"""

from __future__ import annotations

import re
import warnings

from nanogpt.analysis.derive import Peak
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Dtype
from nanogpt.hardware.cpu import cpu_peak_estimate

# --------------------------------------------------------------------------------------------
# GPU datasheet table
# --------------------------------------------------------------------------------------------


def _sparse_print(fp32: float, tf32: float, half: float) -> dict[str, float]:
    """A datasheet row whose tensor rates are printed "with sparsity" (marked *): TF32 and the
    16-bit rate (BF16 = FP16) halved to the dense ones; FP32 (CUDA cores) as printed."""
    return {"fp32": fp32, "tf32": tf32 / 2, "bf16": half / 2, "fp16": half / 2}


# TFLOP/s by GPU model and dtype. "fp32" is the plain CUDA-core FP32 rate (TF32 off); the others
# are tensor-core rates. Each comment names the source and quotes the figures as printed there.
#
# GeForce and RTX workstation cards print two 16-bit tensor rates: FP16 *accumulate* and the
# (on GeForce, halved) FP32 accumulate. PyTorch's matmuls accumulate in FP32, so that is the
# column used for them.
_GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet: the same figures for SXM4 and PCIe, 40 and 80 GB:
    # FP32 19.5 | TF32 156 (312*) | BF16 312 (624*) | FP16 312 (624*).
    "A100 SXM": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    "A100 PCIe": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column:
    # FP32 67 | TF32 989* | BF16 1,979* | FP16 1,979*.
    "H100 SXM": _sparse_print(fp32=67, tf32=989, half=1979),
    # Same datasheet, H100 PCIe column: FP32 51 | TF32 756* | BF16 1,513* | FP16 1,513*.
    "H100 PCIe": _sparse_print(fp32=51, tf32=756, half=1513),
    # Same datasheet, H100 NVL column (per GPU, current edition): FP32 60 | TF32 835* |
    # BF16 1,671* | FP16 1,671*. The launch edition printed the NVLink-bridged *pair* instead
    # (FP32 134, BF16 3,958*); one CUDA device is one GPU, so the per-GPU figures are used.
    "H100 NVL": _sparse_print(fp32=60, tf32=835, half=1671),
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 | TF32 120* | BF16 242* | FP16 242*.
    "L4": _sparse_print(fp32=30.3, tf32=120, half=242),
    # NVIDIA L40S datasheet (prints dense | sparse): FP32 91.6 | TF32 183 | 366* |
    # BF16 362.05 | 733* | FP16 362.05 | 733*.
    "L40S": {"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05},
    # NVIDIA L40 datasheet (dense | sparse): FP32 90.5 | TF32 90.5 | 181* |
    # BF16 181.05 | 362.1* | FP16 181.05 | 362.1*.
    "L40": {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05},
    # NVIDIA A10 Tensor Core GPU datasheet (dense | sparse): FP32 31.2 | TF32 62.5 | 125* |
    # BF16 125 | 250* | FP16 125 | 250*.
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125},
    # A10G (AWS G5 only): NVIDIA publishes no datasheet, so these are LESS CERTAIN. Baseten's
    # "NVIDIA A10 vs A10G for ML model inference" tabulates FP32 35 | TF32 35 | BF16/FP16 70
    # TFLOPS: the GA102 GeForce pattern (FP32-accumulate tensor math at half rate) rather than
    # the A10's. A public matmul benchmark of an A10G (zzc0721/torch-performance-test-data
    # issue #126) reached 69.5 TFLOP/s bf16 and 34.7 tf32, which fits 70/35 and not 125/62.5.
    "A10G": {"fp32": 35, "tf32": 35, "bf16": 70, "fp16": 70},
    # NVIDIA Tesla V100 datasheet, SXM2 column: single precision 15.7 | tensor 125 (mixed FP16
    # multiply with FP32 accumulate; Volta has no sparsity, no bf16 and no tf32).
    "V100 SXM2": {"fp32": 15.7, "fp16": 125},
    # Same datasheet, PCIe column: single precision 14 | tensor 112.
    "V100 PCIe": {"fp32": 14, "fp16": 112},
    # NVIDIA V100S datasheet (PCIe): single precision 16.4 | tensor 130.
    "V100S PCIe": {"fp32": 16.4, "fp16": 130},
    # NVIDIA T4 datasheet: single precision 8.1 | mixed precision (FP16/FP32) 65. Turing has no
    # bf16 or tf32.
    "T4": {"fp32": 8.1, "fp16": 65},
    # NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix "GeForce RTX 3090":
    # FP32 35.6 | TF32 35.6/71* | BF16 (FP32 acc.) 71/142* | FP16 with FP32 accumulate 71/142*
    # (FP16 accumulate, which PyTorch does not use, is 142/284*).
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71},
    # Same whitepaper, appendix "RTX A6000": FP32 38.7 | TF32 77.4/154.8* |
    # BF16 154.8/309.7* | FP16 with FP32 accumulate 154.8/309.7*.
    "RTX A6000": {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8},
    # NVIDIA Ada GPU Architecture whitepaper, GeForce RTX 4090 column: FP32 82.6 |
    # TF32 82.6/165.2* | BF16 165.2/330.4* | FP16 with FP32 accumulate 165.2/330.4*.
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    # Same whitepaper, RTX 6000 Ada Generation column: FP32 91.1 | TF32 182.1/364.2* |
    # BF16 364.2/728.5* | FP16 with FP32 accumulate 364.2/728.5*.
    "RTX 6000 Ada": {"fp32": 91.1, "tf32": 182.1, "bf16": 364.2, "fp16": 364.2},
    # NVIDIA H20 product brief (dense figures, no sparse column): FP32 44 | TF32 74 |
    # BF16 148 | FP16 148. LESS CERTAIN: no public NVIDIA datasheet; widely reported figures,
    # consistent with measured bf16 matmuls of ~136 TFLOP/s.
    "H20": {"fp32": 44, "tf32": 74, "bf16": 148, "fp16": 148},
    # NVIDIA A40 datasheet (dense | sparse): FP32 37.4 | TF32 74.8 | 149.6* |
    # BF16 149.7 | 299.4* | FP16 149.7 | 299.4*.
    "A40": {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7},
    # NVIDIA A30 datasheet (dense | sparse): FP32 10.3 | TF32 82 | 165* | BF16 165 | 330* |
    # FP16 165 | 330*.
    "A30": {"fp32": 10.3, "tf32": 82, "bf16": 165, "fp16": 165},
    # NVIDIA HGX B200 page, per GPU: FP32 75 | TF32 2.2 PF* | BF16 4.5 PF* | FP16 4.5 PF*
    # (NVIDIA's exemplar-performance README uses 2,250 dense BF16).
    "B200": _sparse_print(fp32=75, tf32=2200, half=4500),
    # NVIDIA GB200 NVL72 page, per Blackwell GPU (the rack's figures / 72): FP32 80 |
    # TF32 2.5 PF* | BF16 5 PF* | FP16 5 PF*.
    "GB200": _sparse_print(fp32=80, tf32=2500, half=5000),
    # NVIDIA HGX platform page, HGX B300 column (8 GPUs, all marked * but FP32): FP32 600 TF |
    # TF32 18 PF* | FP16/BF16 36 PF* | FP8 72 PF*; per GPU FP32 75 | TF32 2.25 PF* | BF16 4.5 PF*.
    # LESS CERTAIN: read from secondary copies of NVIDIA's table (fibermall's "HGX B300 NVL16"
    # table; Glenn Lockwood's B300 page, dense per GPU: FP32 75, TF32 1,125, BF16 2,250).
    "B300": _sparse_print(fp32=75, tf32=2250, half=4500),
    # NVIDIA GB300 NVL72 page, per Blackwell Ultra GPU (the rack's / 72): BF16 5 PF* (360 PF*
    # the rack). LESS CERTAIN: the per-GPU figures read from Verda's "GB300 NVL72 architecture"
    # post, which prints them dense: FP32 80 | TF32 1,250 | FP16/BF16 2,500 TFLOP/s.
    "GB300": {"fp32": 80, "tf32": 1250, "bf16": 2500, "fp16": 2500},
    # NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090 column: FP32 104.8 |
    # TF32 104.8/209.5* | BF16 (FP32 accumulate) 209.5/419* | FP16 with FP32 accumulate
    # 209.5/419*. Its boost clock often runs above the rated one: MFU can pass 100 % a little.
    "RTX 5090": {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5},
    # AMD Instinct MI300X (ROCm docs, "AMD Instinct MI300 series microarchitecture", peak
    # table; AMD prints dense figures): FP32 163.4 | BF16 1,307.4 | FP16 1,307.4. ROCm's
    # PyTorch does not run fp32 matmuls as TF32 by default, so tf32 has no figure here.
    "MI300X": {"fp32": 163.4, "bf16": 1307.4, "fp16": 1307.4},
    # AMD Instinct MI250X (AMD's launch specifications, per OAM package of two GCDs): FP32
    # matrix 95.7 | BF16 383 | FP16 383. torch sees each GCD as one device: half of each.
    "MI250X GCD": {"fp32": 95.7 / 2, "bf16": 383 / 2, "fp16": 383 / 2},
}

# Parts whose datasheets print exactly another part's compute figures: the same die at the same
# clocks, with other memory, NVLink or FP64.
# - NVIDIA H200 datasheet: H200 SXM FP32 67 | TF32 989* | BF16 1,979* | FP16 1,979*, as H100
#   SXM; H200 NVL FP32 60 | TF32 835* | BF16 1,671*, as H100 NVL.
# - NVIDIA GH200 Grace Hopper Superchip datasheet, GPU: FP32 67 | TF32 989* | BF16 1,979*, the
#   H100 SXM die. LESS CERTAIN: read from secondary copies of the datasheet.
# - NVIDIA H800 datasheet (the export variant: only FP64 and NVLink are cut): the SXM column as
#   H100 SXM, the PCIe column as H100 PCIe.
# - AMD Instinct MI325X (the MI300X's CDNA 3 die, 304 CUs at 2,100 MHz, with HBM3E): FP32
#   163.4 | FP16/BF16 1,307.4, as MI300X. LESS CERTAIN: read from secondary copies of AMD's
#   specifications (Vultr's ROCm hardware-requirements page: FP16 1,307 TFLOPS).
# MI350X and MI355X (CDNA 4) are not in the table: no copy of AMD's dense BF16/FP16 figures was
# found to source them (only FP32 157.3 for the MI355X), and a row without its 16-bit rate would
# read as "no hardware path" (above). Their points get a calibrated peak or hardware.peak_tflops.
_SAME_COMPUTE = {
    "H200 SXM": "H100 SXM",
    "H200 NVL": "H100 NVL",
    "GH200": "H100 SXM",
    "H800 SXM": "H100 SXM",
    "H800 PCIe": "H100 PCIe",
    "MI325X": "MI300X",
}
_GPU_PEAK_TFLOPS.update({part: _GPU_PEAK_TFLOPS[same] for part, same in _SAME_COMPUTE.items()})

# How a device-name string maps to a table row. Rules are tried in order and the first match
# wins, so a specific rule must come before a general one ("H100 ... NVL" before plain "H100").
# Names are upper-cased first, so the patterns are too.
#
# \b (a word boundary) is what keeps look-alikes apart: in "L40S" there is no boundary after
# "L4" or "L40", so r"\bL4\b" cannot match it; likewise "A10G" vs "A10" vs "A100", and "GH200"
# (a Grace Hopper superchip, not in the table) vs "H200". GeForce names are anchored at the end
# ($) so that "RTX 3090 Ti", "RTX 4090 D" and "RTX 4090 Laptop GPU" (other chips, other clocks)
# fall through to None.
_GPU_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "GH200"),  # before H200: a Grace Hopper superchip, not an H200
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    # The SXM part reports itself as "NVIDIA H100 80GB HBM3" (the PCIe card uses HBM2e). A bare
    # "H100" matches nothing: PCIe is 24% below SXM, too big a difference to guess across.
    (r"\bH100\b.*\b(SXM|HBM3)", "H100 SXM"),
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    # The SXM part reports itself simply as "NVIDIA H200".
    (r"\bH200\b", "H200 SXM"),
    (r"\bA100\b.*\bPCIE\b", "A100 PCIe"),
    # "NVIDIA A100-SXM4-40GB", "...-80GB", and any A100 that names no form factor: the A100
    # datasheet gives SXM4 and PCIe identical peaks, so this choice only affects the label.
    (r"\bA100\b", "A100 SXM"),
    (r"\bL40S\b", "L40S"),
    (r"\bL40\b", "L40"),
    (r"\bL4\b", "L4"),
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bV100S\b", "V100S PCIe"),
    # "Tesla V100-SXM2-16GB" / "-32GB". SXM3 (DGX-2) and bare "V100" names match nothing.
    (r"\bV100\b.*\bSXM2\b", "V100 SXM2"),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
    (r"\bT4\b", "T4"),
    (r"\bRTX 3090$", "RTX 3090"),
    (r"\bRTX 4090$", "RTX 4090"),
    (r"\bRTX A6000$", "RTX A6000"),
    (r"\bRTX 6000 ADA\b", "RTX 6000 Ada"),
    (r"\bH800\b.*\bPCIE\b", "H800 PCIe"),
    (r"\bH800\b", "H800 SXM"),
    (r"\bH20\b", "H20"),  # not H200: no word boundary after "H20" there
    (r"\bA40\b", "A40"),
    (r"\bA30\b", "A30"),
    (r"\bGB200\b", "GB200"),
    (r"\bB200\b", "B200"),
    (r"\bGB300\b", "GB300"),  # (\bB300\b cannot match "GB300": no boundary inside it)
    (r"\bB300\b", "B300"),
    (r"\bRTX 5090$", "RTX 5090"),  # not "5090 D" or "Laptop GPU": other chips, other clocks
    (r"\bMI325X\b", "MI325X"),
    (r"\bMI300X\b", "MI300X"),  # also "AMD Instinct MI300X VF" in cloud VMs
    (r"\bMI250X\b", "MI250X GCD"),
)


def gpu_model(device_name: str) -> str | None:
    """The table row for a CUDA device name ("NVIDIA H100 PCIe" -> "H100 PCIe"); None if unknown."""
    name = device_name.strip().upper()
    for pattern, model in _GPU_NAME_RULES:
        if re.search(pattern, name):
            return model
    return None


def peak_flops(device_name: str, dtype: Dtype) -> float | None:
    """Dense datasheet peak in FLOP/s for a CUDA device name; None if unknown or unsupported."""
    model = gpu_model(device_name)
    if model is None:
        return None
    tflops = _GPU_PEAK_TFLOPS[model].get(Dtype(dtype).value)
    return None if tflops is None else tflops * 1e12


# --------------------------------------------------------------------------------------------
# Choosing the peak for a run
# --------------------------------------------------------------------------------------------


def resolve_peak(
    device_type: str,
    device_name: str,
    dtype: Dtype,
    override_tflops: float | None = None,
    calibrated_flops: float | None = None,
) -> Peak:
    """The peak for one run: the user's override, else the datasheet (cuda) or estimate (cpu),
    else the calibrated (measured) matmul peak."""
    dtype = Dtype(dtype)
    if override_tflops is not None:
        if override_tflops <= 0:
            raise ConfigError("hardware.peak_tflops", "must be positive", "give TFLOP/s or null")
        return Peak(override_tflops * 1e12, "override")
    if device_type == "cuda" and re.search(r"\bMIG\b", device_name.upper()):
        # A MIG slice has a fraction of the GPU's SMs: the whole GPU's datasheet peak would
        # understate its MFU up to 7x.
        flops, source = None, "unknown"
        why = "it is a MIG slice, and the datasheet peak is the whole GPU's"
    elif device_type == "cuda":
        flops, source = peak_flops(device_name, dtype), "datasheet"
        why = "its model is not in the datasheet table, or has no such math mode"
    elif device_type == "cpu":
        flops, source = cpu_peak_estimate(dtype), "cpu-estimate"
        why = "no native path for it is known on this CPU"
    else:
        flops, source, why = None, "unknown", "no datasheet covers this device type"
    if flops is None and calibrated_flops is not None:
        flops, source = calibrated_flops, "calibrated"
    if flops is None:
        warnings.warn(
            f"No peak FLOP/s known for {device_type} device {device_name!r} at {dtype.value} "
            f"({why}), so MFU will be null; set hardware.peak_tflops=<TFLOP/s> to supply one, "
            "or hardware.calibrate=true to measure one.",
            stacklevel=2,
        )
        return Peak(None, "unknown")
    return Peak(flops, source)
