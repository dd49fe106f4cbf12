"""Memory: what the allocator, the driver and the OS saw, and an analytic estimate beside it.

- CUDA caching allocator: peak bytes held by tensors (allocated) and peak bytes the allocator
  took from the driver (reserved), over the measured steps: reset when the probe starts and
  again between warmup and the measured steps (`split`), which keeps warmup's peaks apart
  (mem_warmup_peak_*: compilation, autotuning and CUDA-graph recording transients).
  CUDA-graph compile modes (reduce-overhead, max-autotune) are the exception: their replays
  allocate nothing (the graphs' memory pool was taken while warmup recorded them), so a
  measured-only peak would read about weights + gradients + optimizer state. For them the
  allocated peak is the larger of warmup's and the measured steps' (`graph_aware_peak`), and
  mem_peak_allocated_from says which window it came from.
- NVML (nvidia-ml-py): device memory in use as the driver sees it, all processes included;
  sampled at each window, the largest sample kept.
- Process peak RSS (resident host memory). On Linux the kernel's peak (VmHWM) is reset when the
  probe starts, so it covers this point alone even when several points share a process
  (bench.isolate=false). Elsewhere it falls back to getrusage's ru_maxrss, which cannot be reset:
  the peak of the process's whole life, exact only when each point has its own process (the
  default). The record says which method it used (mem_peak_rss_method).
The estimate counts weights, gradients, optimizer state, activations and logits, so a user can
see where memory goes and what batch size fits.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import resource
import sys
from pathlib import Path

import psutil
import torch

from nanogpt.devices import nvml_handle
from nanogpt.optim import role_counts
from nanogpt.optim_rules import estimated_state
from nanogpt.spec import RunSpec

log = logging.getLogger(__name__)

# proc(5): writing "5" to clear_refs resets the process's peak RSS (VmHWM) to its current RSS.
CLEAR_REFS = Path("/proc/self/clear_refs")
PROC_STATUS = Path("/proc/self/status")


class MemoryProbe:
    def __init__(self, device: torch.device, cuda_graphs: bool = False):
        self.device = device
        self.cuda = device.type == "cuda"
        self.cuda_graphs = cuda_graphs  # a CUDA-graph compile mode: its pool is warmup's
        self._nvml_handle, self._nvml_device = nvml_handle(device) if self.cuda else (None, None)
        self._nvml_peak: int | None = None
        self.rss_method = "ru_maxrss"
        self.warmup: dict[str, int | None] = {}  # warmup's peaks, once split() has run

    def start(self) -> None:
        self.rss_method = reset_peak_rss()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self) -> dict[str, int | None]:
        """Current figures for a log window (no device sync)."""
        sample = {"mem_rss_bytes": psutil.Process().memory_info().rss}
        if self.cuda:
            sample["mem_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            sample["mem_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
            used = _nvml_used(self._nvml_handle)
            if used is not None:
                self._nvml_peak = max(used, self._nvml_peak or 0)
        return sample

    def split(self) -> None:
        """Between warmup and the measured steps: keep warmup's peaks apart (first-step
        compilation, autotuner clones and benchmark buffers, CUDA-graph recording) and start
        the peaks again, so that mem_peak_* are the measured steps' own. No empty_cache: the
        blocks warmup cached stay reserved (the measured steps reuse them), so the reserved
        peak can still hold warmup's; the allocated peak is the measured steps' tensors."""
        self.sample()
        self.warmup = {
            "mem_warmup_peak_allocated_bytes": None,
            "mem_warmup_peak_reserved_bytes": None,
            "mem_warmup_peak_rss_bytes": peak_rss_bytes(self.rss_method),
        }
        if self.cuda:
            self.warmup["mem_warmup_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(
                self.device
            )
            self.warmup["mem_warmup_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(
                self.device
            )
            torch.cuda.reset_peak_memory_stats(self.device)
        self._nvml_peak = None
        # Only a resettable peak (VmHWM) can be the measured steps' own; ru_maxrss stays the
        # process's whole life, warmup included (mem_peak_rss_method says which).
        self.rss_method = reset_peak_rss() if self.rss_method == "vmhwm" else self.rss_method

    def result(self) -> dict[str, int | None]:
        self.sample()
        out = {
            **self.warmup,
            "mem_peak_allocated_bytes": None,
            "mem_peak_allocated_from": None,
            "mem_peak_reserved_bytes": None,
            "mem_nvml_used_bytes": self._nvml_peak,
            "mem_nvml_device": self._nvml_device,
            "mem_peak_rss_bytes": peak_rss_bytes(self.rss_method),
            "mem_peak_rss_method": self.rss_method,
        }
        if self.cuda:
            out["mem_peak_allocated_bytes"], out["mem_peak_allocated_from"] = graph_aware_peak(
                torch.cuda.max_memory_allocated(self.device),
                self.warmup.get("mem_warmup_peak_allocated_bytes"),
                self.cuda_graphs,
            )
            out["mem_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
        return out


def graph_aware_peak(
    measured: int | None, warmup: int | None, cuda_graphs: bool
) -> tuple[int | None, str | None]:
    """The allocated peak a record reports, and the window it comes from ("measured" or
    "warmup"). Normally the measured steps' own. Under CUDA graphs the replays allocate
    nothing: the graphs' pool was allocated while warmup recorded them and is still held, so
    the larger of the two peaks is the one the step needs."""
    if cuda_graphs and warmup is not None and (measured is None or warmup > measured):
        return warmup, "warmup"
    return measured, None if measured is None else "measured"


def reset_peak_rss() -> str:
    """Start a fresh peak-RSS count; returns how peak_rss_bytes will read it.

    "vmhwm": the kernel's high-water mark, reset now (Linux; needs a writable clear_refs).
    "ru_maxrss": getrusage's peak, not resettable: the peak since the process started.
    """
    try:
        CLEAR_REFS.write_text("5")
    except OSError:  # not Linux, or /proc is read-only (some sandboxes)
        return "ru_maxrss"
    return "vmhwm" if _vmhwm_bytes() is not None else "ru_maxrss"


def peak_rss_bytes(method: str = "ru_maxrss") -> int:
    if method == "vmhwm":
        peak = _vmhwm_bytes()
        if peak is not None:
            return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _vmhwm_bytes() -> int | None:
    try:
        status = PROC_STATUS.read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    return None


def release(device: torch.device) -> None:
    """Free what a finished job held so the next one in this process starts clean.

    The caller drops its references (model, optimizer, batches); this collects them, drops
    compiled graphs and their guards, returns cached CUDA blocks to the driver and resets the
    peaks, and hands free C-heap pages back to the OS so the next point's RSS starts low.
    """
    dynamo = sys.modules.get("torch._dynamo")  # loaded only if something was compiled
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        except RuntimeError as exc:
            # After a sticky CUDA error (an illegal access, a device assert) every CUDA call
            # raises again; the point's figures are already in its record, so say so and go on.
            log.warning("releasing %s failed (%s: %s)", device, type(exc).__name__, exc)
    _trim_c_heap()


def save_snapshot(out_dir: Path) -> str | None:
    """Save the CUDA allocator's snapshot, the pickle that pytorch.org/memory_viz reads (PyTorch
    docs, "Understanding CUDA Memory Usage"). Written beside, then renamed: never half a file."""
    path = out_dir / "memory_snapshot.pickle"
    partial = out_dir / ".memory_snapshot.pickle.tmp"
    try:
        torch.cuda.memory._dump_snapshot(str(partial))
        os.replace(partial, path)
    except Exception as exc:  # the record matters more than the snapshot
        partial.unlink(missing_ok=True)
        log.warning("no memory snapshot (%s: %s)", type(exc).__name__, exc)
        return None
    return path.name


def _trim_c_heap() -> None:
    """glibc keeps freed memory in its heap for reuse (still resident): malloc_trim(0) returns
    what it can to the OS. A no-op where there is no glibc (macOS, musl)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _nvml_used(handle) -> int | None:
    if handle is None:
        return None
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


