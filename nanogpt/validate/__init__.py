"""Cross-field checks on a RunSpec, run before any model is built.

Types and unknown keys are Hydra's job (structured configs); these are the checks a type cannot
express. Each failure raises ConfigError: one sentence naming the key and the fix.

The sweep's own process runs them for every point before it measures any. A point on the CPU
is checked without importing torch (hardware/device_support.py, train/optim_rules.py): that process
starts seconds sooner; a model.build or optimizer.build target is found from its source, never
imported (config/target_nodes.py). The package: here the checks of the keys themselves (sizes,
choices, the model, the strategy) and `check`, which runs them all; device.py the checks that ask
this machine's devices (a CUDA, MPS or `auto` device is asked through torch, imported then).
"""

from __future__ import annotations

import os

from nanogpt import optimizers
from nanogpt.config.errors import ConfigError
from nanogpt.config.protocol import CUDA_GRAPH_MODES
from nanogpt.config.spec import COMPILE_MODES, Dtype, RunSpec, Strategy
from nanogpt.config.target_nodes import check_node, require_target
from nanogpt.record.faults import Fault
from nanogpt.scenarios import base as scenarios
from nanogpt.train.checkpoint_rules import check as check_ac
from nanogpt.train.checkpoint_rules import check_offload
from nanogpt.train.data import check_data
from nanogpt.train.lr_schedule import check_schedule
from nanogpt.train.optim_rules import check_optimizer
from nanogpt.validate.device import (
    check_cuda_graph_warmup,
    check_device,
    check_fp8,
    check_gpus_per_point,
    check_precision,
)


def check(spec: RunSpec, here: bool = True) -> None:
    """Every check; with here=False (the point will run on another machine, e.g. a SLURM
    node) none of those that ask this machine's devices."""
    check_sizes(spec)
    check_optimizer(spec)
    check_model(spec)
    check_choices(spec)
    check_strategy(spec)
    check_fp8(spec, None)
    check_ac(spec.perf)
    if here:
        device = check_device(spec.bench.device)
        check_offload(spec.perf, device.type)
        check_precision(spec, device)
        check_fp8(spec, device)
        check_cuda_graph_warmup(spec, device)
        check_gpus_per_point(spec.dist.nproc, device)
    Fault.parse(spec.bench.inject_fault)
    for scenario in scenarios.ALL:  # each scenario's own keys (time to loss's target)
        scenario.checks.check(spec)
    check_schedule(spec)
    m, val = spec.model, scenarios.of_spec(spec).checks.reads_held_out(spec)
    check_data(spec.data, vocab_size=m.vocab_size, block_size=m.block_size, val=val)


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(key, f"is {value} but must be at least {low}", f"set {key}={low} or more")


def check_sizes(spec: RunSpec) -> None:
    m, p, b = spec.model, spec.perf, spec.bench
    for key, value in {
        "model.n_layer": m.n_layer,
        "model.n_head": m.n_head,
        "model.n_embd": m.n_embd,
        "model.block_size": m.block_size,
        "model.vocab_size": m.vocab_size,
        "perf.batch_size": p.batch_size,
        "perf.grad_accum": p.grad_accum,
        "perf.loss_chunk": p.loss_chunk,
        "bench.warmup_steps": 1 if b.warmup_steps is None else b.warmup_steps,  # None: auto
        "bench.measure_steps": b.measure_steps,
        "bench.min_measure_steps": b.min_measure_steps,
        "bench.repeats": b.repeats,
        "bench.profile_steps": b.profile_steps,
        "bench.diagnose_steps": b.diagnose_steps,
        "logger.log_interval": spec.logger.log_interval,
        "dist.nproc": spec.dist.nproc,
        "dist.nodes": spec.dist.nodes,
    }.items():
        _at_least(key, value, 1)
    check_nodes(spec.dist.nproc, spec.dist.nodes)
    if b.min_measure_steps > b.measure_steps:
        raise ConfigError(
            "bench.min_measure_steps",
            f"is {b.min_measure_steps}, more than bench.measure_steps={b.measure_steps}",
            f"set it to at most {b.measure_steps}",
        )
    if not b.time_budget_s > 0:
        raise ConfigError("bench.time_budget_s", "must be positive", "set it to seconds, e.g. 20")
    for key, value in {"bench.warmup_s": b.warmup_s, "bench.measure_s": b.measure_s}.items():
        if not value >= 0:
            raise ConfigError(key, f"is {value} but must be 0 or more", f"set {key}=0 for none")
    if b.warmup_s + b.measure_s > b.time_budget_s:  # the budget is the point's, warmup's too
        floors = b.warmup_s + b.measure_s
        raise ConfigError(
            "bench.time_budget_s",
            f"is {b.time_budget_s} s, less than bench.warmup_s + bench.measure_s = {floors} s",
            f"raise bench.time_budget_s to at least {floors}",
        )
    if not spec.logger.init_timeout_s > 0:
        raise ConfigError("logger.init_timeout_s", "must be positive", "set it to seconds, e.g. 30")
    if b.max_batch_memory_gib is not None and b.max_batch_memory_gib <= 0:
        raise ConfigError(
            "bench.max_batch_memory_gib",
            "must be positive",
            "give GiB, or null for all the memory that is free",
        )
    for key, value in {
        "report.memory_budget_gib": spec.report.memory_budget_gib,
        "cost.usd_per_hour": spec.cost.usd_per_hour,
        "cost.usd_per_kwh": spec.cost.usd_per_kwh,
    }.items():
        if value is not None and not value > 0:
            raise ConfigError(key, f"is {value} but must be positive", "give a number, or null")
    if spec.hardware.peak_tflops is not None and spec.hardware.peak_tflops <= 0:
        raise ConfigError(
            "hardware.peak_tflops", "must be positive", "give TFLOP/s or null for the datasheet"
        )


