"""The fork server (nanogpt/launch/forkserver.py) names the sweep's main module without running
it: neither it nor its children run it again, nor the entry point's imports
(benchmarks/point_isolation.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from .conftest import run_patched, with_micro

# A main module that notes each time it runs, then (as __main__) starts two children of the
# fork server. Without the server naming it, each child would run it again as __mp_main__.
MAIN = """
import os, time
with open(os.environ["MARKS"], "a") as f:
    f.write(__name__ + "\\n")
if __name__ == "__main__":
    from nanogpt.launch import forkserver
    for _ in range(2):
        child = forkserver._server().Process(target=time.sleep, args=(0,))
        child.start()
        child.join()
        assert child.exitcode == 0
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux")
@pytest.mark.parametrize("how", ["script", "module"])
def test_the_main_module_runs_in_the_sweeps_process_alone(tmp_path, how):
    (tmp_path / "sweep_main.py").write_text(MAIN)
    marks = tmp_path / "marks"
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    start = ["sweep_main.py"] if how == "script" else ["-m", "sweep_main"]
    proc = subprocess.run(
        [sys.executable, *start],
        cwd=tmp_path,
        env={**os.environ, "MARKS": str(marks), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the sweep's process alone: neither the server nor its children ran it
    assert marks.read_text().split() == ["__main__"]


# A job process whose signal handler raises while it waits for its point, as submitit's
# time-limit handler does once it stops requeuing: the point (a child of the fork server, which
# multiprocessing would join at exit) is killed, so the job ends now, not at SLURM's hard limit.
GIVES_UP = """
import os, signal, threading, time
from nanogpt.launch import forkserver
from nanogpt.launch.process import wait_for

def give_up(signum, frame):
    raise RuntimeError("Job not requeued because: timed-out too many times.")

signal.signal(signal.SIGUSR2, give_up)
child = forkserver._Forked(forkserver._server().Process(target=time.sleep, args=(300,)))
child.process.start()
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2)).start()
try:
    wait_for(child)
except RuntimeError as err:
    print("raised:", err, "point exit:", child.returncode)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux")
def test_an_exception_that_ends_the_wait_kills_the_point_first(tmp_path):
    (tmp_path / "gives_up.py").write_text(GIVES_UP)
    proc = subprocess.run(
        [sys.executable, "gives_up.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raised: Job not requeued" in proc.stdout and "point exit: -9" in proc.stdout


@pytest.mark.slow
def test_a_cpu_sweeps_own_process_never_imports_torch(tmp_path):
    """The sweep's process composes, checks (validate.py, device_support.py), launches and
    tabulates; torch is the fork server's and its children's. Importing it would cost the
    process seconds of its start on two cores, every sweep."""
    marker = tmp_path / "torch_in_sweep_process"
    setup = (
        "import atexit; atexit.register(lambda: open("
        f"{str(marker)!r}, 'w').write(str('torch' in sys.modules)))"
    )
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *with_micro(["perf.batch_size=1,2"]), f"hydra.sweep.dir={sweep_dir}"]
    proc = run_patched(setup, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(pd.read_csv(sweep_dir / "summary.csv")) == 2  # both points measured
    assert marker.read_text() == "False"
    # the report rebuilds the table without it too
    code = f"import sys, runpy; {setup}; runpy.run_module('nanogpt.report', run_name='__main__')"
    report = subprocess.run(
        [sys.executable, "-c", code, str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "table:" in report.stdout and marker.read_text() == "False"


@pytest.mark.slow
def test_the_entry_point_imports_neither_pandas_nor_torch():
    """pandas is the table's, read at the end in the sweep's process: imported by the entry
    point (nanogpt.run), it cost a sweep refused before any point 0.4 s of CPU on two cores.
    torch is the fork server's and its children's
    (test_a_cpu_sweeps_own_process_never_imports_torch)."""
    code = (
        "import sys, nanogpt.run; print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
