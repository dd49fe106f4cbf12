"""Where a run's figures go besides its record: sinks with `window(stats)` and `finish(result)`.

A sink receives figures and computes none: the window stats come from the measured loop (with
tokens/s and MFU from results/derive.py), the final ones are the record's. Rank 0 alone gets
sinks. A sink can never cost a local record: the record is written by the job
process from the measurement, whatever a sink does. The one sink is Weights & Biases:

- one W&B run per job, files in the job's own dir, grouped by sweep (logger.group, default the
  sweep's id: DATE/TIME, results/store.sweep_id), named by the job's overrides, with the
  resolved config;
- every log window is logged with the optimizer step as W&B's step: `train/*` keys for measured
  windows, `warmup/*` keys for warmup windows (so warmup never mixes into a measured chart);
- at the end, every field of result.json goes into the run's summary (but wall_s, which is
  measured around the whole point after the run closed), and a failed point is a failed run;
- at the end of a multirun, the sweep table goes to a summary run of the same group.

Several runs can live in one process (Hydra's basic launcher with bench.isolate=false), so runs
are created with `reinit="create_new"` and driven only through their own Run object: wandb's
default `reinit` returns the still-active previous run outside notebooks, which is how a
multirun ends up as one merged run.

Any wandb failure (not installed, no key, no network within logger.init_timeout_s, an exception
at init or log) prints one warning line and the point goes on without W&B. The environment
variable NANOGPT_WANDB_FAULT=init|log (TESTING ONLY) makes real wandb fail at that point.
"""

from __future__ import annotations

import logging
import netrc
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from nanogpt.config import LoggerConfig, LoggerMode
from nanogpt.faults import RESULT_STATUSES, describe
from nanogpt.results.store import sweep_id

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")

# TESTING ONLY: NANOGPT_WANDB_FAULT=init|log makes real wandb raise at that point: `init` asks
# wandb.init for a run id that wandb refuses ('/' is not allowed in ids), `log` hands run.log a
# non-string key (wandb raises TypeError). Both exercise the real failure path, no mocks.
FAULT_ENV = "NANOGPT_WANDB_FAULT"
REFUSED_RUN_ID = "injected/fault"
REFUSED_KEY = 0

DEFAULT_HOST = "https://api.wandb.ai"
# Bound on run.finish's upload wait; data not uploaded by then stays on disk for `wandb sync`.
FINISH_TIMEOUT_S = 60.0
# Not in the run summary: the per-step rows (steps.csv; the history has the windows), and wall_s,
# which the job process measures around the whole point, after this run has closed.
SUMMARY_OMITTED = ("steps", "wall_s")


def open_sinks(logger: LoggerConfig, *, name: str, group: str | None, config: dict, run_dir: Path):
    """The sinks of one point: its W&B run, or none when W&B is off or cannot start."""
    run = start_run(
        logger,
        job_type="point",
        name=name,
        group=logger.group or group,
        config=config,
        run_dir=run_dir,
    )
    return [] if run is None else [WandbSink(run)]


def log_sweep_table(
    logger: LoggerConfig, sweep_dir: Path, table: pd.DataFrame, summary_csv: Path
) -> None:
    """The sweep table as a wandb.Table, and summary.csv as an artifact, in a summary run."""
    group = logger.group or sweep_id(sweep_dir)
    run = start_run(
        logger,
        job_type="sweep-summary",
        name=f"{group} summary",
        group=group,
        config={"sweep_dir": str(sweep_dir), "points": len(table)},
        run_dir=sweep_dir,
    )
    if run is None:
        return
    import wandb

    def log_table(wandb_run) -> None:
        wandb_run.log({"sweep_table": wandb.Table(dataframe=table, allow_mixed_types=True)})
        # Artifact names allow letters, digits, '-', '_' and '.'.
        artifact = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"sweep-{group}"), type="sweep-summary")
        artifact.add_file(str(summary_csv))
        wandb_run.log_artifact(artifact)

    run.attempt("logging the sweep table", log_table)
    run.close(exit_code=0)


