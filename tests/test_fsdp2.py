"""dist.strategy=fsdp2 for real: two gloo ranks on CPU (torch.multiprocessing).

The sharded run is checked against the arithmetic it must equal: one unsharded model, stepped
by AdamW on the mean of both ranks' gradients. The same two ranks then train a user's own model
(model.build, the modern GPT of benchmarks/modern_gpt.py): its blocks are found without being
named (transformer.h, as nanoGPT keeps them), each is sharded, then the root. A user's model
without blocks is refused in one line: tests/test_byo_contract.py. A sweep point under torchrun
with FSDP2 is one of tests/test_scale.py's torchrun points (beside DDP's, whose figures it is
checked against).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from nanogpt import validate
from nanogpt.config.errors import ConfigError
from nanogpt.config.protocol import CUDA_GRAPH_MODES
from nanogpt.config.spec import Ac, DistConfig, Loss, ModelConfig, PerfConfig, RunSpec, Strategy
from nanogpt.publish import plots
from nanogpt.train.distributed import World
from nanogpt.train.gpt import GPT, Block
from nanogpt.train.memory_estimate import estimate_memory
from nanogpt.train.optim import build_optimizer
from nanogpt.train.trainer import Trainer, data_source, gpt_config

from .conftest import REPO, sweep_refusal

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

STEPS = 2  # optimizer steps each case trains, sharded and in its reference


def _spec(**perf) -> RunSpec:
    return RunSpec(
        model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256),
        perf=PerfConfig(batch_size=2, grad_accum=2, **perf),
        dist=DistConfig(nproc=2, strategy=Strategy.fsdp2),
    )


def _users_spec(code_dir: str) -> RunSpec:
    """The same shape as _spec's GPT, but the user's modern GPT, built from code_dir."""
    build = {
        "_target_": "modern_gpt.GPT",
        "config": {
            "_target_": "modern_gpt.Config",
            "vocab_size": 256,
            "block_size": 16,
            "n_layer": 2,
            "n_embd": 32,
        },
    }
    return RunSpec(
        model=ModelConfig(block_size=16, vocab_size=256, build=build, code_dir=code_dir),
        perf=PerfConfig(batch_size=2, grad_accum=2),
        dist=DistConfig(nproc=2, strategy=Strategy.fsdp2),
    )


def _step_on_mean_gradient(model, optimizer, spec: RunSpec) -> dict[str, torch.Tensor]:
    """What two data-parallel ranks must compute: their batches' mean gradient, one model."""
    sources = [
        data_source(spec, torch.device("cpu"), World(rank=r, size=2), spec.perf.batch_size)
        for r in (0, 1)
    ]
    for _ in range(STEPS):
        for source in sources:
            for _ in range(spec.perf.grad_accum):
                x, y = source.next_batch()
                _, loss = model(x, y)
                (loss / spec.perf.grad_accum / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optimizer.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {n: p.detach() for n, p in model.named_parameters()}


def _reference(spec: RunSpec) -> dict[str, torch.Tensor]:
    """The built-in GPT, built by hand (the seed, the model, the optimizer), unsharded."""
    torch.manual_seed(spec.bench.seed)
    model = GPT(gpt_config(spec))
    return _step_on_mean_gradient(model, build_optimizer(model, spec.optimizer), spec)


def _users_reference(spec: RunSpec) -> dict[str, torch.Tensor]:
    """A user's model, built as a Trainer builds it (the same seed, the same optimizer's
    groups), on one rank."""
    one = Trainer(dataclasses.replace(spec, dist=DistConfig()), torch.device("cpu"), World())
    return _step_on_mean_gradient(one.raw_model, one.optimizer, spec)


def _train(rank: int, port: int, out_dir, perfs: dict[str, dict], code_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    world = World.from_env()
    world.init()
    seen = {name: _train_one(world, perf) for name, perf in perfs.items()}
    seen["users_model"] = _train_users_model(world, code_dir)
    for case, one in seen.items():  # each a model, trainer and optimizer of its own
        (out_dir / f"rank{rank}_{case}.json").write_text(json.dumps(one))
    world.exit(0)  # as the package's ranks end (World.exit)


def _trained(spec: RunSpec, world: World) -> tuple[Trainer, dict[str, int]]:
    """A sharded Trainer after STEPS steps, and each parameter's local shard size at the start."""
    trainer = Trainer(spec, torch.device("cpu"), world)
    local = {n: p.to_local().numel() for n, p in trainer.raw_model.named_parameters()}
    for _ in range(STEPS):
        trainer.step()
    return trainer, local


def _against(trainer: Trainer, local: dict, spec: RunSpec, reference) -> dict:
    """The sharded parameters, gathered whole, against the unsharded reference's (built after
    the gather: with the gather the ranks' last collective before shutdown, about one run in
    five aborted at exit, "terminate called without an active exception")."""
    full = {n: p.full_tensor() for n, p in trainer.raw_model.named_parameters()}
    ref = reference(spec)
    return {
        "wrapping": trainer.model_wrapping,
        "local": local,
        "global": {n: p.numel() for n, p in full.items()},
        "max_error": max((full[n] - ref[n]).abs().max().item() for n in ref),
        "same_names": sorted(full) == sorted(ref),
    }


def _train_one(world: World, perf: dict) -> dict:
    spec = _spec(**perf)
    trainer, local = _trained(spec, world)
    # Which blocks stay gathered between forward and backward: their parameters are plain
    # (unsharded) tensors then, not DTensor shards.
    loss = trainer.loss(*trainer.source.next_batch())
    gathered = [
        i
        for i, block in enumerate(trainer.raw_model.blocks)
        if not isinstance(block.attn.qkv.weight, DTensor)
    ]
    loss.backward()
    trainer.optimizer.zero_grad(set_to_none=True)
    return _against(trainer, local, spec, _reference) | {
        "gathered_after_forward": gathered,
        "state_local": sum(
            s.to_local().numel()
            for state in trainer.optimizer.state.values()
            for s in state.values()
            if hasattr(s, "to_local")
        ),
    }


def _train_users_model(world: World, code_dir: str) -> dict:
    spec = _users_spec(code_dir)
    trainer, local = _trained(spec, world)
    seen = _against(trainer, local, spec, _users_reference)
    return seen | {"blocks": trainer.raw_model.blocks_name}


PERFS = {
    "plain": {},
    "checkpointed_chunked": {
        "ac": Ac.full,
        "loss": Loss.chunked,
        "loss_chunk": 8,
    },
    "selective": {"ac": Ac.selective},  # torch's selective contexts inside a sharded block
    "every": {"ac": Ac.every},  # block 0 checkpointed, block 1 not
}


@pytest.fixture(scope="module")
def fsdp2_ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Each of PERFS, then a user's model, trained by the same two spawned ranks, one after the
    other (one process group; two fresh interpreters importing torch cost more than the
    training): per case, what each rank saw."""
    out_dir = tmp_path_factory.mktemp("fsdp2_ranks")
    shutil.copy(REPO / "benchmarks" / "modern_gpt.py", out_dir / "modern_gpt.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_train, args=(port, out_dir, PERFS, str(out_dir)), nprocs=2)
    return {
        case: [json.loads((out_dir / f"rank{r}_{case}.json").read_text()) for r in (0, 1)]
        for case in [*PERFS, "users_model"]
    }


def _assert_split(ranks: list[dict]) -> None:
    for name, total in ranks[0]["global"].items():
        shards = [r["local"][name] for r in ranks]
        assert sum(shards) == total and max(shards) < total, name  # split, not replicated


@pytest.mark.slow
@pytest.mark.parametrize("case", PERFS)
def test_fsdp2_shards_every_parameter_and_trains_like_one_model_on_the_mean_gradient(
    fsdp2_ranks, case
):
    ranks = fsdp2_ranks[case]
    _assert_split(ranks)
    # AdamW's two moments, sharded with their parameters: together one copy of each, twice.
    assert sum(r["state_local"] for r in ranks) == 2 * sum(ranks[0]["global"].values())
    assert ranks[0]["wrapping"] == "fsdp2(model, block x 2)"
    for r in ranks:
        assert r["same_names"] and r["max_error"] < 1e-5
        # reshard_after_forward frees every block but the last, which backward starts with.
        assert r["gathered_after_forward"] == [1]


@pytest.mark.slow
def test_fsdp2_shards_a_users_model_by_its_blocks_and_trains_like_one_model(fsdp2_ranks):
    ranks = fsdp2_ranks["users_model"]
    for r in ranks:
        assert r["blocks"] == "transformer.h"  # found, not named
        assert r["wrapping"] == "fsdp2(model, block x 2)"
        assert r["same_names"] and r["max_error"] < 1e-5
    _assert_split(ranks)


@pytest.mark.parametrize("mode", CUDA_GRAPH_MODES)
def test_fsdp2_refuses_compile_modes_that_capture_cuda_graphs(mode):
    spec = _spec(compile=True, compile_mode=mode)
    with pytest.raises(ConfigError, match="perf.compile_mode: .*set|use perf.compile_mode=default"):
        validate.check_strategy(spec)
    validate.check_strategy(_spec(compile=True))  # default mode: no graphs, accepted


def test_checkpointing_is_inside_the_blocks_own_call():
    """What block.compile() compiles is the block's call: the recompute must be inside it, so a
    block called once runs its forward twice (once more in backward), with no outside wrapper."""
    block = GPT(gpt_config(_spec(ac=Ac.full))).blocks[0]  # the GPT sets its policy's options
    calls = []
    block.attn.register_forward_hook(lambda *_: calls.append(1))
    block(torch.randn(2, 16, 32, requires_grad=True)).sum().backward()
    assert len(calls) == 2
    calls.clear()
    plain = Block(gpt_config(_spec()))
    plain.attn.register_forward_hook(lambda *_: calls.append(1))
    plain(torch.randn(2, 16, 32, requires_grad=True)).sum().backward()
    assert len(calls) == 1


def test_fsdp2_estimate_counts_unsharded_gradients_kept_across_micro_steps():
    common = dict(
        n_params=1_000_000, n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=256,
        batch_size=2, optimizer="adamw", dtype="bf16", attention="auto",
        activation_checkpointing=False, world_size=2, strategy="fsdp2", n_block_params=800_000,
    )  # fmt: skip
    one = estimate_memory(**common, grad_accum=1)
    two = estimate_memory(**common, grad_accum=2)
    assert "unsharded_gradients" not in one
    assert two["unsharded_gradients"] == 4 * 1_000_000  # every parameter's, fp32, unsharded
    assert two["total"] - one["total"] == 4 * 1_000_000
    # FSDP2 with accumulation and DDP have between them every part the estimate makes: the
    # memory plot stacks each (but the fit's constant, a part only once a GPU's refit gives it
    # a value: train/gpt.py's MemoryFit)
    ddp = estimate_memory(**(common | {"strategy": "ddp"}), grad_accum=2)
    assert (set(two) | set(ddp)) - {"total"} == set(plots.MEMORY_PARTS) - {"fit_constant"}
    assert "unsharded_gradients" not in ddp  # DDP's gradients are whole anyway


def test_fsdp2_with_one_rank_or_fp16_is_one_line_before_any_point_runs():
    # In-process; exit 2 and nothing written: tests/conftest.py sweep_refusal says where.
    line = sweep_refusal("dist.strategy=fsdp2")
    assert "\n" not in line
    assert " dist.strategy: " in line and "dist.nproc=2" in line
