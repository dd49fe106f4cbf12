"""The search's wall time on two slots against one (goal <= 0.6), and whether two slots choose
as well (tune_vs_grid's `best` within 0.05 of the one-slot search's).

Wall time, on the same candidates. The same search runs on `hydra/launcher=parallel
hydra.launcher.slots=2 hydra.launcher.cores_per_slot=1` and on `slots=1 cores_per_slot=1`,
alternated pair by pair (2 then 1, then 1 then 2, ...) so that a shared machine's load falls on
both alike. Its space is small enough that both sides probe every candidate of it
(SAME_SPACE: 12 candidates, n_trials 12), so both measure the same candidates and the ratio is
the slots', not the picks' (tune_vs_grid's 48-point search probes 10, and on two slots TPE's
later picks differ as the constant lie steers them: finalists 25 % slower on one side than the
other moved its ratio from 0.55 to 0.66 on 2026-11-28). Then the 2 best of the probes, 2 runs
each. The window is `--steps` (800: a finalist's run about 12 s, a probe an eighth of it): with
windows of a few steps a search is mostly its own start, compositions and exit, which no slot
shares, and its ratio tends to 1 whatever the slots (1.37 with 10-step windows on a loaded
machine; docs/benchmarks.md). Two slots measure a probe batch's two candidates (Optuna's
constant liar), the leaders, the finalists' runs and the quality runs side by side, each rung
in one launch. Each search's serial phases are printed too, from the time each line of its
output arrived: the seconds no slot shares. The ratio needs a quiet machine (two 1-core slots
need two free cores; a run's share of a core, printed, says whether it had one); the phases say
how much of a search is serial, before and after a change, on a busy one too:

    phases: first launch A s, first run B s, between launches C s, to the table D s, exit E s;
    serial S s of W s

A: the process's start to its first launch's line (Python, Hydra, the search's checks, study
and first batch); B: to the first run's second warmup step (a slot's start, the run's set-up);
C: the search's own work between launches (tell, ask, compose, estimate), each from the last
run's line to the next launch's; D: the last run's line to the table (pooling, the answer, its
plot, the table); E: the table to the process's end. S = A + B + C + D + E.

Best. tune_vs_grid's search (its 48-point space at a fixed 512 tokens per optimizer step, so
every candidate does the same work; its model, its calibrated window and search settings, the
same seed) runs `--searches` times on each side, alternated (5: picks a few percent apart make
a median of 3 noisy: |B2 - B1| 0.094 with 3 a side, 0.024 with 5, 2026-11-28); then its
48-point grid once (the basic launcher, one point after another), whose fastest point and every
search's pick are measured again in fresh processes, round by round in rotating order. A
side's best is its picks' median tokens/s over the grid's fastest's. These searches' wall
ratio is printed as well, for what it is: on candidates that differ.

Last line:

    search slots: wall 2/1 R on the same candidates (goal <= 0.6: met|not met); best 2 slots
    B2, 1 slot B1: |B2 - B1| D (goal <= 0.05: met|not met)

Usage: python benchmarks/search_slots.py [--pairs 3] [--steps 800] [--searches 5] [--rounds 3]
                                        [--quick] [--wall-only] [--tree DIR] [--out DIR]
--quick: 1 pair, 1 search a side, 1 round, the shortest windows (a check that it runs end to
end, no figure).
--wall-only: the wall pairs alone (no best); --pairs 0: the best alone.
--tree DIR: the searches run another checkout's code (a `git worktree` of an earlier commit):
its phases against this tree's, the same command.
The wall pairs take about 6 min on the 2-core machine, the best part 6 min more.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tune_vs_grid as tvg  # benchmarks/tune_vs_grid.py: the space, model, window and search
import yaml

from nanogpt.analysis.store import RUN_PREFIX, read_result

GOAL_WALL, GOAL_BEST = 0.6, 0.05
WALL_STEPS = 800  # the wall pairs' window: a finalist's run about 12 s here, a probe 1.5 s
SPACE = [f"{k}=choice({','.join(v)})" for k, v in tvg.SPACE.items()]
# The wall pairs' space: every candidate probed on both sides (n_trials = its size), so that
# both measure the same candidates; tune_vs_grid's model and fixed tokens a step
SAME_SPACE = {"perf.batch_size": ["1", "2", "4", "8"], "perf.attention": ["auto", "math", "manual"]}
SAME = [f"{k}=choice({','.join(v)})" for k, v in SAME_SPACE.items()]
SAME_TRIALS = 12


def launcher(slots: int) -> list[str]:
    return [
        "hydra/launcher=parallel",
        f"hydra.launcher.slots={slots}",
        "hydra.launcher.cores_per_slot=1",
    ]


@dataclass
class Phases:
    """A search's serial phases, s (the module's docstring says which lines bound each)."""

    first_launch: float
    first_run: float
    between: float
    to_table: float
    exit: float
    wall: float

    @classmethod
    def of(cls, timed: list[tuple[float, str]], wall: float) -> Phases:
        launches = [t for t, line in timed if line.startswith("parallel: ")]
        warm = next(t for t, line in timed if line.startswith("warmup step 2/"))
        ran = [t for t, line in timed if line.startswith("[")]  # a run's line: [STATUS] point: ...
        table = next(t for t, line in timed if line.startswith("table: "))
        # between two launches: from the previous launch's last run line to the next launch
        between = sum(t - max(r for r in ran if r < t) for t in launches[1:])
        return cls(launches[0], warm - launches[0], between, table - max(ran), wall - table, wall)

    @property
    def serial(self) -> float:
        return self.first_launch + self.first_run + self.between + self.to_table + self.exit

    def line(self) -> str:
        return (
            f"phases: first launch {self.first_launch:.2f} s, first run {self.first_run:.2f} s, "
            f"between launches {self.between:.2f} s, to the table {self.to_table:.2f} s, exit "
            f"{self.exit:.2f} s; serial {self.serial:.1f} s of {self.wall:.1f} s"
        )


def timed_run(command: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, list, float]:
    """Run `command`: its exit and stderr, each stdout line with when it arrived (s from the
    start), and its wall time."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
        timed = [(time.perf_counter() - started, line.rstrip("\n")) for line in proc.stdout]
        proc.wait()
        wall = time.perf_counter() - started
        err.seek(0)
        done = subprocess.CompletedProcess(command, proc.returncode, "", err.read())
    return done, timed, wall


