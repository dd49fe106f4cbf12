"""Where a run's figures go besides its record: sinks with `window(stats)` and `finish(result)`.

A sink receives figures and computes none: the window stats come from the measured loop (with
tokens/s and MFU from analysis/derive.py), the final ones are the record's. Rank 0 alone gets
sinks. A sink can never cost a local record: the record is written by the job
process from the measurement, whatever a sink does. The one sink is Weights & Biases:

- one W&B run per job, files in the job's own dir, grouped by sweep (logger.group, default the
  sweep's id: DATE/TIME, analysis/store.sweep_id), named by the job's overrides, with the
  resolved config and a `point` section: the point's id (its record's point_id), its
  overrides typed (`point.overrides`, dots as '/': keys with no config path of their own, such
  as `+sweep/accum_split`, are there), which repeat of how many it is, and the ids of the runs
  it supersedes;
- every log window is logged with the optimizer step as W&B's step: `train/*` keys for measured
  windows, `warmup/*` keys for warmup windows (so warmup never mixes into a measured chart);
  a time-to-loss run logs each evaluation instead: `val/loss` and `val/train_s` (the training
  clock, evaluations excluded), charted against training time, the step beside it;
  define_metric gives them no summary, so the run summary holds the record's figures only
  (tokens_per_s is the median step's, not the last window's);
- at the end, every field of result.json goes into the run's summary, namespaced by the
  record's part as torchtitan names its metrics (`timing/step_ms_median`, `rates/mfu`,
  `point/status`: results/summary_keys.summary_key), but wall_s, which is measured around the whole
  point after the run closed; a failed point is a failed run;
- at the end of a multirun, the sweep table goes to a summary run of the same group: its rows
  as a wandb.Table and, in the run's summary, each point's pooled figures (`points`, by the
  point's overrides), taken from the sweep the table was built as (analysis/table.Sweep).

Online init that fails (no route, a timeout, a refused key) falls back to offline in the same
process (a new run id: wandb refuses an id twice in a process; the failed attempt's empty dir is
removed) and prints the `wandb sync` command that uploads it later.
A point measured again (a resume, bench.rerun) supersedes the W&B runs already in its dir: the
new run's config lists them (`point.supersedes`, which is all offline runs can do); online,
each of them that W&B knows also gets the tag `superseded`.

Several runs can live in one process (Hydra's basic launcher with bench.isolate=false), so runs
are created with `reinit="create_new"` and driven only through their own Run object: wandb's
default `reinit` returns the still-active previous run outside notebooks, which is how a
multirun ends up as one merged run.

Any other wandb failure (not installed, no key, offline init refused, an exception at log)
prints one warning line (wandb_mode.warn) and the point goes on without W&B.
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import string
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nanogpt.analysis.store import sweep_id
from nanogpt.config.spec import LoggerConfig
from nanogpt.logs import ONCE
from nanogpt.publish.wandb_mode import resolve_mode, warn
from nanogpt.publish.wandb_point import earlier_runs, point_config, tag_superseded
from nanogpt.record.faults import RESULT_STATUSES, describe
from nanogpt.record.summary_keys import namespaced

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from nanogpt.analysis.table import Sweep

T = TypeVar("T")

# Why a run asked to go online logs offline: its online init failed (no route, a refused key).
FELL_BACK = "online init failed"
# Bound on run.finish's upload wait; data not uploaded by then stays on disk for `wandb sync`.
FINISH_TIMEOUT_S = 60.0
# Not in the run summary: wall_s, which the job process measures around the whole point, after
# this run has closed.
SUMMARY_OMITTED = ("wall_s",)
# Window metrics: history only; the summary is the record's (WandbSink.finish).
WINDOW_METRICS = ("train/*", "warmup/*", "val/*")
# A window's phase -> its keys' prefix. "eval": a time-to-loss run's evaluation
# (scenarios/time_to_loss/run.py), val/loss and val/train_s (the training clock at it) at its step.
PREFIXES = {"measure": "train", "warmup": "warmup", "eval": "val"}


def open_sinks(
    logger: LoggerConfig,
    *,
    name: str,
    group: str | None,
    config: dict,
    run_dir: Path,
    point_id: str,
    overrides: list[str] = (),
    repeat: str | None = None,
    supersedes: list[str] = (),
):
    """The sinks of one point: its W&B run, or none when W&B is off or cannot start.
    `point_id` is the point's identity (record/identity.py), the key of its runs; `repeat` is
    "k/N" while bench.repeats measures the point again; `supersedes` the ids of
    earlier runs of this point (`earlier_runs`, taken before it is measured)."""
    run = start_run(
        logger,
        job_type="point",
        name=name,
        group=logger.group or group,
        config={**config, "point": point_config(point_id, overrides, repeat, supersedes)},
        run_dir=run_dir,
        supersedes=supersedes,
    )
    return [] if run is None else [WandbSink(run)]


def log_sweep_table(
    logger: LoggerConfig, sweep_dir: Path, sweep: Sweep, summary_csv: Path
) -> str | None:
    """The sweep table as a wandb.Table, each point's pooled figures in the run's summary
    (`pooled_figures`), and summary.csv as an artifact, in a summary run. Returns why W&B's
    server is out of reach ("online init failed") when the run had to go offline for it, so
    that the sweep does not try it again for its view; else None."""
    table = sweep.table
    group = logger.group or sweep_id(sweep_dir)
    earlier = earlier_runs(sweep_dir)  # the summary runs of earlier runs of this sweep
    run = start_run(
        logger,
        job_type="sweep-summary",
        name=f"{group} summary",
        group=group,
        config={"sweep_dir": str(sweep_dir), "points": len(table), "supersedes": earlier},
        run_dir=sweep_dir,
        supersedes=earlier,
    )
    if run is None:
        return None
    import wandb

    def log_table(wandb_run) -> None:
        wandb_run.log({"sweep_table": wandb.Table(dataframe=table, allow_mixed_types=True)})
        # Artifact names allow letters, digits, '-', '_' and '.'.
        artifact = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"sweep-{group}"), type="sweep-summary")
        artifact.add_file(str(summary_csv))
        wandb_run.log_artifact(artifact)
        wandb_run.summary.update({"points": pooled_figures(sweep)})

    run.attempt("logging the sweep table", log_table)
    run.close(exit_code=0)
    return run.offline_reason


def pooled_figures(sweep: Sweep) -> dict[str, dict]:
    """Each point's figures as the table pooled them (all its runs), by its overrides: the
    table's columns that hold a value (a swept key's column, named with dots, is in the
    overrides already)."""
    import pandas as pd

    points = {}
    for row in sweep.table.to_dict(orient="records"):
        figures = {}
        for column, value in row.items():
            if "." in column or (pd.api.types.is_scalar(value) and pd.isna(value)):
                continue  # a swept key's column, or no value (None, NaN, NA)
            figures[column] = value.item() if hasattr(value, "item") else value  # numpy -> Python
        points[str(row["overrides"])] = figures
    return points


def start_run(
    logger: LoggerConfig,
    *,
    job_type: str,
    name: str,
    group: str | None,
    config: dict,
    run_dir: Path,
    supersedes: list[str] = (),
) -> GuardedRun | None:
    """A new W&B run, or None when W&B is off or cannot start (after one warning line).
    Online init that fails falls back to offline, with the same run id."""
    if logger.backend != "wandb":
        return None
    mode, reason = resolve_mode(logger.mode)
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError as exc:
        warn(f"wandb cannot be imported ({describe(exc)}); install it or use logger=none")
        return None

    def init(mode: str, run_id: str):
        run = wandb.init(
            project=logger.project,
            entity=logger.entity,
            group=group,
            job_type=job_type,
            name=name,
            tags=list(logger.tags),
            config=config,
            dir=run_dir,
            mode=mode,
            id=run_id,
            reinit="create_new",
            settings=wandb.Settings(
                init_timeout=logger.init_timeout_s,
                finish_timeout=FINISH_TIMEOUT_S,
                console="off",  # leave the measured process's stdout/stderr alone
                silent=True,  # one line of ours below instead of wandb's banner
            ),
        )
        for pattern in WINDOW_METRICS:
            run.define_metric(pattern, summary="none")
        # The validation loss's default chart is against training time; its rows also carry
        # the optimizer step (W&B's step), the x axis chosen in the chart's menu.
        run.define_metric("val/loss", step_metric="val/train_s", summary="none")
        return run

    run_id = new_run_id()
    try:
        try:
            run = init(mode, run_id)
        except Exception as exc:
            if mode != "online":
                raise
            warn(f"online init failed ({describe(exc)}); logging offline instead")
            _remove_unstarted(run_dir, run_id)
            mode, reason = "offline", FELL_BACK
            run = init(mode, new_run_id())  # wandb refuses an id twice in one process
    except Exception as exc:  # any wandb failure costs W&B only, never the result
        warn(f"wandb.init failed ({describe(exc)}); this run goes on without W&B")
        return None
    log.info(_where(run, mode, reason), extra={ONCE: f"W&B {job_type} {mode}"})
    if mode == "online" and supersedes:
        tag_superseded(run, supersedes, FINISH_TIMEOUT_S)
    return GuardedRun(run, offline_reason=reason if reason == FELL_BACK else None)


def _remove_unstarted(run_dir: Path, run_id: str) -> None:
    """The dir of an online run whose init failed holds no data; `wandb sync` would upload it
    as an empty run, and a resume would count it among the point's runs."""
    for path in Path(run_dir, "wandb").glob(f"run-*-{run_id}"):
        shutil.rmtree(path, ignore_errors=True)


