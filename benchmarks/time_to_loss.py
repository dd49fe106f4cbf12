"""Does Muon reach a validation loss sooner than AdamW on this CPU, and how sure is that?

The time_to_loss_cpu preset's two points (a 4-layer 64-wide char-level GPT on tinyshakespeare,
AdamW 3e-3 against Muon 0.02, to validation loss 2.5), N runs each, alternated: run r of every
point before run r + 1, so a change in the machine's load over the benchmark falls on both
points alike (as the preset's own sweep does on hydra/launcher=parallel's rounds; Hydra's basic
launcher runs a point's repeats back to back). Each run is the real path of a
sweep's run (point/job.run_point: a forked process, the record written to its own job dir),
with its own seed (bench.seed + r - 1, as a sweep's repeats); the runs of a point are then
pooled and compared by the functions the sweep table calls (results/time_to_loss.py).

Usage: python benchmarks/time_to_loss.py DATA [--runs 5] [--out DIR] [overrides ...]
  DATA: tinyshakespeare's input.txt. Last line:
  time-to-loss: muon/adamw R [low-high], p=P, reached a/N b/N
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from nanogpt.app import to_spec
from nanogpt.configs import CONF_DIR
from nanogpt.point.handoff import Job
from nanogpt.point.job import run_point
from nanogpt.results import store
from nanogpt.results import time_to_loss as ttl
from nanogpt.results.record import Record

POINTS = ("adamw", "muon")


def spec_of(optimizer: str, data: str, extra: list[str]):
    overrides = [
        "+sweep=time_to_loss_cpu",
        f"+sweep/ttl_optimizer={optimizer}",
        f"data.path={data}",
        "logger=none",
        *extra,
    ]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose("config", overrides=overrides))


def one_run(spec, number: int, job_dir: Path) -> Record:
    """Run `number` of a point: its own seed, in a process of its own, its record on disk."""
    bench = dataclasses.replace(
        spec.bench, seed=spec.bench.seed + number - 1, repeats=1, rerun=True
    )
    run_point(dataclasses.replace(spec, bench=bench), Job(job_dir=job_dir))
    return Record.from_dict(store.read_result(job_dir / store.RESULT_FILE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="tinyshakespeare's input.txt")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="where the runs' records go")
    parser.add_argument("overrides", nargs="*", help="more overrides for both points")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="time_to_loss_"))
    specs = {name: spec_of(name, str(args.data.resolve()), args.overrides) for name in POINTS}
    runs: dict[str, list[Record]] = {name: [] for name in POINTS}
    for number in range(1, args.runs + 1):  # alternated: run r of every point before r + 1
        for name in POINTS:
            record = one_run(specs[name], number, out / name / str(number))
            part = record.time_to_loss
            runs[name].append(record)
            print(
                f"run {number} {name}: {record.status}, {part.ttl_note}, "
                f"time_to_loss_s={part.time_to_loss_s}, steps={part.ttl_steps}, "
                f"compile_s={part.ttl_compile_s}, eval_s={part.ttl_eval_s}"
                + (f" ({record.error})" if record.error else ""),
                flush=True,
            )
    pooled = {name: ttl.pool(records).time_to_loss for name, records in runs.items()}
    for name, part in pooled.items():
        print(
            f"{name}: time_to_loss_s {part.time_to_loss_s} [{part.ttl_ci_low}-{part.ttl_ci_high}]"
            f" ({part.ttl_note}), steps {part.ttl_steps_per_run}, s {part.ttl_s_per_run}"
        )
    base = [t for t in pooled["adamw"].ttl_s_per_run if t is not None]
    other = [t for t in pooled["muon"].ttl_s_per_run if t is not None]
    reached = f"reached {len(other)}/{args.runs} {len(base)}/{args.runs}"
    if not (base and other):
        print(f"time-to-loss: muon/adamw - [-], p=-, {reached}")
        return
    ratio, low, high = ttl.ratio(base, other)
    p = ttl.p_value(base, other)
    verdict = ttl.verdict(base, other, ttl.ALPHA)
    print(f"verdict at alpha {ttl.ALPHA}: {verdict}; records in {out}")
    p_text = "-" if p is None else f"{p:.2g}"
    print(f"time-to-loss: muon/adamw {ratio:.2f} [{low:.2f}-{high:.2f}], p={p_text}, {reached}")


if __name__ == "__main__":
    main()
