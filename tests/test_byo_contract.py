"""The user's own model's contract (model.build, docs/models.md), in this process: what its
forward may return, its hooks, the knobs it refuses, and the bad input's one-line errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import (
    Ac,
    Attention,
    DistConfig,
    Dtype,
    Loss,
    ModelConfig,
    PerfConfig,
    RunSpec,
    Strategy,
)
from nanogpt.train import flops
from nanogpt.train import user_model as byo
from nanogpt.validate import check_model_build


def _spec(tmp_path: Path, name: str, source: str, **build) -> RunSpec:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    model = ModelConfig(
        block_size=16,
        vocab_size=64,
        build={"_target_": f"{name}.Model", **build},
        code_dir=str(tmp_path),
    )
    return RunSpec(model=model)


TINY = """
import torch
from torch import nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self, vocab=64, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.Tanh())])
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.layers[0](self.wte(idx)))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return {RETURN}
"""


@pytest.mark.parametrize(
    "returns, says",
    [
        ("logits", "returned a loss of shape (2, 16, 64), not a scalar"),
        ("{'loss': loss}", "returned a dict, not a loss"),
        ("loss.detach()", "returned a loss without grad"),
        ("loss * float('nan')", "returned a non-finite loss (nan)"),
    ],
)
def test_a_first_step_that_breaks_the_contract_is_one_line(tmp_path, returns, says):
    name = f"contract_{abs(hash(returns))}"
    model = byo.build_user_model(_spec(tmp_path, name, TINY.replace("{RETURN}", returns)))
    idx = torch.randint(0, 64, (2, 16))
    with pytest.raises(ConfigError) as err:
        _, loss = model(idx, idx)
        model.check_loss(loss)  # as the trainer does, on the first step
    assert str(err.value).startswith(f"model.build: {name}.Model(idx, targets) {says}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("returns", ["loss", "(logits, loss)", "type('Out', (), {'loss': loss})"])
def test_the_contracts_three_returns_give_the_loss(tmp_path, returns):
    name = f"ok_{abs(hash(returns))}"
    model = byo.build_user_model(_spec(tmp_path, name, TINY.replace("{RETURN}", returns)))
    idx = torch.randint(0, 64, (2, 16))
    _, loss = model(idx, idx)
    assert loss.dim() == 0 and loss.requires_grad
    assert flops.flops_of(_spec(tmp_path, name, TINY.replace("{RETURN}", returns)), model)[
        "flops_source"
    ].startswith("counted")


HOOKED = (
    TINY.replace("{RETURN}", "loss")
    + """
    def init_weights(self):
        torch.nn.init.constant_(self.head.weight, 0.5)

    def flops_per_token(self, seq_len):
        return 1000 + seq_len
