"""optimizer=adafactor (torch.optim.Adafactor), the registry's recipe for a new optimizer
(nanogpt/optimizers/adafactor.py): composed from its YAML, measured for real in this process,
its factored state estimated tensor by tensor as torch keeps it."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.record.identity import measured_config, point_id_of
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World
from nanogpt.validate import check

from .conftest import with_micro


def spec_of(*overrides: str):
    point = ["optimizer=adafactor", "bench.diagnose=false", *overrides]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose("config", overrides=with_micro(point)))


def test_an_adafactor_point_is_ok_and_its_state_estimate_is_torchs(tmp_path):
    spec = spec_of()
    check(spec)
    record = measure(
        spec, torch.device("cpu"), World(), Ceilings(Peak(None, "unknown")), tmp_path, []
    )
    assert record.status == "ok", record.error
    part = record.optimizer
    assert part.optimizer_stepped == "Adafactor"
    roles = part.optimizer_roles
    assert {r["stepped_by"] for r in roles.values()} == {"Adafactor"}
    assert roles["scalars"]["weight_decay"] == 0.0
    # a matrix keeps a row and a column vector: far less than AdamW's 8 bytes a parameter
    for role, r in roles.items():
        step_counters = 4 * r["tensors"]  # torch's scalar step a tensor, left out of the rule
        assert r["state_bytes_est"] == r["state_bytes"] - step_counters, role
    n_params = record.setup.n_params
    assert record.setup.mem_estimate["optimizer_state"] < 8 * n_params / 4
    assert record.setup.mem_estimate["optimizer_state_rule"] == (
        "bytes a parameter: Adafactor 4 x (rows + columns) a matrix, 4 a vector's element"
    )


def test_its_args_are_the_point_and_adamws_keys_are_not():
    spec = spec_of()
    optimizer = measured_config(spec)["optimizer"]
    assert optimizer["args"] == {"beta2_decay": -0.8, "d": 1.0}
    assert not {"betas", "momentum", "adjust_lr_fn"} & set(optimizer)
    assert point_id_of(spec_of("optimizer.betas=[0.5,0.6]")) == point_id_of(spec)
    assert point_id_of(spec_of("optimizer.args.d=2.0")) != point_id_of(spec)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["optimizer.impl=fused"],
            "optimizer.impl: fused is no implementation of torch.optim.Adafactor",
        ),
        (["optimizer.args.beta2_decay=0.5"], "optimizer.args.beta2_decay: is 0.5 but"),
    ],
)
def test_what_adafactor_refuses_is_one_line_before_any_point(overrides, says):
    with pytest.raises(ConfigError) as err:
        check(spec_of(*overrides))
    assert str(err.value).startswith(says) and "\n" not in str(err.value)
