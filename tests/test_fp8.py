"""perf.fp8: which Linears torchao converts, the validation that runs before any point, and (on
a GPU of compute capability 8.9+) a real float8 point. The conversion itself is torchao's, run
for real on CPU: only its float8 matmuls need the GPU."""

from __future__ import annotations

import pytest
import torch.nn as nn

from nanogpt.config.spec import Fp8
from nanogpt.train import float8
from nanogpt.train.gpt import GPT, GPTConfig

from .conftest import sweep_refusal

# A string: pytest evaluates it as the test is set up, so only the worker that runs these tests
# imports torchao (half a second), not every worker as it collects the suite
needs_torchao = pytest.mark.skipif("float8.torchao_missing() is not None", reason="needs torchao")


LINEARS = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


def _gpt(n_embd: int = 64) -> GPT:
    return GPT(GPTConfig(block_size=16, vocab_size=256, n_layer=2, n_head=2, n_embd=n_embd))


def test_the_filter_keeps_the_head_and_dimensions_float8_cannot_take():
    layers = float8.plan(_gpt())
    assert "lm_head" not in layers["converted"]
    assert {"layer": "lm_head", "reason": float8.kept_reason(nn.Linear(64, 256), "lm_head")} in (
        layers["kept"]
    )
    assert set(layers["converted"]) == {
        f"blocks.{i}.{name}"
        for i in (0, 1)
        for name in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    # n_embd 40: 40 % 16 != 0, so no block Linear converts; each is kept with its dimensions.
    odd = float8.plan(_gpt(n_embd=40))
    assert odd["converted"] == []
    assert any("not multiples of 16" in k["reason"] for k in odd["kept"])
    assert float8.fp8_filter(nn.Linear(32, 48), "blocks.0.mlp.fc")
    assert not float8.fp8_filter(nn.Linear(32, 50), "blocks.0.mlp.fc")
    assert not float8.fp8_filter(nn.Embedding(4, 16), "wte")


@needs_torchao
@pytest.mark.parametrize("recipe", [Fp8.tensorwise, Fp8.rowwise])
def test_torchao_converts_exactly_the_planned_layers(recipe):
    from torchao.float8.float8_linear import Float8Linear

    model = _gpt()
    layers = float8.convert(model, recipe)
    swapped = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == set(layers["converted"]) and len(swapped) == 8
    assert type(model.lm_head) is nn.Linear
    assert model.lm_head.weight is model.wte.weight  # the tie survives the swap


def test_every_torchao_recipe_is_a_choice_and_back():
    if float8.torchao_missing():
        pytest.skip("needs torchao")
    from torchao.float8.config import Float8LinearRecipeName

    assert {r.value for r in Float8LinearRecipeName} == {f.value for f in Fp8} - {"none"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["perf.fp8=tensorwise", "perf.dtype=fp32"], "set perf.dtype=bf16"),
        (["perf.fp8=tensorwise", "perf.dtype=bf16"], "set perf.compile=true with it"),
        (
            ["perf.fp8=rowwise", "perf.dtype=bf16", "perf.compile=true"],
            "float8 matmuls need a CUDA GPU, not cpu",
        ),
    ],
)
def test_fp8_where_it_cannot_run_is_one_line_before_any_point(overrides, message):
    # In-process; exit 2 and nothing written: tests/conftest.py sweep_refusal says where.
    line = sweep_refusal("perf.batch_size=1,2", *overrides)
    assert "\n" not in line
    assert line.startswith("error: point 1 of 2") and " perf.fp8: " in line and message in line


def test_an_fp8_point_has_no_mfu_with_the_reason_and_beating_bf16_matmuls_flags_nothing():
    import warnings

    from nanogpt.analysis import derive
    from nanogpt.analysis.derive import Ceilings, Peak
    from nanogpt.record import Record, Setup, Timing
    from nanogpt.record.asked import Asked

    setup = Setup(
        world_size=1,
        tokens_per_step=1000,
        flops_per_token=1_000_000_000,
        flops_per_token_hw=1_300_000_000,
    )
    # 1e12 FLOP in 1 ms is 1 PFLOP/s: above the 0.8 PFLOP/s the bf16 calibration measured.
    ceilings = Ceilings(Peak(0.989e15, "datasheet"), achievable_flops=0.8e15)

    def point(fp8: str) -> Record:
        asked = Asked(dtype="bf16", compile=True, activation_checkpointing=True, fp8=fp8)
        timing = Timing(step_ms_median=1.0, first_step_ms=1.0)
        return Record(asked=asked, setup=setup, timing=timing)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "the FLOP count or the timing is wrong" warning
        fp8 = derive.rates(point("tensorwise"), ceilings)
    # torchtitan's rule since PR #2451: no MFU under float8; what was achieved stays
    assert fp8.mfu is None and fp8.hfu is None and fp8.mfu_note == derive.FP8_NO_MFU
    assert fp8.achieved_tflops == pytest.approx(1000.0)
    assert fp8.mfu_achievable == pytest.approx(1.25) and fp8.mfu_flag is None
    assert "mfu" not in derive.window_rates(setup, 1.0, ceilings, fp8=True)
    with pytest.warns(UserWarning, match="mfu_flag is set"):
        bf16 = derive.rates(point("none"), ceilings)
    assert bf16.mfu == pytest.approx(1e15 / 0.989e15) and bf16.hfu is not None
    assert bf16.mfu_note is None and "mfu" in derive.window_rates(setup, 1.0, ceilings)
    assert bf16.mfu_flag is True  # the same figures without float8 are impossible


@pytest.mark.slow  # a fresh interpreter: torchao's import-time lines come once a process
def test_torchao_is_imported_without_its_import_time_warnings():
    """torchao's import logs torch's register_constant() deprecation (its Enums) and its own
    "Failed to load" kernel lines on a machine like this one: a user reads them as the runner's.
    Imported where the project imports it (train/float8.py, under perf.fp8), none is printed,
    and the loggers are left as they were."""
    import subprocess
    import sys

    if float8.torchao_missing() is not None:
        pytest.skip("torchao is not installed (the fp8 extra)")
    bare = subprocess.run(
        [sys.executable, "-c", "import torchao.float8"], capture_output=True, text=True, timeout=120
    )
    if "register_constant" not in bare.stderr and "Failed to load" not in bare.stderr:
        pytest.skip("this torch and torchao print nothing at torchao's import: nothing to quiet")
    script = (
        "import logging; from nanogpt.train import float8; "
        "assert float8.torchao_missing() is None; "
        "print([logging.getLogger(n).level for n in float8.TORCHAO_IMPORT_NOISE])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "register_constant" not in done.stderr and "Failed to load" not in done.stderr
    assert done.stdout.strip() == "[0, 0]", done.stdout
