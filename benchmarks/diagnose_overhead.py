"""Does the diagnosis change what is measured? Goal: the measured step time with
bench.diagnose=true is the one with bench.diagnose=false, within noise; and what a diagnosis
costs in wall time a point.

Measured side by side in one run: each round is one sweep of four points, bench.diagnose on and
off at two seeds (the seed changes only the synthetic tokens, not the work), run in the default
way (each point in a process of its own), with the order of on and off flipped every round so
that drift hits both alike. Printed per round and as medians:

- on / off: step_ms_median with the diagnosis over the same point without it (same seed);
- off / off: the two seeds' points without it, the A/A ratio: the noise to compare against;
- the wall time the diagnosis adds to a point (result.json's wall_s, on minus off).

Each point computes with one intra-op thread (OMP_NUM_THREADS=1; --threads to change it): on a
shared machine OpenMP's barriers wait for a thread another process descheduled, which turns the
neighbours' load into swings of several times between identical points, far above anything the
diagnosis could do.

Usage: python benchmarks/diagnose_overhead.py [--rounds 5] [--measure-steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from nanogpt.analysis.store import read_result

# A point of a few tens of ms a step on 2 CPU cores: many operators, some real matmuls.
POINT = [
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_embd=64",
    "model.block_size=64",
    "model.vocab_size=1024",
    "perf.batch_size=4",
    "bench.device=cpu",
    "bench.warmup_steps=2",
    "bench.min_measure_steps=5",
    "logger=none",
]
SEEDS = (1337, 1338)


def one_round(tmp: Path, index: int, measure_steps: int, threads: int) -> dict:
    """One sweep of the four points; (diagnose, seed) -> its result.json."""
    order = "true,false" if index % 2 == 0 else "false,true"
    sweep = tmp / f"round{index}"
    args = [
        "-m",
        *POINT,
        f"bench.measure_steps={measure_steps}",
        f"bench.diagnose={order}",
        f"bench.seed={','.join(map(str, SEEDS))}",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "nanogpt.run", *args]
    subprocess.run(command, cwd=tmp, check=True, capture_output=True, env=env)
    records = {}
    for path in sweep.glob("*/result.json"):
        record = read_result(path)
        overrides = " ".join(record["overrides"]).lower()
        seed = next(s for s in SEEDS if f"bench.seed={s}" in overrides)
        records[("bench.diagnose=true" in overrides, seed)] = record
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--measure-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    on_off, a_a, extra_s, verdicts = [], [], [], []
    with tempfile.TemporaryDirectory() as name:
        for i in range(args.rounds):
            records = one_round(Path(name), i, args.measure_steps, args.threads)
            ms = {key: r["step_ms_median"] for key, r in records.items()}
            ratios = [ms[(True, seed)] / ms[(False, seed)] for seed in SEEDS]
            on_off += ratios
            a_a.append(ms[(False, SEEDS[1])] / ms[(False, SEEDS[0])])
            extra_s += [records[(True, s)]["wall_s"] - records[(False, s)]["wall_s"] for s in SEEDS]
            verdicts += [records[(True, s)]["bottleneck"] for s in SEEDS]
            print(
                f"round {i}: on/off {ratios[0]:.3f} {ratios[1]:.3f}, off/off {a_a[-1]:.3f}, "
                f"step {ms[(False, SEEDS[0])]:.1f} ms, diagnosis +{extra_s[-2]:.2f} "
                f"+{extra_s[-1]:.2f} s"
            )
    print(
        f"measured step, diagnosis on / off: median {statistics.median(on_off):.3f} "
        f"(from {min(on_off):.3f} to {max(on_off):.3f}, {len(on_off)} pairs)"
    )
    print(
        f"A/A, off / off (noise): median {statistics.median(a_a):.3f} "
        f"(from {min(a_a):.3f} to {max(a_a):.3f}, {len(a_a)} pairs)"
    )
    print(f"wall time a diagnosis adds to a point: median {statistics.median(extra_s):.2f} s")
    print(f"verdicts: {', '.join(sorted(set(map(str, verdicts))))}")


if __name__ == "__main__":
    main()
