"""The fork server (nanogpt/runner/forkserver.py): a point forked from it costs no entry
point's imports (the sweep's main module is light to run again in each child), a point is
killed when the job gives up waiting, the sweep's own process never imports torch
(benchmarks/point_isolation.py), a Ctrl-C that lands while a slot forks a point is not lost, and
the imports of a fork server and of a fresh worker run with the collector paused, which is back
on after them (benchmarks/import_collector.py)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys

import pytest

from nanogpt.analysis.tidy import read_summary
from nanogpt.runner.process import collector_paused

from .conftest import run_patched, with_micro

# A job process whose signal handler raises while it waits for its point, as submitit's
# time-limit handler does once it stops requeuing: the point (a child of the fork server, which
# multiprocessing would join at exit) is killed, so the job ends now, not at SLURM's hard limit.
GIVES_UP = """
import os, signal, threading, time
from nanogpt.runner import forkserver
from nanogpt.runner.process import wait_for

def give_up(signum, frame):
    raise RuntimeError("Job not requeued because: timed-out too many times.")

if __name__ == "__main__":  # each child runs this script again, as __mp_main__
    signal.signal(signal.SIGUSR2, give_up)
    child = forkserver._Forked(forkserver._server().Process(target=time.sleep, args=(300,)))
    child.process.start()
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR2)).start()
    try:
        wait_for(child)
    except RuntimeError as err:
        print("raised:", err, "point exit:", child.returncode)