def check_nodes(nproc: int, nodes: int) -> None:
    """dist.nproc is the point's ranks on all its nodes: as many on each."""
    if nproc % nodes:
        raise ConfigError(
            "dist.nproc",
            f"is {nproc}, which dist.nodes={nodes} does not divide (the same ranks on each node)",
            f"set dist.nproc to a multiple of {nodes}, e.g. {nodes * max(1, nproc // nodes)}",
        )


def check_model(spec: RunSpec) -> None:
    m = spec.model
    if m.n_embd % m.n_head:
        raise ConfigError(
            "model.n_embd",
            f"{m.n_embd} is not divisible by model.n_head={m.n_head}",
            "choose n_embd as a multiple of n_head",
        )
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError("model.dropout", f"{m.dropout} is outside [0, 1)", "use e.g. 0.0")
    check_model_build(spec)


def check_model_build(spec: RunSpec) -> None:
    """model.build: a target whose module is there, found without importing it (the user's
    code runs only where points are measured: nanogpt/config/target_nodes.py)."""
    build, code_dir = spec.model.build, spec.model.code_dir
    if not build:
        return
    require_target(build, "model.build", "mymod.GPT (or a factory)")
    check_node(build, "model.build", code_dir)


def check_choices(spec: RunSpec) -> None:
    if spec.perf.compile_mode not in COMPILE_MODES:
        raise ConfigError(
            "perf.compile_mode",
            f"'{spec.perf.compile_mode}' is not a torch.compile mode",
            f"use one of {', '.join(COMPILE_MODES)}",
        )
    if spec.optimizer.name not in optimizers.names():  # a module of nanogpt/optimizers/ each
        raise ConfigError(
            "optimizer.name",
            f"'{spec.optimizer.name}' is unknown",
            f"use optimizer={', '.join(optimizers.names())}, or optimizer.build._target_=CLASS",
        )
    if spec.logger.backend not in ("wandb", "none"):
        raise ConfigError(
            "logger.backend", f"'{spec.logger.backend}' is unknown", "use logger=wandb or none"
        )


def check_strategy(spec: RunSpec) -> None:
    """fsdp2 shards over ranks (more than one), in bf16 or fp32: fp16's GradScaler would need
    FSDP's sharded scaler, which this runner does not use."""
    if spec.dist.strategy is not Strategy.fsdp2:
        return
    under_torchrun = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if spec.dist.nproc < 2 and not under_torchrun:
        raise ConfigError(
            "dist.strategy",
            "fsdp2 shards over ranks, and this point has one",
            "set dist.nproc=2 or more (or launch under torchrun)",
        )
    if spec.perf.dtype is Dtype.fp16:
        raise ConfigError(
            "dist.strategy",
            "fsdp2 here has no sharded gradient scaler for fp16",
            "use perf.dtype=bf16 (or fp32) with fsdp2",
        )
    if spec.perf.compile and spec.perf.compile_mode in CUDA_GRAPH_MODES:
        # A CUDA graph replays fixed addresses, while FSDP2 all-gathers into fresh buffers and
        # runs collectives from hooks between graphs: torchtitan compiles FSDP2 blocks without.
        raise ConfigError(
            "perf.compile_mode",
            f"{spec.perf.compile_mode} captures CUDA graphs, which FSDP2's all-gathers break",
            "use perf.compile_mode=default with fsdp2",
        )