def search(
    slots: int, space: list[str], settings: list[str], window: list[str], sweep_dir: Path
) -> dict:
    """One search of `space` with `settings` on `slots` slots into sweep_dir: its wall time (s),
    its launches (the parallel launcher prints a line for each), how much of a core its runs had,
    its pick (the space's overrides of best.yaml), its closing lines (the answer, the points'
    wall by rung), its runs' own wall time (s, summed) and its serial phases."""
    command = [
        sys.executable,
        "-m",
        "nanogpt.run",
        "-m",
        "hydra/sweeper=tune",
        *tvg.MODEL,
        *window,
        *space,
        *settings,
        *launcher(slots),
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc, timed, wall = timed_run(command, sweep_dir.parent)
    if proc.returncode != 0:
        sys.exit(f"error: the search on {slots} slot(s) failed:\n{proc.stderr[-2000:]}")
    lines = [line for _, line in timed]
    keys = {o.split("=")[0] for o in space}
    chosen = yaml.safe_load((sweep_dir / "best.yaml").read_text())["overrides"]
    # Each run's own CPU time over its measured window: how much of its core a run had. Near 1
    # on a free core; near 0.5 where two slots' runs and other work share the 2 cores, and then
    # no second slot can shorten the search
    runs = [read_result(p) for p in sweep_dir.glob(f"*/{RUN_PREFIX}*/result.json")]
    shares = [r["own_cpu_s"] / r["measured_s"] for r in runs if r.get("own_cpu_s")]
    return {
        "wall": wall,
        "core": statistics.median(shares) if shares else float("nan"),
        "launches": sum(line.startswith("parallel: ") for line in lines),
        "pick": [o for o in chosen if o.split("=")[0] in keys],
        "runs_s": sum(r.get("wall_s") or 0.0 for r in runs),
        "said": [line for line in lines if line.startswith(("best (best.yaml)", "search: points"))],
        "phases": Phases.of(timed, wall),
    }


def pairs(
    count: int, space: list[str], settings: list[str], window: list[str], work: Path, name: str
):
    """`count` alternated pairs of the search on 2 slots and on 1 (2 then 1, then 1 then 2, ...),
    each search's lines printed; the pairs' ratios (2 / 1), each side's picks, serial parts."""
    ratios, picks, serial = [], {1: [], 2: []}, {1: [], 2: []}
    for number in range(count):
        walls = {}
        for slots in (2, 1) if number % 2 == 0 else (1, 2):
            done = search(slots, space, settings, window, work / f"{name}{number + 1}_{slots}slot")
            walls[slots] = done["wall"]
            picks[slots].append(done["pick"])
            print(
                f"{name} {number + 1}: {slots} slot(s): {done['wall']:.1f} s, "
                f"{done['launches']} launches, its runs {done['runs_s']:.0f} s, a run had "
                f"{done['core']:.2f} of a core (median own CPU / measured), chose "
                f"{' '.join(done['pick'])}"
            )
            for line in [*done["said"], done["phases"].line()]:
                print(f"    {line}")
            serial[slots].append(done["phases"].serial)
        ratios.append(walls[2] / walls[1])
        print(f"{name} {number + 1}: 2 slots / 1 slot {ratios[-1]:.2f}")
    print(
        f"{name}: serial part, median: 2 slots {statistics.median(serial[2]):.1f} s, 1 slot "
        f"{statistics.median(serial[1]):.1f} s (a search's phases no slot shares)"
    )
    return ratios, picks


def remeasure(configs: list[list[str]], rounds: int, work: Path, window: list[str]) -> list:
    """tokens/s of each config, once a round in a fresh process, the order rotated each round
    (a config is first, last, ... in turn): each its list over the rounds."""
    figures: list[list[float]] = [[] for _ in configs]
    for number in range(rounds):
        shift = number % len(configs)
        for which in [*range(shift, len(configs)), *range(shift)]:
            run_dir = work / f"rematch{number}_{which}"
            tvg.run([*tvg.MODEL, *window, *configs[which], f"hydra.run.dir={run_dir}"], work)
            figures[which].append(read_result(run_dir / "result.json")["tokens_per_s"])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="wall pairs (same candidates)")
    parser.add_argument("--steps", type=int, default=WALL_STEPS, help="the wall pairs' window")
    parser.add_argument("--searches", type=int, default=5, help="tune_vs_grid searches a side")
    parser.add_argument("--rounds", type=int, default=3, help="re-measurements of each pick")
    parser.add_argument("--quick", action="store_true", help="1 of each, short windows")
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here")
    parser.add_argument("--wall-only", action="store_true", help="no best (faster)")
    parser.add_argument("--tree", type=Path, default=tvg.REPO, help="the searches' checkout")
    opts = parser.parse_args()
    if opts.quick:
        opts.pairs, opts.searches, opts.rounds, opts.steps = 1, 1, 1, tvg.MIN_STEPS
    work = opts.out or Path(tempfile.mkdtemp(prefix="search_slots_"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ["OMP_NUM_THREADS"] = "1"  # as tune_vs_grid: one thread a process
    os.environ["PYTHONPATH"] = os.pathsep.join([str(opts.tree), os.environ.get("PYTHONPATH", "")])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start; {work}")

    # The wall pairs: the same candidates on both sides, every one of SAME_SPACE probed
    settings = [o for o in tvg.search(opts.steps) if not o.startswith("hydra.sweeper.n_trials=")]
    settings.append(f"hydra.sweeper.n_trials={SAME_TRIALS}")
    window = tvg.protocol(opts.steps, 0.05)
    if opts.pairs:
        print(f"wall pairs: {SAME_TRIALS} candidates ({' '.join(SAME)}), {opts.steps} steps")
        ratios, _ = pairs(opts.pairs, SAME, settings, window, work, "pair")
        wall = statistics.median(ratios)
        verdict = f"goal <= {GOAL_WALL}: {'met' if wall <= GOAL_WALL else 'not met'}"
        said = f"search slots: wall 2/1 {wall:.2f} on the same candidates ({verdict})"
    else:
        said = "search slots: wall not measured (--pairs 0)"
    if opts.wall_only:
        print(f"{said}; best not measured (--wall-only)")
        return

    # The best: tune_vs_grid's search, its calibrated window, on each side
    if opts.quick:
        steps, step_s = tvg.MIN_STEPS, 0.05
    else:
        steps, step_s, why = tvg.size_points(work)
        print(why)
    window = tvg.protocol(steps, step_s)
    tvg_ratios, picks = pairs(opts.searches, SPACE, tvg.search(steps), window, work, "search")
    print(
        f"tune_vs_grid's search, 2 slots / 1 slot: {statistics.median(tvg_ratios):.2f} (median; "
        "its sides' candidates differ, see the docstring)"
    )
    grid = [f"{k}={','.join(v)}" for k, v in tvg.SPACE.items()]
    grid_dir = work / "grid"
    grid_s = tvg.run(["-m", *tvg.MODEL, *window, *grid, f"hydra.sweep.dir={grid_dir}"], work)
    fastest, figure = tvg.grid_best(grid_dir)
    print(f"grid: {grid_s:.0f} s, fastest {' '.join(fastest)} ({figure:,.0f} tokens/s)")
    configs = [fastest]
    for pick in picks[1] + picks[2]:
        if pick not in configs:
            configs.append(pick)
    print(f"load average {os.getloadavg()[0]:.2f}; re-measuring {len(configs)} configurations")
    figures = remeasure(configs, opts.rounds, work, window)
    medians = [statistics.median(f) for f in figures]
    for config, measured in zip(configs, figures, strict=True):
        print(f"  {' '.join(config)}: {', '.join(f'{x:,.0f}' for x in measured)} tokens/s")
    # tune_vs_grid's `best` of a search: its pick's median over the grid's fastest's
    best = {
        slots: statistics.median(medians[configs.index(p)] / medians[0] for p in picks[slots])
        for slots in (1, 2)
    }
    gap = abs(best[2] - best[1])
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(
        f"{said}; best 2 slots {best[2]:.3f}, 1 slot {best[1]:.3f}: |B2 - B1| {gap:.3f} "
        f"(goal <= {GOAL_BEST}: {'met' if gap <= GOAL_BEST else 'not met'})"
    )


if __name__ == "__main__":
    main()
