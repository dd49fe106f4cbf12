"""perf.loss=chunked: the head and cross-entropy over chunks of tokens, on CPU with real torch.

Gradients are compared with the full loss; the memory claim is checked by watching every tensor
the autograd graph saves and every tensor the step allocates (TorchDispatchMode sees each op's
outputs), and asserting none has the full [B*T, vocab] shape.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.train.chunked_loss import ChunkedLinearCrossEntropy, chunked_cross_entropy
from nanogpt.train.flops import counted_flops_per_token
from nanogpt.train.gpt import GPT, LOGITS_EXTRA_BYTES, GPTConfig
from nanogpt.train.memory_estimate import estimate_memory

from .conftest import sweep_refusal, with_micro

TINY = dict(block_size=16, vocab_size=320, n_layer=2, n_head=2, n_embd=32, bias=False)


def _pair(**extra):
    """The same GPT twice, full and chunked loss, with identical weights."""
    torch.manual_seed(0)
    full = GPT(GPTConfig(**TINY, **extra))
    chunked = GPT(GPTConfig(**TINY, **extra, loss="chunked", loss_chunk=12))
    chunked.load_state_dict(full.state_dict())
    return full, chunked


def _batch(ignore: bool = False):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]), generator=g)
    y = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]), generator=g)
    if ignore:
        y[0, :5] = -1  # nanoGPT's ignore_index: left out of the mean
    return x, y


@pytest.mark.parametrize("ignore", [False, True])
def test_chunked_loss_and_gradients_match_the_full_loss_in_fp32(ignore):
    full, chunked = _pair()
    x, y = _batch(ignore)
    _, loss_full = full(x, y)
    logits, loss_chunked = chunked(x, y)
    assert logits is None  # the chunked path never builds the logits to return them
    loss_full.backward()
    loss_chunked.backward()
    torch.testing.assert_close(loss_chunked, loss_full, rtol=1e-6, atol=1e-6)
    for (name, a), (_, b) in zip(full.named_parameters(), chunked.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_chunked_loss_matches_under_bf16_autocast_within_bf16_tolerance():
    full, chunked = _pair()
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss_full = full(x, y)
        _, loss_chunked = chunked(x, y)
    loss_full.backward()
    loss_chunked.backward()
    torch.testing.assert_close(loss_chunked, loss_full, rtol=2e-2, atol=2e-2)
    for a, b in zip(full.parameters(), chunked.parameters(), strict=True):
        assert b.grad.dtype == a.grad.dtype == torch.float32
        torch.testing.assert_close(b.grad, a.grad, rtol=5e-2, atol=2e-3)


def test_the_function_alone_scales_its_gradient_by_the_incoming_one():
    torch.manual_seed(0)
    x = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(50, 8, requires_grad=True)
    t = torch.randint(0, 50, (10,))
    (3.0 * chunked_cross_entropy(x, w, t, chunk=4)).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    (3.0 * F.cross_entropy(x @ w.t(), t)).backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


class ShapeWatch(TorchDispatchMode):
    """Every shape an op produces while active."""

    def __init__(self):
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.add(tuple(t.shape))
        return out


@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_no_tensor_of_the_full_logits_shape_exists_in_forward_or_backward(loss):
    model = GPT(GPTConfig(**TINY, loss=loss, loss_chunk=12))
    x, y = _batch()
    full_shape = (x.numel(), TINY["vocab_size"])
    watch = ShapeWatch()
    with watch:
        _, out = model(x, y)
        out.backward()
    full_logits = full_shape in watch.shapes or (*x.shape, TINY["vocab_size"]) in watch.shapes
    # The check can fail: the full loss does build them.
    assert full_logits is (loss == "full")
    if loss == "chunked":
        assert (12, TINY["vocab_size"]) in watch.shapes  # a chunk's logits, and no more


class LiveBytes(TorchDispatchMode):
    """The bytes held by the storages ops allocate while active, and their peak, sampled after
    every op. A storage counts from the op that made it until torch frees it: torch's own weak
    reference to a storage (StorageWeakRef) expires when its last tensor, view or autograd
    save lets go. Views and in-place results share an input's storage and add nothing."""

    def __init__(self):
        super().__init__()
        self.live: dict[StorageWeakRef, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {ref: n for ref, n in self.live.items() if not ref.expired()}
        inputs = {StorageWeakRef(t.untyped_storage()) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            ref = StorageWeakRef(t.untyped_storage())
            if ref not in inputs and ref not in self.live:
                self.live[ref] = t.untyped_storage().nbytes()
        self.peak = max(self.peak, sum(self.live.values()))
        return out


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("grads", [True, False])
def test_the_chunked_loss_holds_one_chunk_of_logits_at_a_time(grads):
    n, vocab, width, chunk = 64, 4096, 4, 16  # 4 chunks; the logits dwarf everything else
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g).requires_grad_(grads)
    w = torch.randn(vocab, width, generator=g).requires_grad_(grads)
    targets = torch.randint(0, vocab, (n,), generator=g)
    watch = LiveBytes()
    with watch:
        ChunkedLinearCrossEntropy.apply(x, w, targets, chunk, torch.bfloat16)
    # One chunk at its largest as the ops' outputs show it: the 16-bit product and its fp32
    # upcast (then the fp32 gradient and its 16-bit copy), 2 + 4 bytes a logit (logsumexp's
    # temporary inside the op is the allocator's: tests/test_memory_estimate.py). Beside it for
    # the whole loop: the weight's 16-bit copy, and with gradients dx (x's dtype) and the fp32 dW.
    one_chunk = chunk * vocab * (2 + 4)
    whole = vocab * width * 2 + (n * width * 4 + vocab * width * 4 if grads else 0)
    assert watch.peak >= one_chunk  # the tracker sees the chunk's logits
    # Two chunks alive (chunk i's z and g until chunk i+1 rebinds them) would add 4 + 2 bytes
    # a logit again (4 without gradients): far past this bound.
    assert watch.peak <= whole + 1.1 * one_chunk, (watch.peak, whole, one_chunk)


def test_the_memory_estimate_logits_term_follows_the_loss():
    common = dict(
        n_params=124_000_000,
        n_layer=12,
        n_head=12,
        n_embd=768,
        block_size=1024,
        vocab_size=50304,
        batch_size=12,
        optimizer="adamw",
        dtype="bf16",
        attention="auto",
        activation_checkpointing=False,
    )
    full = estimate_memory(**common)
    chunked = estimate_memory(**common, loss="chunked", loss_chunk=2048)
    # bf16 logits plus the fitted fp32 bytes an eager loss holds beside them
    # (train/memory_estimate.py)
    assert full["logits"] == round(12 * 1024 * 50304 * (2 + LOGITS_EXTRA_BYTES[False]))
    # One chunk's logits at 8 bytes (fp32, and logsumexp's fp32 temporary: the allocator's
    # peak, tests/test_memory_estimate.py), the whole-size dx and fp32 dW, the head's bf16 copy.
    head = 50304 * 768
    assert chunked["logits"] == 2048 * 50304 * 8 + 12 * 1024 * 768 * 4 + head * 4 + head * 2
    compiled = estimate_memory(**common, loss="chunked", loss_chunk=2048, compiled=True)
    assert compiled["logits"] - chunked["logits"] == 2048 * 50304 * (2 + 4 - 8)  # Inductor fuses
    assert chunked["total"] < full["total"]


def test_the_counted_flops_are_the_full_heads():
    # The gradient is taken in forward, chunk by chunk: the same matmuls, no recompute.
    full = counted_flops_per_token(GPTConfig(**TINY))
    assert counted_flops_per_token(GPTConfig(**TINY, loss="chunked", loss_chunk=5)) == full


@pytest.mark.slow
@pytest.mark.compat
def test_torch_compile_traces_the_chunked_loss_and_agrees_with_eager():
    """Dynamo and AOTAutograd trace the loss's autograd.Function, its backward too, and the
    traced graphs give eager's loss and every parameter's gradient. The graphs run on eager
    kernels (backend aot_eager): the tracing is what is checked here, without Inductor's
    codegen and g++ (about 20 CPU-s from a cold cache). Inductor's kernels for the loss are the
    compiled point's in test_a_compiled_chunked_loss_point_is_one_graph, checked against its
    eager twin there."""
    full, chunked = _pair()
    compiled = torch.compile(chunked, backend="aot_eager")
    x, y = _batch()
    _, eager_loss = full(x, y)
    _, compiled_loss = compiled(x, y)
    eager_loss.backward()
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-5)
    for a, b in zip(full.parameters(), chunked.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)


