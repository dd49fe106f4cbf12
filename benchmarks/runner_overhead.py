"""Runner overhead, measured side by side in one run (ratios, not absolute times).

(a) tokens/s of the runner vs a bare hand-written loop on the same model and settings (goal >= 0.98)
(b) the fixed cost of an isolated point: benchmarks/point_isolation.py
(c) time to aggregate 1,000 job records into the table (goal <= 2 s)

Usage: python benchmarks/runner_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nanogpt.analysis.store import read_result
from nanogpt.analysis.table import build_table
from nanogpt.config.spec import OptimizerConfig
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.optim import build_optimizer

# Small enough to be quick, large enough that a step is tens of ms (overhead would show).
MODEL = dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=4096)
BATCH, WARMUP, STEPS = 8, 3, 30
# The runner's side of a runner-vs-bare comparison (byo_overhead.py sweeps its model so too)
PROTOCOL = [
    f"perf.batch_size={BATCH}",
    f"bench.warmup_steps={WARMUP}",
    f"bench.measure_steps={STEPS}",
    "bench.device=cpu",
    "bench.time_budget_s=600",
    "logger=none",
]
RUN_ARGS = [f"model.{k}={v}" for k, v in MODEL.items()] + PROTOCOL


def bare_loop_tokens_per_s() -> tuple[float, float]:
    """(tokens/s at the median step, tokens/s at the 10th-percentile step)."""
    """The loop a user would write by hand: same model, optimizer, data shape, fp32, no probes."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**MODEL, bias=False))
    opt = build_optimizer(model, OptimizerConfig())
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
    ms = [t * 1e3 for t in times]
    return tokens_per_s(statistics.median(ms)), tokens_per_s(percentile_10(ms))


def tokens_per_s(step_ms: float) -> float:
    return BATCH * MODEL["block_size"] / (step_ms / 1e3)


def percentile_10(ms: list[float]) -> float:
    """As the runner computes step_ms_p10 (linear interpolation)."""
    from nanogpt.analysis.stats import summarize

    return summarize(ms)["p10"]


def bare_loop_in_fresh_process(tmp: Path) -> tuple[float, float]:
    """The bare loop in its own fresh process, as the runner measures in a fresh child."""
    out = subprocess.run(
        [sys.executable, __file__, "--bare-once"],
        cwd=tmp,
        check=True,
        capture_output=True,
        text=True,
    )
    median, p10 = out.stdout.split()
    return float(median), float(p10)


def run(args: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args], cwd=cwd, check=True, capture_output=True
    )
    return time.perf_counter() - t0


def runner_tokens_per_s(tmp: Path) -> tuple[float, float]:
    out = tmp / "single"
    run([*RUN_ARGS, f"hydra.run.dir={out}"], tmp)
    record = read_result(out / "result.json")
    return record["tokens_per_s"], tokens_per_s(record["step_ms_p10"])


def aggregate_seconds(tmp: Path, sweep_with_records: Path, n: int = 1000) -> float:
    template = read_result(next(sweep_with_records.glob("*/result.json")))
    big = tmp / "big"
    for i in range(n):
        (big / str(i)).mkdir(parents=True)
        record = {**template, "overrides": [f"bench.seed={i}"]}
        (big / str(i) / "result.json").write_text(json.dumps(record))
    t0 = time.perf_counter()
    table = build_table(big).table
    elapsed = time.perf_counter() - t0
    assert len(table) == n
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bare-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_once:
        print(*bare_loop_tokens_per_s())
        return
    rounds = args.rounds
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        ratios, ratios_p10 = [], []
        # Interleaved, both sides in fresh processes, so machine noise hits them alike.
        for i in range(rounds):
            bare, bare_p10 = bare_loop_in_fresh_process(tmp)
            runner, runner_p10 = runner_tokens_per_s(tmp)
            ratios.append(runner / bare)
            ratios_p10.append(runner_p10 / bare_p10)
            print(
                f"round {i}: runner {runner:,.0f} tok/s, bare {bare:,.0f} tok/s, "
                f"ratio {runner / bare:.3f} (at p10 step time: {runner_p10 / bare_p10:.3f})"
            )
        agg = aggregate_seconds(tmp, tmp)  # the single run's record as the template
    print(
        f"(a) runner / bare tokens/s, median of {rounds}: {statistics.median(ratios):.3f}"
        f"; at p10 step time {statistics.median(ratios_p10):.3f}  (goal >= 0.98)"
    )
    print(f"(c) aggregating 1,000 records: {agg:.2f} s  (goal <= 2 s)")


if __name__ == "__main__":
    main()
