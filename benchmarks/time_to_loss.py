"""Does Muon reach a validation loss sooner than AdamW on this CPU, and how sure is that?

The time_to_loss_cpu preset's sweep, as a user runs it (`python -m nanogpt.run -m
+sweep=time_to_loss_cpu`): two points (a 4-layer 64-wide char-level GPT on tinyshakespeare,
AdamW 3e-3 against Muon 0.02, to validation loss 2.5), N runs each (bench.repeats), each its own
seed. The grid sweeper alternates them, run r of every point before run r + 1, so a change in
the machine's load over the benchmark falls on both points alike; the table pools each point's
runs and compares them (scenarios/time_to_loss/pool.py). This script only reads that table back.

Usage: python benchmarks/time_to_loss.py DATA [--runs 5] [--out DIR] [overrides ...]
  DATA: tinyshakespeare's input.txt. Last line:
  time-to-loss: muon/adamw R [low-high], p=P, reached a/N b/N
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from nanogpt.analysis.tidy import read_summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="tinyshakespeare's input.txt")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="the sweep dir")
    parser.add_argument("overrides", nargs="*", help="more overrides for both points")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="time_to_loss_")) / "sweep"
    command = [
        sys.executable,
        "-m",
        "nanogpt.run",
        "-m",
        "+sweep=time_to_loss_cpu",
        f"data.path={args.data.resolve()}",
        f"bench.repeats={args.runs}",
        "logger=none",
        "report.plots=false",
        f"hydra.sweep.dir={out}",
        *args.overrides,
    ]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        sys.exit(done.returncode)
    table = read_summary(out).set_index("optimizer")
    for name in ("adamw", "muon"):
        row = table.loc[name]
        print(
            f"{name}: time_to_loss_s {row.time_to_loss_s} [{row.ttl_ci_low}-{row.ttl_ci_high}]"
            f" ({row.ttl_note}), runs {row.ttl_run_order or 'baseline'}"
        )
    muon, runs = table.loc["muon"], args.runs
    reached = f"reached {muon.ttl_reached_runs}/{runs} {table.loc['adamw'].ttl_reached_runs}/{runs}"
    print(f"verdict: {muon.ttl_verdict}; sweep in {out}")
    p_text = "-" if muon.ttl_p_value != muon.ttl_p_value else f"{muon.ttl_p_value:.2g}"
    print(
        f"time-to-loss: muon/adamw {muon.ttl_ratio:.2f} [{muon.ttl_ratio_ci_low:.2f}-"
        f"{muon.ttl_ratio_ci_high:.2f}], p={p_text}, {reached}"
    )


if __name__ == "__main__":
    main()
