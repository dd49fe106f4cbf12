"""The memory estimate's terms (nanogpt/train/memory_estimate.py) against what torch's CPU allocator
held, read from the profiler's memory events: every allocation and free, in order, so the peak
is exact and includes the temporaries an op makes inside itself (which a dispatch-level tracker,
seeing only an op's outputs, misses: torch.logsumexp's is the case in point).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from nanogpt.train.chunked_loss import chunked_cross_entropy
from nanogpt.train.distributed import World
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.memory_estimate import estimate_memory


def allocator_peak(fn) -> int:
    """The most bytes the CPU allocator held at once while `fn` ran, above what it held before:
    the profiler's memory events ("[memory]", one per allocation or free, its size signed),
    summed in time order."""
    return allocator_peak_and_kept(fn)[0]


def allocator_peak_and_kept(fn) -> tuple[int, int]:
    """allocator_peak(fn), and the bytes `fn` left allocated (its events' sum: the same in any
    order, unlike the peak)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak, live


def test_logsumexp_allocates_a_temporary_as_big_as_its_input():
    # ATen's logsumexp_out_impl computes exp(z - max) into a new tensor before it sums it: the
    # reason the eager chunked loss holds 8 bytes a logit (fp32 logits + this), not 6.
    z = torch.randn(256, 8192)
    assert allocator_peak(lambda: torch.logsumexp(z, dim=-1)) >= z.numel() * z.element_size()


def test_the_eager_chunked_loss_term_is_the_allocators_peak_within_10_percent():
    # bf16 autocast, where the old count (2 + 4 bytes a logit) and the allocator part ways by 20 %;
    # the chunk's logits dominate, as at GPT-2's 50,304-token vocabulary.
    tokens, width, vocab, chunk = 1024, 64, 8192, 256
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=g, requires_grad=True)
    w = torch.randn(vocab, width, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), generator=g)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = chunked_cross_entropy(x, w, targets, chunk)
        loss.backward()

    measured = allocator_peak(step)
    estimate = estimate_memory(
        n_params=vocab * width,
        n_layer=1,
        n_head=1,
        n_embd=width,
        block_size=tokens,
        vocab_size=vocab,
        batch_size=1,
        optimizer="sgd",
        dtype="bf16",
        attention="auto",
        activation_checkpointing=False,
        loss="chunked",
        loss_chunk=chunk,
    )
    assert abs(estimate["logits"] / measured - 1) <= 0.10, (estimate["logits"], measured)


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank, in this process (torch's HashStore: no port)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_ddp_buckets_term_is_what_torchs_reducer_adds_to_the_peak(one_rank_group, monkeypatch):
    # The project's own DDP call (World.wrap, as a rank of a 2-process job makes it), in a
    # one-rank group: the reducer builds the same buckets at any world size.
    config = GPTConfig(block_size=32, vocab_size=512, n_layer=2, n_head=2, n_embd=64, bias=False)
    torch.manual_seed(0)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))

    def step(model):
        _, loss = model(idx, idx)
        loss.backward()

    bare = GPT(config)
    without = allocator_peak(lambda: step(bare))
    bare.zero_grad(set_to_none=True)
    model = GPT(config)
    # The wrapped step's peak: what the wrapper keeps from its construction (its buckets), plus
    # the step's peak above that. The profiler sees the allocator's events on this thread alone,
    # and the construction first broadcasts the parameters through a flat copy that gloo's
    # thread holds too: whichever thread let go of it last freed it, unseen when gloo's did
    # (kept came out 2x the buckets, in make test's load, after a barrier too). So the wrapper is
    # built without that broadcast (torch's init_sync=False), which builds the same reducer.
    ddp = functools.partial(torch.nn.parallel.DistributedDataParallel, init_sync=False)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", ddp)
    wrapped = {}
    _, kept = allocator_peak_and_kept(
        lambda: wrapped.setdefault("ddp", World(size=2).wrap(model, torch.device("cpu")))
    )
    with_ddp = kept + allocator_peak(lambda: step(wrapped["ddp"]))
    kwargs = dict(
        n_params=model.get_num_params(non_embedding=False),
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        block_size=config.block_size,
        vocab_size=config.vocab_size,
        batch_size=2,
        optimizer="sgd",
        dtype="fp32",
        attention="auto",
        activation_checkpointing=False,
    )
    estimate = estimate_memory(**kwargs, world_size=2, strategy="ddp")
    added = with_ddp - without
    assert abs(estimate["ddp_buckets"] / added - 1) <= 0.10, (estimate["ddp_buckets"], added)
    # a single process is not wrapped, and FSDP2 has no such buckets
    for world, strategy in ((1, "ddp"), (2, "fsdp2")):
        assert "ddp_buckets" not in estimate_memory(**kwargs, world_size=world, strategy=strategy)
