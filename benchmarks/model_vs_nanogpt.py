"""Our GPT vs nanoGPT's model.py on the same config: training-step time, side by side.

nanoGPT's code is not part of this repo; point the script at a checkout's model.py:
    python benchmarks/model_vs_nanogpt.py --nanogpt /path/to/nanoGPT/model.py [--rounds 5]
Both models are built with the same shape, the same AdamW settings and the same batch; rounds
alternate between them so machine noise hits both alike. Prints the median step-time ratio
(goal: ours / nanoGPT <= 1.0, i.e. at least as fast).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from nanogpt.config import OptimizerConfig
from nanogpt.model import GPT, GPTConfig
from nanogpt.optim import build_optimizer

SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=8192, dropout=0.0)
BATCH, STEPS = 8, 15


def load_nanogpt(path: str):
    spec = importlib.util.spec_from_file_location("nanogpt_reference_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_step_s(model: torch.nn.Module) -> float:
    opt = build_optimizer(model, OptimizerConfig())
    tokens = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"] + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    times = []
    for step in range(STEPS + 2):
        t0 = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 2:  # two warmup steps
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nanogpt", required=True, help="path to nanoGPT's model.py")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bias", action="store_true")
    args = parser.parse_args()
    reference = load_nanogpt(args.nanogpt)
    ratios = []
    for i in range(args.rounds):
        torch.manual_seed(i)
        ours = median_step_s(GPT(GPTConfig(**SHAPE, bias=args.bias)))
        torch.manual_seed(i)
        theirs = median_step_s(
            reference.GPT(reference.GPTConfig(**SHAPE, bias=args.bias)), args.bias
        )
        ratios.append(ours / theirs)
        print(
            f"round {i}: ours {ours * 1e3:.1f} ms, nanoGPT {theirs * 1e3:.1f} ms, "
            f"ratio {ours / theirs:.3f}"
        )
    print(
        f"step time ours / nanoGPT, median of {args.rounds}: {statistics.median(ratios):.3f}"
        "  (goal <= 1.0)"
    )


if __name__ == "__main__":
    main()
