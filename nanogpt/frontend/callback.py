"""Entry point (a Hydra callback, named in conf/config.yaml): at the end of a multirun, build the
sweep's table (and send it to W&B).

Hydra 1.3 skips on_multirun_end when a job raises, so jobs never raise for a failed point:
they record it (nanogpt/runner/job.py) and the table is always built here. A job that was
interrupted (Ctrl-C) returns the status `interrupted`: on_job_end then builds the table of what
is done and stops the sweep with exit status 130 (128 + SIGINT, the shell's convention).
"""

from __future__ import annotations

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
from nanogpt.analysis import sweep_lock
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import check_points
from nanogpt.frontend.point_configs import PointConfigs
from nanogpt.frontend.presets import (
    OUR_SWEEPERS,
    launcher_capabilities,
    repeats_refusal,
    runs_here,
    sweep_points,
)
from nanogpt.publish import wandb_mode, wandb_sink, wandb_view
from nanogpt.publish.sweep_outputs import publish, settings_of
from nanogpt.record.faults import (
    CONFIG_EXIT,
    exit_code,
    finishing,
    interrupted_exit,
    signal_hook,
)
from nanogpt.runner.job import Outcome, point_status
from nanogpt.runner.process import collector_paused


def away_from_the_sweep(config: DictConfig) -> bool:
    """Whether this job runs in a process of its own launcher's (a slot of
    hydra/launcher=parallel, a SLURM job: the launcher's `jobs_apart`): the sweep's process
    decides when it stops."""
    return launcher_capabilities(str(config.hydra.launcher.get("_target_", ""))).jobs_apart


def compose_point(config: DictConfig):
    """compose(overrides): a point's config as its job's will be composed (Hydra's, hydra node
    and all), for check_points: through the sweep's PointConfigs (frontend/point_configs.py),
    which composes each choice of config groups once and sets a point's values on a copy."""
    configs = PointConfigs.of(GlobalHydra.instance().config_loader())

    def compose(overrides: list[str]) -> DictConfig:
        return configs.load_sweep_config(config, list(overrides))

    return compose


def _refuse_runs_under_another_sweeper(config: DictConfig, points, compose) -> None:
    """bench.repeats > 1 under a sweeper that is not this project's (Hydra's basic, Optuna,
    Ax): refused before anything runs, each point's where they are known (basic), else the
    sweep's own."""
    sweeper = config.hydra.runtime.choices.get("hydra/sweeper")
    if sweeper in OUR_SWEEPERS:
        return
    configs = [compose(point) for point in points] if points else [config]
    asked = max(int(OmegaConf.select(c, "bench.repeats") or 1) for c in configs)
    if asked > 1:
        raise ConfigError(*repeats_refusal(sweeper, asked))


class SweepReport(Callback):
    started: float | None = None  # when this multirun started (epoch s)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """Before anything is measured: every point of the sweep is composed and validated
        (nothing written yet), then the sweep dir becomes this process's alone
        (analysis/sweep_lock.py), then W&B's server is asked once for the whole sweep."""
        self.started = time.time()
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            points = sweep_points(config)
            compose = compose_point(config)
            if points:
                check_points(points, config.report.baseline, runs_here(config), compose)
            _refuse_runs_under_another_sweeper(config, points, compose)
        except ConfigError as err:
            print(f"error: {err} (nothing was measured)", file=sys.stderr)
            sys.exit(CONFIG_EXIT)
        try:
            sweep_lock.take(sweep_dir)
        except sweep_lock.SweepBusy as holder:
            print(
                f"error: hydra.sweep.dir: {sweep_dir} is being written by another sweep "
                f"({holder}); wait for it to end (`python -m nanogpt.report {sweep_dir}` shows "
                "its table so far), or give this one another hydra.sweep.dir (nothing was "
                "measured)",
                file=sys.stderr,
            )
            sys.exit(CONFIG_EXIT)
        logs.forget_said(sweep_dir)
        # W&B's server asked once for the whole sweep (every run inherits the answer)
        logger = OmegaConf.to_object(config.logger)
        warning = wandb_mode.decide_for_sweep(logger.backend, logger.mode)
        if warning:
            print(warning, file=sys.stderr)

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        signal_hook("job-start")  # TESTING ONLY: a test's signal here (Hydra composed the job)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs) -> None:
        """An interrupted point stops the sweep (after its table); a single run exits with its
        point's status code (faults.EXIT_CODES), never 0 for a point that is not ok."""
        if job_return.status != JobStatus.COMPLETED:
            return
        # run.main returns the run's Outcome; under another sweeper, the objective alone (the
        # status is then the record's)
        value = job_return.return_value
        if isinstance(value, Outcome):
            status = value.status
        else:
            status = point_status(Path(config.hydra.runtime.output_dir))
        point = " ".join(job_return.overrides or []) or "defaults"
        multirun = config.hydra.mode == RunMode.MULTIRUN
        if status == "interrupted" and multirun and not away_from_the_sweep(config):
            sweep_dir, _ = self._table(config)
            resume = f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume"
            print(f"interrupted at {point}; {resume} (ok points are kept)", file=sys.stderr)
            sys.exit(interrupted_exit())
        if not multirun and status != "ok":
            code = exit_code(status)
            print(f"{point}: recorded with status {status} (exit code {code})", file=sys.stderr)
            sys.exit(code)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """The table, then the sweep's exit: 130 if a run was interrupted, 1 if one failed.
        Hydra only warns about a callback that raises (and exits 0): an error here is one line
        and exit 1."""
        try:
            self._end(config)
        except Exception as err:  # noqa: BLE001 - any error: one line, never exit 0
            sweep_dir = Path(config.hydra.sweep.dir)
            print(
                f"error: the sweep's table: {type(err).__name__}: {err} (every record is kept; "
                f"`python -m nanogpt.report {sweep_dir}` builds it again)",
                file=sys.stderr,
            )
            sys.exit(1)

    def _end(self, config: DictConfig) -> None:
        # pandas and the table's code, imported only now (a sweep refused at its start never
        # builds a table), with the collector paused (process.collector_paused)
        with collector_paused():
            from nanogpt.analysis import table as sweep_table
        logs.sweep_console()  # the sweep's own lines (its W&B summary run) as a job's are
        with finishing("the table") as came:  # a Ctrl-C now: the table first, then the stop
            sweep_dir, sweep = self._table(config)
        logger = OmegaConf.to_object(config.logger)
        if came:
            skipped = "; its W&B summary run is not sent" if logger.backend == "wandb" else ""
            print(
                f"interrupted while writing the table: it is finished "
                f"({sweep_dir / sweep_table.SUMMARY_CSV}){skipped}",
                file=sys.stderr,
            )
            sys.exit(interrupted_exit())
        table = sweep.table
        summary_csv = sweep_dir / sweep_table.SUMMARY_CSV
        unreachable = wandb_sink.log_sweep_table(logger, sweep_dir, sweep, summary_csv)
        wandb_view.save_and_publish(logger, sweep_dir, sweep, unreachable)  # its ready view
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
        """The table, once; a Ctrl-C that stops it (the sweep's second: the first stopped a run,
        or was noted by `finishing`) ends with one line that says how to build it from the
        records (they are all written by then)."""
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
        """Build, write and print the sweep's table (publish/sweep_outputs.py)."""
        sweep_dir = Path(config.hydra.sweep.dir)
        return sweep_dir, publish(sweep_dir, settings_of(config))
