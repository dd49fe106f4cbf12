"""perf.compile_scope=blocks against model: the compile time of one first step, each scope in a
fresh process with its own empty Inductor cache, alternated over --rounds. Prints each round's
compile time (Dynamo's own timer, torch._dynamo.utils.calculate_time_spent()["total_wall_time"])
and the ratio blocks / model; docs/benchmarks.md keeps the figures.

    .venv/bin/python benchmarks/compile_scope.py --layers 4 --width 64 --rounds 2

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


def one(scope: str, layers: int, width: int) -> dict:
    """In this (fresh) process: build, compile by `scope`, one step; the compile seconds."""
    import time

    import torch
    from torch._dynamo.utils import calculate_time_spent

    from nanogpt.train.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(
        block_size=64, vocab_size=256, n_layer=layers, n_head=4, n_embd=width, dropout=0.0,
        bias=True, attention="auto", activation_checkpointing=False, loss="full", loss_chunk=2048,
    )  # fmt: skip
    model = GPT(config)
    if scope == "model":
        run = torch.compile(model)
    else:
        for block in model.blocks:
            block.compile()
        run = model
    x = torch.randint(0, 256, (4, 64))
    started = time.perf_counter()
    _, loss = run(x, x)
    loss.backward()
    first = time.perf_counter() - started
    return {"compile_s": calculate_time_spent()["total_wall_time"], "first_step_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's scope
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.layers, args.width)))
        return
    seconds = {"model": [], "blocks": []}
    for number in range(args.rounds):
        for scope in ("model", "blocks") if number % 2 == 0 else ("blocks", "model"):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                cmd = [sys.executable, __file__, "--one", scope, "--layers", str(args.layers)]
                cmd += ["--width", str(args.width)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                figures = json.loads(out.stdout.strip().splitlines()[-1])
            seconds[scope].append(figures["compile_s"])
            print(f"round {number + 1} {scope}: compile {figures['compile_s']:.1f} s")
    ratio = statistics.median(seconds["blocks"]) / statistics.median(seconds["model"])
    print(f"blocks / model, median compile time: {ratio:.2f}")


if __name__ == "__main__":
    main()
