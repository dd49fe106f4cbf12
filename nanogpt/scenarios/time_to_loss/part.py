"""The record's time_to_loss part: how long a run took to reach bench.target_loss on held-out
data, and what it cost to find out (run.py fills one run's; pool.py pools a point's runs). Every
name carries `ttl_` (or is `time_to_loss_s`), so the group stays together in the flat record.
docs/time_to_loss.md says what is timed.

Also what the rest of the package asks of the scenario about a record (`measured`, the columns
its comparison adds to the table, the console line), so that no module outside scenarios/ reads
a field of it. Import it through nanogpt.record, which imports it first (this module reads
record.fields, whose package imports this part for its Record)."""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.record.fields import json_only, marked


@dataclass
class TimeToLoss:
    ttl_target_loss: float | None = None  # bench.target_loss; null: no target, no figures here
    # Training steps' wall time to the evaluation that first read loss <= target, less
    # ttl_compile_s; evaluations excluded. A point: the olympic mean of its runs, when all reached
    time_to_loss_s: float | None = marked(headline=60, shown=(90, "to_target_s", "number"))
    # 95 % interval of the runs' mean time (ttl_ci_method)
    ttl_ci_low: float | None = marked(headline=61)
    ttl_ci_high: float | None = marked(headline=62)
    ttl_ci_method: str | None = json_only()
    ttl_reached: bool | None = None  # every run reached the target
    ttl_runs: int | None = None  # runs (bench.repeats), each a fresh process with its own seed
    ttl_reached_runs: int | None = None  # how many of them reached it
    # e.g. "3 of 5 reached", or why a run did not, with its best loss
    ttl_note: str | None = marked(headline=63, shown=(91, "runs", "text"))
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


def measured(record) -> bool:
    """Whether a run's (or a point's) record is this scenario's: its part holds a target."""
    return record.time_to_loss.ttl_target_loss is not None


# The table's columns this scenario's comparison adds (pool.add_comparison: a point against the
# baseline, no field of its part), each at its place after its part's own (marked on its fields
# above): summary.csv's headline place (analysis/tidy.py), and the console's table (place,
# header, format: analysis/display.py), shown when a point has a target.
COMPARED = {"ttl_ratio": 64, "ttl_p_value": 65, "ttl_verdict": 66}
COMPARED_SHOWN = {"ttl_p_value": (92, "p", "number"), "ttl_verdict": (93, "to_target", "text")}


def console_line(result: dict, fmt) -> str:
    """A run's console line after its status and name (runner/job.py): no step window, the
    time to loss instead; `fmt(key, spec)` formats a field of `result` ("-" when null)."""
    return (
        f"time to loss {result['ttl_target_loss']:g} {fmt('time_to_loss_s', '.2f')} s "
        f"({result.get('ttl_note') or '-'})"
    )