def estimate_of(spec: RunSpec, model, world_size: int, strategy: str) -> dict:
    """estimate_memory for a point: its spec's shapes and settings, `model` (a GPT, possibly on
    the meta device) for the exact parameter counts. The one place a spec becomes the estimate's
    arguments: the measured point (measure/setup.py) and the search's pruning (tune/fit.py)."""
    perf = spec.perf
    return estimate_memory(
        n_params=model.get_num_params(non_embedding=False),
        n_layer=spec.model.n_layer,
        n_head=spec.model.n_head,
        n_embd=spec.model.n_embd,
        block_size=spec.model.block_size,
        vocab_size=spec.model.vocab_size,
        batch_size=perf.batch_size,
        optimizer=spec.optimizer.name,
        optimizer_state_by_role=estimated_state(
            spec.optimizer, role_counts(model, spec.model.vocab_size)
        )[0],
        dtype=perf.dtype.value,
        attention=perf.attention.value,
        activation_checkpointing=perf.activation_checkpointing,
        loss=perf.loss.value,
        loss_chunk=perf.loss_chunk,
        world_size=world_size,
        strategy=strategy,
        reshard_after_forward=spec.dist.reshard_after_forward,
        n_block_params=sum(p.numel() for p in model.blocks.parameters()),
        grad_accum=perf.grad_accum,
        compiled=perf.compile,
    )


