"""Hydra callbacks: at the end of a multirun, build the sweep's table.

Hydra 1.3 skips on_multirun_end when a job raises, so jobs never raise for a failed point:
they record it (nanogpt/job.py) and the table is always built here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from nanogpt import report


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = report.report(sweep_dir, baseline=config.report.baseline, plots=config.report.plots)
        failed = report.failed_points(table)
        if failed:
            print(f"{len(failed)} point(s) failed: {'; '.join(failed)}", file=sys.stderr)
            sys.exit(1)