def start_run(
    logger: LoggerConfig,
    *,
    job_type: str,
    name: str,
    group: str | None,
    config: dict,
    run_dir: Path,
) -> GuardedRun | None:
    """A new W&B run, or None when W&B is off or cannot start (after one warning line)."""
    if logger.backend != "wandb":
        return None
    mode, reason = resolve_mode(logger.mode)
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError as exc:
        _warn(f"wandb cannot be imported ({describe(exc)}); install it or use logger=none")
        return None
    try:
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
            id=REFUSED_RUN_ID if _injected("init") else None,
            reinit="create_new",
            settings=wandb.Settings(
                init_timeout=logger.init_timeout_s,
                finish_timeout=FINISH_TIMEOUT_S,
                console="off",  # leave the measured process's stdout/stderr alone
                silent=True,  # one line of ours below instead of wandb's banner
            ),
        )
    except Exception as exc:  # any wandb failure costs W&B only, never the result
        _warn(f"wandb.init failed ({describe(exc)}); this run goes on without W&B")
        return None
    log.info(_where(run, mode, reason))
    return GuardedRun(run)


def resolve_mode(mode: LoggerMode) -> tuple[str, str | None]:
    """The wandb mode to run in, and why, when `auto` chose offline or disabled.

    auto: wandb's own switch WANDB_MODE when it is set, else online when an API key is
    configured, else offline. The other modes are taken as asked.
    """
    if mode is not LoggerMode.auto:
        return mode.value, None
    if env_mode := os.environ.get("WANDB_MODE"):
        return env_mode, f"WANDB_MODE={env_mode}"
    if api_key_configured():
        return "online", None
    return "offline", "no API key (WANDB_API_KEY or ~/.netrc)"


def api_key_configured() -> bool:
    """Where wandb finds a key: the environment, else the netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", DEFAULT_HOST)).netloc
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _where(run, mode: str, reason: str | None) -> str:
    """One line: where this run's data goes."""
    if mode == "online":
        return f"W&B: run {run.name!r} at {run.url}"
    sync_dir = run.settings.sync_dir
    why = f"{reason}, so " if reason else ""
    return f"W&B: {why}logging offline to {sync_dir}; upload later with `wandb sync {sync_dir}`"


def _injected(point: str) -> bool:
    return os.environ.get(FAULT_ENV) == point


def _warn(message: str) -> None:
    log.warning("W&B: %s", message)  # "warning: W&B: ..." on stderr, and in the job's run.log


class GuardedRun:
    """A wandb Run whose failures end it with one warning, never raising into the caller."""

    def __init__(self, run):
        self.run = run

    def attempt(self, what: str, action: Callable[[Any], T]) -> T | None:
        """action(run), unless an earlier failure ended the run; None if it fails."""
        if self.run is None:
            return None
        try:
            return action(self.run)
        except Exception as exc:  # see the module docstring
            _warn(f"{what} failed ({describe(exc)}); the rest of this run goes without W&B")
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
                _warn(f"finishing the run failed ({describe(exc)})")


class WandbSink:
    """Streams each log window and the final record of one point to its W&B run."""

    def __init__(self, run: GuardedRun):
        self.run = run

    def window(self, stats: dict) -> None:
        prefix = "train" if stats["phase"] == "measure" else "warmup"
        values = {k: v for k, v in stats.items() if k not in ("phase", "step")}
        payload = {f"{prefix}/{key}": value for key, value in values.items()}
        if _injected("log"):
            payload[REFUSED_KEY] = 0
        self.run.attempt("run.log", lambda run: run.log(payload, step=stats["step"]))

    def finish(self, result: dict) -> None:
        summary = {k: v for k, v in result.items() if k not in SUMMARY_OMITTED}
        self.run.attempt("writing the summary", lambda run: run.summary.update(summary))
        # A failed point (error, interrupted) shows as a failed run on the dashboard.
        self.run.close(exit_code=0 if result["status"] in RESULT_STATUSES else 1)
