"""The user's own model (model.build, docs/models.md): built, checked and counted where the point
is measured, never in the sweep's process (its module may touch CUDA at import).

The contract is nanoGPT's: `model(idx, targets)`, both [B, T] token ids, returns a scalar loss,
`(logits, loss)` or an object with `.loss`; a transformers PreTrainedModel is called as
`model(input_ids=idx, labels=idx)` (it shifts the labels itself). Hooks used when present:
`init_weights()` after construction; FLOPs per token from `flops_per_token(seq_len)` or
nanochat's `estimate_flops()`. `UserModel` wraps the model in that contract, so the trainer,
the optimizer's roles, FSDP2 and the diagnosis see what they see of the built-in GPT: a forward
returning `(logits, loss)`, `blocks` (the ModuleList of transformer blocks, found: nanoGPT's
`transformer.h`, a transformers model's `layers`), `config.n_embd` and `get_num_params`.

Figures stay honest: FLOPs per token from a hook, else counted by FlopCounterMode on a copy
built on the meta device, else 6N with attention not counted (`flops_source` says which); the
memory estimate has parameters, gradients and optimizer state exact and the activations null
with the reason (the built-in GPT's formula is never applied to another model).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.errors import ConfigError
from nanogpt.optim import role_counts
from nanogpt.optim_rules import STATE_SLOTS, estimated_state
from nanogpt.spec import Attention, Loss, RunSpec, Strategy
from nanogpt.targets import TargetError, instantiate

BLOCK_NAMES = ("transformer.h", "h", "blocks", "layers", "model.layers", "transformer.layers")


class UserModel(nn.Module):
    """The user's model in the runner's contract: forward(idx, targets) -> (None, loss)."""

    def __init__(self, inner: nn.Module, vocab_size: int, target: str):
        super().__init__()
        self.inner = inner
        self.target = target
        self.hf = _is_transformers(inner)
        found = find_blocks(inner)
        self.blocks_name = found[0] if found else None
        # Not registered a second time as a submodule (state_dict, modules() see them once).
        # No blocks found: the whole model stands for them where roles are given (optim.py);
        # activation checkpointing and FSDP2 are refused (refuse_knobs).
        object.__setattr__(self, "_blocks", found[1] if found else nn.ModuleList([inner]))
        embeddings = [m for m in inner.modules() if isinstance(m, nn.Embedding)]
        width = embeddings[0].embedding_dim if embeddings else None
        self.config = SimpleNamespace(n_embd=width, vocab_size=vocab_size)

    @property
    def blocks(self) -> nn.ModuleList:
        return self._blocks

    def forward(self, idx, targets):
        if self.hf:
            out = self.inner(input_ids=idx, labels=idx)
        else:
            out = self.inner(idx, targets)
        return None, _loss_of(out, self.target)

    def check_loss(self, loss: torch.Tensor) -> None:
        """The first step's loss against the contract: a scalar with grad and a finite value
        (one host read, before any timed step; the trainer calls it outside the compiled
        forward, so no flag of it is a guard that recompiles)."""
        _check_loss(loss, self.target)

    def get_num_params(self, non_embedding: bool = False) -> int:
        return sum(p.numel() for p in self.parameters())


def build_user_model(spec: RunSpec) -> UserModel:
    """spec.model.build, instantiated (nanogpt/targets.py), its weights initialised by its own
    init_weights() when it has one, and the knobs it cannot serve refused in one line."""
    build, target = spec.model.build, str(spec.model.build.get("_target_"))
    try:
        inner = instantiate(build, "model.build", spec.model.code_dir)
    except TargetError as err:
        raise ConfigError(err.key, err.problem, "see docs/models.md") from None
    if not isinstance(inner, nn.Module):
        raise ConfigError(
            "model.build._target_",
            f"{target} made a {type(inner).__name__}, not a torch.nn.Module",
            "name a class or factory that returns the model",
        )
    if callable(getattr(inner, "init_weights", None)):
        inner.init_weights()
    model = UserModel(inner, spec.model.vocab_size, target)
    refuse_knobs(spec, model)
    return model


def refuse_knobs(spec: RunSpec, model: UserModel) -> None:
    """The knobs of the built-in GPT that cannot act on a model the tool did not write, and
    the batches the model cannot take."""
    perf, target = spec.perf, model.target
    if perf.attention is Attention.manual:
        raise ConfigError(
            "perf.attention",
            f"manual is the built-in GPT's own attention path, and {target} has its own",
            "use perf.attention=auto (or an SDPA backend)",
        )
    if perf.loss is Loss.chunked:
        raise ConfigError(
            "perf.loss",
            f"chunked needs the built-in GPT's head, and {target} computes its own loss",
            "use perf.loss=full",
        )
    fsdp = spec.dist.strategy is Strategy.fsdp2 and spec.dist.nproc > 1
    for asked, key in (
        (perf.activation_checkpointing, "perf.activation_checkpointing"),
        (fsdp, "dist.strategy"),
    ):
        if asked and model.blocks_name is None:
            raise ConfigError(
                key,
                f"needs the model's blocks, and {target} has no ModuleList of blocks "
                f"(looked for {', '.join(BLOCK_NAMES)})",
                "name it transformer.h or layers",
            )
    if perf.activation_checkpointing:
        for block in model.blocks:
            block.forward = functools.partial(_checkpointed, block.forward)
    config = getattr(model.inner, "config", None)
    longest = getattr(config, "block_size", None) or getattr(config, "max_position_embeddings", 0)
    if isinstance(longest, int) and 0 < longest < spec.model.block_size:
        raise ConfigError(
            "model.block_size",
            f"is {spec.model.block_size} but {target} takes sequences of {longest} at most",
            f"set model.block_size={longest} or less, or pass ${{model.block_size}} to the model",
        )
    embeddings = [m for m in model.inner.modules() if isinstance(m, nn.Embedding)]
    rows = embeddings[0].num_embeddings if embeddings else None
    if rows is not None and rows < spec.model.vocab_size:
        raise ConfigError(
            "model.vocab_size",
            f"is {spec.model.vocab_size} but {target}'s embedding has {rows} rows: token ids "
            "past it would index outside it",
            f"set model.vocab_size={rows}, or pass ${{model.vocab_size}} to the model",
        )


def _checkpointed(forward, *args, **kwargs):
    """A block's forward under activation checkpointing (recomputed in backward)."""
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The model's ModuleList of transformer blocks: a known name first, else the ModuleList
    of modules of one class holding the most parameters."""
    lists = {n: m for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)}
    for name in BLOCK_NAMES:
        if name in lists:
            return name, lists[name]
    alike = [
        (sum(p.numel() for p in m.parameters()), name)
        for name, m in lists.items()
        if len({type(child) for child in m}) == 1
    ]
    if not alike or max(alike)[0] == 0:
        return None
    name = max(alike)[1]
    return name, lists[name]


def _is_transformers(model: nn.Module) -> bool:
    return any(
        c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
        for c in type(model).__mro__
    )


def _loss_of(out, target: str) -> torch.Tensor:
    """The loss in what the model returned: a tensor, (logits, loss) or an object with .loss."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], torch.Tensor):
        return out[1]
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    raise ConfigError(
        "model.build",
        f"{target}(idx, targets) returned {_shape_of(out)}, not a loss",
        "return a scalar loss, (logits, loss) or an object with .loss (docs/models.md)",
    )