# The activation and logits terms' coefficients, fitted together to the peaks one H100 80GB
# measured on 2026-11-23 (torch 2.11; ../shared/device/h100-2026-11-23.md, summarised in
# docs/benchmarks.md) at GPT-2 124M, block 1024, batch 12, bf16, AdamW, flash attention:
#   eager 11.31 GiB, eager with activation checkpointing 7.76 GiB, compiled 9.08 GiB.
# Eager and checkpointed share the logits and differ by 11 layers' activations: those two fix
# the activations (38.9 bytes) and the eager logits (9.30 bytes a logit, 2 of them bf16); the
# compiled point, its activations assumed the same, fixes the compiled logits (5.43). Rounded,
# the estimate is within 0.1 % of all three (tests/test_model_flops.py holds it to 5 %). These
# are effective bytes: at the peak (the start of backward) the gradients are not allocated yet
# while autocast's weight copies and Inductor's buffers are, and the fit absorbs that.
ACTIVATION_BYTES = 39  # a layer, a token, a channel, 16-bit: Korthikanti's 34, plus the
#                        residual stream, fp32 under autocast, saved at both LayerNorms
LOGITS_EXTRA_BYTES = {False: 7.3, True: 3.4}  # a logit beyond its compute-dtype copy, eager
#   (log_softmax's fp32 output and its fp32 gradient, nearly two fp32 copies) and compiled
#   (Inductor fuses the upcast into the loss kernels: less than one)


