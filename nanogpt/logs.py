"""Logging: every job's lines in its own log file, plain lines on the console.

Hydra configures the job process's logging from conf/hydra/job_logging/nanogpt.yaml: the plain
message on stdout (warnings and errors on stderr, with their level), every line with its time in
JOB_DIR/run.log. The measuring child (runner/) is another process: it gets the same config,
resolved by the job process (its file an absolute path), and appends to the same run.log
(`configure`), so a point's log holds what its child said too.

Progress: while the step bar is drawn on a terminal, the per-window progress lines go to the
log file only (`NotUnderTheBar`); elsewhere (a file, CI, SLURM) there is no bar, and they are the
progress, one line a window.

Once per sweep: a line that every point of a sweep says alike (a Python warning such as "no
known peak for this CPU's dtype", a record marked ONCE such as where W&B logs) reaches the
console for the first point only (`OncePerSweep`); each point's run.log keeps it. The points'
processes share what was said through marker files in SWEEP_DIR/.said/, which each run of the
sweep (a resume too) starts empty (`forget_said`).
"""

from __future__ import annotations

import hashlib
import logging
import logging.config
import os
import shutil
import sys
import warnings
from pathlib import Path

PROGRESS = "progress"  # a record's attribute: a progress line (extra={PROGRESS: True})
ONCE = "once_per_sweep"  # a record's attribute: its key when every point says it alike
SAID_DIR = ".said"  # under the sweep dir: a marker file per line said once


def bar_drawn() -> bool:
    """Whether a progress bar is drawn: only where stderr is a terminal."""
    return sys.stderr.isatty()


class BelowWarning(logging.Filter):
    """Lets through what is below WARNING (stdout's share; stderr takes the rest)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


class NotUnderTheBar(logging.Filter):
    """Drops the progress lines where the bar shows the same figures (on a terminal)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(record, PROGRESS, False) and bar_drawn())


class LevelFormatter(logging.Formatter):
    """`warning: message`, as the tool's other one-line messages read."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


class OncePerSweep(logging.Filter):
    """Lets a line that every point says alike (a Python warning or a library's own warning,
    by its text; a record with ONCE, by that key) through for the first point of the sweep
    only. A library's warning is a record of its own logger (torchao's "Failed to load ...so",
    torch's `_pytree` Enum deprecation), not a Python warning: keyed by the warning's text
    alone, they escaped this filter, and torch's reach the console through torch's own handler,
    not the root's (`say_once_per_sweep` filters both)."""

    def __init__(self, said: Path):
        super().__init__()
        self.said = said

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, ONCE, None)
        if key is None and (record.name == "py.warnings" or _a_librarys(record)):
            key = record.getMessage()
        if key is None:
            return True
        self.said.mkdir(parents=True, exist_ok=True)
        marker = self.said / hashlib.sha256(str(key).encode()).hexdigest()[:16]
        try:  # atomic: of the points' processes, one creates it
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def _a_librarys(record: logging.LogRecord) -> bool:
    """A warning from another package's logger (torch, torchao, triton, transformers...)."""
    ours = record.name in ("root", "__main__") or record.name.split(".")[0] in ("nanogpt", "hydra")
    return record.levelno >= logging.WARNING and not ours


def say_once_per_sweep(sweep_dir: Path | None) -> None:
    """In a multirun's job or measuring process: the console handlers (not run.log's) say each
    line that every point says alike once per sweep, the root's and those of a library's
    logger that writes on its own (torch's: it does not propagate). A single run (sweep_dir
    None) says all."""
    if sweep_dir is None:
        return
    once = OncePerSweep(Path(sweep_dir) / SAID_DIR)
    loggers = [logging.getLogger()]
    loggers += [
        logger
        for logger in list(logging.root.manager.loggerDict.values())
        if isinstance(logger, logging.Logger) and logger.handlers and not logger.propagate
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if not isinstance(handler, logging.FileHandler) and once not in handler.filters:
                handler.addFilter(once)


def forget_said(sweep_dir: Path) -> None:
    """At a multirun's start: nothing said yet (a resumed sweep says its lines again)."""
    shutil.rmtree(Path(sweep_dir) / SAID_DIR, ignore_errors=True)


def configure(config: dict | None, sweep_dir: Path | None = None) -> None:
    """In a child process: the job's logging (Hydra's job_logging, resolved), warnings
    included. None (no Hydra job, e.g. a test's handoff): warnings and up on stderr."""
    if config:
        logging.config.dictConfig(config)
    else:
        console()
    capture_warnings()
    say_once_per_sweep(sweep_dir)


def capture_warnings() -> None:
    """Python warnings into the log, as one line each: the message alone (the handlers add
    `warning:` and, in run.log, the time), not the file, line number and source line."""
    warnings.formatwarning = _one_line
    logging.captureWarnings(True)


def _one_line(message, category, filename, lineno, line=None) -> str:
    return str(message)


def sweep_console() -> None:
    """At a multirun's end, outside any job (Hydra left its own launcher logging): plain lines
    on stdout, `warning: ...` on stderr, as in a job."""
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(BelowWarning())
    out.setFormatter(logging.Formatter("%(message)s"))  # basicConfig's default adds LEVEL:name:
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    err.setFormatter(LevelFormatter("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[out, err], force=True)


def console() -> None:
    """Outside a Hydra job (report, dashboard, calibrate): `warning: ...` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LevelFormatter("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
