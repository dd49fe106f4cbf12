"""The console says what helps: Kineto's trace-point lines never, a line that every point says
alike once per sweep (nanogpt/logs.py, nanogpt/probes/kineto_log.py)."""

from __future__ import annotations

import io
import logging
import os

import pytest
import torch
from torch.autograd.profiler import profile

from nanogpt import logs
from nanogpt.analysis import derive
from nanogpt.config.spec import Exclusive, RunSpec
from nanogpt.probes.kineto_log import without_trace_points
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World

from .conftest import run_cli, with_micro


def _profiled() -> None:
    with profile(use_kineto=True):
        torch.ones(4).add_(1)


def test_kineto_trace_points_are_dropped_and_other_stderr_lines_kept(capfd):
    _profiled()  # as it was: Kineto writes its trace points to descriptor 2
    assert "profiler_start" in capfd.readouterr().err
    with without_trace_points():
        _profiled()
        os.write(2, b"a native line\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_" not in err
    assert err == "a native line\n"


def micro_point() -> RunSpec:
    """A micro point for the real measured loop (scenarios/loop.py), diagnosed on one step."""
    spec = RunSpec()
    shape = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=256)
    for key, value in shape.items():
        setattr(spec.model, key, value)
    spec.perf.batch_size, spec.bench.device, spec.bench.exclusive = 2, "cpu", Exclusive.off
    spec.bench.warmup_steps, spec.bench.measure_steps, spec.bench.min_measure_steps = 1, 2, 1
    spec.bench.diagnose_steps = 1
    return spec


def profiling() -> bool:
    """Whether the profiler runs: of a point's steps, only the diagnosis's."""
    return torch._C._autograd._profiler_enabled()


NO_PEAK = derive.Ceilings(derive.Peak(None, "unknown"))


def test_a_diagnosis_that_raises_writes_to_stderr_and_leaves_its_message(tmp_path, caplog):
    """stderr is set aside only while Kineto starts and stops: the diagnosed steps write to the
    process's own, and their exception reaches the record and the log."""
    own = os.fstat(2)
    seen = []

    def fails_when_profiled(module, args, output):
        if profiling():
            seen.append(os.fstat(2))
            raise RuntimeError("the kernel failed")

    hook = torch.nn.modules.module.register_module_forward_hook(fails_when_profiled)
    try:
        record = measure(micro_point(), torch.device("cpu"), World(), NO_PEAK, tmp_path, [])
    finally:
        hook.remove()
    assert record.status == "ok"  # the measured figures stand
    assert record.diagnosis.diag_error == "failed: RuntimeError: the kernel failed"
    assert "the diagnosis failed (RuntimeError: the kernel failed)" in caplog.text
    assert seen and all((s.st_dev, s.st_ino) == (own.st_dev, own.st_ino) for s in seen)


def _point_process(said, file_lines: io.StringIO) -> io.StringIO:
    """One point's process: a console handler with the sweep's filter, and its run.log."""
    console = io.StringIO()
    root = logging.getLogger("point")
    root.handlers = [logging.StreamHandler(console), logging.StreamHandler(file_lines)]
    root.handlers[0].addFilter(logs.OncePerSweep(said))
    return console


def test_a_line_every_point_says_reaches_the_console_once_per_sweep(tmp_path):
    said, run_log = tmp_path / logs.SAID_DIR, io.StringIO()
    consoles = []
    for point in range(3):
        consoles.append(_point_process(said, run_log))
        log = logging.getLogger("point")
        log.warning(f"W&B: logging offline to run {point}", extra={logs.ONCE: "W&B point"})
        log.warning(f"point {point} measured")  # unmarked: always said
    assert consoles[0].getvalue() == "W&B: logging offline to run 0\npoint 0 measured\n"
    for later in consoles[1:]:
        assert "W&B" not in later.getvalue() and "measured" in later.getvalue()
    assert run_log.getvalue().count("W&B") == 3  # each point's log keeps its own line
    logs.forget_said(tmp_path)  # the sweep runs again (a resume): said again
    again = _point_process(said, run_log)
    logging.getLogger("point").warning("x", extra={logs.ONCE: "W&B point"})
    assert again.getvalue() == "x\n"


def test_python_warnings_are_keyed_by_their_text(tmp_path):
    said = tmp_path / logs.SAID_DIR
    record = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "no peak", (), None)
    first, second = logs.OncePerSweep(said), logs.OncePerSweep(said)  # two points' processes
    assert first.filter(record) and not second.filter(record)
    other = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "other", (), None)
    assert second.filter(other)
    plain = logging.LogRecord("nanogpt", logging.WARNING, __file__, 1, "no peak", (), None)
    assert second.filter(plain)  # not a Python warning, not marked: said every time


def test_a_librarys_own_warnings_are_said_once_even_through_its_own_handler(tmp_path):
    """torchao's "Failed to load" and torch's `_pytree` Enum warning are records of their own
    loggers, not Python warnings, and torch's logger writes through its own handler (it does not
    propagate to the root's): both reached the console on every point."""
    said = tmp_path / logs.SAID_DIR
    torchao = logging.LogRecord("torchao", logging.WARNING, __file__, 1, "Failed to load", (), None)
    first, second = logs.OncePerSweep(said), logs.OncePerSweep(said)
    assert first.filter(torchao) and not second.filter(torchao)
    info = logging.LogRecord("torchao", logging.INFO, __file__, 1, "Failed to load", (), None)
    assert second.filter(info)  # a library's info line is not keyed
    own = logging.getLogger("a_library_with_its_own_handler")
    console = io.StringIO()
    own.handlers, own.propagate = [logging.StreamHandler(console)], False
    kept = {h: list(h.filters) for h in logging.getLogger().handlers}
    try:
        for _ in range(2):  # two points' processes, each filtering its handlers
            logs.say_once_per_sweep(tmp_path)
            own.warning("an Enum subclass is now natively supported")
    finally:
        own.handlers = []
        for handler, filters in kept.items():  # this process's other tests: unfiltered
            handler.filters = filters
    assert console.getvalue().count("natively supported") == 1


@pytest.mark.slow
def test_a_real_sweep_says_its_same_lines_once(tmp_path):
    """Two points, each measured in its own process, both with no known peak for bf16 on this
    CPU and both logging to W&B offline: the console has each such line once, each point's
    run.log its own, and no Kineto trace point."""
    sweep_dir = tmp_path / "sweep"
    overrides = ["perf.batch_size=1,2", "perf.dtype=bf16", "logger=wandb", "logger.mode=offline"]
    args = ["-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}"]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = proc.stdout + proc.stderr
    if "No peak FLOP/s known" in console:  # a CPU whose bf16 has a known path says nothing
        assert console.count("No peak FLOP/s known") == 1
    assert console.count("W&B: logging offline to") == 2  # a point's, the summary run's
    assert "USDT" not in console
    for point in ("0", "1"):
        assert "W&B: logging offline to" in (sweep_dir / point / "run-1" / "run.log").read_text()
