"""Optimizers by role (nanogpt/train/optim.py, nanogpt/train/optim_rules.py): which parameters are
matrices, Muon beside AdamW as one optimizer step, any class by optimizer.build, and the refusals.

Real torch optimizers on the real GPT, real Hydra compositions; the sweeps that run these
points for real are tests/test_runs.py's cases (`muon`, `adagrad`)."""

from __future__ import annotations

import functools
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from nanogpt.config.spec import RunSpec
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.record.identity import measured_config, point_id_of
from nanogpt.train import optim_rules
from nanogpt.train.distributed import World
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.memory_estimate import estimate_of
from nanogpt.train.optim import Combined, build_optimizer, parameter_roles, role_groups, state_bytes
from nanogpt.train.trainer import build_trainer

from .conftest import sweep_refusal, with_micro

VOCAB = 256


@functools.cache
def spec_of(*overrides: str) -> RunSpec:
    """The point's spec as a sweep composes and checks it (MICRO, biases on)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=with_micro(["model.bias=true", *overrides]))
    return to_spec(cfg)


def micro_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32))


def named_roles(model: GPT) -> dict[str, list[str]]:
    names = {id(p): name for name, p in model.named_parameters()}
    return {r: sorted(names[id(p)] for p in ps) for r, ps in parameter_roles(model, VOCAB).items()}


BLOCK_MATRICES = [
    f"blocks.{i}.{m}.weight"
    for i in range(2)
    for m in ("attn.proj", "attn.qkv", "mlp.fc", "mlp.proj")
]


def test_the_built_in_gpt_ties_its_head_to_the_embedding_which_is_no_matrix():
    model = micro_gpt()
    assert model.lm_head.weight is model.wte.weight  # tied: one tensor
    roles = named_roles(model)
    assert roles["embeddings"] == ["wpe.weight", "wte.weight"] and roles["head"] == []
    assert roles["matrices"] == sorted(BLOCK_MATRICES)
    # per block: two LayerNorms' gain and bias, four Linear biases; then ln_f's gain and bias
    assert len(roles["scalars"]) == 2 * 8 + 2
    assert all("ln_" in n or n.endswith(".bias") for n in roles["scalars"])
    counted = sum(p.numel() for ps in parameter_roles(model, VOCAB).values() for p in ps)
    assert counted == model.get_num_params(non_embedding=False)
    # Under muon the tied table is stepped at the head's rate, not nanochat's embedding rate.
    opt = spec_of("optimizer=muon").optimizer
    groups = {g["role"]: g for g in role_groups(model, opt, VOCAB)}
    untied = optim_rules.role_settings(opt, 32, tied_head=False)
    assert groups["embeddings"]["lr"] == untied["head"]["lr"] < untied["embeddings"]["lr"]


def test_an_untied_head_is_the_head_and_muon_steps_only_the_block_matrices():
    model = micro_gpt()
    model.lm_head.weight = torch.nn.Parameter(model.wte.weight.detach().clone())
    roles = named_roles(model)
    assert roles["head"] == ["lm_head.weight"]
    assert roles["embeddings"] == ["wpe.weight", "wte.weight"]
    assert roles["matrices"] == sorted(BLOCK_MATRICES)
    spec = spec_of("optimizer=muon", "optimizer.roles.head.lr=0.01")
    optimizer = build_optimizer(model, spec.optimizer)
    assert isinstance(optimizer, Combined)
    muon, adamw = optimizer.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    stepped = sorted(names[id(p)] for g in muon.param_groups for p in g["params"])
    assert stepped == sorted(BLOCK_MATRICES)
    assert muon.defaults["adjust_lr_fn"] == "original"
    groups = {g["role"]: g for g in role_groups(model, spec.optimizer, VOCAB)}
    assert groups["head"]["lr"] == 0.01 and groups["matrices"]["lr"] == spec.optimizer.lr
    assert groups["scalars"]["weight_decay"] == 0.0


def test_adamw_keeps_nanogpts_groups_every_role_at_optimizer_lr_and_no_decay_on_scalars():
    spec = spec_of("optimizer.roles.embeddings.weight_decay=0.0")
    groups = {g["role"]: g for g in role_groups(micro_gpt(), spec.optimizer, VOCAB)}
    assert {g["lr"] for g in groups.values()} == {spec.optimizer.lr}
    assert groups["matrices"]["weight_decay"] == spec.optimizer.weight_decay > 0
    assert groups["embeddings"]["weight_decay"] == groups["scalars"]["weight_decay"] == 0.0
    # keys added for this issue, at their defaults, leave a point's identity as it was
    assert set(measured_config(spec)["optimizer"]) >= {"lr", "impl"}
    assert {"roles", "build", "adjust_lr_fn"}.isdisjoint(measured_config(RunSpec())["optimizer"])


def test_muon_and_adamw_step_as_one_under_the_fp16_grad_scaler():
    """Both parts unscaled by GradScaler.unscale_, both stepped, both skipped after an inf."""
    spec = spec_of("optimizer=muon", "perf.dtype=fp16", "bench.inject_fault=nan@3")
    trainer = build_trainer(spec, torch.device("cpu"), World())
    muon, adamw = trainer.optimizer.parts
    watched = [muon.param_groups[0]["params"][0], adamw.param_groups[0]["params"][0]]
    # One micro-step by hand: the scaled gradients of both parts come back unscaled.
    x, y = trainer.source.next_batch()
    trainer.scaler.scale(trainer.loss(x, y)).backward()
    scaled = [p.grad.clone() for p in watched]
    trainer.scaler.unscale_(trainer.optimizer)
    scale = trainer.scaler.get_scale()
    assert scale > 1 and all(
        torch.allclose(p.grad * scale, g) for p, g in zip(watched, scaled, strict=True)
    )
    trainer.scaler.update()  # no step taken: the scaler's per-optimizer state starts again
    trainer.optimizer.zero_grad(set_to_none=True)

    def changed_by_step() -> list[bool]:
        before = [p.detach().clone() for p in watched]
        trainer.step()
        return [not torch.equal(b, p) for b, p in zip(before, watched, strict=True)]

    assert changed_by_step() == [True, True]  # step 1
    assert changed_by_step() == [True, True]  # step 2
    assert changed_by_step() == [False, False]  # step 3: NaN loss, the scaler skips both
    assert int(trainer.skipped_steps) == 1


def test_the_state_counted_after_a_step_is_the_estimate_muon_4_bytes_adamw_8():
    spec = spec_of("optimizer=muon")
    trainer = build_trainer(spec, torch.device("cpu"), World())
    trainer.step()
    estimate = estimate_of(spec, trainer.raw_model, 1, "ddp")["optimizer_state_by_role"]
    for group in role_groups(trainer.raw_model, spec.optimizer, spec.model.vocab_size):
        n = sum(p.numel() for p in group["params"])
        counted = state_bytes(trainer.optimizer, group["params"])
        step_counters = 4 * len(group["params"])  # AdamW's step, a float32 scalar a tensor
        if group["stepped_by"] == "Muon":
            assert counted == estimate[group["role"]] == 4 * n
        else:
            assert counted - step_counters == estimate[group["role"]] == 8 * n


def test_any_optimizer_class_by_build_target_as_typed():
    spec = spec_of("optimizer.build._target_=torch.optim.Adagrad", "optimizer.build.lr_decay=0.01")
    assert spec.optimizer.build == {"_target_": "torch.optim.Adagrad", "lr_decay": 0.01}
    optimizer = build_optimizer(micro_gpt(), spec.optimizer)
    assert isinstance(optimizer, torch.optim.Adagrad) and optimizer.defaults["lr_decay"] == 0.01
    lrs = {g["lr"] for g in optimizer.param_groups}
    assert lrs == {spec.optimizer.lr} and len(optimizer.param_groups) == 3  # no untied head


# A user's optimizer module, found where the command runs (model.code_dir): SGD whose momentum
# is `scale.value`, `scale` a nested node with positional arguments.
USER_OPTIMIZER = """
import torch


