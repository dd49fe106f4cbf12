"""Logging: every job's lines in its own log file, plain lines on the console.

Hydra configures the job process's logging from conf/hydra/job_logging/nanogpt.yaml: the plain
message on stdout (warnings and errors on stderr, with their level), every line with its time in
JOB_DIR/run.log. The measuring child (launch/) is another process: it gets the same config,
resolved by the job process (its file an absolute path), and appends to the same run.log
(`configure`), so a point's log holds what its child said too.

Progress: while the step bar is drawn on a terminal, the per-window progress lines go to the
log file only (`NotUnderTheBar`); elsewhere (a file, CI, SLURM) there is no bar, and they are the
progress, one line a window.
"""

from __future__ import annotations

import logging
import logging.config
import sys
import warnings

PROGRESS = "progress"  # a record's attribute: a progress line (extra={PROGRESS: True})


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


def configure(config: dict | None) -> None:
    """In a child process: the job's logging (Hydra's job_logging, resolved), warnings
    included. None (no Hydra job, e.g. a test's handoff): warnings and up on stderr."""
    if config:
        logging.config.dictConfig(config)
    else:
        console()
    capture_warnings()


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
