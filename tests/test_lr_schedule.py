"""optimizer.schedule (nanogpt/train/lr_schedule.py): the factor a step, the rate every param group
of a real optimizer steps with, the point's identity and the bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from nanogpt.config.spec import Schedule
from nanogpt.record.identity import measured_config, point_id_of
from nanogpt.train.distributed import World
from nanogpt.train.lr_schedule import lr_factor
from nanogpt.train.trainer import build_trainer

from .conftest import sweep_refusal
from .test_time_to_loss import _spec


def test_each_schedule_has_its_shape_over_the_horizon():
    f = {s: [lr_factor(s, t, 2, 10, 0.2) for t in range(11)] for s in Schedule}
    assert f[Schedule.constant] == [0.5] + [1.0] * 10  # warmup, then flat (no horizon)
    assert f[Schedule.cosine][:3] == [0.5, 1.0, 1.0]  # the 2nd step at the full rate
    assert f[Schedule.cosine][6] == pytest.approx(0.5)  # half way from warmup to the horizon
    assert f[Schedule.cosine][9] == pytest.approx(0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert f[Schedule.cosine][10] == 0.0  # past the horizon: the end of the schedule
    # wsd: flat until the last round(0.2 x 10) = 2 steps, then linear to 0 at the horizon
    assert f[Schedule.wsd] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0]


def test_every_param_group_steps_at_its_own_rate_times_the_factor():
    """Muon's matrices (0.02) and its AdamW part's roles (other rates) decay together: after
    each real step every group's rate is its base times the factor of the next step."""
    spec = _spec(
        "optimizer=muon", "optimizer.schedule=wsd", "optimizer.decay_frac=0.5", "bench.max_steps=4"
    )
    trainer = build_trainer(spec, torch.device("cpu"), World.from_env())
    groups = trainer.optimizer.param_groups
    bases = [g["lr"] for g in groups]
    assert len(set(bases)) > 1  # the roles' rates differ
    seen = []
    for _ in range(4):
        trainer.step()
        seen.append([g["lr"] / b for g, b in zip(groups, bases, strict=True)])
    # the rate each step used: steps 1, 2 flat, then (4 - t) / 2 for t = 2, 3
    assert [row[0] for row in seen] == pytest.approx([1.0, 1.0, 1.0, 0.5])
    assert all(row == pytest.approx([row[0]] * len(row)) for row in seen)  # one factor for all


def test_a_schedule_is_part_of_the_point_and_constant_keeps_old_ids():
    plain = _spec()
    assert "schedule" not in measured_config(plain)["optimizer"]  # old point_ids unchanged
    assert point_id_of(_spec("optimizer.schedule=constant")) == point_id_of(plain)
    ids = {point_id_of(_spec(f"optimizer.schedule={s.value}")) for s in Schedule}
    ids.add(point_id_of(_spec("optimizer.schedule=wsd", "optimizer.decay_frac=0.5")))
    ids.add(point_id_of(_spec("optimizer.warmup_steps=5")))
    assert len(ids) == 5


def test_a_schedule_without_a_horizon_is_refused_in_one_line():
    line = sweep_refusal(
        "optimizer.schedule=cosine", "optimizer.warmup_steps=8", "bench.max_steps=8"
    )
    assert "): optimizer.warmup_steps: is 8, not below the horizon bench.max_steps=8" in line
    line = sweep_refusal("optimizer.schedule=wsd", "bench.max_steps=0")
    assert "): bench.max_steps: is 0, but optimizer.schedule=wsd" in line and "\n" not in line
    line = sweep_refusal("optimizer.schedule=wsd", "optimizer.decay_frac=1.5")
    assert "): optimizer.decay_frac: is 1.5" in line
