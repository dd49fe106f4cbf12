"""The search's wall time on two slots against one: the same search (hydra/sweeper=tune, the
same candidates and seed) on `hydra/launcher=parallel hydra.launcher.slots=2
hydra.launcher.cores_per_slot=1` and on `slots=1 cores_per_slot=1`, alternated pair by pair so
that a shared machine's load falls on both alike. Two slots measure a probe batch's two
candidates (Optuna's constant liar), the leaders and the finalists' runs side by side.

Prints each pair's wall times and each search's answer (its closing line: best.yaml's overrides
and figures), then the median ratio (two slots / one; goal <= 0.6).

Usage: python benchmarks/search_slots.py [--pairs 3] [OVERRIDE ...]
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

SEARCH = [
    "hydra/sweeper=tune",
    "perf.batch_size=choice(1,2,4,8)",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=64",
    "model.vocab_size=256",
    "bench.device=cpu",
    "bench.exclusive=off",
    "logger=none",
    "hydra.sweeper.n_trials=4",
    "hydra.sweeper.leaders=2",
    "hydra.sweeper.finalists=1",
    "hydra.sweeper.repeats=2",
    "bench.warmup_steps=2",
    "bench.measure_steps=10",
    "bench.diagnose=false",
]


def search(slots: int, extra: list[str]) -> tuple[float, str]:
    """(wall s, the answer: the search's closing line) of one search in a fresh dir."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        launcher = [
            "hydra/launcher=parallel",
            f"hydra.launcher.slots={slots}",
            "hydra.launcher.cores_per_slot=1",
        ]
        command = [sys.executable, "-m", "nanogpt.run", "-m", *SEARCH, *launcher, *extra]
        started = time.perf_counter()
        proc = subprocess.run(
            [*command, f"hydra.sweep.dir={sweep_dir}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "WANDB_MODE": "offline"},
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"error: the search on {slots} slot(s) failed:\n{proc.stderr[-2000:]}")
        found = [line for line in proc.stdout.splitlines() if line.startswith("best (best.yaml)")]
        return wall, found[0].removeprefix("best (best.yaml): ") if found else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    print(f"1-min load {os.getloadavg()[0]:.1f}; {args.pairs} pair(s)")
    ratios = []
    for number in range(args.pairs):
        order = (2, 1) if number % 2 == 0 else (1, 2)
        walls, answers = {}, {}
        for slots in order:
            walls[slots], answers[slots] = search(slots, args.overrides)
            print(
                f"pair {number + 1}: {slots} slot(s): {walls[slots]:.1f} s, best {answers[slots]}"
            )
        ratios.append(walls[2] / walls[1])
    median = statistics.median(ratios)
    print(
        f"search wall, 2 slots / 1 slot, median of {len(ratios)} pairs: {median:.2f} "
        f"(goal <= 0.6: {'met' if median <= 0.6 else 'not met'})"
    )


if __name__ == "__main__":
    main()
