"""The runner on a user's model against a bare training loop of the same model, in one run.

The model is benchmarks/modern_gpt.py (RoPE, RMSNorm, GQA), swept as a user sweeps it:
`python -m nanogpt.run model.build._target_=modern_gpt.GPT ...` with model.code_dir pointing
at it. The bare loop is the one a user writes by hand: the same model and shapes, AdamW at the
runner's settings (weight decay on the 2-D parameters only, torch's default implementation),
gradient clipping at 1.0, fp32, no probes. Both run in fresh processes, interleaved round by
round so that the machine's drift touches both alike (a). The same ratio for the step alone
(b): the runner's trainer for the point, built as the measuring child builds it, and the bare
step, stepped in turns in one process (what the contract wrapper, the role groups and the
runner's step cost, without the process around them). The ratio is runner tokens/s / bare
tokens/s at the median step, and at the 10th-percentile step (a shared machine's other
processes slow the median more than the fastest steps) (goal >= 0.97).

Usage: python benchmarks/byo_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner_overhead import BATCH, PROTOCOL, STEPS, WARMUP  # beside this script

from nanogpt.analysis.store import read_result

HERE = Path(__file__).resolve().parent
SHAPE = dict(vocab_size=4096, block_size=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=128)
RUN_ARGS = [
    "model.build._target_=modern_gpt.GPT",
    "model.build.config._target_=modern_gpt.Config",
    *(f"model.build.config.{k}={v}" for k, v in SHAPE.items()),
    f"model.code_dir={HERE}",
    f"model.vocab_size={SHAPE['vocab_size']}",
    f"model.block_size={SHAPE['block_size']}",
    *PROTOCOL,  # runner_overhead.py's: the same batch, steps and budget
]


def bare_step():
    """One step of the loop a user would write by hand, as a function of no arguments."""
    import torch

    sys.path.insert(0, str(HERE))
    from modern_gpt import GPT, Config

    torch.manual_seed(0)
    model = GPT(Config(**SHAPE))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
    tokens = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"] + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bare_loop_tokens_per_s() -> tuple[float, float]:
    """The bare loop alone (run in a fresh process: --bare-once)."""
    step, ms = bare_step(), []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        step()
        if i >= WARMUP:
            ms.append((time.perf_counter() - t0) * 1e3)
    return tokens_per_s(statistics.median(ms)), tokens_per_s(_p10(ms))


def interleaved(rounds: int, per_round: int = 5) -> tuple[float, float]:
    """The runner's own trainer for the point (composed, validated and built as the measuring
    child builds it: the user's model in its contract wrapper, the role groups, clipping)
    against the bare step, stepped in turns in one process, so that another process on the
    machine touches both alike. (median step ms of the runner's, of the bare loop's)"""
    import torch
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.train.distributed import World
    from nanogpt.train.trainer import build_trainer

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        spec = to_spec(compose("config", RUN_ARGS))
    trainer, bare = build_trainer(spec, torch.device("cpu"), World()), bare_step()
    times: dict[str, list[float]] = {"runner": [], "bare": []}
    for r in range(rounds + 1):  # the first round warms both up
        for name, step in (("runner", trainer.step), ("bare", bare)):
            for _ in range(per_round):
                t0 = time.perf_counter()
                step()
                if r:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times["runner"]), statistics.median(times["bare"])


def tokens_per_s(step_ms: float) -> float:
    return BATCH * SHAPE["block_size"] / (step_ms / 1e3)


def _p10(ms: list[float]) -> float:
    """As the runner computes step_ms_p10: the fastest steps, least touched by other processes
    on a shared machine."""
    from nanogpt.analysis.stats import summarize

    return summarize(ms)["p10"]


def bare_in_fresh_process(tmp: Path) -> tuple[float, float]:
    cmd = [sys.executable, __file__, "--bare-once"]
    out = subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, text=True).stdout
    median, p10 = out.split()
    return float(median), float(p10)


def runner_tokens_per_s(tmp: Path, i: int) -> dict:
    out = tmp / f"single{i}"
    cmd = [sys.executable, "-m", "nanogpt.run", *RUN_ARGS, f"hydra.run.dir={out}"]
    subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)
    return read_result(out / "result.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bare-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_once:
        print(*bare_loop_tokens_per_s())
        return
    ratios, ratios_p10 = [], []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for i in range(args.rounds):
            bare, bare_p10 = bare_in_fresh_process(tmp)
            record = runner_tokens_per_s(tmp, i)
            ratios.append(record["tokens_per_s"] / bare)
            ratios_p10.append(tokens_per_s(record["step_ms_p10"]) / bare_p10)
            print(
                f"round {i}: runner {record['tokens_per_s']:,.0f} tok/s "
                f"(flops_source: {record['flops_source']}), bare {bare:,.0f} tok/s, "
                f"ratio {ratios[-1]:.3f} (at p10 step time: {ratios_p10[-1]:.3f})"
            )
    runner_ms, bare_ms = interleaved(rounds=20)
    print(
        f"(b) the runner's step / the bare step, interleaved in one process, 100 steps each: "
        f"{runner_ms:.2f} ms / {bare_ms:.2f} ms, tokens/s ratio {bare_ms / runner_ms:.3f}"
    )
    print(
        f"(a) runner / bare tokens/s on a user's model, median of {args.rounds}: "
        f"{statistics.median(ratios):.3f}; at p10 step time {statistics.median(ratios_p10):.3f}"
        "  (goal >= 0.97)"
    )


if __name__ == "__main__":
    main()
