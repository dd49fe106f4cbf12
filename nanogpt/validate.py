"""Cross-field checks on a RunSpec, run before any model is built.

Types and unknown keys are Hydra's job (structured configs); these are the checks a type cannot
express. Each failure raises ConfigError: one sentence naming the key and the fix.

The sweep's own process runs them for every point before it measures any. A point on the CPU
is checked without importing torch (device_support.py, optim_rules.py): that process starts
seconds sooner. A CUDA, MPS or `auto` device is asked through torch, imported then, and so is
an optimizer.build class (imported to see that it is there).
"""

from __future__ import annotations

import os

from nanogpt.data import check_data
from nanogpt.device_support import Place, attention_unavailable, parse_device, precision_unavailable
from nanogpt.errors import ConfigError
from nanogpt.faults import Fault
from nanogpt.lr_schedule import check_schedule
from nanogpt.optim_rules import check_optimizer
from nanogpt.protocol import CUDA_GRAPH_MODES, CUDA_GRAPH_WARMUP
from nanogpt.spec import COMPILE_MODES, Dtype, Fp8, RunSpec, Strategy
from nanogpt.target_rules import check_target
from nanogpt.targets import check_node


def check(spec: RunSpec, here: bool = True) -> None:
    """Every check; with here=False (the point will run on another machine, e.g. a SLURM
    node) none of those that ask this machine's devices."""
    check_sizes(spec)
    check_optimizer(spec)
    check_model(spec)
    check_choices(spec)
    check_strategy(spec)
    check_fp8(spec, None)
    if here:
        device = check_device(spec.bench.device)
        check_precision(spec, device)
        check_fp8(spec, device)
        check_cuda_graph_warmup(spec, device)
        check_gpus_per_point(spec.dist.nproc, device)
    Fault.parse(spec.bench.inject_fault)
    check_target(spec)
    check_schedule(spec)
    m, val = spec.model, spec.bench.target_loss is not None  # a target reads held-out tokens
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
    }.items():
        _at_least(key, value, 1)
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
    code runs only where points are measured: nanogpt/targets.py)."""
    build, code_dir = spec.model.build, spec.model.code_dir
    if not build:
        return
    target = build.get("_target_")
    if not target or not isinstance(target, str):
        raise ConfigError(
            "model.build._target_", "is not set", "name a class or factory, e.g. mymod.GPT"
        )
    check_node(build, "model.build", code_dir)


def check_choices(spec: RunSpec) -> None:
    if spec.perf.compile_mode not in COMPILE_MODES:
        raise ConfigError(
            "perf.compile_mode",
            f"'{spec.perf.compile_mode}' is not a torch.compile mode",
            f"use one of {', '.join(COMPILE_MODES)}",
        )
    if spec.optimizer.name not in ("adamw", "sgd", "muon", "from_model"):
        raise ConfigError(
            "optimizer.name",
            f"'{spec.optimizer.name}' is unknown",
            "use optimizer=adamw, sgd, muon or from_model, or optimizer.build._target_=CLASS",
        )
    if spec.logger.backend not in ("wandb", "none"):
        raise ConfigError(
            "logger.backend", f"'{spec.logger.backend}' is unknown", "use logger=wandb or none"
        )


def check_device(name: str) -> Place:
    """The device a run will use (a bare `cuda` is cuda:0, as the run resolves it); fails when
    it is not there."""
    if name == "auto":
        from nanogpt.devices import resolve_device  # the run's own choice: cuda, mps, then cpu

        device = resolve_device(name)
        return Place(device.type, device.index)
    place = parse_device(name)
    if place is None:
        import torch

        try:
            torch.device(name)
        except RuntimeError:
            raise ConfigError(
                "bench.device", f"'{name}' is not a device", "use auto, cpu, cuda, cuda:N or mps"
            ) from None
        raise ConfigError("bench.device", f"'{name}' is not supported", "use cpu, cuda or mps")
    if place.type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "bench.device",
                "cuda was asked for but CUDA is not available",
                "use bench.device=cpu",
            )
        if place.index is not None and place.index >= torch.cuda.device_count():
            raise ConfigError(
                "bench.device",
                f"{name} does not exist ({torch.cuda.device_count()} CUDA devices)",
                "pick an index below the device count",
            )
        return Place("cuda", place.index or 0)
    if place.type == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError("bench.device", "mps is not available here", "use bench.device=cpu")
    return place


def check_gpus_per_point(nproc: int, device: Place) -> None:
    """One GPU per rank: more ranks than GPUs would share devices and skew every figure."""
    if device.type != "cuda":
        return
    import torch

    if nproc > torch.cuda.device_count():
        raise ConfigError(
            "dist.nproc",
            f"{nproc} ranks but only {torch.cuda.device_count()} CUDA devices are visible",
            "use at most one rank per GPU",
        )


def check_precision(spec: RunSpec, device: Place) -> None:
    dtype, attention = spec.perf.dtype, spec.perf.attention
    reason = precision_unavailable(device, dtype)
    if reason:
        fix = "use perf.dtype=fp32" if dtype is Dtype.tf32 else "use perf.dtype=fp16 or fp32"
        raise ConfigError("perf.dtype", reason, fix)
    reason = attention_unavailable(device, attention, dtype)
    if reason and device.type != "cuda":
        fix = f"use perf.attention=auto, flash, math or manual on {device.type}"
        raise ConfigError("perf.attention", reason, fix)
    if reason:
        fix = "use perf.dtype=bf16 or fp16 with it, or perf.attention=auto, efficient or math"
        raise ConfigError("perf.attention", reason, fix)


def check_cuda_graph_warmup(spec: RunSpec, device: Place) -> None:
    """reduce-overhead and max-autotune capture CUDA graphs: the first calls of each compiled
    graph run eagerly, the next records the graph, and only later calls replay it. With fewer
    warmup steps the recording would fall into the measured steps."""
    perf, warmup = spec.perf, spec.bench.warmup_steps
    graphs = perf.compile and perf.compile_mode in CUDA_GRAPH_MODES
    if warmup is None:  # auto: the protocol gives the mode what it needs
        return
    if graphs and device.type == "cuda" and warmup < CUDA_GRAPH_WARMUP:
        raise ConfigError(
            "bench.warmup_steps",
            f"is {warmup}, but perf.compile_mode={perf.compile_mode} records CUDA graphs in the "
            f"first {CUDA_GRAPH_WARMUP} steps",
            f"set bench.warmup_steps={CUDA_GRAPH_WARMUP} or more",
        )


# torchao's float8 matmuls (torch._scaled_mm) need float8 tensor cores: Ada and Hopper, 8.9+.
FP8_CAPABILITY = (8, 9)


def check_fp8(spec: RunSpec, device: Place | None) -> None:
    """perf.fp8 runs under bf16 autocast on a CUDA GPU of compute capability 8.9 or more, with
    torchao installed. device None: the checks that need no device (any machine)."""
    fp8 = spec.perf.fp8
    if fp8 is Fp8.none:
        return
    if device is None:
        if spec.perf.dtype is not Dtype.bf16:
            raise ConfigError(
                "perf.fp8",
                f"{fp8.value} runs the other ops under bf16 autocast, not {spec.perf.dtype.value}",
                "set perf.dtype=bf16 with it",
            )
        if not spec.perf.compile:
            # Eager float8 casts and takes amaxes around every matmul unfused: it would compare
            # that overhead with eager bf16, not float8 training (torchtitan: compile required).
            raise ConfigError(
                "perf.fp8",
                f"{fp8.value} without torch.compile runs unfused casts around every matmul",
                "set perf.compile=true with it",
            )
        return
    if device.type != "cuda":
        raise ConfigError(
            "perf.fp8", f"float8 matmuls need a CUDA GPU, not {device.type}", "use perf.fp8=none"
        )
    import torch

    from nanogpt.float8 import torchao_missing

    capability = torch.cuda.get_device_capability(device.index)
    if capability < FP8_CAPABILITY:
        raise ConfigError(
            "perf.fp8",
            f"{torch.cuda.get_device_name(device.index)} (compute capability "
            f"{capability[0]}.{capability[1]}) has no float8 tensor cores: it needs 8.9 or newer",
            "use perf.fp8=none",
        )
    missing = torchao_missing()
    if missing:
        raise ConfigError("perf.fp8", missing, "pip install -e '.[fp8]'")


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
