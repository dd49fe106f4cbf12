"""Refit the compiled memory estimate's terms from a GPU check's records, and say how far each
point's estimate was off, before and after.

    python benchmarks/memory_refit.py DIR [DIR ...]   # sweep dirs, or a records.tar.gz's tree

The built-in GPT's estimate (nanogpt/train/gpt.py, MemoryFit) is, per rank:

    peak = the runner's parts (weights, gradients, optimizer state, ...: exact from the tensors,
           the record's mem_estimate)
         + per_layer x tokens x n_embd x n_layer x act_bytes / 2
         + (act_bytes + per_logit) x tokens x vocab
         + constant

Its compiled coefficients were fitted at 12 layers only (gpt.py). This reads every ok CUDA
record below DIR that the compiled terms describe: compiled in compile's default mode (CUDA
graphs hold a pool of their own), the full loss, no activation checkpointing, a fused attention
kernel (auto, flash, efficient: no materialised attention matrix), the built-in GPT, one rank;
benchmarks/gpu_check.sh's `memory_fit` part runs GPT-2's width at 2, 4 and 12 layers. Each
record's peak (torch.cuda.max_memory_allocated over the measured steps) less its runner parts
is what the terms must explain; scipy's least squares solves for them.

Which terms can be told apart depends on what the records vary: depth gives the per-layer term
as a slope; the per-logit term and the constant are both flat in depth, so with one tokens x
vocab among the records the constant is held at its current value (gpt.py says 0, no constant
fitted) and the rest of the intercept is the logits'. Records at two or more tokens x vocab
(another batch or vocabulary) fit all three. What is held is said.

Prints the new coefficients beside the old, with what they came from, then a line per record:
its depth, its peak, the old estimate and its error, the new estimate and its error, and the
line to paste into gpt.py's COMPILED_FIT. Exit 2 with one line when the records cannot fit the
terms (none usable, or one depth only).

Needs no Hydra, no pandas: the records alone, read through the record's schema
(Record.from_dict), as benchmarks/gpu_summary.py does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.linalg import lstsq

from nanogpt.analysis.store import iter_records, run_number
from nanogpt.record import Record
from nanogpt.train.gpt import COMPILED_FIT

GIB = 2**30
FUSED = ("auto", "flash", "efficient", "cudnn")  # no attention matrix kept for backward
NOT_RUNNER = {"activations", "logits", "fit_constant", "total"}  # the model's terms, the sum
ACT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}


@dataclass
class Point:
    """One record the compiled terms describe: its shape and its peak."""

    where: str
    n_layer: int
    n_embd: int
    vocab: int
    tokens: int
    act_bytes: int
    peak: int  # torch.cuda.max_memory_allocated over the measured steps
    runner: int  # the runner's parts of the estimate: weights, gradients, optimizer state, ...
    old: int  # the estimate the record holds


def why_not(r: Record) -> str | None:
    """Why a record is not one the compiled terms describe, or None."""
    a = r.asked
    model = (a.measured_config or {}).get("model", {})
    checks = (
        (r.status == "ok", f"status {r.status}"),
        ((r.setup.device or "").startswith("cuda"), f"device {r.setup.device}"),
        (a.compile, "eager"),
        (a.compile_mode in (None, "default"), f"compile_mode {a.compile_mode}"),
        (a.loss_kind in (None, "full"), f"loss {a.loss_kind}"),
        (a.ac in (None, "none") and not a.activation_checkpointing, f"perf.ac={a.ac}"),
        (a.offload in (None, "none"), f"perf.offload={a.offload}"),
        (a.attention in FUSED, f"attention {a.attention}"),
        (not model.get("build"), "a user's model"),
        ((r.setup.world_size or 1) == 1, f"{r.setup.world_size} ranks"),
        (a.fp8 in (None, "none"), f"fp8 {a.fp8}"),
        (r.memory.mem_peak_allocated_bytes is not None, "no allocator peak"),
        (isinstance(r.setup.mem_estimate, dict), "no mem_estimate"),
    )
    return next((why for ok, why in checks if not ok), None)


def point_of(where: str, r: Record) -> Point:
    model = r.asked.measured_config["model"]
    estimate = r.setup.mem_estimate
    runner = sum(
        v for k, v in estimate.items() if k not in NOT_RUNNER and isinstance(v, int | float)
    )
    return Point(
        where=where,
        n_layer=model["n_layer"],
        n_embd=model["n_embd"],
        vocab=model["vocab_size"],
        tokens=r.asked.batch_size * r.asked.block_size,  # a micro-batch's: what backward keeps
        act_bytes=ACT_BYTES[r.asked.dtype],
        peak=r.memory.mem_peak_allocated_bytes,
        runner=int(runner),
        old=estimate["total"],
    )


def read_points(dirs: list[str]) -> tuple[list[Point], list[str]]:
    """The records the terms describe, and a line for each one left out."""
    points, skipped = [], []
    for folder in dirs:
        found = list(iter_records(Path(folder), runs=True))
        measured_by_runs = {p.parent.parent for p, _ in found if run_number(p.parent) is not None}
        for path, flat in found:
            if path.parent in measured_by_runs:  # a point's runs pooled: its runs are read
                continue
            record = Record.from_dict(flat)
            why = why_not(record)
            if why:
                skipped.append(f"{path.parent}: {why}")
            else:
                points.append(point_of(str(path.parent), record))
    return points, skipped


@dataclass
class Refit:
    per_layer: float
    per_logit: float
    constant: float
    held: str | None  # the term held at its value, and why; None when all three were fitted

    def estimate(self, p: Point) -> float:
        layers = p.tokens * p.n_embd * p.n_layer * p.act_bytes / 2
        logits = p.tokens * p.vocab
        return (
            p.runner
            + self.per_layer * layers
            + (p.act_bytes + self.per_logit) * logits
            + (self.constant)
        )


def refit(points: list[Point]) -> Refit:
    """Least squares (scipy.linalg.lstsq) of what each peak holds beyond the runner's parts on
    the terms the records can tell apart."""
    layers = np.array([p.tokens * p.n_embd * p.n_layer * p.act_bytes / 2 for p in points])
    logits = np.array([p.tokens * p.vocab for p in points], dtype=float)
    compute_copy = np.array([p.act_bytes * p.tokens * p.vocab for p in points], dtype=float)
    rest = np.array([p.peak - p.runner for p in points], dtype=float) - compute_copy
    if len({int(x) for x in logits}) > 1:  # logits differ: all three terms
        (per_layer, per_logit, constant), *_ = lstsq(
            np.column_stack([layers, logits, np.ones_like(logits)]), rest
        )
        return Refit(per_layer, per_logit, constant, None)
    held = COMPILED_FIT.constant
    (per_layer, per_logit), *_ = lstsq(np.column_stack([layers, logits]), rest - held)
    why = (
        f"held at {held} B ({COMPILED_FIT.constant_source}): every record has the same tokens x "
        "vocab, so the constant and the logits cannot be told apart; a record at another batch "
        "or vocabulary fits it"
    )
    return Refit(per_layer, per_logit, held, why)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip())
        return 0 if argv else 2
    missing = [d for d in argv if not Path(d).is_dir()]
    if missing:
        print(
            f"memory_refit: no dir {missing[0]}: give sweep dirs holding result.json",
            file=sys.stderr,
        )
        return 2
    points, skipped = read_points(argv)
    depths = sorted({p.n_layer for p in points})
    if len(depths) < 2:
        print(
            f"memory_refit: {len(points)} usable record(s) at depth(s) {depths or 'none'}: the "
            "per-layer term needs compiled default-mode full-loss CUDA points at two depths or "
            "more (gpu_check.sh's memory_fit part); left out: " + "; ".join(skipped[:5]),
            file=sys.stderr,
        )
        return 2
    new = refit(points)
    old = COMPILED_FIT
    widths = sorted({p.n_embd for p in points})
    print(
        f"memory refit: {len(points)} records (compiled, default mode, full loss), depths "
        f"{', '.join(map(str, depths))}, {'/'.join(map(str, widths))} wide, "
        f"{len(skipped)} left out"
    )
    print(
        f"  per layer: {new.per_layer:6.2f} B a token x channel x layer (16-bit); "
        f"was {old.per_layer} ({old.per_layer_source})"
    )
    print(
        f"  per logit: {new.per_logit:6.2f} B beyond the compute-dtype copy; "
        f"was {old.per_logit} ({old.per_logit_source})"
    )
    held = f"; {new.held}" if new.held else ""
    print(f"  constant:  {new.constant / GIB:6.3f} GiB; was {old.constant} B{held}")
    print("  depth  peak GiB  old estimate  error   new estimate  error   record")
    for p in sorted(points, key=lambda p: (p.n_layer, p.where)):
        after = new.estimate(p)
        print(
            f"  {p.n_layer:5d}  {p.peak / GIB:8.3f}  {p.old / GIB:12.3f}  "
            f"{p.old / p.peak - 1:+6.1%}  {after / GIB:12.3f}  {after / p.peak - 1:+6.1%}   "
            f"{p.where}"
        )
    fitted = ", ".join(map(str, depths))
    print(
        "  in nanogpt/train/gpt.py COMPILED_FIT: "
        f"per_layer={new.per_layer:.2f}, per_logit={new.per_logit:.2f}, "
        f"constant={round(new.constant)}, fitted_layers=None (a slope over depths {fitted}), "
        "and each source: this run's records"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
