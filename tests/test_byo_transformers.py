"""A transformers causal LM as the user's model (model.build, docs/models.md "A transformers
causal LM"): built from its config (no weights downloaded), called as transformers models are
(`input_ids=`, `labels=`), its blocks found, its FLOPs counted, and one point measured compiled
with activation checkpointing. Skipped where transformers is not installed (the optional extra
`transformers`, which `make setup` installs)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils.flop_counter import FlopCounterMode

from nanogpt.train import flops
from nanogpt.train import user_model as byo

from .conftest import REPO, with_micro

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

# Not imported at collection: importing transformers takes seconds, and every xdist worker
# collects every file.
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[transformers]')",
)

# docs/models.md's command, key for key (test_the_docs_run_this below holds them together):
# a Llama of 2 layers, 32 wide, grouped-query attention, sized by the runner's own keys.
LLAMA = [
    "model.build._target_=transformers.AutoModelForCausalLM.from_config",
    "model.build.config._target_=transformers.LlamaConfig",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.max_position_embeddings=${model.block_size}",
    "model.build.config.hidden_size=32",
    "model.build.config.intermediate_size=64",
    "model.build.config.num_hidden_layers=2",
    "model.build.config.num_attention_heads=4",
    "model.build.config.num_key_value_heads=2",
    "model.block_size=16",
    "model.vocab_size=256",
    "perf.ac=full",
]
# GPT-2's architecture, whose blocks sit where nanoGPT's do (transformer.h).
GPT2 = [
    "model.build._target_=transformers.AutoModelForCausalLM.from_config",
    "model.build.config._target_=transformers.GPT2Config",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.n_positions=${model.block_size}",
    "model.build.config.n_embd=32",
    "model.build.config.n_layer=2",
    "model.build.config.n_head=4",
    "model.block_size=16",
    "model.vocab_size=256",
    "perf.ac=full",
]
PLAIN = "perf.ac=none"  # the same model, its blocks not wrapped


def spec_of(overrides: list[str], *more: str):
    """The point composed by Hydra from conf/ and checked, as a sweep composes and checks it
    (the check finds transformers' file without importing it)."""
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.validate import check

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        spec = to_spec(compose("config", overrides=with_micro([*overrides, *more])))
    check(spec)
    return spec


def test_the_docs_run_this():
    text = (REPO / "docs" / "models.md").read_text().replace("'", "")
    assert all(override in text for override in LLAMA), [o for o in LLAMA if o not in text]


@needs_transformers
@pytest.mark.parametrize("overrides, blocks", [(LLAMA, "model.layers"), (GPT2, "transformer.h")])
def test_a_transformers_model_keeps_the_contract(overrides, blocks):
    spec = spec_of(overrides)
    model = byo.build_user_model(spec)
    assert model.hf and model.hf_shifts  # a PreTrainedModel whose loss takes shift_labels
    assert model.blocks_name == blocks and len(model.blocks) == 2  # found without being named
    assert model.config.n_embd == 32
    # transformers' cache kept eager (without it, its mask code reads the position ids on the
    # host every step), dropped compiled (the test below)
    assert (
        model.hf_cache
        and not byo.build_user_model(spec_of(overrides, "perf.compile=true")).hf_cache
    )
    torch.manual_seed(0)
    idx = torch.randint(0, 256, (2, 16))
    targets = torch.randint(0, 256, (2, 16))  # not idx shifted: a second shift would show
    model.eval()  # GPT-2's dropout: the two forwards below see the same function
    _, loss = model(idx, targets)
    # The built-in GPT's loss: each of the T positions scored against its target, once shifted
    # (labels=targets would be shifted again by transformers; labels=idx alone drops the last).
    logits = model.inner(input_ids=idx).logits
    expected = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    torch.testing.assert_close(loss, expected)
    # activation checkpointing wraps each block as a module (torch's checkpoint_wrapper, its
    # forward never reassigned); backward runs the blocks' forward again (counted: more FLOPs
    # than the same model's backward unwrapped; a module hook does not fire in the recompute),
    # and grads reach them
    assert all(isinstance(b, CheckpointWrapper) and "forward" not in vars(b) for b in model.blocks)
    backward_flops = {}
    for checkpointed in (True, False):
        torch.manual_seed(0)
        built = model if checkpointed else byo.build_user_model(spec_of(overrides, PLAIN))
        _, built_loss = built(idx, targets)
        with FlopCounterMode(display=False) as counter:
            built_loss.backward()
        backward_flops[checkpointed] = counter.get_total_flops()
    assert backward_flops[True] > backward_flops[False]
    assert all(p.grad is not None for p in model.blocks[1].parameters())
    figures = flops.flops_of(spec, model)
    assert figures["flops_source"] == "counted: FlopCounterMode, one step on a meta copy"
    assert figures["flops_per_token"] == round(figures["flops_per_token_counted"]) > 0
    # What the counter saw is nanoGPT's formula (PaLM's appendix B): 6 FLOPs a matmul weight
    # (GPT-2's tied head counted as the Linear it is) and 12 L T d for attention's two matmuls.
    matmul_weights = sum(
        m.weight.numel()
        for m in model.modules()
        if not isinstance(m, torch.nn.Embedding) and getattr(m, "weight", None) is not None
        if m.weight.dim() == 2
    )
    assert figures["flops_per_token"] == 6 * matmul_weights + 12 * 2 * 16 * 32


# transformers 5.25 put a deprecation wrapper (utils/deprecation.py, deprecate_kwarg) around each
# decoder layer's forward; inside a checkpointed block its side effect is one Dynamo refuses
# under torch.utils.checkpoint's higher-order op: 6 graph breaks and 2 recompiles for this Llama
# of 2 layers, where 5.24 compiled it in one graph (docs/models.md).
SIDE_EFFECT_FROM = "5.25"


@needs_transformers
@pytest.mark.slow  # Inductor's compile of a Llama: tens of seconds on 2 cores, compile workers
def test_a_transformers_model_is_measured_compiled_with_checkpointed_blocks(tmp_path):
    """The runner's measured loop, in this process: the docs' Llama compiled whole with each
    block checkpointed, called without a cache (use_cache=False; with transformers' default
    cache, each checkpointed layer's write into it is a side effect compiled checkpointing
    refuses: 5 breaks, 2 recompiles). What the record says depends on transformers' version, and
    the test asserts the truth of the one installed: before 5.25 one graph, no break, no
    recompile; from 5.25 the breaks counted and named in words, none of the recompiles inside the
    measured window. Then the documented remedy for 5.25: Dynamo told not to replay forward's side
    effects in the recompute captures the model in one graph again."""
    import transformers
    from packaging.version import Version

    from nanogpt.analysis.derive import Ceilings, Peak
    from nanogpt.scenarios.loop import measure
    from nanogpt.train.distributed import World

    spec = spec_of(LLAMA, "perf.compile=true")
    ceilings = Ceilings(Peak(None, "unknown"))

    record = measure(spec, torch.device("cpu"), World(), ceilings, tmp_path, [])
    assert record.status == "ok", record.error
    assert record.compile.compile_note is None, record.compile.compile_note
    assert record.compile.graphs >= 1 and record.compile.compile_s_counted > 0
    assert record.timing.measured_steps == 4 and record.timing.loss_last > 0
    assert record.asked.model == "transformers.AutoModelForCausalLM.from_config"
    setup = record.setup
    assert setup.model_wrapping.startswith("compile(")
    assert setup.flops_source.startswith("counted: FlopCounterMode")
    assert setup.mem_estimate["weights"] == 4 * setup.n_params
    part = record.compile
    if Version(transformers.__version__) < Version(SIDE_EFFECT_FROM):
        assert (part.graph_breaks, part.recompiles, part.recompiles_in_window) == (0, 0, 0)
    else:
        assert part.graph_breaks > 0 and part.recompiles_in_window == 0
        assert part.graph_break_reasons[0].startswith(
            "a side effect inside a checkpointed block: HOP: Unsafe side effect"
        ), part.graph_break_reasons
        # docs/models.md's remedy on 5.25: the wrapper's side effect is not replayed in the
        # recompute (it only names the function for a warning), and the model is one graph
        # (Dynamo's own explain, its eager backend: the capture without Inductor's compile)
        from nanogpt.train import user_model as byo

        model = byo.build_user_model(spec)
        idx = torch.randint(0, 256, (2, 16))
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
            torch._dynamo.reset()
            remedied = torch._dynamo.explain(model)(idx, idx)
        assert (remedied.graph_count, remedied.graph_break_count) == (1, 0)
