"""perf.compile_scope=blocks against model: the compile time of one first step, each scope in a
fresh process with its own empty Inductor cache, alternated over --rounds. Prints each round's
compile time (Dynamo's own timer, torch._dynamo.utils.calculate_time_spent()["total_wall_time"])
and the ratio blocks / model; docs/benchmarks.md keeps the figures.

    .venv/bin/python benchmarks/compile_scope.py --layers 4 --width 64 --rounds 2

With --artifacts, perf.compile_cache=cold against artifacts instead (the whole model): a fresh
process compiles from empty caches and saves torch.compiler.save_cache_artifacts(), then another
fresh process with empty caches loads them (load_cache_artifacts) and compiles; the first step's
wall time of each, alternated over --rounds.

Compiled as the trainer compiles them (train/trainer.py): the whole model in one torch.compile,
or each block in place (nn.Module.compile), the rest eager.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def one(scope: str, layers: int, width: int, artifacts: str | None = None) -> dict:
    """In this (fresh) process: build, compile by `scope`, one step; the compile seconds.
    `artifacts`: a file to save the compile's artifacts to (scope "model-save") or to load them
    from first (scope "model-load")."""
    import time

    import torch
    from torch._dynamo.utils import calculate_time_spent

    started = time.perf_counter()
    if scope == "model-load":
        with open(artifacts, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())

    from nanogpt.train.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(
        block_size=64, vocab_size=256, n_layer=layers, n_head=4, n_embd=width, dropout=0.0,
        bias=True, attention="auto", activation_checkpointing=False, loss="full", loss_chunk=2048,
    )  # fmt: skip
    model = GPT(config)
    if scope.startswith("model"):
        run = torch.compile(model)
    else:
        for block in model.blocks:
            block.compile()
        run = model
    x = torch.randint(0, 256, (4, 64))
    _, loss = run(x, x)
    loss.backward()
    first = time.perf_counter() - started  # the load included
    if scope == "model-save":
        with open(artifacts, "wb") as f:
            f.write(torch.compiler.save_cache_artifacts()[0])
    return {"compile_s": calculate_time_spent()["total_wall_time"], "first_step_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--artifacts", action="store_true", help="cold against artifacts")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's scope
    parser.add_argument("--file", help=argparse.SUPPRESS)  # the child's artifacts
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.layers, args.width, args.file)))
        return
    if args.artifacts:
        caches(args)
        return
    seconds = {"model": [], "blocks": []}
    for number in range(args.rounds):
        for scope in ("model", "blocks") if number % 2 == 0 else ("blocks", "model"):
            figures = _child(scope, args)
            seconds[scope].append(figures["compile_s"])
            print(f"round {number + 1} {scope}: compile {figures['compile_s']:.1f} s")
    ratio = statistics.median(seconds["blocks"]) / statistics.median(seconds["model"])
    print(f"blocks / model, median compile time: {ratio:.2f}")


def caches(args) -> None:
    """Each round: compile from empty caches and save the artifacts, then load them in a fresh
    process with empty caches; the first step of each (the load included)."""
    with tempfile.TemporaryDirectory() as folder:
        saved = os.path.join(folder, "artifacts.bin")
        for number in range(args.rounds):
            cold = _child("model-save", args, saved)["first_step_s"]
            loaded = _child("model-load", args, saved)["first_step_s"]
            print(f"round {number + 1}: cold {cold:.1f} s, artifacts {loaded:.1f} s")


def _child(scope: str, args, artifacts: str | None = None) -> dict:
    """`one(scope)` in a fresh process with its own empty Inductor cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        cmd = [sys.executable, __file__, "--one", scope, "--layers", str(args.layers)]
        cmd += ["--width", str(args.width)] + (["--file", artifacts] if artifacts else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
