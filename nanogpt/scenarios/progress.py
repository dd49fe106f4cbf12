"""A point's progress: a tqdm bar where stderr is a terminal, and one log line per log window
(nanogpt/logs.py sends those to the job's run.log, and to the console only where no bar is
drawn: a file, CI or SLURM gets plain lines instead of a bar's redraws)."""

from __future__ import annotations

import logging

from tqdm import tqdm

from nanogpt.logs import PROGRESS, bar_drawn

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, total: int | None, shown: bool):
        """total: the steps to run, None when time decides (bench.warmup_s, bench.measure_s)."""
        self.total, self.shown, self.done = total, shown, 0
        self.bar = tqdm(total=total, desc="steps", unit="step", disable=not (shown and bar_drawn()))

    def update(self, steps: int = 1) -> None:
        self.done += steps
        self.bar.update(steps)

    def window(self, figures: dict) -> None:
        """A log window's figures: on the bar, and as one line."""
        self.bar.set_postfix(
            step_ms=f"{figures['step_ms']:.1f}",
            tok_s=f"{figures['tokens_per_s']:,.0f}",
            loss=f"{figures['loss']:.3f}",
        )
        if not self.shown:
            return
        mfu = figures.get("mfu")
        log.info(
            "%s step %s: %.1f ms/step, %s tok/s, loss %.3f%s",
            figures["phase"],
            self.done if self.total is None else f"{self.done}/{self.total}",
            figures["step_ms"],
            f"{figures['tokens_per_s']:,.0f}",
            figures["loss"],
            "" if mfu is None else f", MFU {mfu:.1%}",
            extra={PROGRESS: True},
        )

    def close(self) -> None:
        self.bar.close()