def _check_loss(loss: torch.Tensor, target: str) -> None:
    problem = None
    if loss.dim() != 0:
        problem = f"a loss of shape {tuple(loss.shape)}, not a scalar"
    elif not loss.requires_grad:
        problem = "a loss without grad (computed under no_grad, or detached)"
    elif not math.isfinite(loss.item()):
        problem = f"a non-finite loss ({loss.item()})"
    if problem:
        raise ConfigError(
            "model.build", f"{target}(idx, targets) returned {problem}", "see docs/models.md"
        )


def _shape_of(out) -> str:
    if isinstance(out, tuple | list):
        return f"a {type(out).__name__} of {len(out)} ({', '.join(_shape_of(o) for o in out)})"
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return f"a {type(out).__name__}"


def flops_of(spec: RunSpec, model: UserModel) -> dict:
    """FLOPs per token of one forward+backward and where the figure came from."""
    inner, seq = model.inner, spec.model.block_size
    counted, source = None, None
    try:
        counted = _counted(spec)
    except Exception as err:  # noqa: BLE001 - a model that cannot run on meta: say so, go on
        counted_note = f"not counted on meta ({type(err).__name__}: {str(err)[:120]})"
    else:
        counted_note = None
    if callable(getattr(inner, "flops_per_token", None)):
        per_token, source = inner.flops_per_token(seq), "hook: flops_per_token(seq_len)"
    elif callable(getattr(inner, "estimate_flops", None)):
        per_token, source = inner.estimate_flops(), "hook: estimate_flops()"
    elif counted:
        per_token, source = counted, "counted: FlopCounterMode, one step on a meta copy"
    else:
        per_token = 6 * model.get_num_params()
        source = "6N, N = every parameter; attention not counted"
        if counted_note:
            source += f"; {counted_note}"
    return {
        "n_params_flops": model.get_num_params(),
        "flops_per_token": int(round(per_token)),
        "flops_per_token_counted": counted,
        "flops_source": source,
    }


