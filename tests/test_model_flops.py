"""The model's interface and the FLOP accounting, on real torch."""

from __future__ import annotations

import pytest
import torch

from nanogpt.analysis.stats import summarize
from nanogpt.train.flops import counted_flops_per_token
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.memory_estimate import estimate_memory

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

TINY = GPTConfig(block_size=16, vocab_size=256, n_layer=2, n_head=2, n_embd=32)


def test_forward_returns_logits_and_loss_and_ties_weights():
    model = GPT(TINY)
    idx = torch.randint(0, 256, (3, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, 256) and loss.ndim == 0
    assert model.lm_head.weight is model.wte.weight
    logits, loss = model(idx)
    assert logits.shape == (3, 1, 256) and loss is None


def test_num_params_counts_tied_weight_once_and_drops_wpe():
    model = GPT(TINY)
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.get_num_params(non_embedding=False) == sum(unique.values())
    assert model.get_num_params() == sum(unique.values()) - 16 * 32


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["auto", "math", "flash", "manual"])
def test_attention_paths_agree(attention):
    torch.manual_seed(0)
    ref = GPT(TINY).eval()
    other = GPT(GPTConfig(**{**TINY.__dict__, "attention": attention})).eval()
    other.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(ref(idx, idx)[1], other(idx, idx)[1])


def test_activation_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    plain = GPT(TINY)
    ckpt = GPT(GPTConfig(**{**TINY.__dict__, "ac": "full"}))
    ckpt.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    for m in (plain, ckpt):
        m(idx, idx)[1].backward()
    torch.testing.assert_close(plain.wte.weight.grad, ckpt.wte.weight.grad)


def test_gpt2_flops_per_token_equals_hand_computed_formula():
    # GPT-2 124M shape, padded vocab: N excludes the 1024x768 position embedding.
    n = 12 * (4 * 768 * 768 + 4 * 768 + 8 * 768 * 768 + 5 * 768 + 4 * 768) + 768 * 2 + 50304 * 768
    hand = 6 * n + 12 * 12 * 12 * 64 * 1024
    with torch.device("meta"):
        model = GPT(GPTConfig())
    assert model.get_num_params() == n
    assert model.flops_per_token(1024)["model"] == hand


def test_counted_flops_agree_with_formula_within_a_few_percent():
    with torch.device("meta"):
        model = GPT(GPTConfig())
    formula = model.flops_per_token(1024)["model"]
    counted = counted_flops_per_token(GPTConfig())
    assert abs(counted - formula) / formula < 0.03


def test_activation_checkpointing_adds_recompute_to_hardware_flops_only():
    cfg = GPTConfig(**{**TINY.__dict__, "ac": "full"})
    figures = GPT(cfg).flops_per_token(cfg.block_size)
    assert figures["hardware"] > figures["model"]
    assert figures["model"] == GPT(TINY).flops_per_token(cfg.block_size)["model"]


def test_memory_estimate_grows_with_batch_and_shrinks_with_checkpointing():
    kw = dict(
        n_params=10**6,
        n_layer=4,
        n_head=4,
        n_embd=64,
        block_size=64,
        vocab_size=256,
        optimizer="adamw",
        dtype="fp32",
        attention="auto",
    )
    small = estimate_memory(batch_size=1, activation_checkpointing=False, **kw)
    big = estimate_memory(batch_size=8, activation_checkpointing=False, **kw)
    ckpt = estimate_memory(batch_size=8, activation_checkpointing=True, **kw)
    assert big["activations"] == 8 * small["activations"]
    assert ckpt["activations"] < big["activations"]
    assert small["optimizer_state"] == 2 * small["weights"]
    assert small["total"] == sum(v for k, v in small.items() if k != "total")


def test_summarize_statistics():
    stats = summarize([10.0, 20.0, 30.0, 40.0, 50.0])
    assert stats["median"] == 30.0 and stats["mean"] == 30.0
    assert stats["p10"] == pytest.approx(14.0) and stats["p90"] == pytest.approx(46.0)
    assert stats["cv"] == pytest.approx(stats["std"] / 30.0)


# The peaks one H100 80GB measured on 2026-11-23 (torch 2.11; ../shared/device/
# h100-2026-11-23.md) at GPT-2 124M, block 1024, batch 12, bf16, AdamW: what the estimate's
# activation and logits coefficients were fitted to (nanogpt/train/gpt.py).
H100_PEAKS_GIB = {"compiled": 9.08, "eager": 11.31, "checkpointing": 7.76}


@pytest.mark.parametrize("case", H100_PEAKS_GIB)
def test_the_memory_estimate_is_within_5_percent_of_the_h100s_peaks(case):
    shape = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)
    with torch.device("meta"):  # shapes only: the exact parameter count, no memory
        model = GPT(GPTConfig(**shape, bias=False))
    estimate = estimate_memory(
        **shape,
        n_params=model.get_num_params(non_embedding=False),
        batch_size=12,
        optimizer="adamw",
        dtype="bf16",
        attention="auto",
        activation_checkpointing=case == "checkpointing",
        compiled=case == "compiled",
    )
    measured = H100_PEAKS_GIB[case] * 2**30
    assert abs(estimate["total"] / measured - 1) <= 0.05, (case, estimate["total"] / 2**30)
