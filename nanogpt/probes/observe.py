"""The user's model's first step, observed once: the dtype its matmuls run in and whether it
calls scaled_dot_product_attention.

A model the tool did not write may cast itself (a transformers model built in bf16, a model that
`.to(torch.bfloat16)`s itself): its matmuls then run in bf16 whatever perf.dtype asked, and
MFU divided by the fp32 peak would be many times too high. So one forward+backward of a
sequence runs on the meta copy the FLOPs are counted on (train/user_model_meta.meta_copy: shapes
and dtypes, no memory, no compute) under two of torch's modes:

  MatmulDtypes   a TorchDispatchMode: every aten matmul (mm, addmm, bmm, baddbmm, the
                 attention kernels) and the dtype of its first input
  SdpaCalls      a TorchFunctionMode: whether torch.nn.functional.scaled_dot_product_attention
                 was called (below the dispatcher its math path is plain bmm's, so it is caught
                 where the model calls it)

Autocast does not act on meta tensors, so under perf.dtype=bf16 or fp16 the dtype is autocast's
by torch's rule (autocast casts every floating input of a matmul to its dtype); without autocast
it is the dtype observed. The worker resolves the peak MFU divides by from it (runner/worker.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from nanogpt.config.spec import Attention, Dtype, RunSpec
from nanogpt.train.checkpointing import ATTENTION_OPS, MATMUL_OPS

log = logging.getLogger(__name__)
MATMULS = MATMUL_OPS | ATTENTION_OPS  # the ops selective checkpointing keeps too
# torch dtypes to perf.dtype's names; float32 under perf.dtype=tf32 stays tf32 (TF32 is how an
# fp32 matmul runs, not a dtype of its tensors)
NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
AUTOCAST = {Dtype.bf16: "bf16", Dtype.fp16: "fp16"}


class MatmulDtypes(TorchDispatchMode):
    """Counts the matmuls by the dtype of their first input."""

    def __init__(self):
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            first = next(a for a in args if isinstance(a, torch.Tensor))
            self.seen[NAMES.get(first.dtype, str(first.dtype).removeprefix("torch."))] += 1
        return func(*args, **(kwargs or {}))


class SdpaCalls(TorchFunctionMode):
    """Counts the model's calls of F.scaled_dot_product_attention."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@dataclass
class Observation:
    """What the first step showed; `matmul_dtype` is what MFU's peak is read for."""

    matmul_dtype: str | None = None  # fp32 | tf32 | bf16 | fp16 (null: not observed, see note)
    matmul_dtypes: dict = field(default_factory=dict)  # observed on meta: dtype -> matmul calls
    sdpa_called: bool | None = None
    notes: list = field(default_factory=list)  # what was asked and acted on nothing, in words
    unobserved: str | None = None  # why nothing was observed (the record says it, not the console)
    blocks: str | None = None  # the blocks found (byo.UserModel.described_blocks)

    def peak_dtype(self, asked: Dtype) -> Dtype:
        """The dtype whose peak MFU divides by: the observed one where it is known."""
        return Dtype(self.matmul_dtype) if self.matmul_dtype else asked


def first_step(spec: RunSpec) -> Observation:
    """One forward+backward of the user's model on its meta copy, observed; a model that cannot
    run on meta leaves the observation null with the reason."""
    from nanogpt.train.user_model_meta import meta_copy

    asked = spec.perf.dtype
    blocks = None
    try:
        copy, idx = meta_copy(spec)
        blocks = copy.described_blocks()
        matmuls, sdpa = MatmulDtypes(), SdpaCalls()
        with sdpa, matmuls:
            _, loss = copy(idx, idx)
            loss.backward()
    except Exception as err:  # noqa: BLE001 - not observed: say why, measure on
        why = f"first step not observed on meta ({type(err).__name__}: {str(err)[:120]})"
        return Observation(unobserved=why, blocks=blocks)
    seen = dict(matmuls.seen)
    if asked in AUTOCAST:
        dtype = AUTOCAST[asked]  # autocast casts every matmul's inputs (not on meta: by rule)
    elif seen:
        dtype = matmuls.seen.most_common(1)[0][0]
        if dtype == "fp32" and asked is Dtype.tf32:
            dtype = "tf32"
    else:
        dtype = None
    notes = []
    target = spec.model.build.get("_target_")
    if dtype in ("bf16", "fp16") and asked not in AUTOCAST:
        notes.append(
            f"perf.dtype={asked.value} had no effect: {target}'s matmuls ran in {dtype} (the "
            f"model casts itself); MFU is divided by the {dtype} peak"
        )
    if dtype not in (None, "fp32", "tf32", "bf16", "fp16"):
        dtype = None  # a dtype with no peak in the table: MFU stays on the asked one's
        notes.append(f"matmuls ran in {', '.join(seen)}: no peak for it, the asked one's kept")
    if spec.perf.attention not in (Attention.auto, Attention.manual) and not sdpa.calls:
        notes.append(
            f"perf.attention={spec.perf.attention.value} acted on nothing: {target} never calls "
            "torch.nn.functional.scaled_dot_product_attention"
        )
    return Observation(dtype, seen, sdpa.calls > 0, notes, blocks=blocks)


def fill(setup, seen: Observation, is_main: bool = True) -> None:
    """The observation into the record's Setup; each note said once on the console (rank 0)."""
    setup.matmul_dtype = seen.matmul_dtype
    setup.matmul_dtypes = seen.matmul_dtypes or None
    setup.sdpa_called = seen.sdpa_called
    setup.model_blocks = seen.blocks
    setup.observed_note = "; ".join([*seen.notes, *filter(None, [seen.unobserved])]) or None
    for note in seen.notes if is_main else ():  # a model that failed its build has none
        log.warning(note)


def host_syncs(trainer, diagnosed: bool) -> tuple[int | None, str]:
    """The host syncs of one training step, counted on CUDA by torch's sync debug mode (each
    synchronizing call, such as a GradScaler reading found_inf with a non-fused optimizer or a
    `.item()`, warns once), in one step after the diagnosis: no measured step runs under it.
    Null with the reason elsewhere."""
    if trainer.device.type != "cuda":
        return None, f"not counted on {trainer.device.type}: torch's sync debug mode is CUDA's"
    if not diagnosed:
        return None, "not counted: it runs with the diagnosis (bench.diagnose=false)"
    import warnings

    torch.cuda.synchronize(trainer.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.step()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    torch.cuda.synchronize(trainer.device)
    count = sum("synchroniz" in str(w.message) for w in caught)
    return count, "torch.cuda.set_sync_debug_mode('warn'), one step after the diagnosis"
