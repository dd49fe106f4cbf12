"""How long calibrating one dtype takes with the default shape search (goal: <= 10 s each).

Calibrates every dtype the device has, fresh, into a throw-away cache (the user's cache is left
alone), and prints the wall time of each beside the achievable TFLOP/s it found. The load average
is printed too: on a busy machine both the time and the figures suffer.

Usage: python benchmarks/calibrate_speed.py [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from nanogpt.config.spec import Dtype
from nanogpt.hardware.calibration import calibrate
from nanogpt.hardware.devices import precision_unavailable
from nanogpt.hardware.env import device_name

GOAL_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    device = torch.device(parser.parse_args().device)
    print(
        f"{device_name(device)} ({device}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "calibration.json"
        for dtype in Dtype:
            reason = precision_unavailable(device, dtype)
            if reason:
                print(f"{dtype.value:5}  skipped: {reason}")
                continue
            started = time.perf_counter()
            entry = calibrate(device, (dtype,), force=True, cache=cache)[dtype.value]
            wall = time.perf_counter() - started
            verdict = "ok" if wall <= GOAL_S else f"OVER the {GOAL_S:.0f} s goal"
            print(
                f"{dtype.value:5}  {wall:5.1f} s  {entry['tflops']:.4g} TFLOP/s at {entry['shape']}"
                f"  ({verdict})"
            )


if __name__ == "__main__":
    main()