def estimate_memory(
    *,
    n_params: int,
    n_layer: int,
    n_head: int,
    n_embd: int,
    block_size: int,
    vocab_size: int,
    batch_size: int,
    optimizer: str,
    dtype: str,
    attention: str,
    activation_checkpointing: bool,
    loss: str = "full",
    loss_chunk: int = 2048,
    world_size: int = 1,
    strategy: str = "ddp",
    reshard_after_forward: bool = True,
    n_block_params: int = 0,
    grad_accum: int = 1,
    compiled: bool = False,
    optimizer_state_by_role: dict[str, int] | None = None,
) -> dict:
    """Analytic training memory in bytes, by component.

    Parameters stay fp32 under autocast; gradients match them. AdamW keeps two fp32 moments,
    SGD with momentum one. `optimizer_state_by_role` (bytes by role of parameter, from
    optim_rules.estimated_state: AdamW 8 a parameter, Muon 4) replaces that count when given,
    and the estimate lists it by role ("optimizer_state_by_role", outside the total's parts).
    Activations per layer follow Korthikanti et al. (2022), "Reducing
    Activation Recomputation in Large Transformer Models", section 4.1: s*b*h*(34 + 5*a*s/h)
    bytes with 16-bit activations, ACTIVATION_BYTES (fitted, above) for its 34; the 5*a*s/h term
    is the materialised attention matrix, which fused (flash / memory-efficient) kernels never
    store. fp32 activations double the 16-bit
    parts. With checkpointing each layer keeps only its input, plus one layer being recomputed.
    Logits (b*s*vocab) take their compute dtype's bytes plus LOGITS_EXTRA_BYTES (fitted,
    above): eager, log_softmax's fp32 output and its fp32 gradient; compiled, Inductor fuses
    the upcast into the loss kernels and holds less. With
    loss=chunked (nanogpt/chunked_loss.py) only one chunk's logits exist at a time, in the
    compute dtype and in fp32 (the buffer the softmax gradient is built in, eager or compiled),
    plus the head's gradients it keeps whole: dx (b*s*n_embd) and dW (vocab*n_embd), both fp32.
    (So compiled, at GPT-2's width, the chunked loss can hold more than the full one.)

    With strategy=fsdp2 over world_size ranks, the figures are per rank: weights, gradients and
    optimizer state are sharded (1/world_size each), and the parameters gathered for compute
    are added as "gathered_params" in the compute dtype: with reshard_after_forward, the
    root's (embeddings, final LayerNorm) plus two blocks' (the one computing and the one
    prefetched); without it, all of them, held from forward to backward. With grad_accum > 1,
    FSDP2 skips the reduce-scatter on all but the last micro-step and keeps each parameter's
    gradient unsharded, in fp32 (its reduce dtype), across them: "unsharded_gradients".
    """
    act_bytes = 2 if dtype in ("bf16", "fp16") else 4
    tokens = batch_size * block_size
    per_layer = tokens * n_embd * ACTIVATION_BYTES * act_bytes // 2
    if attention in ("manual", "math"):
        per_layer += 5 * n_head * block_size * tokens * act_bytes // 2
    if activation_checkpointing:
        activations = n_layer * tokens * n_embd * act_bytes + per_layer
    else:
        activations = n_layer * per_layer
    states = {"adamw": 2, "sgd": 1}.get(optimizer, 2)
    if loss == "chunked":
        chunk = min(loss_chunk, tokens)
        logits = (
            chunk * vocab_size * (act_bytes + 4) + 4 * tokens * n_embd + 4 * vocab_size * n_embd
        )
    else:
        logits = round(tokens * vocab_size * (act_bytes + LOGITS_EXTRA_BYTES[compiled]))
    shards = world_size if strategy == "fsdp2" else 1
    parts = {
        "weights": 4 * n_params // shards,
        "gradients": 4 * n_params // shards,
        "optimizer_state": 4 * states * n_params // shards,
        "activations": activations,
        "logits": logits,
    }
    if strategy == "fsdp2":
        per_block = n_block_params // max(n_layer, 1)
        gathered = n_params
        if reshard_after_forward:
            gathered = n_params - n_block_params + 2 * min(per_block, n_block_params)
        parts["gathered_params"] = act_bytes * gathered
        if grad_accum > 1:
            parts["unsharded_gradients"] = 4 * n_params
    if optimizer_state_by_role is not None:
        parts["optimizer_state"] = sum(optimizer_state_by_role.values()) // shards
    parts["total"] = sum(parts.values())
    if optimizer_state_by_role is not None:
        by_role = optimizer_state_by_role.items()
        parts["optimizer_state_by_role"] = {role: b // shards for role, b in by_role}
    return parts
