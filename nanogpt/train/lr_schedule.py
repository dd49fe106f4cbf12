"""The learning-rate schedule (optimizer.schedule), without torch: the factor each step's rate
is multiplied by, and the keys checked before any point runs.

The trainer (train/trainer.py) multiplies every param group's own base rate by one factor
before each optimizer step, so the roles keep their ratios (Muon's matrices and its AdamW part's
embeddings decay together). The horizon is bench.max_steps, in a target run (its step budget)
and in a throughput point alike; a throughput point steps past it only if its protocol runs
longer, and then trains at the schedule's last rate (0 for cosine and wsd), which a step's time
does not feel. With `t` the optimizer steps already taken (0 before the first), `w` the warmup
steps and `H` the horizon:

  warmup     (t + 1) / w while t < w: the w-th step is the first at the full rate
  constant   1
  cosine     0.5 (1 + cos(pi (t - w) / (H - w))): 1 after warmup, nearly 0 at the last step
             (nanoGPT's, down to 0 rather than lr / 10)
  wsd        1, then (H - t) / D over the last D = round(decay_frac H) steps (nanochat's
             warmdown, modded-nanogpt's cooldown: a linear decay to 0; decay_frac 0.2 is theirs)

With warmup and a decay that overlap, the lower factor wins.
"""

from __future__ import annotations

import math

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import RunSpec, Schedule


def lr_factor(schedule: Schedule, t: int, warmup: int, horizon: int, decay_frac: float) -> float:
    """The factor of step t + 1's rate (t steps already taken)."""
    warm = (t + 1) / warmup if t < warmup else 1.0
    if schedule is Schedule.constant:
        return warm
    if t >= horizon:  # past the horizon: the schedule's end
        return 0.0
    if schedule is Schedule.cosine:
        progress = max(0, t - warmup) / max(1, horizon - warmup)
        return min(warm, 0.5 * (1.0 + math.cos(math.pi * progress)))
    decay = max(1, round(decay_frac * horizon))
    return min(warm, 1.0, (horizon - t) / decay)


def is_flat(spec: RunSpec) -> bool:
    """No schedule at all: the rate never changes (the trainer leaves the groups alone)."""
    opt = spec.optimizer
    return Schedule(opt.schedule) is Schedule.constant and opt.warmup_steps == 0


def check_schedule(spec: RunSpec) -> None:
    opt, horizon = spec.optimizer, spec.bench.max_steps
    if opt.warmup_steps < 0:
        raise ConfigError("optimizer.warmup_steps", f"is {opt.warmup_steps}", "use 0 or more")
    if not 0 < opt.decay_frac <= 1:
        raise ConfigError(
            "optimizer.decay_frac", f"is {opt.decay_frac}", "use a share in (0, 1], e.g. 0.2"
        )
    if is_flat(spec):
        return
    if horizon < 1:
        raise ConfigError(
            "bench.max_steps",
            f"is {horizon}, but optimizer.schedule={Schedule(opt.schedule).value} "
            f"(warmup {opt.warmup_steps}) needs a horizon in steps",
            "set bench.max_steps to the steps the schedule spans, or optimizer.schedule=constant",
        )
    if opt.warmup_steps >= horizon and Schedule(opt.schedule) is not Schedule.constant:
        raise ConfigError(
            "optimizer.warmup_steps",
            f"is {opt.warmup_steps}, not below the horizon bench.max_steps={horizon}",
            "use fewer warmup steps or a longer bench.max_steps",
        )
