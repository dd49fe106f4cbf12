"""Whether the diagnostics change the measured step: one point with none of them against the
same point with all of them (bench.profile, bench.memory_snapshot, bench.find_max_batch),
side by side in one run, rounds interleaved, each in its own `python -m nanogpt.run` process.

On an H100 (2026-11-23, code before gpu-protocol) GPT-2 eager bf16 at batch 12 read 40.8 ms a
step with any one of them or none, and 50.0 ms (+23 %) with all three: the profiler ran just
before the measured steps in the same process (Kineto can leave CUPTI attached afterwards) and
the allocator history was recorded during them. Now the profiler runs after the measured steps,
the history stops before them, and the max-batch search has its own process; this prints the
ratio that should be 1 within noise, and each record's `diagnostics_active`.

Usage: python benchmarks/instrumentation_cost.py [--rounds 3] [OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from nanogpt.analysis.store import read_result

ALL = ["bench.profile=true", "bench.memory_snapshot=true", "bench.find_max_batch=true"]
CPU_MODEL = [
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_embd=128",
    "model.block_size=128",
    "perf.batch_size=4",
    "bench.measure_steps=30",
    "bench.max_batch_memory_gib=2",
]


def measured(tmp: Path, overrides: list[str]) -> dict:
    run_dir = tmp / f"run_{len(list(tmp.iterdir()))}"
    args = [*overrides, "logger=none", f"hydra.run.dir={run_dir}"]
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args], cwd=tmp, check=True, capture_output=True
    )
    return read_result(run_dir / "result.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="e.g. perf.dtype=bf16")
    args = parser.parse_args()
    base = [*([] if torch.cuda.is_available() else CPU_MODEL), *args.overrides]
    none, every = [], []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.rounds):
            plain, instrumented = measured(tmp, base), measured(tmp, [*base, *ALL])
            none.append(plain["step_ms_median"])
            every.append(instrumented["step_ms_median"])
            print(
                f"round {i}: none {none[-1]:.2f} ms, all {every[-1]:.2f} ms "
                f"(active during the measured steps: {instrumented['diagnostics_active']})"
            )
    ratio = statistics.median(a / b for a, b in zip(every, none, strict=True))
    print(f"step time with all diagnostics / without: {ratio:.3f} (median of {args.rounds})")


if __name__ == "__main__":
    main()
