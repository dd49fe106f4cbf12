"""What a fresh process per point costs: the fixed cost of an isolated point (bench.isolate=true,
the default: a child forked from the sweep's fork server) beyond the same point measured in the
sweep's own process (bench.isolate=false). Goal: at most 1 s a point on 2 CPU cores.

Measured side by side in one run, rounds interleaved so that machine noise hits both alike. The
cost of one point is the slope: (a sweep of N points - a sweep of 1 point) / (N - 1), minus the
time its training steps took (steps.csv), so the once-per-sweep start-up (interpreter, imports,
the fork server's start, the table) is left out.

Usage: python benchmarks/point_isolation.py [--rounds 3] [--points 6]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import MICRO  # noqa: E402 - the tests' micro point: a few ms a step

# How a point runs: forked from the fork server (the default), a fresh interpreter each
# (NANOGPT_FORKSERVER=0, the launch before the fork server), in the sweep's own process.
MODES = {
    "forked": (True, {}),
    "fresh interpreter": (True, {"NANOGPT_FORKSERVER": "0"}),
    "in-process": (False, {}),
}


def sweep_overhead(tmp: Path, mode: str, points: int) -> float:
    """Wall time of a multirun of `points` points minus the time its training steps took."""
    isolate, env = MODES[mode]
    sweep = tmp / f"sweep_{points}_{time.monotonic_ns()}"
    seeds = ",".join(str(s) for s in range(points))
    args = ["-m", *MICRO, f"bench.isolate={str(isolate).lower()}", f"bench.seed={seeds}"]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp,
        check=True,
        capture_output=True,
        env={**os.environ, **env},
    )
    wall = time.perf_counter() - started
    training = 0.0
    for steps in sweep.glob("*/steps.csv"):
        with open(steps) as f:
            training += sum(float(row["step_ms"]) for row in csv.DictReader(f)) / 1e3
    return wall - training


def per_point(tmp: Path, mode: str, points: int) -> float:
    one = sweep_overhead(tmp, mode, 1)
    many = sweep_overhead(tmp, mode, points)
    return (many - one) / (points - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=6)
    args = parser.parse_args()
    costs: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.rounds):
            for mode, seconds in costs.items():
                seconds.append(per_point(tmp, mode, args.points))
            print(f"round {i}: " + ", ".join(f"{m} {s[-1]:.2f} s" for m, s in costs.items()))
    base = costs["in-process"]
    for mode in ("forked", "fresh interpreter"):
        extra = statistics.median(a - b for a, b in zip(costs[mode], base, strict=True))
        verdict = "met" if extra <= 1.0 else "NOT met"
        print(
            f"{mode}: a point costs {extra:.2f} s more than in-process (median of "
            f"{args.rounds} rounds; goal <= 1 s: {verdict})"
        )


if __name__ == "__main__":
    main()
