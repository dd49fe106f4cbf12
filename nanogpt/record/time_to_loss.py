"""The record's time_to_loss part: how long a run took to reach bench.target_loss on held-out
data, and what it cost to find out (scenarios/time_to_loss.py fills one run's; results/
time_to_loss.py pools a point's runs). Every name carries `ttl_` (or is `time_to_loss_s`), so
the group stays together in the flat record. docs/time_to_loss.md says what is timed."""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.record.fields import json_only


@dataclass
class TimeToLoss:
    ttl_target_loss: float | None = None  # bench.target_loss; null: no target, no figures here
    # Training steps' wall time to the evaluation that first read loss <= target, less
    # ttl_compile_s; evaluations excluded. A point: the olympic mean of its runs, when all reached
    time_to_loss_s: float | None = None
    ttl_ci_low: float | None = None  # 95 % interval of the runs' mean time (ttl_ci_method)
    ttl_ci_high: float | None = None
    ttl_ci_method: str | None = json_only()
    ttl_reached: bool | None = None  # every run reached the target
    ttl_runs: int | None = None  # runs (bench.repeats), each a fresh process with its own seed
    ttl_reached_runs: int | None = None  # how many of them reached it
    ttl_note: str | None = None  # e.g. "3 of 5 reached", or why a run did not, with its best loss
    ttl_steps: int | None = None  # steps to target (a point: the median over runs that reached)
    ttl_tokens: int | None = None  # ttl_steps x tokens_per_step
    ttl_best_loss: float | None = None  # the lowest validation loss read (a point: of any run)
    ttl_compile_s: float | None = None  # first steps' excess over the median step (a point: mean)
    ttl_eval_s: float | None = None  # evaluation time, not timed as training (a point: mean)
    ttl_eval_every: int | None = None  # bench.eval_every
    ttl_s_per_run: list | None = None  # time_to_loss_s of each run (null: not reached)
    ttl_steps_per_run: list | None = None
    ttl_best_loss_per_run: list | None = None
    # Every evaluation: {step, train_s, val_loss}, the first at step 0 (before any step), a list
    # per run in a pooled record
    ttl_evals: list | None = json_only()
    # Each run's wall-clock span, [start, end] in epoch s (its step-0 evaluation to its last),
    # a pair per run: the table reads from them whether compared points' runs alternated
    ttl_run_times: list | None = json_only()
