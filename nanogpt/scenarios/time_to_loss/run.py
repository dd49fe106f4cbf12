"""A time-to-loss run: train from the first step until the validation loss reaches a target.

Called by the measured loop (scenarios/loop.py) instead of the throughput window when
bench.target_loss is set (docs/time_to_loss.md). What is timed, and what is not:

- the untrained model is evaluated first (step 0, outside the clock): a target it already reads
  fails the point in one line (check_first_loss), and the curve starts from it;
- every training step counts as progress: no warmup is set aside, the first step trains too;
- the training steps' wall time is read at evaluations (a device sync there: the loss has to be
  read anyway) and at each of the first FIRST_STEPS steps, which are timed alone;
- evaluations are not training: the clock stops before one and starts after it, so a slow
  evaluation changes no time to target. An evaluation runs the uncompiled module (the trainer's
  raw_model) under no_grad, in eval mode, on the same `bench.eval_batches` held-out batches every
  time (drawn with a fixed seed, EVAL_SEED, so every run and every point reads the same ones);
  its compiles are never the point's recompiles;
- compilation is not training either: `ttl_compile_s` is the first steps' excess over the median
  step (the median of the later stretches' mean step), and time_to_loss_s is the training time
  to the first evaluation that read loss <= target, less it (MLPerf likewise leaves
  initialisation out of its clock).

A run that ends its budget (bench.max_steps, or bench.max_s of wall time, evaluations included)
first is "not reached", with its best loss: a figure, never a failed point.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import RunSpec
from nanogpt.hardware.devices import synchronize
from nanogpt.probes.compile_health import CompileProbe
from nanogpt.probes.setup import describe_optimizer, describe_setup
from nanogpt.record import Record, TimeToLoss
from nanogpt.scenarios.base import Measuring
from nanogpt.train.data import open_source
from nanogpt.train.trainer import Trainer

EVAL_SEED = 20260101  # the held-out batches' draw: one fixed set for every run of every point
FIRST_STEPS = 3  # timed alone, synced: compilation (and a recompile on step 2) lands here


def held_out_batches(spec: RunSpec, device: torch.device) -> list:
    """bench.eval_batches batches of the validation split, drawn once."""
    source = open_source(
        spec.data,
        vocab_size=spec.model.vocab_size,
        block_size=spec.model.block_size,
        batch_size=spec.perf.batch_size,
        device=device,
        seed=EVAL_SEED,
        split="val",
    )
    return [source.next_batch() for _ in range(spec.bench.eval_batches)]


def validation_loss(trainer: Trainer, batches: list) -> float:
    """The mean loss over the held-out batches: the uncompiled module, no_grad, eval mode, in
    the training's precision (autocast) and attention kernel."""
    model = trainer.raw_model
    model.eval()
    try:
        with torch.no_grad(), trainer.forward_context():
            losses = [model(x, y)[1].float() for x, y in batches]
        return torch.stack(losses).mean().item()
    finally:
        model.train()


def measure(spec: RunSpec, trainer: Trainer, record: Record, *, context: Measuring) -> None:
    """The parts a time-to-loss run measures (the measured loop calls it instead of the
    throughput window): the setup and the optimizer as before any run, compile health over the
    whole run (no measured window: recompiles_in_window null), and the time_to_loss part."""
    record.setup = describe_setup(spec, trainer)
    record.optimizer = describe_optimizer(spec, trainer, record.setup.mem_estimate)
    compiles = CompileProbe(spec.perf.compile)
    compiles.start()
    train_to_target(spec, trainer, record, sinks=context.sinks)
    record.compile = compiles.result()
    record.compile.compiled_blocks = trainer.compiled_blocks


