"""The main sweep's wall time on this machine: `make sweep`'s command (the README's), run for
real in a temporary dir, and the FLOPs split of the model it measures.

Goal: within 150 s on 2 CPU cores that emulate bf16/fp16 matmuls (it took about 300 s with the
nano model as the CPU default). Give --tree DIR (a checkout of another commit, e.g. from
`git archive`) to time that one side by side: rounds alternate between the trees, so that a
shared machine's load falls on both alike, and the ratio is printed.

Usage: python benchmarks/sweep_time.py [--rounds 1] [--tree /tmp/old_checkout]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nanogpt.train.flops import counted_head_share  # noqa: E402
from nanogpt.train.gpt import GPTConfig  # noqa: E402

SWEEP = ["-m", "perf.compile=true,false", "perf.dtype=bf16,fp16"]  # the Makefile's `sweep`
MODELS = ("nano", "nano-1k")  # the CPU default before issue 26, and after


def flops_split(name: str) -> str:
    """`blocks N % / head M %` of a model preset (conf/model/NAME.yaml), counted FLOPs."""
    import yaml

    preset = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    head = counted_head_share(GPTConfig(**{k: v for k, v in preset.items() if k in fields}))
    return f"blocks {1 - head:.0%} / head {head:.0%}"


def sweep_seconds(tree: Path) -> float:
    """Wall time of the README sweep run from `tree`'s code, in a fresh temporary dir."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree), "WANDB_MODE": "offline"}
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "nanogpt.run", *SWEEP, f"hydra.sweep.dir={tmp}/sweep"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"error: the sweep from {tree} failed:\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", type=Path, help="another checkout, timed side by side")
    args = parser.parse_args()
    for name in MODELS:
        print(f"model {name}: {flops_split(name)} of a step's FLOPs (GPT-2 124M: 73 % / 27 %)")
    trees = {"this checkout": ROOT, **({str(args.tree): args.tree} if args.tree else {})}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, tree in trees.items():
            seconds[name].append(sweep_seconds(tree))
            print(f"round {i}: {name}: {seconds[name][-1]:.0f} s", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    here = statistics.median(seconds["this checkout"])
    verdict = "met" if here <= 150 else "NOT met"
    print(f"make sweep: {here:.0f} s (goal <= 150 s: {verdict}; 1-min load {load:.1f})")
    if args.tree:
        other = statistics.median(seconds[str(args.tree)])
        print(f"{args.tree}: {other:.0f} s; this checkout takes {here / other:.2f}x its time")


if __name__ == "__main__":
    main()
