"""Does the verdict of `python -m nanogpt.report NEW --compare OLD` hold on real sweeps?

A/A: the same point measured in two sweeps must come out "~" (no significant difference) in at
least 95 % of trials. A real difference: the same point with the machine's two cores against
one (OMP_NUM_THREADS=1, a matmul-bound model: a slowdown well over 20 %) must be judged
significant every time. Run it on an idle machine: other load is a real difference too.

Usage: python benchmarks/compare_significance.py [--trials 20] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from nanogpt.analysis.compare import compare_sweeps
from nanogpt.analysis.table import build_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import with_micro  # noqa: E402
from tests.test_compare import THREADS  # noqa: E402 - the matmul-bound point of the tests

POINT = [*with_micro(THREADS), "bench.warmup_steps=3"]


def sweep(folder: Path, threads: str, repeats: int) -> Path:
    args = ["-m", *POINT, f"bench.repeats={repeats}", f"hydra.sweep.dir={folder}"]
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": threads},
    )
    return folder


def verdict(old: Path, new: Path) -> tuple[str, float]:
    old_sweep, new_sweep = build_table(old), build_table(new)
    row = compare_sweeps(
        old_sweep.table, old_sweep.series(), new_sweep.table, new_sweep.series()
    ).iloc[0]
    return row["verdict"], row["change_pct"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="bench.repeats of each sweep")
    args = parser.parse_args()
    same, found = [], []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.trials):
            a, b = (sweep(tmp / f"{i}{side}", "2", args.repeats) for side in "ab")
            same.append(verdict(a, b))
            slow = sweep(tmp / f"{i}slow", "1", args.repeats)
            found.append(verdict(a, slow))
            print(
                f"trial {i}: A/A {same[-1][0]} ({same[-1][1]:+.1f} %), "
                f"one thread {found[-1][0]} ({found[-1][1]:+.1f} %)",
                flush=True,
            )
    quiet = sum(v == "~" for v, _ in same) / len(same)
    caught = sum(v == "slower" for v, _ in found) / len(found)
    print(
        f"A/A judged ~ in {quiet:.0%} of {len(same)} trials (goal >= 95 %: "
        f"{'met' if quiet >= 0.95 else 'NOT met'})"
    )
    print(
        f"one thread (median change {sorted(c for _, c in found)[len(found) // 2]:+.1f} %) "
        f"judged slower in {caught:.0%} of trials (goal 100 %: "
        f"{'met' if caught == 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
