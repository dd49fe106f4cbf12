"""This project against nanoGPT on the same device and configuration: tokens/s side by side.

    python benchmarks/vs_nanogpt.py --nanogpt PATH/TO/nanoGPT model [--device cpu] [--rounds 5]
    python benchmarks/vs_nanogpt.py --nanogpt PATH/TO/nanoGPT bench [--rounds 3]   # CUDA only

nanoGPT is not part of this repo: PATH is a checkout of https://github.com/karpathy/nanoGPT.
Rounds alternate between the two sides, so a machine's drift hits both alike; the figure is the
median over rounds of ours / nanoGPT's tokens/s (goal >= 1.0: at least as fast).

model  Our GPT (nanogpt/train/gpt.py) against nanoGPT's model.py, stepped by one identical loop
       (the same batch, AdamW settings and autocast): the two models' own speed. Any device.
       The loop synchronizes before and after its timed steps only.

bench  `python -m nanogpt.run` against nanoGPT's bench.py, each a process of its own with its
       own clock, at bench.py's configuration: GPT-2 124M without biases, 12 x 1024 tokens,
       fused AdamW (lr 1e-4, weight decay 0.01, no clipping), synthetic tokens. This is what a
       user of either tool is told. bench.py synchronizes CUDA unconditionally, hence CUDA only.
       Know what differs in the clocks: bench.py times 20 steps after 10 with time.time() and
       reads the loss to the host every step (a sync per step); the runner times each step with
       CUDA events and syncs once per logging window. Where the two figures part by more than
       the model comparison does, that sync is the first suspect.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from nanogpt.analysis.store import RESULT_FILE, read_result
from nanogpt.config.spec import OptimizerConfig
from nanogpt.hardware.devices import synchronize
from nanogpt.train.gpt import GPT, GPTConfig
from nanogpt.train.optim import build_optimizer

REPO = Path(__file__).resolve().parent.parent
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16}
# bench.py's dtype names for ours; its float32 runs with TF32 matmuls allowed, our tf32.
BENCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32"}


def load_nanogpt_model(checkout: Path):
    """nanoGPT's model.py as a module (it imports only torch)."""
    sys.path.insert(0, str(checkout))
    try:
        import model as reference  # nanoGPT's model.py
    finally:
        sys.path.pop(0)
    return reference


