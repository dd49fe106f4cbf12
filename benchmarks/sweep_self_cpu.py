"""The sweep process's own CPU time (RUSAGE_SELF): what composing, launching, resuming and
tabulating cost, apart from the measuring processes (the fork server and its children are
processes of their own). Against another checkout (--tree: e.g. `git archive` of an earlier
commit), alternated pair by pair so that a shared machine's load falls on both alike; prints
each pair, the median ratio (this tree over the other) and the goal.

The sweep is `make sweep`'s command (the README's), or with --micro the same four points on a
micro model (seconds a point instead of half a minute: the sweep process's share is the same
code). --points N makes it N micro points instead (perf.batch_size=1..N), for the cost a point
at scale: --points 20 against --points 200 (issue 44's goal: within 1.2x a point).

Usage: python benchmarks/sweep_self_cpu.py [--tree DIR] [--pairs 5] [--micro | --points N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["perf.compile=true,false", "perf.dtype=bf16,fp16"]  # the Makefile's `sweep`
MICRO = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=16",
    "model.vocab_size=256",
    "perf.batch_size=2",
    "bench.device=cpu",
    "bench.warmup_steps=1",
    "bench.measure_steps=2",
    "bench.min_measure_steps=1",
    "bench.diagnose=false",
    "bench.exclusive=off",
    "logger=none",
]
# Runs nanogpt.run as `python -m` does, and writes this process's own CPU seconds at its exit.
WRAPPER = """
import atexit, json, resource, runpy, sys
out = sys.argv.pop(1)
def said():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as f:
        json.dump({"cpu_s": usage.ru_utime + usage.ru_stime}, f)
atexit.register(said)
sys.argv[0] = "nanogpt.run"
runpy.run_module("nanogpt.run", run_name="__main__", alter_sys=True)
"""


def self_cpu(tree: Path, overrides: list[str]) -> float:
    """The sweep process's CPU seconds, the sweep run from `tree`'s code in a fresh dir."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree), "WANDB_MODE": "offline"}
        out = Path(tmp) / "cpu.json"
        command = [sys.executable, "-c", WRAPPER, str(out), "-m", *overrides]
        proc = subprocess.run(
            [*command, f"hydra.sweep.dir={tmp}/sweep"], cwd=tmp, env=env, capture_output=True
        )
        if proc.returncode != 0:
            sys.exit(f"error: the sweep from {tree} failed:\n{proc.stderr.decode()[-2000:]}")
        return json.loads(out.read_text())["cpu_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="another checkout to compare with")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--micro", action="store_true", help="make sweep's points, micro model")
    parser.add_argument("--points", type=int, help="N micro points (perf.batch_size=1..N)")
    args = parser.parse_args()
    if args.points:
        sizes = ",".join(str(n) for n in range(1, args.points + 1))
        overrides = [
            *[o for o in MICRO if not o.startswith("perf.batch")],
            f"perf.batch_size={sizes}",
        ]
    else:
        overrides = [*SWEEP, *MICRO] if args.micro else SWEEP
    load = os.getloadavg()[0]
    print(f"{len(overrides)} overrides; 1-min load {load:.1f}; {args.pairs} pair(s)")
    ours, theirs = [], []
    for number in range(args.pairs):
        trees = [ROOT, args.tree] if number % 2 == 0 else [args.tree, ROOT]
        for tree in trees:
            if tree is None:
                continue
            seconds = self_cpu(tree, overrides)
            (ours if tree == ROOT else theirs).append(seconds)
            print(f"pair {number + 1}: {'this tree' if tree == ROOT else tree}: {seconds:.2f} s")
    per_point = args.points or 4
    mid = statistics.median(ours)
    print(f"this tree: median {mid:.2f} s ({mid / per_point:.3f} s a point)")
    if theirs:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        median = statistics.median(ratios)
        print(f"other tree: median {statistics.median(theirs):.2f} s")
        print(
            f"sweep process CPU, this tree / other, median of {len(ratios)} pairs: {median:.3f}"
            f" (goal <= 1.10: {'met' if median <= 1.10 else 'not met'})"
        )


if __name__ == "__main__":
    main()
