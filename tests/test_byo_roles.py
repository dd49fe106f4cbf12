"""Roles that fit any model (train/optim_rules.py): the shapes models no one here wrote hold — a
gate outside the blocks, value embeddings, a head padded past the vocabulary, a projection before
the head, a 3-D tensor in a block, a setup_optimizer returning a class the state table lacks —
sorted without a refusal, and trained `ok` under every optimizer in one real sweep."""

from __future__ import annotations

import textwrap

import pytest
import torch

from nanogpt.analysis.store import read_result
from nanogpt.config.spec import ModelConfig, OptimizerConfig, RunSpec
from nanogpt.train.optim import parameter_roles

from .conftest import case_sweep

# nanochat's shapes, small: vocab 100 with the head padded to 128 rows (a multiple of 64), value
# embeddings beside the token table, a smear gate and a projection between the blocks and the
# head, a block holding a stack of two experts (3-D); setup_optimizer returns one optimizer of a
# class of its own (a sign-momentum rule, one buffer a parameter), as nanochat's MuonAdamW is.
ODD = """
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width, bias=False)
        self.experts = nn.Parameter(torch.randn(2, width, width) * 0.02)

    def forward(self, x):
        h = self.attn(self.norm(x))
        return x + torch.tanh(torch.einsum("btd,edf->btf", h, self.experts) / 2)


class SignMomentum(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, beta=0.9):
        super().__init__(params, dict(lr=lr, beta=beta))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["beta"]).add_(p.grad)
                p.add_(buf.sign(), alpha=-group["lr"])


class Model(nn.Module):
    def __init__(self, vocab=100, width=16, depth=2, cast=None):
        super().__init__()
        padded = -(-vocab // 64) * 64
        self.wte = nn.Embedding(vocab, width)
        self.value_embeds = nn.ModuleList([nn.Embedding(vocab, width) for _ in range(depth)])
        self.smear_gate = nn.Linear(width, 1, bias=False)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.proj = nn.Linear(width, width, bias=False)
        self.lm_head = nn.Linear(width, padded, bias=False)
        self.vocab = vocab
        if cast:  # a model that casts itself, as one built in bf16 by transformers
            self.to(getattr(torch, cast))

    def forward(self, idx, targets):
        x = self.wte(idx)
        x = x + torch.sigmoid(self.smear_gate(x)) * x.roll(1, dims=1)
        for block, ve in zip(self.blocks, self.value_embeds):
            x = block(x + ve(idx))
        logits = self.lm_head(self.proj(x))[..., : self.vocab]
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def setup_optimizer(self, weight_decay, learning_rate, betas, device_type):
        return SignMomentum(self.parameters(), lr=learning_rate)
"""
BUILD = ["model.build._target_=odd.Model", "model.vocab_size=100"]


def test_every_shape_has_a_role_and_none_is_refused(tmp_path):
    (tmp_path / "odd.py").write_text(textwrap.dedent(ODD))
    from nanogpt.train.user_model import build_user_model

    spec = RunSpec(
        model=ModelConfig(
            block_size=16, vocab_size=100, build={"_target_": "odd.Model"}, code_dir=str(tmp_path)
        )
    )
    model = build_user_model(spec)
    names = {id(p): n for n, p in model.inner.named_parameters()}
    roles = {
        role: sorted(names[id(p)] for p in params)
        for role, params in parameter_roles(model, 100).items()
    }
    assert roles == {
        "matrices": ["blocks.0.attn.weight", "blocks.1.attn.weight"],
        "embeddings": ["value_embeds.0.weight", "value_embeds.1.weight", "wte.weight"],
        "head": ["lm_head.weight"],  # 128 rows for a vocabulary of 100
        "scalars": [f"blocks.{i}.norm.{k}" for i in (0, 1) for k in ("bias", "weight")],
        "other": ["blocks.0.experts", "blocks.1.experts", "proj.weight", "smear_gate.weight"],
    }
    # the head is the *last* 2-D tensor with vocab rows: a projection of vocab_size rows before
    # it would be `other`, not a second head
    assert parameter_roles(model, 16)["head"] == [model.inner.lm_head.weight]


def test_others_defaults_are_the_matrices_under_adamw_and_the_adamw_parts_under_muon():
    from nanogpt.train.optim_rules import role_settings

    adamw = role_settings(OptimizerConfig(lr=0.003, weight_decay=0.2), 768)
    assert adamw["other"] == adamw["matrices"] == {"lr": 0.003, "weight_decay": 0.2}
    muon = role_settings(OptimizerConfig(name="muon", lr=0.02, weight_decay=0.0), 768)
    assert muon["other"] == muon["head"] == {"lr": 0.004, "weight_decay": 0.01}
    asked = OptimizerConfig(name="muon")
    asked.roles.other.lr = 0.001
    assert role_settings(asked, 768)["other"]["lr"] == 0.001


