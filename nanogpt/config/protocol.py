"""The measurement protocol: how long a point warms up, how long it is measured, and when a
window counts as steady. One place for the numbers, and for why they are what they are.

Why time, not steps, on a GPU. An H100 SXM (700 W, 2026-11-23, ../shared/device) running
GPT-2 124M at batch 12 boosts for its first seconds, then holds its power cap (`sw_power_cap`):
the median of the first 20 steps after a 0.3 s warmup was 27.41 ms at 1,980 MHz, steps 20-200
(about 0.9-5.9 s in) 27.82 ms, and the last 500 steps of a minute 27.97 ms at 1,782 MHz. A
fixed 20-step window (0.55 s there) measures the boost, not the run a user will have, and
NVML's energy counter advances too few times in it to give a mean power (750 W and 631 W read
on a 700 W card). So on CUDA:

- warmup lasts at least WARMUP_S of steps after the first (compiling) one: past the boost,
  the allocator grown, cuDNN/cuBLAS heuristics and CUDA graphs recorded;
- the measured window lasts at least MEASURE_S and at least MEASURE_STEPS steps: by then the
  median sits within about 0.5 % of the one-minute figure, and the energy counter has advanced
  tens of times. The README's four-point sweep stays near two minutes on an H100;
- a window is marked unsteady when it was cut short, or when its last third is significantly
  slower or faster than its first (the clocks still moving): `steady`, `unsteady_reasons`
  (short, drift) and `steady_note`.

On a CPU the work does not boost and settle the same way, a step is long, and the sweep should
stay quick: no time floors by default, 20 steps, and a budget of 15 s a point. On a CPU that
emulates 16-bit matmuls (an AMD EPYC of family 23, no AVX-512 BF16) a bf16 step of the CPU
default model takes about a second, so `make sweep`'s four points are budget-bound there.

The budget is the point's, not only its measured window's: it runs from the end of the first
(compiling) step, warmup spends it first, and the profiled steps that follow the measured ones
(the diagnosis, bench.profile) are set aside from it at the measured steps' pace.

Warmup in steps: the first step compiles; one more lets lazy initialisation finish. CUDA-graph
compile modes (reduce-overhead, max-autotune) run each graph eagerly, then record it, then
replay: CUDA_GRAPH_WARMUP steps before the first replay. fp16 warms up until the GradScaler's
scale has settled (no skipped step in the last warmup window), at most SCALE_SETTLE_STEPS more.
"""

from __future__ import annotations

# Device defaults of the time-based keys (conf/bench/default.yaml reads them through
# frontend/compose.py).
CUDA_BENCH = {"warmup_s": 3.0, "measure_s": 5.0, "measure_steps": 30, "time_budget_s": 30.0}
CPU_BENCH = {"warmup_s": 0.0, "measure_s": 0.0, "measure_steps": 20, "time_budget_s": 15.0}

WARMUP_STEPS = 2  # the first (compile, lazy init) and one steady one
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
CUDA_GRAPH_WARMUP = 3  # steps: warm-up run, recording run, then replays
SCALE_SETTLE_STEPS = 200  # fp16: extra warmup steps allowed for the loss scale to settle

# A window is too short to be steady on a GPU below this (the boost lasts about a second or
# two on the H100 above); and its drift counts only beyond DRIFT_PCT *and* outside the noise.
STEADY_MIN_S = 2.0
DRIFT_PCT = 2.0


def warmup_steps(asked: int | None, compile_mode: str | None, on_cuda: bool) -> int:
    """The warmup steps a point runs: the number asked, or what its compile mode needs."""
    if asked is not None:
        return asked
    return needed_warmup(compile_mode, on_cuda)


def needed_warmup(compile_mode: str | None, on_cuda: bool) -> int:
    """Steps before the first one that may be measured (compile_mode None: eager)."""
    if on_cuda and compile_mode in CUDA_GRAPH_MODES:
        return CUDA_GRAPH_WARMUP
    return WARMUP_STEPS