"""
)


def test_init_weights_and_the_flops_hook_are_used(tmp_path):
    spec = _spec(tmp_path, "hooked", HOOKED)
    model = byo.build_user_model(spec)
    assert torch.all(model.inner.head.weight == 0.5)
    assert flops.flops_of(spec, model) == {
        "n_params_flops": model.get_num_params(),
        "flops_per_token": 1016,
        "flops_per_token_hw": None,  # a number: no hardware FLOPs (a dict may hold them)
        "flops_per_token_counted": pytest.approx(flops.counted_per_token(spec, model)),
        "flops_formula": None,
        "flops_source": "hook: flops_per_token(seq_len)",
    }
    assert model.blocks_name == "layers"


@pytest.mark.parametrize(
    "change, says",
    [
        ({"build": {"wrong": 1}}, "model.build: tinyargs.Model(...) refused its arguments: "),
        ({"vocab_size": 128}, "model.vocab_size: is 128 but tinyargs.Model's embedding has 64"),
        ({"perf": PerfConfig(attention=Attention.manual)}, "perf.attention: manual is the"),
        ({"perf": PerfConfig(loss=Loss.chunked)}, "perf.loss: chunked needs the built-in"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(tmp_path, change, says):
    spec = _spec(tmp_path, "tinyargs", TINY.replace("{RETURN}", "loss"), **change.get("build", {}))
    if "vocab_size" in change:
        spec.model.vocab_size = change["vocab_size"]
    if "perf" in change:
        spec.perf = change["perf"]
    with pytest.raises(ConfigError) as err:
        byo.build_user_model(spec)
    assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_a_module_that_fails_at_import_is_named_with_its_error(tmp_path):
    spec = _spec(tmp_path, "broken_import", "import not_installed_anywhere\n\nclass Model: ...\n")
    check_model_build(spec)  # the file is there: the sweep's process does not import it
    with pytest.raises(ConfigError) as err:
        byo.build_user_model(spec)
    assert str(err.value).startswith(
        "model.build._target_: 'broken_import.Model': ModuleNotFoundError: "
        "No module named 'not_installed_anywhere'"
    )


def test_checkpointing_wraps_the_blocks_found_and_fsdp2_without_them_is_refused(tmp_path):
    idx = torch.randint(0, 64, (2, 16))
    counted = {}
    for checkpointed in (False, True):
        spec = _spec(tmp_path, "ckpt", TINY.replace("{RETURN}", "loss"))
        spec.perf = PerfConfig(ac=Ac.full if checkpointed else Ac.none)
        model = byo.build_user_model(spec)
        with FlopCounterMode(display=False) as counter:
            _, loss = model(idx, idx)
            loss.backward()
        counted[checkpointed] = counter.get_total_flops()
    # The block (an 8x8 Linear, tanh) runs its forward again in backward: 2 x B*T x 8 x 8.
    assert counted[True] - counted[False] == 2 * (2 * 16) * 8 * 8
    # wrapped as a module (torch's checkpoint_wrapper), its forward never reassigned; the roles
    # sort the same tensors, and a name is the user's own
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from nanogpt.train.optim import parameter_roles

    assert isinstance(model.blocks[0], CheckpointWrapper) and "forward" not in vars(model.blocks[0])
    assert model.described_blocks() == "layers: 1 x Sequential"
    names = {id(p): byo.user_name(n) for n, p in model.named_parameters()}
    roles = parameter_roles(model, 64)
    assert sorted(names[id(p)] for p in roles["matrices"]) == ["layers.0.0.weight"]
    flat = TINY.replace("{RETURN}", "loss").replace("nn.ModuleList([", "(").replace("])", ")")
    spec = _spec(tmp_path, "noblocks", flat)
    spec.perf = PerfConfig(ac=Ac.full)
    with pytest.raises(ConfigError, match="^perf.ac: needs the model's blocks"):
        byo.build_user_model(spec)
    # FSDP2 shards block by block: without blocks, one line naming the key (where blocks are
    # found it runs: tests/test_fsdp2.py)
    spec.perf, spec.dist = PerfConfig(), DistConfig(nproc=2, strategy=Strategy.fsdp2)
    with pytest.raises(ConfigError) as err:
        byo.build_user_model(spec)
    assert str(err.value).startswith(
        "dist.strategy: needs the model's blocks, and noblocks.Model has no ModuleList of blocks "
        "(looked for transformer.h, "
    )
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "returns, says",
    [
        ("{'loss': loss}", "returned a dict, not a loss; return a scalar loss, (logits, loss)"),
        ("loss * float('inf')", "returned a non-finite loss (inf); see docs/models.md."),
    ],
)
def test_a_point_whose_model_breaks_the_contract_fails_in_one_line(tmp_path, returns, says):
    """Measured for real (in this process): the check runs where the model is, at the first
    step, and the point's record says what came back."""
    from nanogpt.analysis.derive import Ceilings, Peak
    from nanogpt.scenarios.loop import measure
    from nanogpt.train.distributed import World

    name = f"breaks_{abs(hash(returns))}"
    spec = _spec(tmp_path, name, TINY.replace("{RETURN}", returns))
    spec.bench.device, spec.bench.diagnose, spec.perf.batch_size = "cpu", False, 2
    ceilings = Ceilings(Peak(None, "unknown"))
    record = measure(spec, torch.device("cpu"), World(), ceilings, tmp_path, [])
    assert record.status == "error"
    assert record.error.startswith(f"ConfigError: model.build: {name}.Model(idx, targets) {says}")
    assert "\n" not in record.error