def tokens_per_s(model, device: torch.device, dtype: str, batch: int, steps: int) -> float:
    """Train `model` for 3 untimed steps, then `steps` timed ones; tokens/s of the timed ones."""
    model.to(device)
    opt = build_optimizer(model, OptimizerConfig(), prefer_fused=device.type == "cuda")
    block = model.config.block_size
    tokens = torch.randint(0, model.config.vocab_size, (batch, block + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    cast = AUTOCAST[dtype]
    autocast = torch.autocast(device.type, dtype=cast) if cast else nullcontext()

    def step() -> None:
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return batch * block * steps / (time.perf_counter() - start)


def in_turn(round_: int, **sides):
    """Each side's figure; who goes first alternates from round to round."""
    order = list(sides.items())[:: 1 if round_ % 2 == 0 else -1]
    return {name: measure() for name, measure in order}


def model_rate(gpt, config, device: torch.device, args, seed: int) -> float:
    torch.manual_seed(seed)
    model = gpt(config)
    if args.compile:
        model = torch.compile(model)
    return tokens_per_s(model, device, args.dtype, args.batch_size, args.steps)


def compare_models(args) -> list[float]:
    reference = load_nanogpt_model(args.nanogpt)
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    shape.update(block_size=args.block_size, vocab_size=50304, dropout=0.0, bias=False)
    device = torch.device(args.device)
    ratios = []
    for i in range(args.rounds):
        rates = in_turn(
            i,
            ours=partial(model_rate, GPT, GPTConfig(**shape), device, args, i),
            nanoGPT=partial(
                model_rate, reference.GPT, reference.GPTConfig(**shape), device, args, i
            ),
        )
        ratios.append(rates["ours"] / rates["nanoGPT"])
        print(
            f"round {i}: ours {rates['ours']:,.0f} tok/s, nanoGPT {rates['nanoGPT']:,.0f} "
            f"tok/s, ratio {ratios[-1]:.3f}",
            flush=True,
        )
    return ratios


def nanogpt_bench(checkout: Path, dtype: str, compile: bool) -> float:
    """bench.py's tokens/s, from the ms per iteration it prints (12 x 1024 tokens a step)."""
    done = subprocess.run(
        [
            sys.executable,
            "bench.py",
            "--real_data=False",
            f"--dtype={BENCH_DTYPES[dtype]}",
            f"--compile={compile}",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    ms = float(re.search(r"time per iteration: ([\d.]+)ms", done.stdout).group(1))
    return 12 * 1024 / (ms / 1e3)


def runner_bench(dtype: str, compile: bool, run_dir: Path) -> float:
    """`python -m nanogpt.run` at bench.py's configuration; result.json's tokens/s."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nanogpt.run",
            "model=gpt2",
            "model.bias=false",
            "perf.batch_size=12",
            f"perf.dtype={dtype}",
            f"perf.compile={compile}",
            "optimizer.impl=fused",
            "optimizer.lr=1e-4",
            "optimizer.weight_decay=0.01",
            "optimizer.grad_clip=0",
            "data=synthetic",
            "bench.device=cuda",
            # bench.py's window: 10 burn-in steps, then 20 timed (no time floors)
            "bench.warmup_steps=10",
            "bench.warmup_s=0",
            "bench.measure_steps=20",
            "bench.measure_s=0",
            "bench.min_measure_steps=20",
            "logger=none",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        check=True,
    )
    record = read_result(run_dir / RESULT_FILE)
    if record["status"] != "ok":
        raise SystemExit(f"the runner's point ended {record['status']}: {record['error']}")
    return record["tokens_per_s"]


def compare_tools(args) -> list[float]:
    if not torch.cuda.is_available():
        raise SystemExit("bench: nanoGPT's bench.py needs CUDA; use the `model` comparison here")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            rates = in_turn(
                i,
                ours=partial(runner_bench, args.dtype, args.compile, Path(tmp) / f"round{i}"),
                nanoGPT=partial(nanogpt_bench, args.nanogpt, args.dtype, args.compile),
            )
            ours, theirs = rates["ours"], rates["nanoGPT"]
            ratios.append(ours / theirs)
            print(
                f"round {i}: runner {ours:,.0f} tok/s, bench.py {theirs:,.0f} tok/s, "
                f"ratio {ratios[-1]:.3f}",
                flush=True,
            )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    sub = parser.add_subparsers(dest="what", required=True)
    model = sub.add_parser("model", help="the two models in one loop, any device")
    model.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    model.add_argument("--dtype", choices=sorted(AUTOCAST), default="bf16")
    # bench.py's GPT-2 124M shape; on a CPU pass e.g. --n-layer 4 --n-embd 128 --block-size 128
    for name, default in (
        ("n-layer", 12),
        ("n-head", 12),
        ("n-embd", 768),
        ("block-size", 1024),
        ("batch-size", 12),
        ("steps", 10),
    ):
        model.add_argument(f"--{name}", type=int, default=default)
    bench = sub.add_parser("bench", help="the runner against bench.py, CUDA only")
    bench.add_argument("--dtype", choices=sorted(BENCH_DTYPES), default="bf16")
    args = parser.parse_args()
    if not (args.nanogpt / "model.py").is_file():
        raise SystemExit(f"--nanogpt: {args.nanogpt} has no model.py; give a nanoGPT checkout")
    ratios = compare_models(args) if args.what == "model" else compare_tools(args)
    print(
        f"tokens/s ours / nanoGPT ({args.what}, {args.dtype}, compile={args.compile}), "
        f"median of {len(ratios)} rounds: {statistics.median(ratios):.3f}  (goal >= 1.0)"
    )


if __name__ == "__main__":
    main()