"""


def test_the_collector_is_paused_for_a_block_and_on_again_after_it():
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # objects the collector tracks
        with collector_paused():  # a block already paused: nothing changes
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)  # what the block made, frozen


def test_what_outlives_a_first_run_in_process_is_frozen_once_after_the_start_froze_its_own(
    monkeypatch,
):
    """A sweep's process freezes its start's imports (run.cli: Hydra, its callback), then, after
    the first run it measures itself (bench.isolate=false), what that run left: torch's modules
    and objects (runner/job.py). The second freeze must happen though the first did, and once."""
    from nanogpt.runner import job

    monkeypatch.setattr(job, "_frozen_after_a_run", False)  # this process: no run yet
    with collector_paused():
        start = [[] for _ in range(10)]  # the start's imports
    first_run = [[] for _ in range(10)]  # what the first run imported and left
    job._freeze_what_outlives_a_run()
    later = [[] for _ in range(10)]  # a later run's
    job._freeze_what_outlives_a_run()
    tracked = {id(o) for o in gc.get_objects()}  # a frozen object is in no generation
    assert id(start) not in tracked and id(first_run) not in tracked
    assert id(later) in tracked  # once a process, not after every run


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", ["nanogpt.runner.worker", "nanogpt.runner.forkserver_preload"]
)  # fmt: skip
def test_a_worker_or_fork_server_has_the_collector_on_after_its_imports(module):
    """Each imports torch with the collector paused (process.collector_paused), then freezes what
    it imported; the points it measures (a fork server's children inherit its state) must find
    the collector on, or their garbage would pile up."""
    code = (
        "import gc, importlib, sys; importlib.import_module(sys.argv[1]); "
        "print(gc.isenabled(), gc.get_freeze_count() > 10000, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, module], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "True"]


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
    """The sweep's process composes, checks (validate/, hardware/device_support.py), launches and
    tabulates; torch is the fork server's and its children's. Importing it would cost the
    process seconds of its start on two cores, every sweep. It imports Hydra and its callback
    with the collector paused (run.cli), pandas only for the table at its end (a refused sweep
    never imports it): the collector must be on again by the sweep's end."""
    marker = tmp_path / "torch_in_sweep_process"
    setup = (
        "import atexit, gc; atexit.register(lambda: open("
        f"{str(marker)!r}, 'w').write(f\"{{'torch' in sys.modules}} {{gc.isenabled()}} \""
        "f\"{'pandas' in sys.modules}\"))"
    )
    refused = run_patched(setup, "-m", *with_micro(["perf.batch_size=0,1"]), cwd=tmp_path)
    assert refused.returncode == 2 and "perf.batch_size" in refused.stderr, refused.stderr
    assert marker.read_text() == "False True False"  # no torch, no pandas; the collector on
    sweep_dir = tmp_path / "sweep"
    # an optimizer.build class too: checked from its source, not imported (config/target_nodes.py)
    points = ["perf.batch_size=1,2", "optimizer.build._target_=torch.optim.Adagrad"]
    args = ["-m", *with_micro(points), f"hydra.sweep.dir={sweep_dir}"]
    proc = run_patched(setup, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(read_summary(sweep_dir)) == 2  # both points measured
    assert marker.read_text() == "False True True"  # no torch; the collector on; the table
    # the report rebuilds the table without it too
    code = f"import sys, runpy; {setup}; runpy.run_module('nanogpt.report', run_name='__main__')"
    report = subprocess.run(
        [sys.executable, "-c", code, str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "table:" in report.stdout and marker.read_text().split()[0] == "False"


@pytest.mark.slow
def test_the_entry_point_run_again_in_a_child_imports_nothing_heavy():
    """Each child of the fork server first runs the sweep's main module again, as __mp_main__
    (multiprocessing.spawn._fixup_main_from_name, for `python -m nanogpt.run`); run here as it
    runs there, it imports none of Hydra, OmegaConf (1-2 s a point on 2 cores, which no point
    uses), pandas (the table's, read at the end in the sweep's process: it cost a sweep refused
    before any point 0.4 s of CPU) or torch (the fork server's and its children's,
    test_a_cpu_sweeps_own_process_never_imports_torch)."""
    code = (
        "import runpy, sys; runpy.run_module('nanogpt.run', run_name='__mp_main__', "
        "alter_sys=True); "
        "print(sorted(m for m in ('hydra', 'omegaconf', 'pandas', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# A CPU slot of the parallel launcher forks its points itself (forkserver.fork_here), and a
# fresh interpreter's point (no fork server, a torchrun point) is started by Popen with a
# preexec_fn, which runs the same handlers. A Ctrl-C that lands while either forks would run its
# KeyboardInterrupt inside Python's at-fork handlers, which report it as "ignored" and drop it:
# the point would be measured whole and the sweep run on to exit 0. Here an at-fork handler
# sends the Ctrl-C at that moment, once.
CTRL_C_IN_FORK = """
import json, os, signal, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.runner import forkserver
from nanogpt.runner.handoff import Handoff, Job

folder, overrides = Path(sys.argv[1]), sys.argv[2:]
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    spec = to_spec(compose("config", overrides=overrides))
sent = []

def ctrl_c_mid_fork():
    if not sent:
        sent.append(os.getpid())
        os.kill(os.getpid(), signal.SIGINT)

if forkserver._fork_safe:  # NANOGPT_FORKSERVER=0: fresh interpreters
    forkserver.fork_here()
os.register_at_fork(before=ctrl_c_mid_fork)
try:
    outcome = forkserver.run_forked(Handoff("point", spec, Job(folder)), folder)
except KeyboardInterrupt:
    print(json.dumps({"raised": True}))
else:
    print(json.dumps({"raised": False, "interrupted": outcome.interrupted,
                      "exit": outcome.returncode, "sent": bool(sent)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("start", ["fork_here", "fresh_interpreter"])
def test_a_ctrl_c_while_a_point_is_forked_is_not_lost(start, tmp_path):
    """The fork runs with SIGINT and SIGTERM held (process.signals_held): the Ctrl-C is raised
    once the child exists and passed on to it (it came before the child was), which stops before
    it measures; the wait says so, and the job records the point as interrupted (runner/job.py).
    A forked child exits 130. A fresh interpreter is ended by the signal (-2), or, where the
    Ctrl-C lands while Python imports its own startup modules (site, os), by Python itself with
    exit 1 and a KeyboardInterrupt traceback ("Fatal Python error: init_import_site"): Python
    does so for any Ctrl-C at that moment, and either way the point is not measured."""
    env = {**os.environ, "NANOGPT_FORKSERVER": "0" if start == "fresh_interpreter" else "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_FORK, str(tmp_path), *with_micro([])],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    exit_code = seen.pop("exit")
    assert seen == {"raised": False, "interrupted": True, "sent": True}
    if start == "fork_here":
        assert exit_code == 130
    else:  # Python's own exit 1 says why: the Ctrl-C, raised as it imported site
        site = "init_import_site" in proc.stderr and "KeyboardInterrupt" in proc.stderr
        assert exit_code == -signal.SIGINT or (exit_code == 1 and site), proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr
    assert start != "fork_here" or "Traceback" not in proc.stderr
