"""Entry point: `python -m nanogpt.calibrate [bench.device=cuda:1] [hardware.recalibrate=true]`.

Measures the matmul FLOP/s this machine achieves in every dtype it runs (cached ones are
reused; hardware/calibration.py says how and where) and prints them beside the peak MFU uses.
Composed by Hydra from the same conf/ and schema as `python -m nanogpt.run`.
"""

from __future__ import annotations

import datetime
import sys
import warnings

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import CompactHydraException
from omegaconf.errors import OmegaConfBaseException

from nanogpt import logs
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Dtype
from nanogpt.frontend.compose import hydra_error_line, to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.hardware import calibration
from nanogpt.hardware.device_support import precision_unavailable
from nanogpt.hardware.devices import resolve_device
from nanogpt.hardware.env import device_name
from nanogpt.hardware.peaks import resolve_peak


def format_table(
    device: torch.device,
    results: dict[str, dict | None],
    measured_since: str = "",
    override_tflops: float | None = None,
) -> str:
    """Achievable vs peak per dtype; entries measured before `measured_since` say "cached"."""
    name = device_name(device)
    header = (
        "dtype",
        "achievable TFLOP/s",
        "best shape",
        "peak TFLOP/s",
        "peak source",
        "ach/peak",
    )
    rows, notes = [header], []
    for dtype, entry in results.items():
        if entry is None:
            rows.append((dtype, "-", "-", "-", "-", "-"))
            notes.append(f"{dtype}: not calibrated: {precision_unavailable(device, Dtype(dtype))}.")
            continue
        with warnings.catch_warnings():  # resolve_peak's "MFU will be null" is about runs
            warnings.simplefilter("ignore")
            peak = resolve_peak(device.type, name, Dtype(dtype), override_tflops)
        ratio = entry["tflops"] * 1e12 / peak.flops if peak.flops else None
        when = "cached" if entry["measured_at"] < measured_since else f"{entry['seconds']:.1f} s"
        rows.append(
            (
                dtype,
                f"{entry['tflops']:.4g}",
                entry["shape"],
                f"{peak.flops / 1e12:.4g}" if peak.flops else "-",
                peak.source,
                f"{ratio:.0%} ({when})" if ratio else f"- ({when})",
            )
        )
        if ratio and ratio > 1:
            notes.append(
                f"{dtype}: the measured matmul beats the {peak.source} peak, which is therefore "
                "no ceiling here; mfu_achievable is the honest figure."
            )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([f"{name} ({device})", *lines, *notes])


def main(argv: list[str] | None = None) -> int:
    """Hydra-composed like nanogpt/run.py (same conf/ and schema), with no output dir of its own."""
    overrides = sys.argv[1:] if argv is None else argv
    logs.console()
    if {"-h", "--help"} & set(overrides):
        print(__doc__.strip())
        return 0
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            spec = to_spec(compose(config_name="config", overrides=overrides))
        device = resolve_device(spec.bench.device)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat()
        results = calibration.calibrate(device, force=spec.hardware.recalibrate)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (CompactHydraException, OmegaConfBaseException) as err:
        print(f"error: {hydra_error_line(err)}", file=sys.stderr)
        return 2
    print(format_table(device, results, started, spec.hardware.peak_tflops))
    print(f"cache: {calibration.cache_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
