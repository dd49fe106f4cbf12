"""Shared test set-up: micro configs and a runner for real `python -m nanogpt.run` processes."""

from __future__ import annotations

import collections
import contextlib
import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nanogpt.runner.process import collector_paused

from . import process_guard

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TIKTOKEN_CACHE = SHARED / "tiktoken_cache"
SHAKESPEARE = SHARED / "data" / "tinyshakespeare" / "input.txt"

# A model small enough that a measured run takes well under a second on 2 CPU cores.
MICRO = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=16",
    "model.vocab_size=256",
    "perf.batch_size=2",
    "bench.device=cpu",
    "bench.warmup_steps=1",
    "bench.measure_steps=4",
    "bench.min_measure_steps=1",
    "bench.diagnose_steps=1",  # the diagnosis runs in every test, on one recorded step
    # This machine is shared: every point would warn "contended" (tests/test_measured_window.py
    # sets it where contention is what is tested).
    "bench.exclusive=off",
    "logger=none",
]

# Under pytest-xdist (make test), each worker process gets its share of the cores. torch's
# default, a thread a core, would put 2 x 2 threads on 2 cores, and OpenMP's barrier then waits
# for a thread the other worker's descheduled: a micro step took 1 s instead of 0.1 s. The
# processes a test starts (sweeps, torchrun) inherit the share; a test that sets
# OMP_NUM_THREADS for its own children still decides for them.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // WORKERS)))
    if "torch" in sys.modules:  # imported before this file (a plugin): tell it too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
if TIKTOKEN_CACHE.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))

needs_shared = pytest.mark.skipif(
    not (TIKTOKEN_CACHE.is_dir() and SHAKESPEARE.is_file()),
    reason="../shared (tiktoken cache, tinyshakespeare) is not beside the repo",
)


def with_micro(overrides, base: list[str] = MICRO) -> list[str]:
    """BASE (MICRO), with any key that `overrides` sets left to them (Hydra refuses a key
    twice)."""
    keys = {o.lstrip("+").split("=")[0] for o in overrides}
    return [o for o in base if o.split("=")[0] not in keys] + list(overrides)


