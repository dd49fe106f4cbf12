"""Does the search find the grid's best at a fraction of its cost? (goals: >= 0.95, <= 0.25)

On this CPU, one space of 48 points (micro-batch x attention x loss x optimizer implementation,
at a fixed 512 tokens per optimizer step, so every point trains the same thing) is run twice:
as the full grid (`python -m nanogpt.run -m` with comma lists, the configured protocol for every
point) and as a search (`hydra/sweeper=tune`, the same protocol for its leaders). Then the
search's chosen configuration and the grid's fastest are measured again side by side, in fresh
processes, alternating which goes first, `--rounds` times: neither figure is one process's luck.

Points are sized by time, not by a fixed step count, so that the ratios mean the same on a fast
CPU and a slow one: a short calibration sweep (4 points of the space, CALIBRATION_STEPS steps
each) measures a step's time and a point's fixed cost in a sweep (its composition, launch, fork,
set-up and warmup: the time between two points finishing, less the later one's measured
window), and the measured window is then made long enough that its steps are COMPUTE_SHARE of
a point's wall time. With a fixed 30 steps a 3x faster CPU spent most of each point starting
it, so a probe saved nothing (time 0.32 against 0.21 on the CPU the steps were tuned on).

Prints the load average (the machine is shared: both wall times and figures suffer from it),
the point size chosen and why, each phase's wall time and its wall time per point, the
re-measured tokens/s of both, and last:

    tune/grid: best B, time T; a grid point W s (N steps, compute C %)

B = the chosen configuration's tokens/s / the grid best's (medians over the rounds), T = the
search's wall time / the grid's, W = the grid's wall time / its points. Before it, the ratio
round by round and of the best rounds: on a shared machine a round can run at half speed, and
a B within that spread is not resolved by `--rounds` rounds.

Usage: python benchmarks/tune_vs_grid.py [--rounds 4] [--out DIR] [--steps N]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from nanogpt.analysis.store import RUN_PREFIX, read_result

REPO = Path(__file__).resolve().parents[1]
GOAL_BEST, GOAL_TIME = 0.95, 0.25
MODEL = [  # a step takes milliseconds on one core; batching still pays
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "model.block_size=64",
    "model.vocab_size=256",
    "bench.device=cpu",
    "logger=none",
    "tune.tokens_per_step=512",  # 8 sequences of 64 a step: micro-batch x grad_accum
    "bench.warmup_steps=2",
    "bench.diagnose=false",
]
COMPUTE_SHARE = 0.8  # a point's measured steps: this share of its wall time in a sweep
MIN_STEPS = 30  # never a shorter window than the one the search's probe must be worth cutting
CALIBRATION_STEPS = 10
CALIBRATION = ["perf.batch_size=1,2,4,8"]  # the axis that moves a step's time most


def protocol(steps: int, step_s: float) -> list[str]:
    """The measured window of every grid point and of the search's finalists: `steps` steps,
    at least half of them, within a budget of 4x their expected time (a slow point is cut)."""
    budget = max(5.0, 4 * steps * step_s)
    return [
        f"bench.measure_steps={steps}",
        f"bench.min_measure_steps={max(2, steps // 2)}",
        f"bench.time_budget_s={budget:.0f}",
    ]


SPACE = {  # 4 x 3 x 2 x 2 = 48 points
    "perf.batch_size": ["1", "2", "4", "8"],
    "perf.attention": ["auto", "math", "manual"],
    "perf.loss": ["full", "chunked"],
    "optimizer.impl": ["for_loop", "foreach"],
}


def search(steps: int) -> list[str]:
    """10 probes of an eighth of the window (4 of them the first design's, every value of
    every choice once; TPE's 6 after them), then the 2 best measured again in 2 fresh processes
    each: as many probes as keep the search within GOAL_TIME of the grid here (0.23). With 6,
    TPE had 2 probes of its own after the design and its pick was 0.74 (time 0.18)."""
    probe = max(4, steps // 8)
    return [
        "hydra.sweeper.n_trials=10",
        "hydra.sweeper.leaders=2",
        "hydra.sweeper.finalists=2",
        "hydra.sweeper.repeats=2",
        f"hydra.sweeper.probe=['bench.measure_steps={probe}','bench.min_measure_steps=2']",
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


def records(sweep_dir: Path) -> list[dict]:
    """Every point's result.json below a sweep dir: SWEEP/POINT/result.json, pooled from its
    runs, not each run's POINT/run-R/result.json too (counted twice, a point's two records
    finished together: the calibration's fixed cost came out negative and its window 30 steps)."""
    return [
        read_result(path)
        for path in sweep_dir.rglob("result.json")
        if not path.parent.name.startswith(RUN_PREFIX)
    ]


def size_points(work: Path) -> tuple[int, float, str]:
    """The measured window's steps that make a point's steps COMPUTE_SHARE of its wall time in
    a sweep, from a calibration sweep; the step's time (s); a line that says how."""
    sweep_dir = work / "calibration"
    wall = run(
        [
            "-m",
            *MODEL,
            *protocol(CALIBRATION_STEPS, 1.0),
            *CALIBRATION,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        work,
    )
    points = sorted(records(sweep_dir), key=lambda r: r["finished_at"])
    if len(points) < 3 or any(p["status"] != "ok" for p in points):
        sys.exit(f"the calibration sweep did not measure its points: {sweep_dir}")
    step_s = statistics.median(p["step_ms_median"] for p in points) / 1e3
    done = [datetime.datetime.fromisoformat(p["finished_at"]).timestamp() for p in points]
    # between two points finishing: the later one's whole cost in the sweep; less its steps
    fixed_s = statistics.median(
        later - earlier - p["measured_s"]
        for earlier, later, p in zip(done, done[1:], points[1:], strict=False)
    )
    steps = math.ceil(COMPUTE_SHARE / (1 - COMPUTE_SHARE) * fixed_s / step_s)
    steps = max(MIN_STEPS, steps)
    share = steps * step_s / (steps * step_s + fixed_s)
    why = (
        f"calibration ({len(points)} points, {wall:.0f} s): a step {step_s * 1e3:.1f} ms "
        f"(median), a point's fixed cost in a sweep {fixed_s:.2f} s; point size {steps} "
        f"measured steps, {steps * step_s:.2f} s of steps, {share:.0%} of a point's wall"
    )
    return steps, step_s, why


def grid_best(sweep_dir: Path) -> tuple[list[str], float]:
    """The grid's fastest point: its swept overrides and tokens/s."""
    best, figure = None, -1.0
    for record in records(sweep_dir):
        if record.get("status") == "ok" and (record.get("tokens_per_s") or 0) > figure:
            figure = record["tokens_per_s"]
            best = [o for o in record["overrides"] if o.split("=")[0] in SPACE]
    return best, figure


def remeasure(
    a: list[str], b: list[str], rounds: int, work: Path, window: list[str]
) -> tuple[list, list]:
    """tokens/s of a and b, each measured once per round in a fresh process, alternating."""
    figures: dict[int, list[float]] = {0: [], 1: []}
    for number in range(rounds):
        order = [(0, a), (1, b)] if number % 2 == 0 else [(1, b), (0, a)]
        for which, overrides in order:
            run_dir = work / f"rematch{number}_{which}"
            run([*MODEL, *window, *overrides, f"hydra.run.dir={run_dir}"], work)
            figures[which].append(read_result(run_dir / "result.json")["tokens_per_s"])
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here")
    parser.add_argument("--steps", type=int, default=None, help="skip the sizing: N steps")
    opts = parser.parse_args()
    work = opts.out or Path(tempfile.mkdtemp(prefix="tune_vs_grid_"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    # one thread a process: on a loaded 2-core machine, two OpenMP threads spin-wait on each
    # other and a step of this model takes seconds instead of milliseconds
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; {work}")

    if opts.steps:
        steps, step_s = opts.steps, 0.05
        print(f"point size {steps} measured steps (given)")
    else:
        steps, step_s, why = size_points(work)
        print(why)
    window = protocol(steps, step_s)

    space = [f"{k}=choice({','.join(v)})" for k, v in SPACE.items()]
    tune_dir = work / "tune"
    tune_s = run(
        [
            "-m",
            "hydra/sweeper=tune",
            *MODEL,
            *window,
            *space,
            *search(steps),
            f"hydra.sweep.dir={tune_dir}",
        ],
        work,
    )
    tune_points = len(records(tune_dir))
    chosen = yaml.safe_load((tune_dir / "best.yaml").read_text())["overrides"]
    chosen = [o for o in chosen if o.split("=")[0] in SPACE]
    print(
        f"search: {tune_s:.0f} s, {tune_points} points ({tune_s / tune_points:.1f} s a point), "
        f"chose {' '.join(chosen)}"
    )

    grid = [f"{k}={','.join(v)}" for k, v in SPACE.items()]
    grid_dir = work / "grid"
    grid_s = run(["-m", *MODEL, *window, *grid, f"hydra.sweep.dir={grid_dir}"], work)
    grid_points = len(records(grid_dir))
    point_s = grid_s / grid_points
    best, figure = grid_best(grid_dir)
    measured = statistics.median(r["measured_s"] for r in records(grid_dir))
    print(
        f"grid: {grid_s:.0f} s, {grid_points} points ({point_s:.1f} s a point, of which "
        f"{measured:.1f} s measured: {measured / point_s:.0%}), fastest {' '.join(best)} "
        f"({figure:,.0f} tokens/s)"
    )

    # the runner flags a point measured while other processes used the CPU (`contended`): its
    # figure is then partly the other processes' doing, and so is any ranking of such points
    busy = [r for r in records(grid_dir) + records(tune_dir) if r.get("contended")]
    print(
        f"contended: {len(busy)} of {grid_points + tune_points} points measured beside other "
        "processes (the grid's and the search's)"
    )
    print(f"load average {os.getloadavg()[0]:.2f}; re-measuring both, {opts.rounds} rounds")
    ours, theirs = remeasure(chosen, best, opts.rounds, work, window)
    print(f"chosen: {', '.join(f'{x:,.0f}' for x in ours)} tokens/s")
    print(f"grid best: {', '.join(f'{x:,.0f}' for x in theirs)} tokens/s")
    ratio = statistics.median(ours) / statistics.median(theirs)
    spread = max(ours + theirs) / min(ours + theirs)
    # each round's two runs share that moment's load: their ratio, round by round, shows how far
    # the machine moves the figure (a process that shares its core with another session's runs
    # near half speed), and the best of the rounds each side's speed when it ran alone
    paired = [o / t for o, t in zip(ours, theirs, strict=True)]
    print(
        f"round by round: {', '.join(f'{p:.2f}' for p in paired)}; best of the rounds: "
        f"{max(ours) / max(theirs):.2f}"
    )
    print(
        f"best ratio {ratio:.2f} (goal >= {GOAL_BEST}); time ratio {tune_s / grid_s:.2f} "
        f"(goal <= {GOAL_TIME}), a grid point {point_s:.1f} s and a search point "
        f"{tune_s / tune_points:.1f} s of wall; the {2 * opts.rounds} re-measurements spread "
        f"{spread:.2f}x; load average {os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"tune/grid: best {ratio:.2f}, time {tune_s / grid_s:.2f}; a grid point {point_s:.1f} s "
        f"({steps} steps, compute {measured / point_s:.0%})"
    )


if __name__ == "__main__":
    main()