def train_to_target(
    spec: RunSpec,
    trainer: Trainer,
    record: Record,
    evaluate: Callable[[], float] | None = None,
    sinks: list = (),
) -> None:
    """Train until an evaluation reads loss <= bench.target_loss or the budget ends; fill
    record.time_to_loss (and the first and last training losses; the evaluations are
    ttl_evals, not steps.csv rows: a target run times no single step), each evaluation also
    to the sinks (W&B: a window of phase "eval", outside the training clock). `evaluate`
    (default: the held-out loss) is a parameter so a test can make it slow."""
    bench, device = spec.bench, trainer.device
    if evaluate is None:
        batches = held_out_batches(spec, device)
        evaluate = lambda: validation_loss(trainer, batches)  # noqa: E731
    part = record.time_to_loss = TimeToLoss(
        ttl_target_loss=bench.target_loss, ttl_eval_every=bench.eval_every, ttl_runs=1
    )
    first, stretches = [], []  # first steps' s; (steps, s) between evaluations
    reached_at = None
    synchronize(device)
    started_at = time.time()  # the run's wall-clock span: did compared points' runs alternate?
    clock = time.perf_counter()
    evals = [{"step": 0, "train_s": 0.0, "val_loss": evaluate()}]  # before any step, untimed
    check_first_loss(bench.target_loss, evals[0]["val_loss"])
    _emit(sinks, evals[-1])
    train_s, eval_s = 0.0, time.perf_counter() - clock
    wall0 = clock = time.perf_counter()
    timed_to = 0  # the last step whose time is counted
    for step in range(1, bench.max_steps + 1):
        loss = trainer.step()
        if step <= FIRST_STEPS:
            synchronize(device)
            now = time.perf_counter()
            first.append(now - clock)
            train_s, clock, timed_to = train_s + now - clock, now, step
            if step == 1:
                record.timing.loss_first = loss.item()
        over = time.perf_counter() - wall0 >= bench.max_s
        if not (step % bench.eval_every == 0 or step == bench.max_steps or over):
            continue
        synchronize(device)  # the training clock stops here ...
        now = time.perf_counter()
        if step > timed_to:
            stretches.append((step - timed_to, now - clock))
            train_s, timed_to = train_s + now - clock, step
        record.timing.loss_last = loss.item()
        val = evaluate()  # ... and is not running while the model is evaluated (or logged)
        evals.append({"step": step, "train_s": train_s, "val_loss": val})
        _emit(sinks, evals[-1])
        clock = time.perf_counter()
        eval_s += clock - now
        if val <= bench.target_loss:
            reached_at = evals[-1]
            break
        if over:
            break
    part.ttl_run_times = [[started_at, time.time()]]
    _fill(part, record, first, stretches, evals, reached_at, eval_s, spec)


def _emit(sinks, evaluation: dict) -> None:
    """An evaluation to the sinks, as a window of phase "eval" (W&B: val/loss, val/train_s)."""
    for sink in sinks:
        sink.window(
            {
                "phase": "eval",
                "step": evaluation["step"],
                "loss": evaluation["val_loss"],
                "train_s": evaluation["train_s"],
            }
        )


def check_first_loss(target: float, loss: float) -> None:
    """A target the untrained model already reads times nothing: the point fails (status
    error) with one line, before its clock starts."""
    if loss <= target:
        raise ConfigError(
            "bench.target_loss",
            f"is {target:g}, but the first evaluation, before any step, already reads "
            f"{loss:.4f}: there is no time to loss to measure",
            f"set a target below {loss:.4f}",
        )


def compile_seconds(first: list[float], stretches: list[tuple[int, float]]) -> float:
    """The first steps' excess over the median step: the median of the later stretches' mean
    step (or of the first steps themselves when the run ended within them)."""
    means = [s / n for n, s in stretches] or first
    median = statistics.median(means)
    return sum(max(0.0, s - median) for s in first)


def _fill(part, record, first, stretches, evals, reached_at, eval_s, spec) -> None:
    part.ttl_compile_s = compile_seconds(first, stretches)
    part.ttl_eval_s = eval_s
    part.ttl_evals = evals
    best = min(e["val_loss"] for e in evals)
    part.ttl_best_loss = best
    part.ttl_best_loss_per_run = [best]
    part.ttl_reached = reached_at is not None
    part.ttl_reached_runs = int(part.ttl_reached)
    if reached_at is None:
        last = evals[-1]
        budget = (
            f"{spec.bench.max_steps} steps"
            if last["step"] == spec.bench.max_steps
            else f"bench.max_s={spec.bench.max_s:g} s"
        )
        part.ttl_note = (
            f"not reached: loss {spec.bench.target_loss:g} not read in {budget} "
            f"({last['step']} steps); best {best:.4f}"
        )
        part.ttl_s_per_run, part.ttl_steps_per_run = [None], [None]
        return
    part.time_to_loss_s = max(0.0, reached_at["train_s"] - part.ttl_compile_s)
    part.ttl_steps = reached_at["step"]
    part.ttl_tokens = reached_at["step"] * record.setup.tokens_per_step
    part.ttl_note = f"reached at step {reached_at['step']}"
    part.ttl_s_per_run, part.ttl_steps_per_run = [part.time_to_loss_s], [part.ttl_steps]
