"""What a fresh process per point costs: the fixed cost of an isolated point (bench.isolate=true,
the default: a child forked from the sweep's fork server) beyond the same point measured in the
sweep's own process (bench.isolate=false). Goal: at most 1 s a point on 2 CPU cores.

Measured side by side in one run, rounds interleaved so that machine noise hits both alike. The
cost of one point is, by default, the median over a sweep's points but its first of the point's
wall_s (result.json: the job process's clock around the whole point, the child's start, run and
exit included) minus the time its training steps took (steps.csv); the first point (which
starts the fork server, or warms the sweep's own process) and the once-per-sweep start-up are
left out. --slope measures it as before: (a sweep of N points - a sweep of 1 point) / (N - 1),
minus the steps' time, which Hydra's own per-job cost enters alike for both modes, and which on
a loaded machine carries the noise of two whole sweeps.

--tree DIR (a checkout of another commit, e.g. from `git archive`) measures that code too, in
the same interleaved rounds, and prints both trees' extra cost side by side: before/after.
--modes picks the modes (e.g. `forked,in-process` to leave out the slow fresh interpreters).

Usage: python benchmarks/point_isolation.py [--rounds 3] [--points 6] [--tree DIR] [--modes ...]
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
from nanogpt.analysis.store import read_result
from tests.conftest import MICRO  # noqa: E402 - the tests' micro point: a few ms a step

# How a point runs: forked from the fork server (the default), a fresh interpreter each
# (NANOGPT_FORKSERVER=0, the launch before the fork server), in the sweep's own process.
MODES = {
    "forked": (True, {}),
    "fresh interpreter": (True, {"NANOGPT_FORKSERVER": "0"}),
    "in-process": (False, {}),
}


ROOT = Path(__file__).resolve().parents[1]


def sweep_overhead(tmp: Path, mode: str, points: int, tree: Path = ROOT) -> float:
    """Wall time of a multirun of `points` points, run from `tree`'s code, minus the time its
    training steps took."""
    isolate, env = MODES[mode]
    env = {**env, "PYTHONPATH": str(tree)}
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


def per_record(tmp: Path, mode: str, points: int, tree: Path = ROOT) -> float:
    """The median of the points' wall_s minus their steps' time, the first point left out."""
    isolate, env = MODES[mode]
    sweep = tmp / f"sweep_{points}_{time.monotonic_ns()}"
    seeds = ",".join(str(s) for s in range(points))
    args = ["-m", *MICRO, f"bench.isolate={str(isolate).lower()}", f"bench.seed={seeds}"]
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp,
        check=True,
        capture_output=True,
        env={**os.environ, **env, "PYTHONPATH": str(tree)},
    )
    costs = []
    for number in range(1, points):
        job = sweep / str(number)
        wall = read_result(job / "result.json")["wall_s"]
        with open(job / "steps.csv") as f:
            costs.append(wall - sum(float(row["step_ms"]) for row in csv.DictReader(f)) / 1e3)
    return statistics.median(costs)


def per_point(tmp: Path, mode: str, points: int, tree: Path = ROOT) -> float:
    one = sweep_overhead(tmp, mode, 1, tree)
    many = sweep_overhead(tmp, mode, points, tree)
    return (many - one) / (points - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--tree", type=Path, help="another checkout, measured side by side")
    parser.add_argument("--slope", action="store_true", help="sweep of N - sweep of 1 points")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES)
    )
    args = parser.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    trees = {"this checkout": ROOT, **({str(args.tree): args.tree} if args.tree else {})}
    costs = {(tree, mode): [] for tree in trees for mode in modes}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.rounds):
            for (tree, mode), seconds in costs.items():
                measure = per_point if args.slope else per_record
                seconds.append(measure(tmp, mode, args.points, trees[tree]))
            print(
                f"round {i}: " + ", ".join(f"{t} {m} {s[-1]:.2f} s" for (t, m), s in costs.items())
            )
    load = os.getloadavg()[0]
    for tree in trees:
        base = costs.get((tree, "in-process"))
        for mode in [m for m in modes if m != "in-process" and base]:
            extra = statistics.median(a - b for a, b in zip(costs[tree, mode], base, strict=True))
            verdict = "met" if extra <= 1.0 else "NOT met"
            print(
                f"{tree}: {mode}: a point costs {extra:.2f} s more than in-process (median of "
                f"{args.rounds} rounds, 1-min load {load:.1f}; goal <= 1 s: {verdict})"
            )


if __name__ == "__main__":
    main()
