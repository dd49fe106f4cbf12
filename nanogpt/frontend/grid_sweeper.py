"""Entry point (a Hydra sweeper plugin, the default: conf/config.yaml): a grid's points × runs,
round by round.

A run is what is measured, resumed and alternated; a point is a row pooled from its runs. So a
Hydra job is one run, and this sweeper orders them: it expands the overrides into points as
Hydra's basic sweeper does (presets.expand: the cartesian product of every comma list), gives
each point its runs (its bench.repeats) and launches one round per `launcher.launch` call —
run 1 of every point, wait for all of them, then run 2, ... — so that run r of every point
starts after every run r - 1 has ended, under any launcher (basic, parallel, SLURM), which
knows nothing of rounds. A drift of the machine's speed over a sweep then falls on every point
alike (docs/time_to_loss.md).

Each run's dir is SWEEP_DIR/POINT/run-R (POINT: the point's index; the sweeper sets
hydra.sweep.subdir), and its job measures that run alone (runner/job.run_point) and hands back
its Outcome (status and record). A run that was not ok ends its point: its later runs are not
launched (its record is the point's). An interrupted run stops the sweep after its round. The
point's row is pooled from its runs when the table is built (analysis/store.pool_runs).

Resume: the same command again measures only the missing runs, in round order: each job keeps
an ok record of its run (store.Index) and says `skipped`; the sweep then says what it kept.
The search (hydra/sweeper=tune) launches its candidates' runs through `run_rounds` too; on
several slots with all of a rung's rounds in one launch (`per_launch`), in round order.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from nanogpt.analysis.store import RESULT_FILE, RUN_PREFIX
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.point_configs import with_point_configs
from nanogpt.frontend.presets import expand
from nanogpt.publish.sweep_outputs import publish, settings_of
from nanogpt.record.faults import CONFIG_EXIT, handle_sigterm, interrupted_exit
from nanogpt.runner.job import Outcome
from nanogpt.scenarios import base as scenarios

KEPT, DONE = "skipped", ("ok", "skipped")
# What the sweeper reads of each point to give it its runs: bench.repeats, and the keys its
# default follows, each scenario's (its checks' RUN_KEYS: time to loss's target makes it 5)
RUN_KEYS = ("bench.repeats", *(key for s in scenarios.ALL for key in s.checks.RUN_KEYS))


@dataclass
class Point:
    """A point of the sweep: its dir's index, its overrides and how many runs it has."""

    index: int
    overrides: list[str]
    runs: int


@dataclass
class Rounds:
    """What run_rounds did: every launch's JobReturns, each point's Outcomes in run order, and
    whether a run was interrupted (the sweep stops)."""

    returns: list[list[JobReturn]]
    outcomes: dict[int, list[Outcome]]
    interrupted: bool = False
    at: str = "the sweep's start"  # the round being launched, for an interruption's line

    def kept_line(self) -> str | None:
        """`resume: kept N runs of M points`, where a resume kept any."""
        kept = {i: sum(o.status == KEPT for o in runs) for i, runs in self.outcomes.items()}
        runs, points = sum(kept.values()), sum(1 for n in kept.values() if n)
        if not runs:
            return None
        return (
            f"resume: kept {runs} run(s) of {points} point(s) with an ok record from an earlier "
            "run (bench.rerun=true measures them again)"
        )


def outcome_of(job_return: JobReturn) -> Outcome:
    """A job's Outcome: what run.main returned, a status a launcher recorded for a job it saw
    end (hydra/launcher=slurm), or `error` with the exception of a job that raised."""
    if job_return.status != JobStatus.COMPLETED:
        try:
            job_return.return_value  # noqa: B018 - raises the job's exception
        except Exception as err:  # noqa: BLE001 - any exception a job raised is its error
            error = f"{type(err).__name__}: {err}"  # Hydra logged only that the job failed
            print(f"[error] {' '.join(job_return.overrides or [])}: {error}", file=sys.stderr)
            return Outcome("error", {"status": "error", "error": error})
    value = job_return.return_value
    if isinstance(value, Outcome):
        return value
    if isinstance(value, str):
        return Outcome(value, {"status": value})
    return Outcome("error", {"status": "error", "error": f"the job returned {value!r}"})


