"""The user's own model (model.build, docs/models.md): built, checked and counted where the point
is measured, never in the sweep's process (its module may touch CUDA at import).

The contract is nanoGPT's: `model(idx, targets)`, both [B, T] token ids, returns a scalar loss,
`(logits, loss)` or an object with `.loss`; a transformers PreTrainedModel is called as
`model(input_ids=idx, labels=idx, shift_labels=targets)` (below: the same next-token loss over
the same T targets as the built-in GPT's). `init_weights()` is called after construction when
the model has it. `UserModel` wraps the model in that contract, so the trainer, the optimizer's
roles, FSDP2 and the diagnosis see what they see of the built-in GPT: a forward returning
`(logits, loss)`, `blocks` (the ModuleList of transformer blocks, found: nanoGPT's
`transformer.h`, a transformers model's `model.layers`), `config.n_embd` and `get_num_params`.
Its FLOPs and memory figures: train/user_model_meta.py.
"""

from __future__ import annotations

import inspect
import math
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_WRAPPED_MODULE,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import checkpoint

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Attention, Dtype, Loss, RunSpec, Strategy
from nanogpt.config.target_nodes import TargetError, instantiate
from nanogpt.train.checkpoint_rules import needs_blocks
from nanogpt.train.checkpointing import block_options

PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # nanogpt/
BLOCK_NAMES = ("transformer.h", "h", "blocks", "layers", "model.layers", "transformer.layers")


class UserModel(nn.Module):
    """The user's model in the runner's contract: forward(idx, targets) -> (None, loss)."""

    def __init__(self, inner: nn.Module, vocab_size: int, target: str):
        super().__init__()
        self.inner = inner
        self.target = target
        self.hf = _is_transformers(inner)
        self.hf_shifts = self.hf and _takes_shift_labels(inner)
        # transformers' cache (use_cache): made each forward by default, though a training step
        # generates nothing. Eager, it is kept: without one, transformers' mask code reads the
        # position ids on the host (packed sequences?), a device sync every step. Compiled, it
        # is dropped (build_user_model): Dynamo skips that read, and a checkpointed layer's
        # write into the cache is a side effect compiled checkpointing refuses (a graph break a
        # layer).
        self.hf_cache = True
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
        if self.hf_shifts:
            # transformers shifts `labels` itself (logits at t against labels at t+1), so
            # labels=targets would shift them twice. shift_labels are the already-shifted
            # targets: every one of the T positions scored against the next token, as the
            # built-in GPT scores them. (labels must be given for the loss to be computed.)
            out = self.inner(
                input_ids=idx, labels=idx, shift_labels=targets, use_cache=self.hf_cache
            )
        elif self.hf:
            # An older loss without shift_labels: labels=idx, shifted by the model, scores the
            # first T-1 positions (the last target is not in the batch's ids).
            out = self.inner(input_ids=idx, labels=idx, use_cache=self.hf_cache)
        else:
            out = self.inner(idx, targets)
        return None, _loss_of(out, self.target)

    def check_loss(self, loss: torch.Tensor) -> None:
        """The first step's loss against the contract: a scalar with grad and a finite value
        (one host read, before any timed step; the trainer calls it outside the compiled
        forward, so no flag of it is a guard that recompiles)."""
        _check_loss(loss, self.target)

    def described_blocks(self) -> str:
        """The blocks found, for the record: "layers: 2 x Block", or why none."""
        if self.blocks_name is None:
            return f"none found (looked for {', '.join(BLOCK_NAMES)}): the whole model is one"
        classes = dict.fromkeys(type(_unwrapped(b)).__name__ for b in self.blocks)
        return f"{self.blocks_name}: {len(self.blocks)} x {' / '.join(classes)}"

    def get_num_params(self, non_embedding: bool = False) -> int:
        return sum(p.numel() for p in self.parameters())


def build_user_model(spec: RunSpec) -> UserModel:
    """spec.model.build, instantiated (nanogpt/config/target_nodes.py), its weights initialised by
    its own init_weights() when it has one, and the knobs it cannot serve refused in one line."""
    build, target = spec.model.build, str(spec.model.build.get("_target_"))
    try:
        inner = instantiate(build, "model.build", spec.model.code_dir)
    except TargetError as err:
        raise ConfigError(err.key, err.problem, "see docs/models.md") from None
    except Exception as err:  # noqa: BLE001 - the user's __init__: its own line, not ours
        raise _raised(target, "(...)", err, "its constructor") from None
    if not isinstance(inner, nn.Module):
        raise ConfigError(
            "model.build._target_",
            f"{target} made a {type(inner).__name__}, not a torch.nn.Module",
            "name a class or factory that returns the model",
        )
    on_meta = any(t.is_meta for t in (*inner.parameters(), *inner.buffers()))
    if callable(getattr(inner, "init_weights", None)):
        if on_meta:  # built on meta as nanochat builds (shapes first): storage, then its init
            inner.to_empty(device="cpu")
        try:
            inner.init_weights()
        except Exception as err:  # noqa: BLE001 - the user's init_weights: its own line
            raise _raised(target, ".init_weights()", err, "its init_weights()") from None
    elif on_meta:
        raise ConfigError(
            "model.build",
            f"{target} left its parameters on the meta device and has no init_weights() to "
            "give them values",
            "define init_weights() (the runner calls it after to_empty), or build the model "
            "on a real device (docs/models.md)",
        )
    check_forward(inner, target)
    model = UserModel(inner, spec.model.vocab_size, target)
    model.hf_cache = not spec.perf.compile
    refuse_knobs(spec, model)
    return model


