"""One point's model, optimizer, precision and data; `step()` is one optimizer step.

`build_trainer` reads the spec once: it seeds, sets the math mode (TF32 only for `tf32`),
builds the model, converts its Linears to float8 when asked, wraps it for data parallelism
(DDP or FSDP2), compiles it when asked, and picks autocast,
the GradScaler (fp16) and the attention kernel; `step()` sets the learning rate of
optimizer.schedule first (nanogpt/train/lr_schedule.py). With `bench.inject_fault` (a testing knob)
it returns a `FaultyTrainer`, so the trainer that measures never checks for a fault.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from nanogpt.config.spec import Attention, Dtype, Fp8, RunSpec, Schedule, Strategy
from nanogpt.hardware.devices import AUTOCAST_DTYPES, set_matmul_precision
from nanogpt.record.faults import Fault
from nanogpt.train import float8
from nanogpt.train.checkpointing import step_context
from nanogpt.train.data import open_source
from nanogpt.train.distributed import World
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.lr_schedule import is_flat, lr_factor
from nanogpt.train.optim import build_optimizer, implementation, role_groups
from nanogpt.train.sharding import apply_fsdp2, set_gradient_sync
from nanogpt.train.user_model import build_user_model, user_name

SDPA_BACKENDS = {
    Attention.flash: SDPBackend.FLASH_ATTENTION,
    Attention.efficient: SDPBackend.EFFICIENT_ATTENTION,
    Attention.cudnn: SDPBackend.CUDNN_ATTENTION,
    Attention.math: SDPBackend.MATH,
}


def gpt_config(spec: RunSpec) -> GPTConfig:
    m = spec.model
    return GPTConfig(
        block_size=m.block_size,
        vocab_size=m.vocab_size,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.n_embd,
        dropout=m.dropout,
        bias=m.bias,
        attention=spec.perf.attention.value,
        ac=spec.perf.ac.value,
        ac_every=spec.perf.ac_every,
        ac_policy=spec.perf.ac_policy.value,
        loss=spec.perf.loss.value,
        loss_chunk=spec.perf.loss_chunk,
    )


def build_model(spec: RunSpec) -> torch.nn.Module:
    """The built-in GPT, or the user's own model (model.build: train/user_model.py), on the CPU."""
    if spec.model.build:
        return build_user_model(spec)
    return GPT(gpt_config(spec))


def data_source(spec: RunSpec, device: torch.device, world: World, batch_size: int):
    """The batches a Trainer draws (probes/max_batch.py reopens it at other batch sizes)."""
    return open_source(
        spec.data,
        vocab_size=spec.model.vocab_size,
        block_size=spec.model.block_size,
        batch_size=batch_size,
        device=device,
        seed=spec.bench.seed + world.rank,
    )


def tokens_per_step(spec: RunSpec, world_size: int) -> int:
    """Tokens one optimizer step trains on, over all ranks."""
    perf = spec.perf
    return perf.batch_size * spec.model.block_size * perf.grad_accum * world_size


