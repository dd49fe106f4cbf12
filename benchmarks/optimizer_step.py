"""AdamW against Muon on the CPU: a step and its optimizer.step, alternated in rounds.

Both trainers are built as a sweep point builds them (the composed config, build_trainer), then
stepped in turns, ROUND steps each, so that a machine whose speed drifts (other processes, the
clock) touches both alike. The optimizer's own time is its `step()` timed around the call; the
rest of the step is forward, backward and clipping. Medians over every timed step.

Usage: python benchmarks/optimizer_step.py [--model micro|nano-1k] [--rounds 20]
(OMP_NUM_THREADS=1 on a shared machine: a parallel region waits for a core another process
holds, and Muon's many small matmuls pay that wait many times a step)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.train.distributed import World
from nanogpt.train.trainer import build_trainer

# tests/conftest.py's MICRO model; nano-1k is the CPU default (conf/model/nano-1k.yaml)
MODELS = {
    "micro": [
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=16",
        "model.vocab_size=256",
        "perf.batch_size=2",
    ],
    "nano-1k": ["model=nano-1k", "perf.batch_size=8"],
}
ROUND, WARMUP = 5, 3


def trainer_for(optimizer: str, model: list[str]):
    overrides = ["bench.device=cpu", "logger=none", f"optimizer={optimizer}", *model]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides)
    return build_trainer(to_spec(cfg), torch.device("cpu"), World())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="micro")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    trainers, step_ms, opt_ms = {}, {}, {}
    for name in ("adamw", "muon"):
        trainer = trainer_for(name, MODELS[args.model])
        times = opt_ms[name] = []
        step = trainer.optimizer.step

        def timed(*a, _step=step, _times=times, **k):
            started = time.perf_counter()
            out = _step(*a, **k)
            _times.append((time.perf_counter() - started) * 1e3)
            return out

        trainer.optimizer.step = timed  # an instance attribute: GradScaler.step calls it
        for _ in range(WARMUP):  # the first steps create the optimizer's state
            trainer.step()
        times.clear()
        trainers[name], step_ms[name] = trainer, []
    for _ in range(args.rounds):
        for name, trainer in trainers.items():
            for _ in range(ROUND):
                started = time.perf_counter()
                trainer.step()
                step_ms[name].append((time.perf_counter() - started) * 1e3)
    for name in trainers:
        step, opt = statistics.median(step_ms[name]), statistics.median(opt_ms[name])
        print(
            f"{args.model} {name}: step {step:.2f} ms, optimizer.step {opt:.2f} ms "
            f"({opt / step:.0%}), {len(step_ms[name])} steps, {torch.get_num_threads()} threads"
        )


if __name__ == "__main__":
    main()