class Factor:
    def __init__(self, value):
        self.value = value


class Scaled(torch.optim.SGD):
    def __init__(self, params, lr=0.1, scale=None):
        super().__init__(params, lr=lr, momentum=scale.value)
"""


def test_a_users_optimizer_is_checked_from_its_source_and_built_as_model_build_is(
    tmp_path, monkeypatch
):
    """optimizer.build as model.build: the sweep's check reads the module's source and never
    imports it; the measuring process builds the node with its nested _target_ and _args_,
    the module found in code_dir (where the command ran)."""
    name = f"user_optimizer_{abs(hash(str(tmp_path)))}"
    (tmp_path / f"{name}.py").write_text(USER_OPTIMIZER)
    monkeypatch.chdir(tmp_path)
    build = [
        f"optimizer.build._target_={name}.Scaled",
        f"optimizer.build.scale._target_={name}.Factor",
        "optimizer.build.scale._args_=[0.5]",
    ]
    spec = spec_of(*build)  # composed and checked, as the sweep's process does
    assert name not in sys.modules and spec.model.code_dir == str(tmp_path)
    monkeypatch.chdir("/")  # the measuring process may run anywhere: code_dir finds it
    optimizer = build_optimizer(micro_gpt(), spec.optimizer, code_dir=spec.model.code_dir)
    assert type(optimizer).__name__ == "Scaled"
    assert {g["momentum"] for g in optimizer.param_groups} == {0.5}
    monkeypatch.chdir(tmp_path)
    line = sweep_refusal(*build, "optimizer.build.scael=2")
    assert f"optimizer.build.scael: is no argument of {name}.Scaled" in line
    line = sweep_refusal(f"optimizer.build._target_={name}.Scald")
    assert f"optimizer.build._target_: '{name}.Scald': module {name} has no Scald" in line
    # the point is the optimizer's code too: its source changed, a resume measures it again
    before = point_id_of(spec)
    (tmp_path / f"{name}.py").write_text(USER_OPTIMIZER + "\n# tuned\n")
    assert point_id_of(spec) != before and point_id_of(spec) == point_id_of(spec_of(*build))


REFUSALS = {
    "dist.strategy: fsdp2 shards every matrix": ["optimizer=muon", "dist.strategy=fsdp2"],
    "optimizer.build: replaces the optimizer": [
        "optimizer=muon",
        "optimizer.build._target_=torch.optim.Adagrad",
    ],
    "optimizer.build._target_: 'torch.optim.Adagrab': module torch.optim has no Adagrab": [
        "optimizer.build._target_=torch.optim.Adagrab"
    ],
    "optimizer.build._target_: is not set; name a class, e.g. torch.optim.Adagrad": [
        "optimizer.build.lr_decay=0.01"
    ],
    "optimizer.build.lr_dcay: is no argument of torch.optim.Adagrad": [
        "optimizer.build._target_=torch.optim.Adagrad",
        "optimizer.build.lr_dcay=0.01",
    ],
    "optimizer.impl: fused is a flag of the built-in optimizers": [
        "optimizer.build._target_=torch.optim.Adagrad",
        "optimizer.impl=fused",
    ],
    "optimizer.adjust_lr_fn: 'rms' is not one of": ["optimizer=muon", "optimizer.adjust_lr_fn=rms"],
    "optimizer.roles.head.lr: is -1.0 but must be positive": ["optimizer.roles.head.lr=-1"],
}


@pytest.mark.parametrize("expected", REFUSALS)
def test_each_refusal_is_one_line_naming_the_key(expected):
    line = sweep_refusal(*REFUSALS[expected])
    assert expected in line and "\n" not in line and line.startswith("error: point 1 of 1")


def test_a_torch_without_muon_is_refused_in_one_line(monkeypatch):
    from nanogpt.optimizers import muon

    assert muon.muon_missing() is None  # this torch has it
    monkeypatch.setattr(muon, "torch_version", lambda: "2.8.0+cpu")
    line = sweep_refusal("optimizer=muon")
    assert "optimizer: torch 2.8.0+cpu has no torch.optim.Muon" in line and "\n" not in line


def test_adamw_sgd_and_muon_keep_their_point_id_as_registry_recipes():
    """Each optimizer is a module of nanogpt/optimizers/ now: records written before (a micro
    sweep of adamw, sgd and muon, tests/data/optimizer_points.json) are found by a resume. Their
    optimizer keys are measured as before, so the point_id is the one recorded (the other groups
    are the record's own: a change there is no change of this refactor's)."""
    import json
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.record.identity import measured_config, point_id

    fixture = json.loads((Path(__file__).parent / "data" / "optimizer_points.json").read_text())
    assert [r["overrides"][0] for r in fixture] == [
        "optimizer=adamw",
        "optimizer=sgd",
        "optimizer=muon",
    ]
    for record in fixture:
        assert point_id(record["measured_config"]) == record["point_id"]
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            spec = to_spec(compose("config", overrides=record["overrides"]))
        now = measured_config(spec)["optimizer"]
        assert now == record["measured_config"]["optimizer"], record["overrides"][0]
        assert point_id({**record["measured_config"], "optimizer": now}) == record["point_id"]