def check_forward(inner: nn.Module, target: str) -> None:
    """nanoGPT's contract: forward(idx, targets). A forward that takes only idx (a generation
    model, a transformers model is called its own way) is one line naming the wrapper."""
    if _is_transformers(inner):
        return
    try:
        inspect.signature(inner.forward).bind(None, None)
    except TypeError:
        signature = inspect.signature(inner.forward)
        raise ConfigError(
            "model.build",
            f"{target}.forward{signature} does not take (idx, targets)",
            "wrap it in a module whose forward(idx, targets) returns the loss, e.g. "
            "F.cross_entropy(self.inner(idx).flatten(0, 1), targets.flatten()) (docs/models.md)",
        ) from None
    except ValueError:  # no signature to read (a C extension's): the first step will tell
        return


def _raised(target: str, call: str, err: Exception, part: str) -> ConfigError:
    """The user's code raised: the error and the line of theirs it came from."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not _ours(f.filename)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    said = (str(err).splitlines() or [""])[0]
    return ConfigError(
        "model.build",
        f"{target}{call} raised {type(err).__name__}: {said}{where}",
        f"fix {part} where it raised, or the arguments model.build gives it",
    )


def _ours(filename: str) -> bool:
    """A frame of the runner's, torch's or another installed library's, not the user's."""
    return filename.startswith(PACKAGE_DIR) or "site-packages" in filename


def refuse_knobs(spec: RunSpec, model: UserModel) -> None:
    """The knobs of the built-in GPT that cannot act on a model the tool did not write, and
    the batches the model cannot take."""
    perf, target = spec.perf, model.target
    halves = [n for n, p in model.inner.named_parameters() if p.dtype is torch.float16]
    if perf.dtype is Dtype.fp16 and halves:
        raise ConfigError(
            "perf.dtype",
            f"fp16 trains with a GradScaler, which cannot unscale fp16 gradients, and {target} "
            f"keeps {len(halves)} parameters in fp16 ({halves[0]}, ...)",
            "keep the model's parameters in fp32 (autocast runs its matmuls in fp16), or use "
            "perf.dtype=bf16",
        )
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
        (needs_blocks(perf), "perf.ac"),
        (fsdp, "dist.strategy"),
    ):
        if asked and model.blocks_name is None:
            raise ConfigError(
                key,
                f"needs the model's blocks, and {target} has no ModuleList of blocks "
                f"(looked for {', '.join(BLOCK_NAMES)})",
                "name it transformer.h or layers",
            )
    # the blocks the policy checkpoints (perf.ac, train/checkpoint_rules.py), each wrapped as a
    # module (torch's checkpoint_wrapper, as torchtitan wraps its blocks), never its forward
    # reassigned: FSDP2 shards the wrapper, the roles sort the same tensors, and names are the
    # user's (`user_name` drops the wrapper's part); selective's policy rides in its options
    for i, options in enumerate(block_options(len(model.blocks), perf)):
        if options is not None:
            model.blocks[i] = checkpoint_wrapper(
                model.blocks[i], checkpoint_fn=checkpoint, **options
            )
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


def user_name(name: str) -> str:
    """A parameter's or module's name as the user's model names it: without UserModel's
    `inner.` and checkpoint_wrapper's `_checkpoint_wrapped_module.`."""
    return name.removeprefix("inner.").replace(_CHECKPOINT_WRAPPED_MODULE + ".", "")


def _unwrapped(module: nn.Module) -> nn.Module:
    return getattr(module, _CHECKPOINT_WRAPPED_MODULE, module)


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


def _takes_shift_labels(model: nn.Module) -> bool:
    """Whether the transformers model's loss takes already-shifted labels (its ForCausalLMLoss
    has since transformers 4.50; the forward passes its keyword arguments on to it)."""
    try:
        return "shift_labels" in inspect.signature(model.loss_function).parameters
    except (AttributeError, TypeError, ValueError):
        return False


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