def _counted(spec: RunSpec) -> float | None:
    """One forward+backward of a sequence, counted on a copy built on the meta device (shapes
    only: no memory, no compute, no weights initialised)."""
    seq = spec.model.block_size
    with torch.device("meta"):
        copy = UserModel(
            instantiate(spec.model.build, "model.build", spec.model.code_dir),
            spec.model.vocab_size,
            str(spec.model.build["_target_"]),
        )
        idx = torch.zeros(1, seq, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = copy(idx, idx)
        loss.backward()
    total = counter.get_total_flops()
    return total / seq if total else None


def memory_of(
    spec: RunSpec, model: UserModel, world_size: int, strategy: str, optimizer=None
) -> dict:
    """Parameters, gradients and optimizer state, exact from the model's own tensors (this
    rank's share under FSDP2); activations unknown, so no total. optimizer=from_model: the
    state from the classes the model's method made (`optimizer`), null for a class unknown."""
    shards = world_size if strategy == "fsdp2" else 1
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if spec.optimizer.name == "from_model":
        state, rule = _own_state(optimizer)
        by_role = {}
    else:
        by_role, rule = estimated_state(spec.optimizer, role_counts(model, spec.model.vocab_size))
        state = sum(by_role.values())
    return {
        "weights": weights // shards,
        "gradients": grads // shards,
        "optimizer_state": None if state is None else state // shards,
        "optimizer_state_rule": rule,
        "activations": None,
        "total": None,
        "optimizer_state_by_role": {role: b // shards for role, b in by_role.items()},
        "note": (
            f"activations not estimated: {model.target} is not the built-in GPT, whose formula "
            "does not apply; the total is unknown (the measured peak is in the record's memory)"
        ),
    }


def _own_state(optimizer) -> tuple[int | None, str]:
    """The state bytes the model's own optimizer(s) will keep, from each part's class
    (optim_rules.STATE_SLOTS: fp32 slots a parameter); None when a class is not in the table."""
    parts = getattr(optimizer, "parts", [optimizer])
    total, rules = 0, []
    for part in parts:
        name = type(part).__name__
        slots = STATE_SLOTS.get(name)
        if name == "SGD":
            slots = int(any(g.get("momentum") for g in part.param_groups))
        if slots is None:
            return None, f"{name} is not in the table of optimizer state (optim_rules.py)"
        rules.append(f"{name} {4 * slots}")
        total += sum(4 * slots * p.numel() for g in part.param_groups for p in g["params"])
    return total, "bytes a parameter: " + ", ".join(dict.fromkeys(rules))
