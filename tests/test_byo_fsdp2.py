"""dist.strategy=fsdp2 on a user's own model (model.build): two gloo ranks on CPU, spawned as
tests/test_fsdp2.py spawns them for the built-in GPT. The blocks are found without being named
(the modern GPT keeps them as nanoGPT does, transformer.h), each is sharded, then the root, and
the sharded run equals one unsharded model stepped by AdamW on the mean of both ranks'
gradients. A model without blocks is refused in one line: tests/test_byo_contract.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp

from nanogpt.distributed import World
from nanogpt.measure.trainer import Trainer, data_source
from nanogpt.spec import DistConfig, ModelConfig, PerfConfig, RunSpec, Strategy

from .conftest import REPO

STEPS = 2


def _spec(code_dir: str) -> RunSpec:
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


def _reference(spec: RunSpec) -> dict[str, torch.Tensor]:
    """One unsharded model, built as a Trainer builds it (the same seed, the same optimizer's
    groups), stepped on both ranks' batches' mean gradient."""
    one = Trainer(dataclasses.replace(spec, dist=DistConfig()), torch.device("cpu"), World())
    accum = spec.perf.grad_accum
    sources = [
        data_source(spec, torch.device("cpu"), World(rank=r, size=2), spec.perf.batch_size)
        for r in (0, 1)
    ]
    for _ in range(STEPS):
        for source in sources:
            for _ in range(accum):
                _, loss = one.raw_model(*source.next_batch())
                (loss / accum / 2).backward()
        torch.nn.utils.clip_grad_norm_(one.raw_model.parameters(), spec.optimizer.grad_clip)
        one.optimizer.step()
        one.optimizer.zero_grad(set_to_none=True)
    return {n: p.detach() for n, p in one.raw_model.named_parameters()}


def _train(rank: int, port: int, out_dir, code_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    world = World.from_env()
    world.init()
    spec = _spec(code_dir)
    trainer = Trainer(spec, torch.device("cpu"), world)
    local = {n: p.to_local().numel() for n, p in trainer.raw_model.named_parameters()}
    for _ in range(STEPS):
        trainer.step()
    full = {n: p.full_tensor() for n, p in trainer.raw_model.named_parameters()}
    ref = _reference(spec)
    seen = {
        "wrapping": trainer.model_wrapping,
        "blocks": trainer.raw_model.blocks_name,
        "local": local,
        "global": {n: p.numel() for n, p in full.items()},
        "max_error": max((full[n] - ref[n]).abs().max().item() for n in ref),
        "same_names": sorted(full) == sorted(ref),
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(seen))
    world.shutdown()


@pytest.mark.slow  # two spawned ranks
def test_fsdp2_shards_a_users_model_by_its_blocks_and_trains_like_one_model(tmp_path):
    shutil.copy(REPO / "benchmarks" / "modern_gpt.py", tmp_path / "modern_gpt.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_train, args=(port, tmp_path, str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["blocks"] == "transformer.h"  # found, not named
        assert r["wrapping"] == "fsdp2(model, block x 2)"
        assert r["same_names"] and r["max_error"] < 1e-5
    for name, total in ranks[0]["global"].items():
        shards = [r["local"][name] for r in ranks]
        assert sum(shards) == total and max(shards) < total, name  # split, not replicated