def test_a_model_that_cannot_run_on_meta_is_6n_with_attention_not_counted(tmp_path):
    source = TINY.replace("{RETURN}", "loss if loss.item() < 1e9 else loss")
    spec = _spec(tmp_path, "no_meta", source)
    model = byo.build_user_model(spec)
    figures = flops.flops_of(spec, model)
    assert figures["flops_per_token"] == 6 * model.get_num_params()
    assert figures["flops_per_token_counted"] is None
    assert figures["flops_source"].startswith(
        "6N, N = every parameter; attention not counted; not counted on meta ("
    )


CONFIGURED = """
from dataclasses import dataclass

raise RuntimeError("imported: the check must only read this file")

@dataclass
class Config:
    width: int = 8
    depth: int = 1

class Model:
    def __init__(self, config, vocab=64):
        pass

def factory(*, config, **more):
    pass
"""


@pytest.mark.parametrize(
    "build, says",
    [
        (
            {"nope": 1},
            "model.build.nope: is no argument of read_only.Model; use one of config, vocab.",
        ),
        (
            {"config": {"_target_": "read_only.Config", "heads": 2}},
            "model.build.config.heads: is no argument of read_only.Config; use one of depth, "
            "width.",
        ),
        (
            {"config": {"_target_": "read_only.Missing"}},
            "model.build.config._target_: 'read_only.Missing': module read_only has no Missing; "
            "name a class or function that read_only defines.",
        ),
    ],
)
def test_arguments_are_checked_from_the_source_without_running_it(tmp_path, build, says):
    spec = _spec(tmp_path, "read_only", CONFIGURED, **build)
    with pytest.raises(ConfigError) as err:
        check_model_build(spec)
    assert str(err.value) == says
    spec.model.build = {"_target_": "read_only.factory", "anything": 1}  # **more: any key
    check_model_build(spec)


def test_a_search_never_prunes_a_user_model_by_the_built_in_gpts_estimate(tmp_path):
    from nanogpt.tune import fit

    spec = _spec(tmp_path, "searched", TINY.replace("{RETURN}", "loss"))
    assert fit.estimate_bytes(spec) is None  # not the GPT's formula, and nothing imported
    assert fit.misfit(None, fit.Budget(1, "a tiny budget")) is None
    assert fit.estimate_bytes(RunSpec()) > 1  # the built-in GPT is still estimated


