"""The CPU a process spends importing what it measures with, with Python's cyclic collector
paused for the imports (nanogpt/runner/process.collector_paused, as the code runs) and with it on
(the same imports, collector_paused replaced by a no-op), alternated pair by pair in fresh
interpreters so that a shared machine's load falls on both alike.

Two imports are timed: a sweep's fork server's preload (runner/forkserver_preload.py: torch,
torch._dynamo and the worker; every sweep with isolated points starts one) and a fresh worker
(`python -m nanogpt.runner.worker`: a torchrun rank, a point without the fork server). Prints
each pair's CPU seconds, the medians and the ratio paused / on (goal: below 0.9).

Usage: python benchmarks/import_collector.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

MODULES = ["nanogpt.runner.forkserver_preload", "nanogpt.runner.worker"]
# `on`: the collector left running through the imports, as before they paused it
IMPORT = """
import contextlib, importlib, sys
if sys.argv[2] == "on":
    import nanogpt.runner.process as process
    process.collector_paused = contextlib.nullcontext
importlib.import_module(sys.argv[1])
"""


def cpu_of(module: str, collector: str) -> float:
    """CPU seconds (user + system) of one fresh interpreter importing `module`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", IMPORT, module, collector], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    cpu_of(MODULES[0], "paused")  # the first import reads the files from disk: not counted
    for module in MODULES:
        paused, on = [], []
        for _ in range(args.pairs):
            paused.append(cpu_of(module, "paused"))
            on.append(cpu_of(module, "on"))
            print(f"{module}: paused {paused[-1]:.2f} s, on {on[-1]:.2f} s")
        ratio = statistics.median(paused) / statistics.median(on)
        print(
            f"{module}: median paused {statistics.median(paused):.2f} CPU-s, on "
            f"{statistics.median(on):.2f} CPU-s, ratio {ratio:.2f} (goal < 0.9: "
            f"{'met' if ratio < 0.9 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
