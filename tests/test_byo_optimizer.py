"""optimizer=from_model: the user's model's own optimizer factory (nanoGPT's configure_optimizers,
nanochat's setup_optimizer returning a list), composed from conf/optimizer/from_model.yaml and
measured for real in this process; what the runner cannot honour refused in one line."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from hydra import compose, initialize_config_dir

from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World
from nanogpt.validate import check

from .conftest import with_micro

# A nanoGPT fork's model: its configure_optimizers decays the 2-D weights only (nanoGPT's own
# rule) and remembers what it was called with; setup_optimizer returns two optimizers as
# nanochat's does (Muon on the block matrices, AdamW on the rest).
FORK = """
import torch
from torch import nn
import torch.nn.functional as F

CALLS = []

class Model(nn.Module):
    def __init__(self, vocab=64, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        logits = self.head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        CALLS.append(dict(weight_decay=weight_decay, learning_rate=learning_rate,
                          betas=betas, device_type=device_type))
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": rest, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def setup_optimizer(self, matrix_lr=0.02, lr=0.004):
        matrices = [p for p in self.layers.parameters() if p.dim() == 2]
        rest = [p for p in self.parameters() if all(p is not m for m in matrices)]
        return [torch.optim.Muon(matrices, lr=matrix_lr), torch.optim.AdamW(rest, lr=lr)]
"""


def spec_of(tmp_path, name: str | None, *overrides: str):
    """A point on the user's model in tmp_path (None: the built-in GPT), composed and checked
    as a sweep composes and checks it."""
    model = []
    if name:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(FORK))
        model = [f"model.build._target_={name}.Model", f"model.code_dir={tmp_path}"]
    point = [
        "optimizer=from_model",
        "model.block_size=16",
        "model.vocab_size=64",
        *model,
        "bench.device=cpu",
        "bench.diagnose=false",
        "perf.batch_size=2",
        *overrides,
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose("config", overrides=with_micro(point)))


def measured(spec, tmp_path):
    return measure(
        spec, torch.device("cpu"), World(), Ceilings(Peak(None, "unknown")), tmp_path, []
    )


def test_configure_optimizers_is_called_with_the_configs_arguments_and_steps(tmp_path):
    spec = spec_of(tmp_path, "fork_adamw", "optimizer.lr=0.003")
    check(spec)  # the sweep's own check: the module is not imported
    assert "fork_adamw" not in sys.modules
    record = measured(spec, tmp_path)
    assert record.status == "ok", record.error
    # the runner filled device_type (optimizer.device_arg), the rest from optimizer.args
    call = sys.modules["fork_adamw"].CALLS[0]
    assert call == dict(weight_decay=0.1, learning_rate=0.003, betas=(0.9, 0.95), device_type="cpu")
    part = record.optimizer
    assert part.optimizer_stepped == "AdamW"
    assert part.optimizer_note.startswith("the model's own configure_optimizers(")
    assert part.optimizer_note.endswith("device_type): 2 param groups")
    n_params = sum(p.numel() for p in record_model_params(spec))
    assert part.optimizer_state_bytes >= 8 * n_params  # exp_avg, exp_avg_sq (+ step counters)
    assert record.setup.mem_estimate["optimizer_state"] == 8 * n_params


def record_model_params(spec):
    from nanogpt.train import user_model as byo

    return list(byo.build_user_model(spec).parameters())


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_list_of_optimizers_steps_as_one_under_the_grad_scaler_too(tmp_path, dtype):
    name = f"fork_list_{dtype}"
    spec = spec_of(
        tmp_path,
        name,
        "optimizer.method=setup_optimizer",
        "optimizer.device_arg=''",
        "~optimizer.args.weight_decay",
        "~optimizer.args.learning_rate",
        "~optimizer.args.betas",
        "optimizer.args.matrix_lr=0.01",
        f"perf.dtype={dtype}",
    )
    record = measured(spec, tmp_path)
    assert record.status == "ok", record.error
    assert record.optimizer.optimizer_stepped == "Muon + AdamW"
    assert record.setup.optimizer_impl_used.startswith("Muon for_loop")
    assert record.optimizer.optimizer_state_bytes > 0  # both parts stepped: their state exists


def test_a_model_without_the_method_fails_its_point_in_one_line(tmp_path):
    spec = spec_of(tmp_path, "fork_none", "optimizer.method=make_optimizer")
    check(spec)  # only the child, which builds the model, can tell
    record = measured(spec, tmp_path)
    assert record.status == "error"
    assert record.error == (
        "ConfigError: optimizer.method: fork_none.Model has no method make_optimizer(); name "
        "the model's optimizer factory, or use optimizer=adamw, sgd or muon."
    )


def test_arguments_the_method_refuses_fail_the_point_in_one_line(tmp_path):
    spec = spec_of(tmp_path, "fork_args", "optimizer.args.eps=1e-8")
    record = measured(spec, tmp_path)
    assert record.status == "error"
    assert record.error.startswith(
        "ConfigError: optimizer.args: fork_args.Model.configure_optimizers(weight_decay, "
        "learning_rate, betas, eps, device_type) refused its arguments: "
    )
    assert "\n" not in record.error


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            None,
            "optimizer: from_model calls the model's own optimizer method, and the built-in GPT "
            "has none; use optimizer=adamw, sgd or muon, or set model.build (docs/models.md).",
        ),
        (["optimizer.impl=fused"], "optimizer.impl: is a setting of the runner's own optimizers"),
        (
            ["optimizer.roles.head.lr=0.1"],
            "optimizer.roles.head: is a setting of the runner's own optimizers",
        ),
        (["optimizer.method=''"], "optimizer.method: is not set"),
    ],
)
def test_what_the_runner_cannot_honour_is_refused_before_any_point(tmp_path, overrides, says):
    with pytest.raises(ConfigError) as err:  # composing checks the point, as a sweep does
        spec_of(tmp_path, "fork_refused" if overrides else None, *(overrides or []))
    assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_from_models_keys_are_in_its_points_identity_and_in_no_other(tmp_path):
    """optimizer.method, .args and .device_arg came after sweeps were recorded: a point that
    leaves them at their defaults keeps its point_id (a resume finds it)."""
    from nanogpt.config.spec import RunSpec
    from nanogpt.record.identity import measured_config

    new = {"method", "args", "device_arg"}
    assert not new & set(measured_config(RunSpec())["optimizer"])
    measured = measured_config(spec_of(tmp_path, "fork_identity"))["optimizer"]
    assert measured["method"] == "configure_optimizers" and measured["args"]["learning_rate"]


def test_a_from_model_points_identity_ignores_the_keys_its_method_never_gets(tmp_path):
    """betas, weight_decay, momentum... are the runner's own optimizers' keys: the model's
    method gets optimizer.args. Changing one is the same point, and the record leaves them out."""
    from nanogpt.record.identity import measured_config, point_id_of

    spec = spec_of(tmp_path, "fork_betas")
    other = spec_of(tmp_path, "fork_betas", "optimizer.betas=[0.5,0.6]", "optimizer.momentum=0.5")
    assert other.optimizer.betas == [0.5, 0.6]
    assert point_id_of(other) == point_id_of(spec)
    optimizer = measured_config(spec)["optimizer"]
    assert not {"betas", "weight_decay", "momentum", "impl", "roles"} & set(optimizer)
    assert optimizer["grad_clip"] == 1.0  # the trainer applies it: part of the point
    changed = spec_of(tmp_path, "fork_betas", "optimizer.args.betas=[0.5,0.6]")
    assert point_id_of(changed) != point_id_of(spec)  # what the method gets is the point
