"""Where the gap between the old default point and nanoGPT bench.py's configuration goes.

On an H100 (2026-11-23) the README's default GPT-2 point took 31.7 ms a step (biases on, AdamW
impl=auto = foreach, gradient clipping at 1.0) and bench.py's configuration 27.4 ms (no biases,
fused AdamW, no clipping). This script measures the steps between the two, one change at a
time, side by side in one run (rounds interleaved, each point in its own `python -m
nanogpt.run` process), and prints each change's ratio of tokens/s:

  old default     model.bias=true  optimizer.impl=foreach optimizer.grad_clip=1.0
  - biases        model.bias=false optimizer.impl=foreach optimizer.grad_clip=1.0
  + fused AdamW   model.bias=false optimizer.impl=fused   optimizer.grad_clip=1.0  (default)
  - clipping      model.bias=false optimizer.impl=fused   optimizer.grad_clip=0     (bench.py's)

On CUDA the model is GPT-2 124M at batch 12 (the device default); elsewhere pass a model that
fits the machine (the default here is 4 layers x 256 wide at block 128, batch 8).

Usage: python benchmarks/default_gap.py [--rounds 3] [OVERRIDE ...]
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

STEPS = {
    "old default": ["model.bias=true", "optimizer.impl=foreach", "optimizer.grad_clip=1.0"],
    "- biases": ["model.bias=false", "optimizer.impl=foreach", "optimizer.grad_clip=1.0"],
    "+ fused AdamW": ["model.bias=false", "optimizer.impl=fused", "optimizer.grad_clip=1.0"],
    "- clipping": ["model.bias=false", "optimizer.impl=fused", "optimizer.grad_clip=0"],
}
CPU_MODEL = [
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=256",
    "model.block_size=128",
    "perf.batch_size=8",
    "bench.measure_steps=30",
]


def tokens_per_s(tmp: Path, name: str, overrides: list[str]) -> float:
    run_dir = tmp / f"{name.replace(' ', '_')}_{len(list(tmp.iterdir()))}"
    args = [*overrides, "logger=none", f"hydra.run.dir={run_dir}"]
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args], cwd=tmp, check=True, capture_output=True
    )
    record = read_result(run_dir / "result.json")
    return record["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="e.g. perf.dtype=bf16 perf.compile=true")
    args = parser.parse_args()
    base = [] if torch.cuda.is_available() else CPU_MODEL
    rates: dict[str, list[float]] = {name: [] for name in STEPS}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.rounds):
            for step, overrides in STEPS.items():
                rates[step].append(tokens_per_s(tmp, step, [*base, *overrides, *args.overrides]))
            print(f"round {i}: " + ", ".join(f"{s} {r[-1]:,.0f} tok/s" for s, r in rates.items()))
    names = list(STEPS)
    print(f"tokens/s ratios, median of {args.rounds} interleaved rounds:")
    for before, after in zip(names, names[1:], strict=False):
        ratio = statistics.median(a / b for a, b in zip(rates[after], rates[before], strict=True))
        print(f"  {after:<14} {ratio:.3f}x  ({before} -> {after})")
    total = statistics.median(a / b for a, b in zip(rates[names[-1]], rates[names[0]], strict=True))
    print(f"  bench.py's configuration over the old default: {total:.3f}x")


if __name__ == "__main__":
    main()
