"""The spec's config groups: a plain dataclass each (model, optimizer, perf, data, bench, ...).

Hydra registers them as structured-config schemas (nanogpt/frontend/compose.py), so a wrong type or
an unknown key fails at composition; conf/<group>/*.yaml give them values. RunSpec (the package's
__init__) holds one of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nanogpt.config.choices import (
    Ac,
    AcPolicy,
    Attention,
    DataKind,
    Dtype,
    Exclusive,
    Fp8,
    LoggerMode,
    Loss,
    Objective,
    Offload,
    OptimizerImpl,
    Schedule,
    Strategy,
    Tokenizer,
)

# Whether a key makes a point another one is said on its field (record/identity.py reads it).
# A key is in the point unless its field says otherwise: NOT_A_POINT, it never changes a figure
# (where a file goes, whether to measure again, how many runs, an explanation); LATER, it was
# added after sweeps were recorded, so it is in the point only when set off its default (a point
# measured before it keeps its point_id, and a resume finds it).
POINT = "point"
NOT_A_POINT, LATER = "not a point", "later"


def key(default: Any = None, *, point: str, factory: Any = None) -> Any:
    """A field with what it does to a point (its default, or a factory for one)."""
    if factory is not None:
        return field(default_factory=factory, metadata={POINT: point})
    return field(default=default, metadata={POINT: point})


@dataclass
class ModelConfig:
    name: str = "nano"
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    dropout: float = 0.0
    bias: bool = False
    chosen_by: str | None = key(
        None, point=NOT_A_POINT
    )  # model=auto: which model the device got, and why
    # The user's own model, built Hydra's way in the measuring child
    # (nanogpt/config/target_nodes.py,
    # docs/models.md): {_target_: mymod.GPT, its arguments, nested _target_ allowed}. Empty:
    # the built-in GPT of the keys above. block_size and vocab_size still shape the batches.
    build: dict[str, Any] = key(factory=dict, point=LATER)
    # where model.build and optimizer.build are found (default: cwd)
    code_dir: str | None = key(None, point=NOT_A_POINT)


@dataclass
class RoleConfig:
    """A role's learning rate and weight decay; None: the optimizer's default for the role
    (nanogpt/train/optim_rules.py)."""

    lr: float | None = None
    weight_decay: float | None = None


@dataclass
class RolesConfig:
    """optimizer.roles.<role>: the parameters outside the block matrices, whose own learning
    rate and weight decay are optimizer.lr and optimizer.weight_decay."""

    embeddings: RoleConfig = field(default_factory=RoleConfig)
    head: RoleConfig = field(default_factory=RoleConfig)  # an untied head only
    scalars: RoleConfig = field(default_factory=RoleConfig)  # norms, biases, gains
    # 2-D tensors outside the blocks that are no head (gates, projections), 3-D and more anywhere
    other: RoleConfig = field(default_factory=RoleConfig)


@dataclass
class OptimizerConfig:
    name: str = "adamw"  # adamw | sgd | muon | from_model
    lr: float = 6e-4  # the block matrices' (and, for adamw and sgd, every role's by default)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's (muon: its AdamW)
    weight_decay: float = 0.1  # the block matrices' (adamw, sgd: every 2-D role's by default)
    momentum: float = 0.9  # sgd and muon
    grad_clip: float = 1.0  # 0 disables clipping
    impl: OptimizerImpl = OptimizerImpl.auto  # muon: its AdamW part (Muon steps a tensor a time)
    adjust_lr_fn: str = key(
        "original", point=LATER
    )  # muon: torch.optim.Muon's learning-rate adjustment
    roles: RolesConfig = key(factory=RolesConfig, point=LATER)
    # Any optimizer class, built Hydra's way: {_target_: torch.optim.Adagrad, _partial_: true,
    # its other arguments}, called with the parameter groups (nanogpt/train/optim.py). Empty: by
    # name.
    build: dict[str, Any] = key(factory=dict, point=LATER)
    # optimizer=from_model: the model's own factory, called as `model.<method>(**args)` (nanoGPT's
    # configure_optimizers, nanochat's setup_optimizer); `device_arg` names the argument the
    # runner fills with the point's device type ("cuda", "cpu"), empty for none. `args` are also
    # an optimizer class's own keyword arguments where its recipe takes them (adafactor's).
    method: str = key("", point=LATER)
    args: dict[str, Any] = key(factory=dict, point=LATER)
    device_arg: str = key("", point=LATER)
    # The learning rate's schedule, every param group scaled by one factor a step, its horizon
    # bench.max_steps (nanogpt/train/lr_schedule.py, docs/time_to_loss.md)
    schedule: Schedule = key(Schedule.constant, point=LATER)
    warmup_steps: int = key(
        0, point=LATER
    )  # linear warmup from 0 over this many steps (any schedule)
    decay_frac: float = key(0.2, point=LATER)  # wsd: the share of bench.max_steps decaying to 0


@dataclass
class PerfConfig:
    compile: bool = False
    compile_mode: str = "default"
    dtype: Dtype = Dtype.fp32
    attention: Attention = Attention.auto
    # Activation checkpointing as a policy (nanogpt/train/checkpoint_rules.py, docs/config.md)
    ac: Ac = key(Ac.none, point=LATER)
    ac_every: int = key(2, point=LATER)  # ac=every: every n-th block checkpointed
    ac_policy: AcPolicy = key(AcPolicy.matmuls, point=LATER)  # ac=selective: what a block keeps
    ac_budget: float = key(0.5, point=LATER)  # ac=budget: the share of activations kept (0-1)
    offload: Offload = key(Offload.none, point=LATER)  # cpu: kept tensors in pinned host memory
    # The old switch, still read: true is perf.ac=full (said once, in one line). After
    # composition it mirrors perf.ac=full, so a point keeps the point_id it had under it.
    activation_checkpointing: bool = False
    batch_size: int = 8  # micro-batch, sequences (conf/: 12 on CUDA, 8 elsewhere)
    grad_accum: int = 1  # micro-batches per optimizer step
    fp8: Fp8 = Fp8.none  # torchao float8 training (bf16 autocast, CUDA capability >= 8.9)
    loss: Loss = Loss.full
    loss_chunk: int = 2048  # tokens per chunk with loss=chunked


@dataclass
class DataConfig:
    kind: DataKind = DataKind.synthetic
    path: str | None = None
    cache_dir: str | None = key(None, point=NOT_A_POINT)  # where `text` keeps its tokenized .bin
    tokenizer: Tokenizer = key(Tokenizer.gpt2, point=LATER)  # text: gpt2 | char
    val_fraction: float = key(0.1, point=LATER)  # text: the last share of tokens held out


@dataclass
class BenchConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    seed: int = 1337
    # The protocol (nanogpt/config/protocol.py): warmup until warmup_steps *and* warmup_s are done
    # (and fp16's loss scale has settled); then measure until measure_steps *and* measure_s are
    # done, or time_budget_s is spent once min_measure_steps are in. conf/bench/default.yaml
    # sets the time floors by device: seconds on CUDA (clocks settle), none on CPU.
    warmup_steps: int | None = None  # None: what the compile mode needs (config/protocol.py)
    warmup_s: float = 0.0
    measure_steps: int = 20
    measure_s: float = 0.0
    time_budget_s: float = 20.0  # a point's steps (warmup, diagnosis too) stop after this long ...
    min_measure_steps: int = 5  # ... once this many steps are in
    repeats: int = key(
        1, point=NOT_A_POINT
    )  # measure the point this many times, each a fresh process
    isolate: bool = True  # measure in a fresh child process
    cold_compile_cache: bool = False  # give this point its own, empty Inductor cache
    profile: bool = False  # torch.profiler over profile_steps steps after the measured ones
    profile_steps: int = 3
    diagnose: bool = True  # after the measured steps: why the point is as fast as it is
    diagnose_steps: int = 2  # profiled steps of the diagnosis (after one unrecorded one)
    memory_snapshot: bool = False  # on CUDA OOM, save an allocator snapshot
    find_max_batch: bool = False  # grow then bisect perf.batch_size until OOM
    max_batch_memory_gib: float | None = None  # the search's memory budget (default: all free)
    rerun: bool = key(False, point=NOT_A_POINT)  # rerun points that already have an ok record
    inject_fault: str | None = None  # TESTING ONLY: oom@N | nan@N | raise@N | kill@N
    exclusive: Exclusive = key(
        Exclusive.warn, point=NOT_A_POINT
    )  # others on the device while measuring
    # Time to a target validation loss (scenarios/time_to_loss/, docs/time_to_loss.md): set, a run
    # trains from its first step until an evaluation reads loss <= target_loss, or its budget ends
    target_loss: float | None = key(None, point=LATER)
    eval_every: int = key(50, point=LATER)  # steps between evaluations of the validation loss
    eval_batches: int = key(
        8, point=LATER
    )  # held-out batches an evaluation reads (the same each time)
    max_steps: int = key(5000, point=LATER)  # a target run's step budget ...
    max_s: float = key(600.0, point=LATER)  # ... and its wall-time budget (training, evaluation)


@dataclass
class HardwareConfig:
    peak_tflops: float | None = None  # overrides the datasheet peak (TFLOP/s)
    calibrate: bool = False  # measure the achievable matmul peak if not cached
    recalibrate: bool = key(False, point=NOT_A_POINT)  # force a fresh calibration


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    mode: LoggerMode = LoggerMode.auto
    project: str = "nanogpt-sweep"
    entity: str | None = None
    group: str | None = None  # default: the sweep's dir name
    tags: list[str] = field(default_factory=list)
    log_interval: int = 10  # steps per window: timing and loss are read (synced) once a window
    init_timeout_s: float = 30.0


@dataclass
class DistConfig:
    nproc: int = 1  # the point's ranks, all nodes: >1 runs it under torchrun (or SLURM's tasks)
    # The machines its ranks span (hydra/launcher=slurm only): nproc / nodes ranks on each,
    # the first node the ranks' rendezvous (docs/distributed.md)
    nodes: int = key(1, point=LATER)
    strategy: Strategy = Strategy.ddp  # with more than one rank: ddp | fsdp2
    reshard_after_forward: bool = True  # fsdp2: free gathered parameters after forward


@dataclass
class ReportConfig:
    baseline: str | None = None  # text of the baseline point's overrides (default: eager fp32)
    plots: bool = False
    memory_budget_gib: float | None = None  # the recommendation's "fastest that fits" line
    ttl_alpha: float = 0.01  # time to loss: "faster to target" below this one-sided p-value


@dataclass
class CostConfig:
    usd_per_hour: float | None = None  # the machine's price: gives usd_per_1m_tokens
    usd_per_kwh: float | None = None  # energy's price, added where energy is known


@dataclass
class TuneConfig:
    """The search's keys a point also reads (hydra/sweeper=tune, docs/tune.md)."""

    # Tokens per optimizer step, all ranks: perf.grad_accum becomes
    # N / (perf.batch_size x model.block_size x dist.nproc), so every candidate trains the same.
    tokens_per_step: int | None = None
    # What run.main returns (one: a float, several: a tuple) and the tune sweeper optimises.
    objective: list[Objective] = field(default_factory=lambda: [Objective.tokens_per_s])