def test_a_sweep_over_the_loss_records_it_and_its_estimate(sweep):
    proc, sweep_dir = sweep("perf.loss=full,chunked", "perf.loss_chunk=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    full, chunked = (read_result(p) for p in sorted(sweep_dir.glob("*/result.json")))
    assert (full["loss_kind"], chunked["loss_kind"]) == ("full", "chunked")
    assert full["loss_chunk"] is None and chunked["loss_chunk"] == 8
    assert chunked["mem_estimate"]["logits"] < full["mem_estimate"]["logits"]
    assert chunked["flops_per_token_counted"] == full["flops_per_token_counted"]
    table = read_summary(sweep_dir)
    assert list(table["loss_kind"]) == ["full", "chunked"] and set(table["status"]) == {"ok"}


@pytest.mark.slow  # Inductor's compile: its compile workers
@pytest.mark.compat  # torch 2.11's Dynamo could not trace the autocast query: 3 graph breaks
# From a cold Inductor cache (a CI machine's) Inductor compiles 25-29 kernels with g++ for this
# point alone, 16-20 s on 2 cores: make test-heavy runs it on the lock's torch, make test-compat
# on the oldest (both in .ci/run); make test's compiled points are test_compile_health's and the
# models' (test_byo_roles, test_byo_transformers). The tracing itself is checked in make test
# (test_torch_compile_traces_the_chunked_loss_and_agrees_with_eager, on aot_eager).
@pytest.mark.heavy
def test_a_compiled_chunked_loss_point_is_one_graph(tmp_path):
    """The runner's measured loop, in this process, on a compiled micro point with the chunked
    loss: the Function and its dtype query inside the compiled model, no graph break and no
    recompile, on every supported torch (make test-compat runs it on the oldest); and Inductor's
    kernels train as eager does (the same point, not compiled: the same first and last loss)."""
    from hydra import compose, initialize_config_dir

    from nanogpt.analysis.derive import Ceilings, Peak
    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.scenarios.loop import measure
    from nanogpt.train.distributed import World
    from nanogpt.validate import check

    def measured(compiled: str):
        overrides = ["perf.loss=chunked", "perf.loss_chunk=8", f"perf.compile={compiled}"]
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            spec = to_spec(compose("config", overrides=with_micro(overrides)))
        check(spec)
        assert spec.perf.loss.value == "chunked"
        ceilings = Ceilings(Peak(None, "unknown"))
        record = measure(spec, torch.device("cpu"), World(), ceilings, tmp_path / compiled, [])
        assert record.status == "ok", record.error
        return record

    torch._dynamo.reset()  # GPT.forward compiled by another test of this process: not a recompile
    record, eager = measured("true"), measured("false")
    part = record.compile
    assert part.graphs >= 1 and part.compile_note is None, part.compile_note
    found = (torch.__version__, part.graph_break_reasons)
    assert (part.graph_breaks, part.recompiles) == (0, 0), found
    for loss, rel in (("loss_first", 1e-4), ("loss_last", 1e-3)):  # as compile_economics' twins
        compiled_loss, eager_loss = getattr(record.timing, loss), getattr(eager.timing, loss)
        assert eager_loss > 0 and compiled_loss == pytest.approx(eager_loss, rel=rel), loss


def test_a_chunk_of_no_tokens_is_one_line_before_any_point():
    # In-process; exit 2 and nothing written: tests/conftest.py sweep_refusal says where.
    line = sweep_refusal("perf.loss=chunked", "perf.loss_chunk=0")
    assert "\n" not in line
    assert "perf.loss_chunk: is 0 but must be at least 1" in line


def _head_input_grad(dtype: torch.dtype | None, n: int, vocab: int, width: int, chunk: int):
    """d loss / d x of the chunked loss on fixed inputs, under autocast to `dtype` (None: fp32).
    Small weights make the softmax nearly uniform: every entry of d loss / d logits is about
    1 / (vocab * n), the size fp16 cannot hold (its smallest subnormal is 6e-8)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g).requires_grad_(True)
    w = torch.randn(vocab, width, generator=g) * 0.02
    targets = torch.randint(0, vocab, (n,), generator=g)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = chunked_cross_entropy(x, w, targets, chunk)
    loss.backward()
    return x.grad


def test_the_fp16_head_gradient_is_as_close_to_fp32_as_bf16s():
    # 2,048 tokens x 8,192 vocabulary: entries of 1/(8192 * 2048) = 6e-8 before the fix's cast.
    shape = dict(n=2048, vocab=8192, width=16, chunk=1024)
    exact = _head_input_grad(None, **shape)

    def error(dtype):
        return ((_head_input_grad(dtype, **shape) - exact).norm() / exact.norm()).item()

    fp16, bf16 = error(torch.float16), error(torch.bfloat16)
    # fp16 keeps 11 significant bits to bf16's 8: once nothing underflows it is the closer.
    assert fp16 <= 1.5 * bf16, (fp16, bf16)
    assert bf16 < 0.02