# the point's identity is also read below: `from_model`'s keys the method never receives
CASES = {
    "adamw": [*BUILD, "optimizer=adamw"],
    # and an SDPA backend asked of a model without SDPA (one point fewer: it trains the same)
    "sgd_sdpa_knob": [*BUILD, "optimizer=sgd", "perf.attention=math"],
    "muon": [*BUILD, "optimizer=muon"],
    "from_model": [*BUILD, "optimizer=from_model", "optimizer.method=setup_optimizer"],
    # its matmuls in bf16 whatever perf.dtype asks
    "bf16_cast": [*BUILD, "+model.build.cast=bfloat16", "perf.dtype=fp32"],
    "compiled": [*BUILD, "perf.compile=true", "bench.diagnose=false"],
}


@pytest.fixture(scope="module")
def odd_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    (root / "odd.py").write_text(textwrap.dedent(ODD))
    return case_sweep(root, CASES)


@pytest.mark.slow
def test_odd_shapes_train_ok_under_every_optimizer(odd_sweep):
    records = {name: read_result(job / "result.json") for name, job in odd_sweep.items()}
    for name, r in records.items():
        assert r["status"] == "ok", (name, r.get("error"))
        assert r["model"] == "odd.Model"
    roles = records["muon"]["optimizer_roles"]
    assert {role: part["tensors"] for role, part in roles.items()} == {
        "matrices": 2,
        "embeddings": 3,
        "head": 1,
        "scalars": 4,
        "other": 4,
    }
    assert roles["matrices"]["stepped_by"] == "Muon" and roles["other"]["stepped_by"] == "AdamW"
    # the model named: its blocks and their class; on a CPU no host sync is counted, and why
    assert records["muon"]["model_blocks"] == "blocks: 2 x Block"
    assert records["muon"]["host_sync_in_step"] is None
    assert records["muon"]["host_sync_note"].startswith("not counted on cpu")
    assert roles["other"]["n_params"] == 2 * (2 * 16 * 16) + 16 * 16 + 16
    # from_model: a class the state table lacks, its state counted after the first warmup step
    own = records["from_model"]
    assert own["optimizer_stepped"] == "SignMomentum"
    n_params = own["n_params"]
    assert own["mem_estimate"]["optimizer_state"] == 4 * n_params  # one fp32 buffer each
    assert "counted from optimizer.state" in own["mem_estimate"]["optimizer_state_rule"]


@pytest.mark.slow
def test_a_self_casting_model_is_divided_by_the_peak_of_the_dtype_its_matmuls_ran_in(odd_sweep):
    from nanogpt.config.spec import Dtype
    from nanogpt.hardware.calibration import ceilings_for_run

    cast = read_result(odd_sweep["bf16_cast"] / "result.json")
    plain = read_result(odd_sweep["adamw"] / "result.json")
    assert cast["status"] == "ok" and cast["dtype"] == "fp32"  # asked
    assert cast["matmul_dtype"] == "bf16" and set(cast["matmul_dtypes"]) == {"bf16"}
    assert plain["matmul_dtype"] == "fp32" and plain["observed_note"] is None
    assert cast["peak_dtype"] == "bf16"
    # this CPU's peak table: the bf16 figure, not the fp32 one MFU used to be divided by
    cpu = torch.device("cpu")
    bf16 = ceilings_for_run(cpu, Dtype.bf16, None).peak.flops
    assert cast["peak_tflops"] == pytest.approx(bf16 / 1e12)
    assert plain["peak_tflops"] == pytest.approx(
        ceilings_for_run(cpu, Dtype.fp32, None).peak.flops / 1e12
    )
    assert cast["observed_note"].startswith(
        "perf.dtype=fp32 had no effect: odd.Model's matmuls ran in bf16 (the model casts itself)"
    )
    assert cast["sdpa_called"] is False
    knob = read_result(odd_sweep["sgd_sdpa_knob"] / "result.json")
    assert knob["status"] == "ok"
    assert knob["observed_note"] == (
        "perf.attention=math acted on nothing: odd.Model never calls "
        "torch.nn.functional.scaled_dot_product_attention"
    )


@pytest.mark.slow
def test_a_compiled_point_without_fp8_never_loads_torchao(odd_sweep):
    """torchao's load warnings ("Failed to load ..._C_cutlass_90a.abi3.so") and its _pytree
    Enum warnings came with every compiled point; torchao is imported for perf.fp8 only."""
    job = odd_sweep["compiled"]
    assert read_result(job / "result.json")["status"] == "ok"
    logged = "".join(p.read_text() for p in job.rglob("run.log"))
    assert "[ok] +case=compiled" in logged
    assert "torchao" not in logged and "KernelPreference" not in logged