class Trainer:
    """Model, optimizer, precision and data for one point; `step()` is one optimizer step."""

    def __init__(self, spec: RunSpec, device: torch.device, world: World):
        perf = spec.perf
        self.device = device
        self.world = world
        set_matmul_precision(perf.dtype)
        # One initialisation on every rank: DDP would broadcast rank 0's weights anyway, but
        # fully_shard shards whatever each rank holds. Then a seed per rank (dropout).
        torch.manual_seed(spec.bench.seed)
        self.raw_model = build_model(spec).to(device)
        # A user's model's first loss is checked against the contract once (train/user_model.py).
        self.check_loss = getattr(self.raw_model, "check_loss", None)
        torch.manual_seed(spec.bench.seed + world.rank)
        # float8 first, on the whole unsharded model (nanogpt/train/sharding.py gives the order).
        self.fp8_layers = None
        if perf.fp8 is not Fp8.none:
            self.fp8_layers = float8.convert(self.raw_model, perf.fp8)
            if spec.model.build:  # the user's own layer names, not the wrapper's (inner.)
                layers = self.fp8_layers
                layers["converted"] = [user_name(n) for n in layers["converted"]]
                layers["kept"] = [{**k, "layer": user_name(k["layer"])} for k in layers["kept"]]
        self.fsdp = spec.dist.strategy is Strategy.fsdp2 and world.size > 1
        mode = None if perf.compile_mode == "default" else perf.compile_mode
        if self.fsdp:
            self.model_wrapping = self._shard(spec, mode)
            self.ddp = self.model = self.raw_model
        else:
            # DDP first, then compile (the order torch.compile's docs give for DDP): Dynamo's
            # DDPOptimizer then splits the graph at DDP's bucket boundaries, so each bucket's
            # all-reduce overlaps the rest of backward. DDP inside a compiled module cannot
            # overlap.
            self.ddp = world.wrap(self.raw_model, device)
            self.model = self.ddp
            wrapping = "ddp(model)" if self.ddp is not self.raw_model else "model"
            if perf.compile:
                self.model = torch.compile(self.model, mode=mode)
                wrapping = f"compile({wrapping})"
            self.model_wrapping = wrapping
        if self.fp8_layers is not None:
            self.model_wrapping = self.model_wrapping.replace("model", "float8(model)", 1)
        # fp16's narrow range needs loss scaling (Micikevicius et al., 2018); bf16 does not.
        self.scaler = torch.amp.GradScaler(device.type, enabled=perf.dtype is Dtype.fp16)
        # On CUDA, impl=auto is the fused optimizer for every dtype, as nanoGPT's train.py
        # runs: the points of a sweep then differ only in what the sweep varies.
        # the parameters by role, a param group each, once: the optimizer is built from them
        # and the record's roles (probes/setup.py) read them; none for the model's own optimizer
        self.role_groups = []
        if spec.optimizer.name != "from_model":
            self.role_groups = role_groups(self.raw_model, spec.optimizer, spec.model.vocab_size)
        self.optimizer = build_optimizer(
            self.raw_model,
            spec.optimizer,
            prefer_fused=device.type == "cuda",
            device_type=device.type,
            code_dir=spec.model.code_dir,
            groups=self.role_groups,
        )
        self.optimizer_impl_used = implementation(self.optimizer)
        # optimizer.schedule: each group's own rate, as built, is its base
        # (nanogpt/train/lr_schedule)
        opt = spec.optimizer
        self.schedule = None  # (Schedule, warmup, horizon, decay_frac), or None: a flat rate
        if not is_flat(spec):
            kind = Schedule(opt.schedule)
            self.schedule = (kind, opt.warmup_steps, spec.bench.max_steps, opt.decay_frac)
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        # GradScaler.step reads found_inf to the host every step unless the optimizer checks it
        # on the device itself (the fused ones do): then one host sync stays in each step.
        fused = getattr(self.optimizer, "_step_supports_amp_scaling", False)
        self.host_sync_in_step = self.scaler.is_enabled() and not fused
        # Steps the GradScaler skipped (inf/NaN gradients: it halves the scale and does not
        # step), counted on the device so that no step waits for the host.
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)
        self.autocast_dtype = AUTOCAST_DTYPES.get(perf.dtype)
        self.backend = SDPA_BACKENDS.get(perf.attention)
        self.grad_accum = perf.grad_accum
        self.tokens_per_step = tokens_per_step(spec, world.size)
        self.grad_clip = spec.optimizer.grad_clip
        self.perf = perf  # the checkpointing policy's step context (train/checkpointing.py)
        self.source = data_source(spec, device, world, perf.batch_size)
        self.steps_done = 0
        self.last_data_ms = 0.0

    def _shard(self, spec: RunSpec, mode: str | None) -> str:
        """FSDP2 in torchtitan's order: compile each block (activation checkpointing is inside
        the block's forward, so it is compiled with it), then fully_shard each block and the
        root."""
        perf = spec.perf
        wrapping = "block"
        if perf.compile:
            for block in self.raw_model.blocks:
                block.compile(mode=mode)
            wrapping = "compile(block)"
        apply_fsdp2(
            self.raw_model,
            self.raw_model.blocks,
            param_dtype=AUTOCAST_DTYPES.get(perf.dtype),
            reshard_after_forward=spec.dist.reshard_after_forward,
        )
        return f"fsdp2(model, {wrapping} x {len(self.raw_model.blocks)})"

    def _grad_sync(self, last_micro_step: bool):
        """Gradients are reduced across ranks on the last micro-step of accumulation only."""
        if self.fsdp:
            set_gradient_sync(self.raw_model, last_micro_step)
            return contextlib.nullcontext()
        return self.world.sync_grads(self.ddp, last_micro_step)

    def _kernel(self):
        """The attention backend asked for, around forward *and* backward: activation
        checkpointing recomputes the forward inside backward, and a recompute that picked
        another kernel than the forward did would fail torch.utils.checkpoint's check."""
        if self.backend is None:
            return contextlib.nullcontext()
        return sdpa_kernel(self.backend)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def forward_context(self):
        """The forward's precision (autocast) and attention kernel, for a forward outside
        step() (scenarios/time_to_loss/run.py's evaluation)."""
        with self._autocast(), self._kernel():
            yield

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self._autocast():  # the forward only: backward runs in the forward's dtypes
            _, loss = self.model(x, y)
        if self.check_loss is not None:  # a user's model: its first loss, outside compile
            self.check_loss(loss)
            self.check_loss = None
        return loss / self.grad_accum

    def step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches. Returns the mean loss, on device."""
        if self.schedule is not None:
            self.set_lr(self.steps_done)
        self.steps_done += 1
        total = torch.zeros((), device=self.device)
        data_s = 0.0
        for micro in range(self.grad_accum):
            t0 = time.perf_counter()
            x, y = self.source.next_batch()
            data_s += time.perf_counter() - t0
            # DDP all-reduces gradients only on the last micro-step of accumulation.
            last = micro == self.grad_accum - 1
            with self._grad_sync(last), self._kernel(), step_context(self.perf):
                loss = self.loss(x, y)
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        # update() lowers the scale after a step it skipped: compared on the device, no sync.
        before = self.scaler._scale.clone() if self.scaler.is_enabled() else None
        self.scaler.update()
        if before is not None:
            self.skipped_steps += self.scaler._scale < before
        self.optimizer.zero_grad(set_to_none=True)
        self.last_data_ms = data_s * 1e3
        return total

    def set_lr(self, t: int) -> None:
        """Every param group at its base rate times the schedule's factor for step t + 1: the
        roles keep their ratios. A Python float: no device work, no sync."""
        kind, *rest = self.schedule
        factor = lr_factor(kind, t, *rest)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor


class FaultyTrainer(Trainer):
    """TESTING ONLY (bench.inject_fault): a Trainer whose loss goes through the fault, which
    fails the run for real at its step (nanogpt/record/faults.py)."""

    def __init__(self, spec: RunSpec, device: torch.device, world: World, fault: Fault):
        super().__init__(spec, device, world)
        self.fault = fault

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fault.trigger(self.steps_done, super().loss(x, y), self.device)


def build_trainer(spec: RunSpec, device: torch.device, world: World) -> Trainer:
    fault = Fault.parse(spec.bench.inject_fault)
    if fault is None:
        return Trainer(spec, device, world)
    return FaultyTrainer(spec, device, world, fault)
