"""Runner overhead, measured side by side in one run (ratios, not absolute times).

(a) tokens/s of the runner vs a bare hand-written loop on the same model and settings (goal >= 0.98)
(b) fixed cost per job of a multirun beyond its training steps, child process included (goal <= 3 s)
(c) time to aggregate 1,000 job records into the table (goal <= 2 s)

Usage: python benchmarks/runner_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nanogpt.config import OptimizerConfig
from nanogpt.model import GPT, GPTConfig
from nanogpt.optim import build_optimizer
from nanogpt.report import build_table

# Small enough to be quick, large enough that a step is tens of ms (overhead would show).
MODEL = dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=4096)
BATCH, WARMUP, STEPS = 8, 3, 30
RUN_ARGS = [f"model.{k}={v}" for k, v in MODEL.items()] + [
    f"perf.batch_size={BATCH}",
    f"bench.warmup_steps={WARMUP}",
    f"bench.measure_steps={STEPS}",
    "bench.device=cpu",
    "bench.time_budget_s=600",
    "logger=none",
]


def bare_loop_tokens_per_s() -> float:
    """The loop a user would write by hand: same model, optimizer, data shape, fp32, no probes."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**MODEL, bias=False))
    opt = build_optimizer(model, OptimizerConfig(), torch.device("cpu"))
    tokens = torch.randint(0, MODEL["vocab_size"], (BATCH, MODEL["block_size"] + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    times = []
    for step in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= WARMUP:
            times.append(time.perf_counter() - t0)
    return BATCH * MODEL["block_size"] / statistics.median(times)


def run(args: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args], cwd=cwd, check=True, capture_output=True
    )
    return time.perf_counter() - t0


def runner_tokens_per_s(tmp: Path) -> float:
    out = tmp / "single"
    run([*RUN_ARGS, f"hydra.run.dir={out}"], tmp)
    return json.loads((out / "result.json").read_text())["tokens_per_s"]


def fixed_cost_per_job(tmp: Path, jobs: int = 4) -> tuple[float, float]:
    """Wall time of a multirun minus the time its jobs spent in training steps, per job."""
    sweep = tmp / "sweep"
    shutil.rmtree(sweep, ignore_errors=True)
    seeds = ",".join(str(s) for s in range(jobs))
    wall = run(
        [
            "-m",
            *RUN_ARGS,
            "bench.measure_steps=5",
            f"bench.seed={seeds}",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp,
    )
    training = 0.0
    for steps in sweep.glob("*/steps.csv"):
        with open(steps) as f:
            training += sum(float(r["step_ms"]) for r in csv.DictReader(f)) / 1e3
    return (wall - training) / jobs, wall


def aggregate_seconds(tmp: Path, sweep_with_records: Path, n: int = 1000) -> float:
    template = json.loads(next(sweep_with_records.glob("*/result.json")).read_text())
    big = tmp / "big"
    for i in range(n):
        (big / str(i)).mkdir(parents=True)
        record = {**template, "overrides": [f"bench.seed={i}"]}
        (big / str(i) / "result.json").write_text(json.dumps(record))
    t0 = time.perf_counter()
    table, _ = build_table(big)
    elapsed = time.perf_counter() - t0
    assert len(table) == n
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        ratios = []
        for i in range(rounds):  # interleaved, so machine noise hits both sides alike
            bare = bare_loop_tokens_per_s()
            runner = runner_tokens_per_s(tmp)
            ratios.append(runner / bare)
            print(
                f"round {i}: runner {runner:,.0f} tok/s, bare {bare:,.0f} tok/s, "
                f"ratio {runner / bare:.3f}"
            )
        per_job, wall = fixed_cost_per_job(tmp)
        agg = aggregate_seconds(tmp, tmp / "sweep")
    print(
        f"(a) runner / bare tokens/s, median of {rounds}: {statistics.median(ratios):.3f}"
        "  (goal >= 0.98)"
    )
    print(
        f"(b) fixed cost per job: {per_job:.2f} s (4-job multirun, {wall:.1f} s wall)"
        "  (goal <= 3 s)"
    )
    print(f"(c) aggregating 1,000 records: {agg:.2f} s  (goal <= 2 s)")


if __name__ == "__main__":
    main()
