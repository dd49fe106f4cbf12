"""Does the search find the grid's best at a fraction of its cost? (goals: >= 0.95, <= 0.25)

On this CPU, one space of 48 points (micro-batch x attention x loss x optimizer implementation,
at a fixed 512 tokens per optimizer step, so every point trains the same thing) is run twice:
as the full grid (`python -m nanogpt.run -m` with comma lists, the configured protocol for every
point) and as a search (`hydra/sweeper=tune`, the same protocol for its leaders). Then the
search's chosen configuration and the grid's fastest are measured again side by side, in fresh
processes, alternating which goes first, `--rounds` times: neither figure is one process's luck.

Prints the load average (the machine is shared: both wall times and figures suffer from it),
each phase's wall time, the re-measured tokens/s of both, and last:

    tune/grid: best B, time T

B = the chosen configuration's tokens/s / the grid best's (medians over the rounds), T = the
search's wall time / the grid's.

Usage: python benchmarks/tune_vs_grid.py [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GOAL_BEST, GOAL_TIME = 0.95, 0.25
MODEL = [  # a point takes a second or two on 2 cores; batching still pays
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=64",
    "model.vocab_size=256",
    "bench.device=cpu",
    "logger=none",
    "tune.tokens_per_step=512",  # 8 sequences of 64 a step: micro-batch x grad_accum
    # the protocol of every grid point and of the search's finalists (the probe is shorter):
    # a window long enough to be worth a probe's shortcut, as a real protocol is
    "bench.warmup_steps=2",
    "bench.measure_steps=30",
    "bench.min_measure_steps=15",
    "bench.time_budget_s=5",
    "bench.diagnose=false",
]
SPACE = {  # 4 x 3 x 2 x 2 = 48 points
    "perf.batch_size": ["1", "2", "4", "8"],
    "perf.attention": ["auto", "math", "manual"],
    "perf.loss": ["full", "chunked"],
    "optimizer.impl": ["for_loop", "foreach"],
}
SEARCH = [  # 6 probes, then the 2 best measured again in 2 fresh processes each
    "hydra.sweeper.n_trials=6",
    "hydra.sweeper.leaders=2",
    "hydra.sweeper.finalists=2",
    "hydra.sweeper.repeats=2",
    "hydra.sweeper.probe=['bench.measure_steps=4','bench.min_measure_steps=2']",
]


def run(args: list[str], cwd: Path) -> float:
    """`python -m nanogpt.run ARGS`, its wall time; stops the benchmark if it fails."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *args], cwd=cwd, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-2000:]}")
    return wall


def grid_best(sweep_dir: Path) -> tuple[list[str], float]:
    """The grid's fastest point: its swept overrides and tokens/s."""
    best, figure = None, -1.0
    for path in sweep_dir.rglob("result.json"):
        record = json.loads(path.read_text())
        if record.get("status") == "ok" and (record.get("tokens_per_s") or 0) > figure:
            figure = record["tokens_per_s"]
            best = [o for o in record["overrides"] if o.split("=")[0] in SPACE]
    return best, figure


def remeasure(a: list[str], b: list[str], rounds: int, work: Path) -> tuple[list, list]:
    """tokens/s of a and b, each measured once per round in a fresh process, alternating."""
    figures: dict[int, list[float]] = {0: [], 1: []}
    for number in range(rounds):
        order = [(0, a), (1, b)] if number % 2 == 0 else [(1, b), (0, a)]
        for which, overrides in order:
            run_dir = work / f"rematch{number}_{which}"
            run([*MODEL, *overrides, f"hydra.run.dir={run_dir}"], work)
            figures[which].append(json.loads((run_dir / "result.json").read_text())["tokens_per_s"])
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here")
    opts = parser.parse_args()
    work = opts.out or Path(tempfile.mkdtemp(prefix="tune_vs_grid_"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    # one thread a process: on a loaded 2-core machine, two OpenMP threads spin-wait on each
    # other and a step of this model takes seconds instead of milliseconds
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; {work}")

    space = [f"{k}=choice({','.join(v)})" for k, v in SPACE.items()]
    tune_dir = work / "tune"
    tune_s = run(
        ["-m", "hydra/sweeper=tune", *MODEL, *space, *SEARCH, f"hydra.sweep.dir={tune_dir}"], work
    )
    chosen = yaml.safe_load((tune_dir / "best.yaml").read_text())["overrides"]
    chosen = [o for o in chosen if o.split("=")[0] in SPACE]
    print(f"search: {tune_s:.0f} s, chose {' '.join(chosen)}")

    grid = [f"{k}={','.join(v)}" for k, v in SPACE.items()]
    grid_dir = work / "grid"
    grid_s = run(["-m", *MODEL, *grid, f"hydra.sweep.dir={grid_dir}"], work)
    best, figure = grid_best(grid_dir)
    print(f"grid: {grid_s:.0f} s, 48 points, fastest {' '.join(best)} ({figure:,.0f} tokens/s)")

    print(f"load average {os.getloadavg()[0]:.2f}; re-measuring both, {opts.rounds} rounds")
    ours, theirs = remeasure(chosen, best, opts.rounds, work)
    print(f"chosen: {', '.join(f'{x:,.0f}' for x in ours)} tokens/s")
    print(f"grid best: {', '.join(f'{x:,.0f}' for x in theirs)} tokens/s")
    ratio = statistics.median(ours) / statistics.median(theirs)
    spread = max(ours + theirs) / min(ours + theirs)
    print(
        f"best ratio {ratio:.2f} (goal >= {GOAL_BEST}); time ratio {tune_s / grid_s:.2f} "
        f"(goal <= {GOAL_TIME}); the {2 * opts.rounds} re-measurements spread {spread:.2f}x; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    print(f"tune/grid: best {ratio:.2f}, time {tune_s / grid_s:.2f}")


if __name__ == "__main__":
    main()