def new_run_id() -> str:
    """A run id as wandb makes them (8 lowercase letters and digits), chosen here so that an
    offline fallback keeps the id the online attempt had."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _where(run, mode: str, reason: str | None) -> str:
    """One line: where this run's data goes."""
    if mode == "online":
        return f"W&B: run {run.name!r} at {run.url}"
    sync_dir = run.settings.sync_dir
    why = f"{reason}, so " if reason else ""
    return f"W&B: {why}logging offline to {sync_dir}; upload later with `wandb sync {sync_dir}`"


class GuardedRun:
    """A wandb Run whose failures end it with one warning, never raising into the caller.
    `offline_reason` is FELL_BACK for a run that went offline because its online init failed."""

    def __init__(self, run, offline_reason: str | None = None):
        self.run = run
        self.offline_reason = offline_reason

    def attempt(self, what: str, action: Callable[[Any], T]) -> T | None:
        """action(run), unless an earlier failure ended the run; None if it fails."""
        if self.run is None:
            return None
        try:
            return action(self.run)
        except Exception as exc:  # see the module docstring
            warn(f"{what} failed ({describe(exc)}); the rest of this run goes without W&B")
            self.close(exit_code=1, quiet=True)
            return None

    def close(self, exit_code: int, quiet: bool = False) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish(exit_code=exit_code)
        except Exception as exc:
            if not quiet:
                warn(f"finishing the run failed ({describe(exc)})")


class WandbSink:
    """Streams each log window and the final record of one point to its W&B run."""

    def __init__(self, run: GuardedRun):
        self.run = run

    def window(self, stats: dict) -> None:
        prefix = PREFIXES[stats["phase"]]
        values = {k: v for k, v in stats.items() if k not in ("phase", "step")}
        payload = {f"{prefix}/{key}": value for key, value in values.items()}
        self.run.attempt("run.log", lambda run: run.log(payload, step=stats["step"]))

    def finish(self, result: dict) -> None:
        summary = namespaced({k: v for k, v in result.items() if k not in SUMMARY_OMITTED})
        self.run.attempt("writing the summary", lambda run: run.summary.update(summary))
        # A failed point (error, interrupted) shows as a failed run on the dashboard.
        self.run.close(exit_code=0 if result["status"] in RESULT_STATUSES else 1)
