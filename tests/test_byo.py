"""The user's own model (model.build, docs/models.md): a module written outside the package,
swept for real from its directory, and the contract's and the bad input's one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.errors import ConfigError
from nanogpt.measure import byo
from nanogpt.results.identity import measured_config, point_id_of
from nanogpt.spec import Attention, Loss, ModelConfig, PerfConfig, RunSpec
from nanogpt.validate import check_model_build

from .conftest import with_micro

# A modern GPT (RoPE, RMSNorm, grouped-query attention), as a user keeps it beside their
# command. It notes each process that imports it: the sweep's own process must not.
MODERN_GPT = """
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

with open(__file__ + ".imported", "a") as marker:
    marker.write(f"{os.getpid()}\\n")


@dataclass
class Config:
    vocab_size: int = 256
    block_size: int = 16
    n_layer: int = 1
    n_head: int = 4
    n_kv_head: int = 2
    n_embd: int = 32


def rope(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv, self.d = c.n_head, c.n_kv_head, c.n_embd // c.n_head
        self.norm1, self.norm2 = nn.RMSNorm(c.n_embd), nn.RMSNorm(c.n_embd)
        self.q = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.kv_proj = nn.Linear(c.n_embd, 2 * self.kv * self.d, bias=False)
        self.o = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.up = nn.Linear(c.n_embd, 4 * c.n_embd, bias=False)
        self.down = nn.Linear(4 * c.n_embd, c.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.h, self.d).transpose(1, 2)
        k, v = self.kv_proj(h).view(B, T, 2, self.kv, self.d).unbind(2)
        q, k = rope(q, cos, sin), rope(k.transpose(1, 2), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.relu(self.up(self.norm2(x))).square())


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.transformer = nn.ModuleDict({"h": blocks})
        self.norm = nn.RMSNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        d = config.n_embd // config.n_head
        inverse = 1e4 ** -(torch.arange(0, d, 2) / d)
        angles = torch.outer(torch.arange(config.block_size).float(), inverse)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.transformer.h:
            x = block(x, self.cos[: idx.shape[1]], self.sin[: idx.shape[1]])
        logits = self.lm_head(self.norm(x)).float()
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
"""
BUILD = [
    "model.build._target_=modern_gpt.GPT",
    "model.build.config._target_=modern_gpt.Config",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.block_size=${model.block_size}",
]


@pytest.fixture(scope="module")
def byo_sweep(tmp_path_factory):
    """BUILD swept over two dtypes by a real `python -m nanogpt.run -m`, run from the directory
    that holds modern_gpt.py: (the sweep process's pid, the user's dir, the sweep dir)."""
    root = tmp_path_factory.mktemp("byo")
    (root / "modern_gpt.py").write_text(MODERN_GPT)
    sweep_dir = root / "sweep"
    args = [*with_micro([*BUILD, "perf.dtype=fp32,bf16"]), f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanogpt.run", "-m", *args],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return proc.pid, root, sweep_dir


@pytest.mark.slow
def test_a_users_modern_gpt_is_swept_with_honest_figures(byo_sweep):
    sweep_pid, root, sweep_dir = byo_sweep
    records = [json.loads((sweep_dir / str(i) / "result.json").read_text()) for i in (0, 1)]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert {r["dtype"] for r in records} == {"fp32", "bf16"}
    for r in records:
        assert r["model"] == "modern_gpt.GPT"  # not model=auto's nano-1k
        assert r["flops_source"].startswith("counted: FlopCounterMode")
        assert r["flops_per_token"] == round(r["flops_per_token_counted"]) > 0
        assert r["flops_per_token"] != 6 * r["n_params"]  # counted, attention included
        estimate = r["mem_estimate"]
        assert estimate["weights"] == estimate["gradients"] == 4 * r["n_params"]
        assert estimate["optimizer_state"] == 8 * r["n_params"]  # AdamW's two fp32 moments
        assert estimate["activations"] is None and "not estimated" in estimate["note"]
        assert r["mem_estimate_bytes"] is None  # never the built-in GPT's formula
        assert r["tokens_per_s"] > 0 and r["mfu"] is not None
    # User code ran only where points were measured, never in the sweep's process.
    importers = {int(p) for p in (root / "modern_gpt.py.imported").read_text().split()}
    assert importers and sweep_pid not in importers


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from nanogpt.app import to_spec
    from nanogpt.configs import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose(config_name="config", overrides=overrides))


@pytest.mark.slow
def test_the_point_follows_the_models_source(byo_sweep, tmp_path):
    _, root, sweep_dir = byo_sweep
    record = json.loads((sweep_dir / "0" / "result.json").read_text())
    user = tmp_path / "user"
    user.mkdir()
    (user / "modern_gpt.py").write_text(MODERN_GPT)
    overrides = [*with_micro([*BUILD, "perf.dtype=fp32"]), f"model.code_dir={user}"]
    spec = _compose(overrides)
    assert spec.model.build["config"]["block_size"] == 16  # interpolated, plain values
    assert point_id_of(spec) == record["point_id"]  # the same code: a resume skips it
    (user / "modern_gpt.py").write_text(MODERN_GPT + "\n# one more line\n")
    assert point_id_of(spec) != record["point_id"]  # changed: measured again


def test_without_build_the_builtin_gpts_point_is_unchanged():
    """model.build and model.code_dir are left out of a built-in point's identity, so the
    points recorded before them keep their point_id (a resume finds them)."""
    measured = measured_config(RunSpec())["model"]
    assert not {"build", "code_dir", "build_source"} & set(measured)


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
    assert byo.flops_of(_spec(tmp_path, name, TINY.replace("{RETURN}", returns)), model)[
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
    assert byo.flops_of(spec, model) == {
        "n_params_flops": model.get_num_params(),
        "flops_per_token": 1016,
        "flops_per_token_counted": pytest.approx(byo._counted(spec)),
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
    spec = _spec(tmp_path, "broken_import", "import not_installed_anywhere\n")
    check_model_build(spec)  # the file is there: the sweep's process does not import it
    with pytest.raises(ConfigError) as err:
        byo.build_user_model(spec)
    assert str(err.value).startswith(
        "model.build._target_: 'broken_import.Model': ModuleNotFoundError: "
        "No module named 'not_installed_anywhere'"
    )


@pytest.mark.slow
def test_a_target_that_is_not_there_stops_the_sweep_before_anything(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanogpt.run",
            "-m",
            "model.build._target_=nosuch.GPT",
            *with_micro(["perf.dtype=fp32,bf16"]),
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        len(lines) == 1 and "model.build._target_: 'nosuch.GPT': no module nosuch in " in (lines[0])
    ), lines
    assert not sweep_dir.exists()


def test_activation_checkpointing_wraps_the_blocks_found_or_is_refused(tmp_path):
    idx = torch.randint(0, 64, (2, 16))
    counted = {}
    for checkpointed in (False, True):
        spec = _spec(tmp_path, "ckpt", TINY.replace("{RETURN}", "loss"))
        spec.perf = PerfConfig(activation_checkpointing=checkpointed)
        model = byo.build_user_model(spec)
        with FlopCounterMode(display=False) as counter:
            _, loss = model(idx, idx)
            loss.backward()
        counted[checkpointed] = counter.get_total_flops()
    # The block (an 8x8 Linear, tanh) runs its forward again in backward: 2 x B*T x 8 x 8.
    assert counted[True] - counted[False] == 2 * (2 * 16) * 8 * 8
    flat = TINY.replace("{RETURN}", "loss").replace("nn.ModuleList([", "(").replace("])", ")")
    spec = _spec(tmp_path, "noblocks", flat)
    spec.perf = PerfConfig(activation_checkpointing=True)
    with pytest.raises(
        ConfigError, match="^perf.activation_checkpointing: needs the model's blocks"
    ):
        byo.build_user_model(spec)


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
    from nanogpt.distributed import World
    from nanogpt.measure.loop import measure
    from nanogpt.results.derive import Ceilings, Peak

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
    figures = byo.flops_of(spec, model)
    assert figures["flops_per_token"] == 6 * model.get_num_params()
    assert figures["flops_per_token_counted"] is None
    assert figures["flops_source"].startswith(
        "6N, N = every parameter; attention not counted; not counted on meta ("
    )
