"""What a time-to-loss run needs (bench.target_loss, docs/time_to_loss.md), checked without
torch before any point runs: one ConfigError line naming the key and the fix."""

from __future__ import annotations

import dataclasses

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import DataKind, RunSpec

# bench.repeats' default follows the target: 5 runs with one, 1 without (conf/bench/default.yaml,
# frontend/compose.py's target_repeats resolver)
RUN_KEYS = ("bench.target_loss",)


def check(spec: RunSpec) -> None:
    bench = spec.bench
    if bench.target_loss is None:
        return
    if spec.data.kind is DataKind.synthetic:
        raise ConfigError(
            "bench.target_loss",
            "is set but data=synthetic has no held-out text: its loss means nothing",
            "use data=text data.path=input.txt (or data=tokens), or unset bench.target_loss",
        )
    if not bench.target_loss > 0:  # NaN too
        raise ConfigError("bench.target_loss", f"is {bench.target_loss}", "use a loss above 0")
    if bench.repeats < 2:
        raise ConfigError(
            "bench.repeats",
            f"is {bench.repeats}, but a time to loss needs runs to compare (a p-value of one "
            "run means nothing)",
            "set bench.repeats=5 (the default with a target) or at least 2",
        )
    for key in ("eval_every", "eval_batches", "max_steps"):
        if getattr(bench, key) < 1:
            raise ConfigError(f"bench.{key}", f"is {getattr(bench, key)}", "use 1 or more")
    if not bench.max_s > 0:
        raise ConfigError("bench.max_s", f"is {bench.max_s}", "use seconds, e.g. 600")
    if spec.dist.nproc > 1:
        raise ConfigError(
            "dist.nproc",
            f"is {spec.dist.nproc}, but a time-to-loss run trains on one device here",
            "set dist.nproc=1 with bench.target_loss",
        )


def target_of(bench) -> float | None:
    """bench.target_loss of a RunSpec's bench (or a composed config's): None without one."""
    return bench.target_loss


def asked(spec: RunSpec) -> bool:
    """Whether a run is this scenario's: bench.target_loss is set (docs/time_to_loss.md)."""
    return target_of(spec.bench) is not None


def reads_held_out(spec: RunSpec) -> bool:
    """A target is a validation loss: its runs read the held-out split."""
    return asked(spec)


def run_spec(spec: RunSpec, number: int) -> RunSpec:
    """Run `number`'s spec: its own seed (bench.seed + number - 1: the model's init and the
    batches' draw), as a run of a distribution over seeds."""
    if number == 1:
        return spec
    bench = dataclasses.replace(spec.bench, seed=spec.bench.seed + number - 1)
    return dataclasses.replace(spec, bench=bench)