def test_a_model_kept_in_the_users_config_dir_is_composed_and_built(tmp_path):
    """conf/model/mygpt.yaml in the user's own config dir (`--config-dir ./conf model=mygpt`;
    here Hydra's search path, as --config-dir sets it), the runner's keys passed on by
    interpolation."""
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR

    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mygpt.yaml").write_text(
        "name: mygpt\nblock_size: 16\nvocab_size: 64\n"
        "build:\n  _target_: kept.Model\n  vocab: ${model.vocab_size}\n  width: 8\n"
    )
    (tmp_path / "kept.py").write_text(textwrap.dedent(TINY.replace("{RETURN}", "loss")))
    overrides = [
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "model=mygpt",
        "model.vocab_size=32",
        "bench.device=cpu",
        f"model.code_dir={tmp_path}",
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        spec = to_spec(compose(config_name="config", overrides=overrides))
    assert spec.model.name == "mygpt"
    assert spec.model.build == {"_target_": "kept.Model", "vocab": 32, "width": 8}
    model = byo.build_user_model(spec)
    assert model.inner.wte.num_embeddings == 32


def test_nanochats_estimate_flops_hook_is_used(tmp_path):
    source = (
        TINY.replace("{RETURN}", "loss")
        + "\n    def estimate_flops(self):\n        return 4242.4\n"
    )
    spec = _spec(tmp_path, "nanochat_like", source)
    figures = flops.flops_of(spec, byo.build_user_model(spec))
    assert figures["flops_per_token"] == 4242
    assert figures["flops_source"] == "hook: estimate_flops()"


# Contract breaks a user meets before any step, each its own model, run by one real multirun.
BREAKS = """
import torch
from torch import nn
import torch.nn.functional as F


class Base(nn.Module):
    def __init__(self, vocab=256, width=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([nn.Linear(width, width)])
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.layers[0](self.wte(idx)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class NoTargets(Base):
    def forward(self, idx):
        return self.head(self.layers[0](self.wte(idx)))


class OnMeta(Base):
    def __init__(self):
        with torch.device("meta"):
            super().__init__()


class Raises(Base):
    def __init__(self):
        super().__init__()
        raise RuntimeError("width must divide the heads")


class InitRaises(Base):
    def init_weights(self):
        raise ValueError("no such init")
"""
BROKEN = {
    "NoTargets": "breaks.NoTargets.forward(idx) does not take (idx, targets); wrap it in a "
    "module whose forward(idx, targets) returns the loss",
    "OnMeta": "breaks.OnMeta left its parameters on the meta device and has no init_weights() "
    "to give them values; define init_weights()",
    "Raises": "breaks.Raises(...) raised RuntimeError: width must divide the heads at "
    "breaks.py:33; fix its constructor where it raised",
    "InitRaises": "breaks.InitRaises.init_weights() raised ValueError: no such init at "
    "breaks.py:38; fix its init_weights() where it raised",
}


@pytest.fixture(scope="module")
def broken_sweep(tmp_path_factory):
    from .conftest import run_cli, with_micro

    root = tmp_path_factory.mktemp("breaks")
    (root / "breaks.py").write_text(BREAKS)
    targets = ",".join(f"breaks.{name}" for name in BROKEN)
    proc = run_cli(
        "-m",
        *with_micro([f"model.build._target_={targets}"]),
        f"hydra.sweep.dir={root / 'sweep'}",
        cwd=root,
    )
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("name", BROKEN)
def test_a_contract_break_is_one_line_naming_model_build(broken_sweep, name):
    assert broken_sweep.returncode != 0
    out = broken_sweep.stdout + broken_sweep.stderr
    assert "Traceback" not in out
    (line,) = [
        line for line in out.splitlines() if line.startswith("[error]") and f"breaks.{name}" in line
    ]
    assert f"ConfigError: model.build: {BROKEN[name]}" in line


def test_an_fp16_model_under_perf_dtype_fp16_is_refused_in_one_line(tmp_path):
    source = TINY.replace("{RETURN}", "loss").replace(
        "self.head = nn.Linear(width, vocab)", "self.head = nn.Linear(width, vocab).half()"
    )
    spec = _spec(tmp_path, "halves", source)
    spec.perf = PerfConfig(dtype=Dtype.fp16)
    with pytest.raises(ConfigError) as err:
        byo.build_user_model(spec)
    assert str(err.value) == (
        "perf.dtype: fp16 trains with a GradScaler, which cannot unscale fp16 gradients, and "
        "halves.Model keeps 2 parameters in fp16 (head.weight, ...); keep the model's parameters "
        "in fp32 (autocast runs its matmuls in fp16), or use perf.dtype=bf16."
    )
    spec.perf = PerfConfig(dtype=Dtype.bf16)
    byo.build_user_model(spec)  # bf16 needs no scaler


def test_a_model_built_on_meta_with_init_weights_is_materialised(tmp_path):
    source = TINY.replace("{RETURN}", "loss") + textwrap.indent(
        textwrap.dedent("""
        @classmethod
        def on_meta(cls):
            with torch.device("meta"):
                return cls()

        def init_weights(self):
            for p in self.parameters():
                torch.nn.init.normal_(p, std=0.02)
        """),
        "    ",
    )
    spec = _spec(tmp_path, "meta_built", source)
    spec.model.build = {"_target_": "meta_built.Model.on_meta"}
    model = byo.build_user_model(spec)
    assert not any(p.is_meta for p in model.parameters())