def run_rounds(
    launcher,
    points: list[Point],
    first_job: int = 0,
    done: Rounds | None = None,
    per_launch: int = 1,
) -> Rounds:
    """Launch `points`' runs round by round: run r of every point still going (its runs so far
    ok or kept) in one launch, after every run r - 1 ended. `per_launch` rounds go out in one
    launch, round by round in its job order (the search on several slots hands them all at once:
    a finalist's runs side by side, no slot waiting for a round of fewer points than slots); a
    point's later runs in that launch run even if an earlier one fails. `done` (filled as the
    rounds go, so a caller stopped by a signal knows where it was): a fresh Rounds by default."""
    done = done or Rounds([], {})
    done.outcomes.update({p.index: [] for p in points})
    number = first_job
    most = max((p.runs for p in points), default=0)
    for first in range(1, most + 1, max(1, per_launch)):
        going = [
            p
            for p in points
            if p.runs >= first and all(o.status in DONE for o in done.outcomes[p.index])
        ]
        if not going:
            break
        last = min(most, first + max(1, per_launch) - 1)
        jobs = [(p, run) for run in range(first, last + 1) for p in going if p.runs >= run]
        runs = f"run {first}" if last == first else f"runs {first}-{last}"
        done.at = f"{runs} of {len(going)} point(s)"
        batch = [
            [*p.overrides, f"hydra.sweep.subdir={p.index}/{RUN_PREFIX}{run}"] for p, run in jobs
        ]
        returns = list(launcher.launch(batch, initial_job_idx=number))
        number += len(batch)
        done.returns.append(returns)
        outcomes = [outcome_of(r) for r in returns]
        if len(outcomes) == len(jobs):
            paired = dict(zip(((p.index, run) for p, run in jobs), outcomes, strict=True))
        else:  # a launcher stopped by a signal returns the runs that ran: found by job dir
            found = {
                (Path(o.job_dir).parent.name, Path(o.job_dir).name): o
                for o in outcomes
                if o.job_dir
            }
            paired = {
                (p.index, run): found[key]
                for p, run in jobs
                if (key := (str(p.index), f"{RUN_PREFIX}{run}")) in found
            }
            done.interrupted = True
        for point, run in jobs:  # in run order: a point's runs of one launch, first to last
            if (point.index, run) in paired:
                done.outcomes[point.index].append(paired[point.index, run])
                done.interrupted |= paired[point.index, run].status == "interrupted"
        if done.interrupted:  # a signal stopped a run: the sweep stops (its table is built)
            break
    return done


class Grid:
    """The sweeper behind hydra_plugins/nanogpt_tune's GridSweeper (Hydra's Sweeper API: setup,
    then sweep)."""

    def __init__(self, params: Any = None) -> None:
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.config = with_point_configs(hydra_context), config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=self.hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> list[list[JobReturn]]:
        try:
            points = self.points(arguments)
        except ConfigError as err:
            print(f"error: {err} (nothing was measured)", file=sys.stderr)
            sys.exit(CONFIG_EXIT)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        most = max((p.runs for p in points), default=1)
        if most > 1:
            print(f"grid: {len(points)} point(s) × up to {most} runs, run r of every point first")
            sys.stdout.flush()
        handle_sigterm()  # SIGTERM from here on stops the sweep as Ctrl-C does (exit 143)
        done = Rounds([], {})
        try:
            run_rounds(self.launcher, points, done=done)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM in this process: in a run's job (the
            self._stop(sweep_dir, done)  # basic launcher), between runs, or while Hydra
        if done.interrupted:  # composes the next job; or a launcher that saw it stop its runs
            self._stop(sweep_dir, done)
        line = done.kept_line()
        if line:
            print(line)
        return done.returns

    def _stop(self, sweep_dir: Path, done: Rounds) -> NoReturn:
        """The table of what is done, one line, exit 130 (143 after SIGTERM); a second signal
        while the table is written: its one line only (nanogpt.report builds it)."""
        try:
            if any(sweep_dir.rglob(RESULT_FILE)):
                publish(sweep_dir, settings_of(self.config))
        except KeyboardInterrupt:
            print(
                f"interrupted while writing the table; build it with `python -m nanogpt.report "
                f"{sweep_dir}` (every record is kept)",
                file=sys.stderr,
            )
            sys.stdout.flush()
            os._exit(interrupted_exit())
        resume = f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume"
        print(f"interrupted at {done.at}; {resume} (ok runs are kept)", file=sys.stderr)
        sys.stdout.flush()
        sys.exit(interrupted_exit())

    def points(self, arguments: list[str]) -> list[Point]:
        """The sweep's points (hydra.sweeper.params, then the command line), each with its
        runs."""
        given = [*(f"{k}={v}" for k, v in self.params.items()), *arguments]
        expanded = expand(given)
        if expanded is None:
            raise ConfigError(
                "hydra/sweeper",
                "the grid sweeper takes comma lists (a=1,2), not range(...) or interval(...)",
                "use hydra/sweeper=tune to search a range",
            )
        return [Point(i, p, self._runs(p)) for i, p in enumerate(expanded)]

    def _runs(self, overrides: list[str]) -> int:
        """The point's bench.repeats: the sweep's own (its master config) unless the point's
        overrides set RUN_KEYS or choose a config group, which may set them (then the point is
        composed here). Overrides given once, not swept, are the master's."""
        given = set(self.config.hydra.overrides.task)
        own = OverridesParser.create().parse_overrides([o for o in overrides if o not in given])
        config = self.config
        if any(o.key_or_group in RUN_KEYS or "." not in o.key_or_group for o in own):
            compose = self.hydra_context.config_loader.load_sweep_config
            config = compose(self.config, list(overrides))
        return max(1, int(OmegaConf.select(config, "bench.repeats") or 1))
