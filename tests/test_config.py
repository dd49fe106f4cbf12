"""Composition with Hydra's compose API against the structured-config schema."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import Attention, Dtype, Objective, RunSpec, spec_from_dict, spec_to_dict
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR, runs_here
from nanogpt.hardware.devices import resolve_device
from nanogpt.train.flops import counted_head_share
from nanogpt.train.gpt import GPTConfig
from nanogpt.validate import check

from .conftest import with_micro


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_defaults_compose_to_a_valid_spec():
    spec = to_spec(composed("bench.device=cpu"))
    assert isinstance(spec, RunSpec)
    assert spec.model.name == "nano-1k" and spec.perf.dtype is Dtype.fp32
    assert spec.perf.compile is False and spec.bench.isolate is True


def test_the_default_model_is_the_one_the_device_is_for():
    # On CPU nano-1k at batch 8, a GPT's split of FLOPs (the blocks most, the head a quarter
    # or less, as GPT-2 124M's 27 %); on CUDA nanoGPT bench.py's GPT-2 124M, block 1024, batch
    # 12. Composed, not validated: this machine may have no GPU.
    cpu = OmegaConf.to_object(composed("bench.device=cpu"))
    assert (cpu.model.name, cpu.model.n_layer, cpu.perf.batch_size) == ("nano-1k", 4, 8)
    assert "nano-1k" in cpu.model.chosen_by
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    shape = {k: v for k, v in dataclasses.asdict(cpu.model).items() if k in fields}
    assert counted_head_share(GPTConfig(**shape)) < 0.3
    gpu = OmegaConf.to_object(composed("bench.device=cuda:1"))
    m = gpu.model
    # nanoGPT's train.py and bench.py train GPT-2 without biases
    assert (m.name, m.n_layer, m.n_embd, m.block_size, m.bias) == ("gpt2", 12, 768, 1024, False)
    assert gpu.perf.batch_size == 12 and "bench.py" in m.chosen_by
    # An override of a model key still wins; a model picked by name says nothing of a choice.
    assert OmegaConf.to_object(composed("bench.device=cuda", "model.n_layer=2")).model.n_layer == 2
    assert OmegaConf.to_object(composed("bench.device=cuda", "model=nano")).model.chosen_by is None


@pytest.mark.parametrize(
    "name,layers,heads,width",
    [
        ("gpt2", 12, 12, 768),
        ("gpt2-medium", 24, 16, 1024),
        ("gpt2-large", 36, 20, 1280),
        ("gpt2-xl", 48, 25, 1600),
    ],
)
def test_gpt2_family_shapes(name, layers, heads, width):
    m = to_spec(composed(f"model={name}")).model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) == (
        layers,
        heads,
        width,
        1024,
        50304,
    )


def test_enum_choices_parse():
    spec = to_spec(composed("perf.dtype=bf16", "perf.attention=manual"))
    assert spec.perf.dtype is Dtype.bf16 and spec.perf.attention is Attention.manual


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.n_layers=3", "n_layers"),
        ("perf.dtype=fp8", "perf.dtype"),
        ("perf.batch_size=big", "perf.batch_size"),
        ("model=gpt5", "model"),
    ],
)
def test_schema_rejects_bad_keys_and_types_at_composition(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        composed(override)
    assert key in str(err.value) or key in str(err.value.__cause__)


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.n_embd=33", "model.n_embd"),
        ("perf.batch_size=0", "perf.batch_size"),
        ("perf.dtype=tf32", "perf.dtype"),
        ("perf.attention=efficient", "perf.attention"),
        ("bench.device=cuda", "bench.device"),
        ("perf.compile_mode=fast", "perf.compile_mode"),
        ("bench.inject_fault=boom", "bench.inject_fault"),
    ],
)
def test_cross_field_checks_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        to_spec(composed(*with_micro([override])))
    assert str(err.value).startswith(key)


def test_spec_round_trips_through_json_dict():
    """Every kind of field comes back typed: an Enum, a nested dataclass (optimizer.roles and
    a role), a list of Enums (tune.objective), a plain dict (optimizer.build)."""
    spec = to_spec(
        composed(
            "perf.dtype=fp16",
            "perf.attention=math",
            "optimizer.roles.head.lr=0.5",
            "tune.objective=[tokens_per_s,peak_memory_gib]",
            "optimizer.build._target_=torch.optim.Adagrad",
            "optimizer.build.foreach=true",
        )
    )
    back = spec_from_dict(json.loads(json.dumps(spec_to_dict(spec))))
    assert back == spec and back.optimizer.roles.head.lr == 0.5
    assert back.tune.objective == [Objective.tokens_per_s, Objective.peak_memory_gib]


@pytest.mark.parametrize(
    "override,key",
    [
        ("optimizer.lr=-1", "optimizer.lr"),
        ("optimizer.lr=nan", "optimizer.lr"),
        ("optimizer.betas=[2,3]", "optimizer.betas"),
        ("optimizer.betas=[0.9]", "optimizer.betas"),
        ("optimizer.weight_decay=-0.1", "optimizer.weight_decay"),
        ("optimizer.momentum=-1", "optimizer.momentum"),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("bench.min_measure_steps=5", "bench.min_measure_steps"),  # with measure_steps=4
        ("logger.init_timeout_s=0", "logger.init_timeout_s"),
    ],
)
def test_values_the_run_would_reject_later_fail_before_it(override, key):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        to_spec(composed(*with_micro([override])))


def test_points_for_other_machines_are_not_checked_against_this_ones_devices():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")  # hydra/launcher=local
    # A SLURM sweep is submitted from a login node that may have no GPU: its points are
    # validated before submission, but not against the login node's devices.
    spec = OmegaConf.to_object(composed("bench.device=cuda", "perf.dtype=tf32"))
    check(spec, here=False)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        basic = compose(config_name="config", return_hydra_config=True)
        local = compose("config", ["hydra/launcher=local"], return_hydra_config=True)
        slurm = compose("config", ["hydra/launcher=slurm"], return_hydra_config=True)
    # submitit's local executor runs the points on this machine, SLURM on the cluster's
    assert runs_here(basic) and runs_here(local) and not runs_here(slurm)


@pytest.mark.parametrize(("name", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_a_cuda_device_is_resolved_with_its_index(name, index):
    # torch.cuda.set_device and the allocator's memory fraction look the index up with this
    # function and refuse a bare `cuda`; the default bench.device (auto) and every CUDA preset
    # give one. Building a torch.device needs no GPU.
    device = resolve_device(name)
    assert torch.cuda._utils._get_device_index(device) == index


def test_a_job_composed_by_point_configs_is_the_one_hydra_composes(monkeypatch):
    """frontend/point_configs.PointConfigs, the loader the sweepers give their launcher and the
    callback's check composes through, composes the config groups once for the jobs that choose
    the same ones and sets each job's values on a copy: every job equals Hydra's own composition
    of it, hydra node and all (the overrides Hydra records, the dirname it makes of them, the
    run's subdir), flags included; what it cannot set on a copy Hydra composes whole, and a
    value that does not fit fails with Hydra's own error. It pickles (a slot, a SLURM job)."""
    import pickle

    from hydra.core.global_hydra import GlobalHydra

    from nanogpt.frontend.callback import compose_point
    from nanogpt.frontend.point_configs import PointConfigs

    jobs = [
        ["perf.batch_size=3", "model.n_layer=2", "hydra.sweep.subdir=0/run-1"],
        ["perf.batch_size=4", "perf.dtype=bf16"],  # the same groups: no composition of its own
        ["perf.batch_size=2", "model=nano", "hydra.sweep.subdir=1/run-2"],  # another group
        ["+sweep/accum_split=8x2", "optimizer.lr=0.01"],  # a group added
        ["optimizer.betas=[0.8,0.9]"],  # a list: Hydra composes the job whole
        ["bench.warmup_s=${bench.measure_s}"],  # an interpolation, as Hydra keeps it
        ["hydra.job.env_copy=[HOME]", "perf.batch_size=5"],  # a hydra setting: Hydra's
        ["+bench.extra=1"],  # a key added: Hydra's
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        master = compose(
            config_name="config",
            overrides=with_micro(["hydra.job.config.override_dirname.kv_sep=:"]),
            return_hydra_config=True,
        )
        loader = GlobalHydra.instance().config_loader()
        by_hydra = loader.load_sweep_config
        composed = []

        def counted(master_config, overrides):
            composed.append(list(overrides))
            return by_hydra(master_config, overrides)

        monkeypatch.setattr(loader, "load_sweep_config", counted)
        configs = PointConfigs.of(loader)
        assert PointConfigs.of(loader) is configs and PointConfigs.of(configs) is configs
        for job in jobs:
            ours, hydras = configs.load_sweep_config(master, job), by_hydra(master, job)
            assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydras), job
            for cfg in (ours, hydras):  # Hydra's flags: a struct, with a writable hydra node
                assert OmegaConf.is_struct(cfg) and not OmegaConf.is_readonly(cfg.hydra)
        assert ours.hydra.overrides.task == ["+bench.extra=1"]
        assert configs.load_sweep_config(master, jobs[0]).hydra.job.override_dirname == (
            "model.n_layer:2,perf.batch_size:3"
        )
        by_hydra_whole = [jobs[i] for i in (4, 6, 7)]
        assert composed == [[], ["model=nano"], ["+sweep/accum_split=8x2"], *by_hydra_whole]
        # the callback's check composes through the same one: nothing composed again
        composed.clear()
        for_the_check = compose_point(master)
        for_the_check(jobs[1])
        assert composed == []
        with pytest.raises(ConfigCompositionException) as hydras:
            by_hydra(master, ["perf.batch_size=many"])
        with pytest.raises(ConfigCompositionException) as ours:
            for_the_check(["perf.batch_size=many"])
        assert str(ours.value) == str(hydras.value)
        monkeypatch.undo()  # Hydra's own method again (the counter is no module's: no pickle)
        again = pickle.loads(pickle.dumps(configs))
        assert again.loader is not None and again._bases == {}
        assert OmegaConf.to_yaml(again.load_sweep_config(master, jobs[0])) == OmegaConf.to_yaml(
            by_hydra(master, jobs[0])
        )