def run_cli(
    *args: str,
    cwd: Path,
    module: str = "nanogpt.run",
    timeout: float = 300,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run `python -m MODULE ARGS` for real, from `cwd`, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_in_terminal(command: list[str], cwd: Path, **popen) -> subprocess.Popen:
    """Start `command` as a shell starts a foreground job, for a test that then signals it as a
    terminal would (Ctrl-C: SIGINT to its process group): a session of its own, with SIGINT at
    its default and not blocked. An exec'd child inherits an ignored or blocked signal, and this
    worker's state is not a shell's: a non-interactive shell starts a background command (`make
    test &`) with SIGINT ignored (seen: the warning below named it), and C code that sets
    SIG_IGN leaves Python's record of the handler unchanged. That is said as a warning (a clue)
    and undone here first."""
    masks = _signal_masks(os.getpid())
    if SIGINT_BIT & (masks["SigIgn"] | masks["SigBlk"]):
        why = f"SIGINT was ignored or blocked in the test process: {signal_state([])}"
        warnings.warn(why, stacklevel=2)
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN, SIG_DFL or None (set outside Python)
        handler = signal.default_int_handler
    signal.signal(signal.SIGINT, handler)  # rewrites the OS-level disposition
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return subprocess.Popen(command, cwd=cwd, start_new_session=True, **popen)


SIGINT_BIT = 1 << (signal.SIGINT - 1)


def _signal_masks(pid: int) -> dict[str, int]:
    masks = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn", "SigCgt"):
                masks[key] = int(value, 16)
    return masks


def signal_state(pids) -> str:
    """Whether each process (and this one) ignores, blocks or catches SIGINT, read from
    /proc/PID/status: what a test that waited in vain for a signal's effect says."""
    parts = []
    for pid in [os.getpid(), *pids]:
        try:
            masks = _signal_masks(pid)
        except OSError:
            parts.append(f"{pid}: gone")
            continue
        flags = [key for key, mask in masks.items() if mask & SIGINT_BIT]
        parts.append(f"{pid}: SIGINT {'/'.join(flags) or 'default'}")
    return "; ".join(parts)


def report_cli(*args) -> subprocess.CompletedProcess:
    """`python -m nanogpt.report ARGS`, run in this process (nanogpt.report.main(argv), which
    the command's `sys.exit` only wraps): its exit code and what it printed, without an
    interpreter's start. Where the command's process is what is tested (its imports), the test
    starts one (tests/test_forkserver.py)."""
    from nanogpt import report

    argv = [str(arg) for arg in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(argv)
    return subprocess.CompletedProcess(
        ["nanogpt.report", *argv], code, out.getvalue(), err.getvalue()
    )


def fail_if_slower(new: Path, old: Path, *extra: str) -> subprocess.CompletedProcess:
    """`python -m nanogpt.report NEW --compare OLD --fail-if-slower 10 EXTRA...`"""
    return report_cli(new, "--compare", old, "--fail-if-slower", "10", *extra)


def run_patched(setup: str, *args: str, cwd: Path, env: dict | None = None):
    """`python -m nanogpt.run ARGS` in an interpreter where the Python `setup` ran first (a
    module made unimportable, a constant changed), as a real process."""
    code = (
        f"import runpy, sys; {setup}; "
        "sys.argv[0] = 'nanogpt.run'; runpy.run_module('nanogpt.run', run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def run_without_a_key(
    module: str, args: list[str], cwd: Path, env: dict | None = None, code: str | None = None
) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` (or `python -c CODE ARGS`) with no W&B key anywhere: no WANDB_*
    variable, no netrc, a HOME of its own."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    clean["HOME"] = str(cwd / "home")
    command = ["-m", module] if code is None else ["-c", code]
    return subprocess.run(
        [sys.executable, *command, *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def sweep_refusal(*overrides: str, baseline: str | None = None) -> str:
    """The one line `python -m nanogpt.run -m OVERRIDES` (micro) stops with before it measures
    anything, worked out in this process as the sweep's callback works it out
    (SweepReport.on_multirun_start: every point composed and checked). That CLI path itself
    (exit 2, one line, nothing written) runs for real in
    test_faults.py::test_a_bad_point_anywhere_stops_the_sweep_before_anything_is_measured."""
    from hydra import initialize_config_dir

    from nanogpt.config.errors import ConfigError
    from nanogpt.frontend.compose import check_points
    from nanogpt.frontend.presets import CONF_DIR, expand

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        try:
            check_points(expand(with_micro(overrides)), baseline, True, compose_points())
        except ConfigError as err:
            return f"error: {err} (nothing was measured)"
    raise AssertionError(f"-m {' '.join(overrides)} would run")


def compose_points():
    """compose(overrides): a point's config as a sweep's job gets it, hydra node and all, as the
    sweep's callback composes it for its check (callback.compose_point, through
    frontend/point_configs.PointConfigs: each choice of config groups composed once), from a
    master with no overrides. Inside Hydra's initialize_config_dir."""
    from hydra import compose

    from nanogpt.frontend.callback import compose_point

    return compose_point(compose("config", return_hydra_config=True))


# A tiny text for the char tokenizer: 1080 characters, 14 distinct
TINY_TEXT = "abracadabra, said the cat.\n" * 40


@pytest.fixture
def text_file(tmp_path, monkeypatch):
    """TINY_TEXT in a file, with the tokenized cache (XDG_CACHE_HOME) in this test's own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    path = tmp_path / "input.txt"
    path.write_text(TINY_TEXT, encoding="utf-8")
    return path


@pytest.fixture
def sweep(tmp_path):
    """Run a multirun into tmp_path/sweep; returns (process, sweep_dir)."""

    def _run(*overrides: str, micro: bool = True, **kwargs):
        sweep_dir = tmp_path / "sweep"
        args = [
            "-m",
            *(with_micro(overrides) if micro else overrides),
            f"hydra.sweep.dir={sweep_dir}",
        ]
        return run_cli(*args, cwd=tmp_path, **kwargs), sweep_dir

    return _run


@pytest.fixture
def single(tmp_path):
    """Run one (non-multirun) job into tmp_path/run; returns (process, run_dir)."""

    def _run(*overrides: str, micro: bool = True, **kwargs):
        run_dir = tmp_path / "run"
        args = [*(with_micro(overrides) if micro else overrides), f"hydra.run.dir={run_dir}"]
        return run_cli(*args, cwd=tmp_path, **kwargs), run_dir

    return _run


# One real micro sweep for every test that only reads a finished sweep (its records, table,
# report and recommendation): 2 x 2 isolated points, with the report's memory budget and price.
MICRO_SWEEP = [
    "perf.batch_size=1,2",
    "optimizer.impl=foreach,for_loop",
    "report.memory_budget_gib=64",
    "cost.usd_per_hour=3.6",
]


def once_a_session(request, name: str, run) -> tuple[subprocess.CompletedProcess, Path]:
    """`run(root)` (a real process, run in the new folder ROOT) once for the whole test session,
    however many xdist workers ask: a session fixture alone runs once in each worker, and make
    test's workers each need the shared sweeps (their modules land on several). The first to
    ask runs it under a file lock in the session's temporary folder, above the workers' own;
    the others wait for it and read its process back from ROOT/process.json. Only for a result
    the tests read and never write (one that changes a file works on a copy). Returns (the
    process, ROOT); a run that failed is not kept (the next to ask runs it again)."""
    from filelock import FileLock  # torch's own dependency

    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    # An xdist worker's is .../pytest-N/popen-gwK: N is the session's. (Asked of the config:
    # PYTEST_XDIST_WORKER is also in the environment of a pytest that a test starts.)
    if hasattr(request.config, "workerinput"):
        base = base.parent
    root, saved = base / name, base / name / "process.json"
    with FileLock(base / f"{name}.lock"):
        if saved.is_file():
            return subprocess.CompletedProcess(**json.loads(saved.read_text())), root
        shutil.rmtree(root, ignore_errors=True)  # a failed attempt's
        root.mkdir()
        proc = run(root)
        if proc.returncode == 0:
            fields = ("args", "returncode", "stdout", "stderr")
            saved.write_text(json.dumps({key: getattr(proc, key) for key in fields}))
        return proc, root


@pytest.fixture(scope="session")
def micro_sweep(request):
    """MICRO_SWEEP, run once for the session (once_a_session: once for all xdist workers):
    (process, sweep_dir). Tests read it; one that changes a file works on a copy
    (shutil.copytree)."""

    def run(root):
        args = ["-m", *with_micro(MICRO_SWEEP), f"hydra.sweep.dir={root / 'sweep'}"]
        return run_cli(*args, cwd=root)

    proc, root = once_a_session(request, "micro_sweep", run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, root / "sweep"


# W&B's window settings: 3 warmup steps (step 1 alone, then a warmup window of steps 2-3) and
# 4 measured steps in windows of 2: a point's run has W&B steps 3 (warmup/*), 5 and 7 (train/*).
WANDB = ["logger=wandb", "bench.warmup_steps=3", "logger.log_interval=2"]
# One real sweep, in the sweep's own process (bench.isolate=false) with W&B offline and no key,
# for the tests of the points' W&B runs (test_wandb.py) and of the diagnosis (test_diagnose.py):
# job 0 diagnosed (2 profiled steps), job 1 not.
WANDB_SWEEP = [
    *WANDB,
    "logger.mode=offline",
    "bench.isolate=false",
    "bench.diagnose=true,false",
    "bench.diagnose_steps=2",
]


@pytest.fixture(scope="session")
def wandb_sweep(request):
    """WANDB_SWEEP, run once for the session (once_a_session): (process, sweep_dir). Tests only
    read it."""

    def run(root):
        args = ["-m", *with_micro(WANDB_SWEEP), f"hydra.sweep.dir={root / 'sweep'}"]
        return run_without_a_key("nanogpt.run", args, root)

    proc, root = once_a_session(request, "wandb_sweep", run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, root / "sweep"


# A case sweep measures its points in the sweep's own process (one torch import, no fork
# server): what its tests check is a point's figures, not its process.
CASE_DEFAULTS = ["bench.isolate=false"]


def case_sweep(root: Path, cases: dict[str, list[str]]) -> dict[str, Path]:
    """Scenarios that no grid combines (each its own overrides), measured as the points of one
    real micro sweep: one Hydra start and one torch import for all of them, where a single run
    each pays both (about 7 s of CPU on 2 cores; 4 cases took 12.7 s against 27.6 s as single
    runs, one after the other on an idle machine). Each case is written as a
    config of a `case` group below ROOT/conf, MICRO included (the command line would override
    a case's own values; a key naming a config group, as `data=text`, becomes an override in
    its defaults list), and the sweep runs `+case=NAME,...` with that directory on Hydra's
    search path. Returns case name -> its job dir. The single-run path itself (a run
    dir of its own, its exit code) is tested by tests/test_faults.py's single runs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from nanogpt.frontend.presets import CONF_DIR

    group_dir = root / "conf" / "case"
    group_dir.mkdir(parents=True)
    for name, overrides in cases.items():
        node, groups = OmegaConf.create(), []
        every = with_micro(overrides, base=[*MICRO, *CASE_DEFAULTS])
        for override in OverridesParser.create().parse_overrides(every):
            key, value = override.key_or_group, override.value()  # typed as Hydra types it
            if (Path(CONF_DIR) / key).is_dir():
                groups.append({f"override /{key}": value})
            else:
                OmegaConf.update(node, key, value)
        if groups:
            node.defaults = groups
        (group_dir / f"{name}.yaml").write_text("# @package _global_\n" + OmegaConf.to_yaml(node))
    sweep_dir = root / "sweep"
    proc = run_cli(
        "-m",
        f"hydra.searchpath=[file://{root / 'conf'}]",
        f"+case={','.join(cases)}",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {}
    for job, name in enumerate(cases):  # Hydra's basic sweeper runs a comma list in its order
        job_dir = sweep_dir / str(job)
        assert f"+case={name}" in (job_dir / "run-1" / ".hydra" / "overrides.yaml").read_text()
        jobs[name] = job_dir
    return jobs


# Fixtures that run real sweeps or processes: a test that uses one is `slow` (make test-fast
# leaves it out). Tests that start processes themselves carry @pytest.mark.slow.
SLOW_FIXTURES = {
    "micro_sweep",
    "cases",
    "crowded_sweep",
    "fsdp2_ranks",
    "torchrun_points",
    "sweep",
    "single",
    "preset_sweep",
    "oom_sweep",
    "in_process_sweep",
    "result_keys",
    "bad_input_runs",
    "diagnosed_sweep",
    "wandb_sweep",
    "tidy_sweep",
    "attention_sweep",
}


def pytest_configure(config):
    process_guard.register(config)  # make test-fast: an unmarked test may start no process


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collecting imports every test module, and with them torch, pandas and Hydra: with the
    collector paused, as a worker's imports are (nanogpt/runner/process.collector_paused),
    3.5 CPU-s against 5.4. (xdist's controller collects nothing: there it is a moment.)"""
    with collector_paused():
        return (yield)


def pytest_collection_finish(session):
    """What the test process holds once every test module is imported (torch, pandas, Hydra,
    the modules and their constants) lives until it exits: collected once here, the rest is
    frozen as the collection ends (collector_paused's gc.freeze(), out of the collector's
    sight), as the fork server's imports are (nanogpt/runner/forkserver_preload.py). Each
    collection after that (memory.release's, after every run a test measures in this process,
    and the collector's own full passes) walks only what the tests make: over the whole import
    graph one took about 0.3 s. test_protocol, test_logs, test_record, test_byo_optimizer and
    test_adafactor together: 33.0 CPU-s against 36.0."""
    gc.collect()


# The one file of tests marked `alone`: make test runs it by path after the rest, by itself.
ALONE_FILE = Path(__file__).parent / "test_alone.py"


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("alone") and Path(item.path) != ALONE_FILE:
            raise pytest.UsageError(
                f"{item.nodeid} is marked alone: move it to {ALONE_FILE.name}, the one file that "
                "make test runs by itself"
            )
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # make test hands xdist's workers a module at a time (--dist loadscope), in this order
    # (--no-loadscope-reorder: xdist's own order is by the number of tests, which puts a module of
    # many quick tests first and the few-but-slow sweep modules, last in the alphabet, at the
    # end, where one worker ran on alone for minutes). Modules with the most slow tests (those
    # that start processes) go first, so the quick ones fill the gaps at the end.
    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # stable: a module's tests keep their order
