"""Entry point (a Hydra callback, named in conf/config.yaml): at the end of a multirun, build the
sweep's table (and send it to W&B).

Hydra 1.3 skips on_multirun_end when a job raises, so jobs never raise for a failed point:
they record it (nanogpt/launch/job.py) and the table is always built here. A job that was
interrupted (Ctrl-C) returns the status `interrupted`: on_job_end then builds the table of what
is done and stops the sweep with exit status 130 (128 + SIGINT, the shell's convention).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nanogpt import logs
from nanogpt.app import check_points
from nanogpt.configs import runs_here, sweep_points
from nanogpt.errors import ConfigError
from nanogpt.faults import CONFIG_EXIT, exit_code, interrupted_exit
from nanogpt.launch.job import point_status, skipped_since
from nanogpt.launch.placement import CORUN_ENV
from nanogpt.reporters import wandb_sink, wandb_view
from nanogpt.results import table as sweep_table


def away_from_the_sweep() -> bool:
    """Whether this job runs in a process of its own launcher's (a slot of
    hydra/launcher=parallel, a SLURM job): the sweep's process decides when it stops."""
    return bool(os.environ.get(CORUN_ENV)) or os.environ.get("SUBMITIT_EXECUTOR") == "slurm"


# Launchers that compose each point in this process or in a fork of it (never pickled): they
# may take a composition remembered from the check (RememberedCompositions).
IN_PROCESS_LAUNCHERS = ("basic", "parallel")


class RememberedCompositions:
    """Hydra composes each point of a basic sweep three times: for check_points, again when the
    sweeper checks the batch (validate_batch_is_legal) and again when the launcher runs it, each
    0.2-0.3 s on 2 cores (more than a micro point's measurement). The same master config and
    overrides compose to the same config, so the multirun's config loader keeps the check's
    composition and hands out copies: a point is composed once. A copy is what Hydra would
    have composed (its launcher sets job.id and job.num on it, as on its own), and an entry is
    dropped after the two uses a sweep makes of it (the sweeper's check, the launch). At most
    LIMIT are kept at once (a composed config holds about 160 KiB): the points of a larger grid
    past them are composed each time, as Hydra does."""

    USES = 2
    LIMIT = 256

    def __init__(self, loader):
        self.compose = loader.load_sweep_config  # Hydra's own, bound to the loader
        self.kept: dict[tuple, list] = {}  # (master id, overrides) -> [config, uses left]

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        key = (id(master_config), tuple(sweep_overrides))
        kept = self.kept.get(key)
        if kept is None:
            config = self.compose(master_config, list(sweep_overrides))
            if len(self.kept) >= self.LIMIT:
                return config
            self.kept[key] = [config, self.USES + 1]  # + the check's own use
            kept = self.kept[key]
        kept[1] -= 1
        if kept[1] <= 0:
            del self.kept[key]
        return copy.deepcopy(kept[0])


def remember_compositions(config: DictConfig):
    """Compose a point as its job will be composed, once: where the launcher composes in this
    process (or a fork), the loader of this multirun keeps each point's composition for the
    sweeper's check and the launch. Returns compose_point(overrides) for check_points."""
    loader = GlobalHydra.instance().config_loader()
    if config.hydra.runtime.choices.get("hydra/launcher") in IN_PROCESS_LAUNCHERS:
        if not isinstance(loader.load_sweep_config, RememberedCompositions):
            loader.load_sweep_config = RememberedCompositions(loader)
    return lambda overrides: loader.load_sweep_config(config, overrides)


class SweepReport(Callback):
    started: float | None = None  # when this multirun started (epoch s)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Before anything is measured, every point of the sweep is composed and validated."""
        self.started = time.time()
        logs.forget_said(Path(config.hydra.sweep.dir))
        try:
            points = sweep_points(config)
            if points:
                compose_point = remember_compositions(config)
                check_points(points, config.report.baseline, runs_here(config), compose_point)
        except ConfigError as err:
            print(f"error: {err} (nothing was measured)", file=sys.stderr)
            sys.exit(CONFIG_EXIT)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        """An interrupted point stops the sweep (after its table); a single run exits with its
        point's status code (faults.EXIT_CODES), never 0 for a point that is not ok."""
        if job_return.status != JobStatus.COMPLETED:
            return
        # run.main returns the objective (for Hydra's sweepers); the status is the record's
        status = point_status(Path(config.hydra.runtime.output_dir))
        point = " ".join(job_return.overrides or []) or "defaults"
        multirun = config.hydra.mode == RunMode.MULTIRUN
        if status == "interrupted" and multirun and not away_from_the_sweep():
            sweep_dir, _ = self._table(config)
            resume = f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume"
            print(f"interrupted at {point}; {resume} (ok points are kept)", file=sys.stderr)
            sys.exit(interrupted_exit())
        if not multirun and status != "ok":
            code = exit_code(status)
            print(f"{point}: recorded with status {status} (exit code {code})", file=sys.stderr)
            sys.exit(code)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        logs.sweep_console()  # the sweep's own lines (its W&B summary run) as a job's are
        sweep_dir, table = self._table(config)
        logger = OmegaConf.to_object(config.logger)
        summary_csv = sweep_dir / sweep_table.SUMMARY_CSV
        unreachable = wandb_sink.log_sweep_table(logger, sweep_dir, table, summary_csv)
        wandb_view.save_and_publish(logger, sweep_dir, unreachable)  # the sweep's ready view
        stopped = table[table["status"] == "interrupted"]
        if len(stopped):  # a launcher that runs points elsewhere (parallel slots, SLURM jobs)
            resume = f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume"
            points = "; ".join(stopped["overrides"].astype(str))
            print(f"interrupted at {points}; {resume} (ok points are kept)", file=sys.stderr)
            sys.exit(interrupted_exit())
        failed = sweep_table.failed_points(table)
        if failed:
            print(f"{len(failed)} point(s) failed: {'; '.join(failed)}", file=sys.stderr)
            sys.exit(1)

    def _table(self, config: DictConfig):
        """The table, once; a second Ctrl-C or SIGTERM while it is written stops with one line
        that says how to build it from the records (they are all written by then)."""
        try:
            return self._publish(config)
        except KeyboardInterrupt:
            sweep_dir = Path(config.hydra.sweep.dir)
            print(
                f"interrupted while writing the table; build it with "
                f"`python -m nanogpt.report {sweep_dir}` (every record is kept)",
                file=sys.stderr,
            )
            sys.stdout.flush()
            os._exit(interrupted_exit())  # no second traceback from Hydra or the interpreter

    def _publish(self, config: DictConfig):
        """Build, write and print the sweep's table; say how many points a resume kept."""
        sweep_dir = Path(config.hydra.sweep.dir)
        report, cost = config.report, config.cost
        sweep = sweep_table.publish(
            sweep_dir,
            baseline=report.baseline,
            memory_budget_gib=report.memory_budget_gib,
            usd_per_hour=cost.usd_per_hour,
            usd_per_kwh=cost.usd_per_kwh,
        )
        if report.plots:
            from nanogpt.reporters.plots import write_plots  # matplotlib only when asked for

            for path in write_plots(sweep_dir, sweep.table):
                print(f"plot: {path}")
        skipped = skipped_since(sweep_dir, self.started) if self.started else 0
        if skipped:
            print(
                f"resume: skipped {skipped} point(s) with an ok record from an earlier run "
                "(bench.rerun=true measures them again)"
            )
        return sweep_dir, sweep.table
