"""How long the test suite takes on this machine: `make test` (what CI runs) and `make test-fast`.
Goals (issue 26): make test within 8 minutes and make test-fast within 60 s on 2 CPU cores.

Runs the commands of the Makefile's `test` and `test-fast` recipes, read from the Makefile
itself (so this stays what make runs), without make's set-up step: with this interpreter's
venv, from the repository root. Prints each target's wall time, its tests (passed, skipped,
failed, deselected) and the slowest tests pytest names, with the machine's cores and load
average before and after: the machine may be shared, and a load above the core count
stretches every figure.

Usage: python benchmarks/suite_time.py [--targets test-fast test] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def recipe(target: str, jobs: str) -> list[str]:
    """The shell commands of a Makefile target, $(BIN) and $(JOBS) filled in."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    commands = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        command = line.strip().replace("$(BIN)", str(Path(sys.executable).parent))
        commands.append(command.replace("$(JOBS)", jobs))
    return commands


def counts(output: str) -> dict[str, int]:
    """The numbers of pytest's last summary line ("3 passed, 1 skipped in 2.0s")."""
    last = [line for line in output.splitlines() if " in " in line and SUMMARY.search(line)]
    found: dict[str, int] = {}
    for number, kind in SUMMARY.findall(last[-1] if last else ""):
        kind = "error" if kind.startswith("error") else kind
        found[kind] = found.get(kind, 0) + int(number)
    return found


def slowest(output: str, n: int = 5) -> list[str]:
    """The first lines of pytest's --durations list (then the failures, from -ra)."""
    return [line for line in output.splitlines() if re.match(r"^\d+\.\d+s (call|setup)", line)][:n]


def run_target(target: str, jobs: str) -> tuple[float, dict[str, int], list[str], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    total, tally, slow, code = 0.0, {}, [], 0
    for command in recipe(target, jobs):
        started = time.perf_counter()
        done = subprocess.run(
            command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, check=False
        )
        total += time.perf_counter() - started
        code = code or done.returncode
        for kind, number in counts(done.stdout).items():
            tally[kind] = tally.get(kind, 0) + number
        slow += slowest(done.stdout)
        slow += [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return total, tally, slow, code


def interpreter() -> str:
    """Which Python runs the suite, and whether its interpreter calls into a shared libpython
    (read from this process's memory map). On this project's CI image, pyenv's 3.11.7 (shared
    libpython, built without profile-guided optimisation) ran make test's parallel part in
    9 min 29 s and Debian's python3.11 (one static executable, Debian's optimised build) in
    6 min 52 s, the same commit back to back (docs/install.md)."""
    base = f"{getattr(sys, '_base_executable', sys.executable)} {sys.version.split()[0]}"
    try:
        with open("/proc/self/maps") as maps:
            shared = any("libpython" in line for line in maps)
    except OSError:  # not Linux
        return f"{base}, libpython unknown (no /proc/self/maps)"
    return f"{base}, libpython {'shared' if shared else 'static'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["test-fast", "test"])
    parser.add_argument("--jobs", default="3", help="the Makefile's JOBS (worker processes)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; load average before: {os.getloadavg()[0]:.1f}")
    print(f"interpreter: {interpreter()}")
    for target in args.targets:
        wall, tally, slow, code = run_target(target, args.jobs)
        tests = ", ".join(f"{number} {kind}" for kind, number in tally.items())
        verdict = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"make {target}: {wall:.0f} s wall, {tests} [{verdict}]")
        for line in slow:
            print(f"    {line}")
    print(f"load average after: {os.getloadavg()[0]:.1f} (above {cores}: the machine was shared)")


if __name__ == "__main__":
    main()
