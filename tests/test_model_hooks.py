"""The built-in GPT keeps the contract it asks of a user's model (docs/models.md): its FLOPs and
its activation memory are hooks on the model, and one FLOPs path (train/flops.flops_of) and
one memory path (train/memory_estimate.estimate_of) serve it and a user's model alike."""

from __future__ import annotations

import textwrap

import pytest
import torch

from nanogpt.analysis import derive
from nanogpt.config.spec import Ac, Dtype, ModelConfig, RunSpec, Strategy
from nanogpt.record import Record, Setup, Timing
from nanogpt.record.asked import Asked
from nanogpt.train import user_model as byo
from nanogpt.train.flops import counted_flops_per_token, flops_of
from nanogpt.train.gpt import FLOPS_FORMULA, GPT
from nanogpt.train.memory_estimate import estimate_memory, estimate_of
from nanogpt.train.optim import role_counts
from nanogpt.train.optim_rules import estimated_state
from nanogpt.train.trainer import gpt_config


def _gpt_spec(**perf) -> RunSpec:
    spec = RunSpec(model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    for key, value in perf.items():
        setattr(spec.perf, key, value)
    return spec


@pytest.mark.parametrize("checkpointed", [False, True])
def test_the_gpts_flops_come_from_its_own_hook_through_the_one_path(checkpointed):
    spec = _gpt_spec(ac=Ac.full if checkpointed else Ac.none)
    model = GPT(gpt_config(spec))
    figures = flops_of(spec, model)
    hook = model.flops_per_token(16)
    assert figures["flops_source"] == "hook: flops_per_token(seq_len)"
    assert figures["flops_formula"] == FLOPS_FORMULA
    assert figures["flops_per_token"] == hook["model"]
    assert figures["flops_per_token_hw"] == hook["hardware"]
    assert (figures["flops_per_token_hw"] > figures["flops_per_token"]) is checkpointed
    assert figures["flops_per_token_counted"] == counted_flops_per_token(model.config)


@pytest.mark.parametrize(
    "world,strategy,perf",
    [
        (1, Strategy.ddp, {}),
        (2, Strategy.ddp, {"dtype": Dtype.bf16, "loss": "chunked"}),
        (2, Strategy.fsdp2, {"dtype": Dtype.bf16, "grad_accum": 2, "compile": True}),
    ],
)
def test_the_gpts_estimate_through_its_hook_is_its_formula(world, strategy, perf):
    from nanogpt.config.spec import Loss

    if "loss" in perf:
        perf["loss"] = Loss(perf["loss"])
    spec = _gpt_spec(**perf)
    spec.dist.strategy = strategy
    with torch.device("meta"):  # as the search prunes: shapes only
        model = GPT(gpt_config(spec))
    got = estimate_of(spec, model, world, strategy.value)
    p, m = spec.perf, spec.model
    by_role = estimated_state(spec.optimizer, role_counts(model, m.vocab_size))[0]
    expected = estimate_memory(
        n_params=model.get_num_params(non_embedding=False),
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.n_embd,
        block_size=m.block_size,
        vocab_size=m.vocab_size,
        batch_size=p.batch_size,
        optimizer=spec.optimizer.name,
        optimizer_state_by_role=by_role,
        dtype=p.dtype.value,
        attention=p.attention.value,
        activation_checkpointing=p.ac is Ac.full,
        loss=p.loss.value,
        loss_chunk=p.loss_chunk,
        world_size=world,
        strategy=strategy.value,
        reshard_after_forward=spec.dist.reshard_after_forward,
        n_block_params=sum(x.numel() for x in model.blocks.parameters()),
        grad_accum=p.grad_accum,
        compiled=p.compile,
    )
    assert {k: got[k] for k in expected} == expected
    assert ("ddp_buckets" in got) is (world > 1 and strategy is Strategy.ddp)


HOOKED = """
import torch
from torch import nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, vocab=64, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def flops_per_token(self, seq_len):
        return {"model": 6000, "hardware": 8000}

    def activation_memory(self, batch_size, seq_len, dtype, activation_checkpointing, compiled):
        return {"activations": 3 * batch_size * seq_len * 8 * dtype.itemsize}
"""


def _user_spec(tmp_path, source: str, name: str) -> RunSpec:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    model = ModelConfig(
        block_size=16, vocab_size=64, build={"_target_": f"{name}.Model"}, code_dir=str(tmp_path)
    )
    return RunSpec(model=model)


def test_a_user_models_hooks_give_hardware_flops_and_a_total(tmp_path):
    spec = _user_spec(tmp_path, HOOKED, "hooked_both")
    spec.perf.ac = Ac.full
    model = byo.build_user_model(spec)
    figures = flops_of(spec, model)
    assert (figures["flops_per_token"], figures["flops_per_token_hw"]) == (6000, 8000)
    estimate = estimate_of(spec, model, 1, "ddp")
    activations = 3 * spec.perf.batch_size * 16 * 8 * 4  # fp32
    assert estimate["activations"] == activations and "note" not in estimate
    parts = ("weights", "gradients", "optimizer_state", "activations")
    assert estimate["total"] == sum(estimate[k] for k in parts)
    # the hook's hardware FLOPs give the point an HFU, as the GPT's do
    setup = Setup(world_size=1, tokens_per_step=1000, **figures)
    asked = Asked(dtype="fp32", compile=False, activation_checkpointing=True, fp8="none")
    record = Record(asked=asked, setup=setup, timing=Timing(step_ms_median=1.0))
    rates = derive.rates(record, derive.Ceilings(derive.Peak(1e12, "override")))
    assert rates.hfu == pytest.approx(rates.mfu * 8000 / 6000)


def test_a_user_model_without_the_memory_hook_has_no_total_and_says_why(tmp_path):
    source = HOOKED.split("    def activation_memory")[0]
    spec = _user_spec(tmp_path, source, "hooked_flops_only")
    estimate = estimate_of(spec, byo.build_user_model(spec), 2, "ddp")
    assert estimate["activations"] is None and estimate["total"] is None
    assert "no hook activation_memory(batch_size, seq_len, dtype" in estimate["note"]
    assert estimate["ddp_buckets"] == estimate["gradients"]  # the runner's part, any model
