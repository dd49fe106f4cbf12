"""What hydra/launcher=parallel saves: the wall time of a sweep of 4 CPU points on 2 core sets
(one core each, one thread each), against the same 4 points run one after another by the
default launcher (each point free to use every core). Goal: parallel / serial <= 0.6.

Measured side by side in one run: rounds alternate which sweep goes first, so that machine
noise and other users' load hit both alike; the load average is printed with each round (this
machine is shared: a busy neighbour takes cores from the parallel sweep's slots, and from the
serial sweep's threads, in different measure). Each sweep gets a fresh sweep dir: nothing is
resumed. Every point trains a small GPT for a fixed number of steps (no time budget), so both
sweeps do the same work.

Usage: python benchmarks/parallel_launcher.py [--rounds 3] [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POINT = [  # tens of ms a step on one core, fp32 (this CPU emulates 16-bit matmuls)
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_embd=64",
    "model.block_size=64",
    "model.vocab_size=256",
    "perf.batch_size=4",
    "perf.dtype=fp32",
    "bench.device=cpu",
    "bench.warmup_steps=2",
    "bench.min_measure_steps=1",
    "bench.time_budget_s=100000",
    "bench.diagnose=false",
    "logger=none",
    "bench.seed=0,1,2,3",
]
LAUNCHERS = {"serial": [], "parallel": ["hydra/launcher=parallel", "hydra.launcher.slots=2"]}


def sweep_wall(tmp: Path, name: str, steps: int) -> float:
    sweep_dir = tmp / f"{name}_{time.monotonic_ns()}"
    args = ["-m", *LAUNCHERS[name], *POINT, f"bench.measure_steps={steps}"]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} cores; 4 points of {args.steps} measured steps; {args.rounds} rounds")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(args.rounds):
            order = ["serial", "parallel"] if number % 2 == 0 else ["parallel", "serial"]
            load = os.getloadavg()[0]
            wall = {name: sweep_wall(Path(tmp), name, args.steps) for name in order}
            ratios.append(wall["parallel"] / wall["serial"])
            print(
                f"round {number + 1}: serial {wall['serial']:.1f} s, parallel "
                f"{wall['parallel']:.1f} s, ratio {ratios[-1]:.2f} (load {load:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after)"
            )
    median = statistics.median(ratios)
    verdict = "met" if median <= 0.6 else "not met"
    print(f"parallel / serial wall time: median {median:.2f} (goal <= 0.6: {verdict})")


if __name__ == "__main__":
    main()
