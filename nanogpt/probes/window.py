"""Log windows: the steps between two reads of the device, and the per-step log.

A window's steps run without a host sync: CUDA events time each step, the loss is summed on the
device, and both are read once when the window closes (probes/timing.py).
"""

from __future__ import annotations

import math

import torch

from nanogpt.analysis import stats
from nanogpt.probes.timing import StepTimer
from nanogpt.record.faults import Diverged
from nanogpt.train.trainer import Trainer


class StepLog:
    """Per-step rows for steps.csv: loss is known only at window ends (read once a window)."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, step: int, phase: str, step_ms: float, data_ms: float) -> None:
        self.rows.append(
            {"step": step, "phase": phase, "step_ms": step_ms, "data_ms": data_ms, "loss": None}
        )

    def measured(self, key: str) -> list[float]:
        return [r[key] for r in self.rows if r["phase"] == "measure"]


class Window:
    """Steps between two reads of the device: timing and loss are synced once per window."""

    def __init__(self, trainer: Trainer, log: StepLog, phase: str):
        self.trainer, self.log, self.phase = trainer, log, phase
        self.timer = StepTimer(trainer.device)
        self.loss_sum = torch.zeros((), device=trainer.device)
        self.data_ms: list[float] = []
        self.count = 0
        self.steps_total, self.wall_ms_total = 0, 0.0  # over all the windows closed

    def step(self) -> None:
        self.timer.start()
        self.loss_sum += self.trainer.step()
        self.timer.stop()
        self.data_ms.append(self.trainer.last_data_ms)
        self.count += 1

    def close(self) -> dict:
        """The window's median step and mean loss (one device read); its rows go to the log."""
        times = self.timer.flush()
        self.steps_total += len(times)
        self.wall_ms_total += self.timer.wall_ms
        first = self.trainer.steps_done - len(times) + 1
        for i, (ms, data_ms) in enumerate(zip(times, self.data_ms, strict=True)):
            self.log.add(first + i, self.phase, ms, data_ms)
        loss = self.loss_sum.item() / self.count
        self.log.rows[-1]["loss"] = loss
        if not math.isfinite(loss):
            raise Diverged(f"loss is {loss} in the window ending at step {self.trainer.steps_done}")
        window = {
            "phase": self.phase,
            "step": self.trainer.steps_done,
            "step_ms": stats.summarize(times)["median"],
            "loss": loss,
            "lr": self.trainer.optimizer.param_groups[0]["lr"],  # a host float: no sync
        }
        self.loss_sum.zero_()
        self.data_ms.clear()
        self.count = 0
        return window
