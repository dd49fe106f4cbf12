"""Faults: every sweep point ends with a record and the right status, whatever happens to it.

Real `python -m nanogpt.run` processes with the testing knob bench.inject_fault (oom, nan, raise,
kill at a given step), real signals (Ctrl-C as SIGINT to the process group, kill -9 of the
sweep), and the bad-input list of the issue "faults", each a real process.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from nanogpt.analysis import sweep_lock
from nanogpt.analysis.store import read_result
from nanogpt.analysis.sweep_lock import LOCK_FILE
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import hydra_error_line, to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.record.faults import CONFIG_EXIT, Fault, classify, describe, exit_code

from .conftest import (
    report_cli,
    run_cli,
    run_patched,
    with_micro,
)
from .signalling import in_terminal, interrupt, wait_until

FAULTS = {"null": "ok", "oom@2": "oom", "nan@2": "diverged", "raise@2": "error", "kill@2": "error"}


def records_by(sweep_dir, key: str, where: dict[str, str] | None = None) -> dict[str, dict]:
    """The sweep's records (those whose overrides include `where`), keyed by override `key`."""
    out = {}
    for path in sweep_dir.glob("*/result.json"):
        record = read_result(path)
        overrides = dict(o.split("=", 1) for o in record["overrides"])
        if (where or {}).items() <= overrides.items():
            out[overrides[key]] = record
    return out


@contextlib.contextmanager
def sweep_in_terminal(tmp_path, *overrides: str):
    """A multirun in its own session (so the test can signal it as a terminal would), killed
    with its group if the test leaves it running; its stderr goes to tmp_path/stderr.txt."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}"]
    command = [sys.executable, "-m", "nanogpt.run", *args]
    with (
        open(tmp_path / "stderr.txt", "wb") as stderr,
        in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=stderr) as proc,
    ):
        yield proc, sweep_dir


# ---------------------------------------------------------------------------------------------
# The guard's pieces, on real exceptions
# ---------------------------------------------------------------------------------------------


def test_a_real_cpu_allocation_failure_is_oom_and_other_failures_are_not():
    with pytest.raises(RuntimeError) as cpu_oom:
        torch.empty(1 << 47, dtype=torch.uint8)  # 128 TiB: the default allocator refuses
    assert classify(cpu_oom.value) == "oom"
    # a system call that refuses memory (ENOMEM), as an mmap, a library's mapping or a thread's
    # stack does under the max-batch search's address-space limit, is out of memory too
    with pytest.raises(OSError) as refused:
        mmap.mmap(-1, 1 << 47)  # 128 TiB of address space: the kernel refuses the mapping
    assert refused.value.errno == errno.ENOMEM and classify(refused.value) == "oom"
    with pytest.raises(OSError) as missing:
        open("/nonexistent/file")  # noqa: SIM115 -- an OSError that is not about memory
    assert classify(missing.value) == "error"
    assert classify(KeyboardInterrupt()) == "interrupted"
    assert classify(ValueError("bad")) == "error"
    assert describe(ValueError("first\nsecond")) == "ValueError: first"
    assert describe(KeyboardInterrupt()) == "KeyboardInterrupt"


# Under an address-space limit (the max-batch search's on CPU) the allocation refused can be a
# small one inside torch's C++ rather than a tensor's storage: a graph that only grows nodes makes
# it one, and torch raises C++'s std::bad_alloc as a RuntimeError whose whole text is its name.
BAD_ALLOC = """
import resource, psutil, torch
from nanogpt.record.faults import classify, describe
y = torch.ones(1, requires_grad=True)
resource.setrlimit(resource.RLIMIT_AS, (psutil.Process().memory_info().vms + (64 << 20), -1))
try:
    while True:
        y = y * 1.0001  # one more autograd node; of the products only the last is kept
except BaseException as exc:
    print(classify(exc), describe(exc))
"""


@pytest.mark.slow
def test_a_refused_allocation_in_torchs_cpp_is_oom():
    proc = subprocess.run(
        [sys.executable, "-c", BAD_ALLOC], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "oom RuntimeError: std::bad_alloc", proc.stdout + proc.stderr


@pytest.mark.parametrize("text", ["oom", "boom@2", "nan@x", "@3"])
def test_a_malformed_fault_knob_names_the_key(text):
    with pytest.raises(ConfigError, match=r"^bench\.inject_fault: "):
        Fault.parse(text)


# ---------------------------------------------------------------------------------------------
# Injected faults in real sweeps
# ---------------------------------------------------------------------------------------------


def test_injected_faults_each_get_a_record_and_only_errors_fail_the_sweep(sweep):
    proc, sweep_dir = sweep(
        "bench.inject_fault=" + ",".join(FAULTS),
        "bench.memory_snapshot=true",  # CUDA only: on CPU it must be a harmless no-op
    )
    records = records_by(sweep_dir, "bench.inject_fault")
    assert {fault: r["status"] for fault, r in records.items()} == FAULTS, proc.stderr[-3000:]
    assert "can't allocate memory" in records["oom@2"]["error"]
    assert records["nan@2"]["error"].startswith("Diverged: loss is nan")
    assert records["raise@2"]["error"] == "RuntimeError: injected fault at step 2"
    assert "killed by signal 9" in records["kill@2"]["error"]
    # The row keeps what was measured before the failure.
    assert records["oom@2"]["first_step_ms"] > 0 and records["oom@2"]["n_params"] > 0
    assert records["nan@2"]["measured_steps"] == 4 and records["nan@2"]["step_ms_median"] > 0
    assert records["oom@2"]["mem_peak_rss_bytes"] > 0
    assert not list(sweep_dir.rglob("*.pickle"))
    # Every point is in the table; the two error rows make the sweep fail, by name.
    table = read_summary(sweep_dir)
    assert len(table) == len(FAULTS) and sorted(table["status"]) == sorted(FAULTS.values())
    assert proc.returncode == 1
    failed_line = next(line for line in proc.stderr.splitlines() if "point(s) failed:" in line)
    assert "2 point(s) failed:" in failed_line  # (after the killed child's last progress bar)
    assert (
        "bench.inject_fault=raise@2" in failed_line and "bench.inject_fault=kill@2" in failed_line
    )


def test_oom_and_nan_are_results_and_one_process_releases_memory_between_points(sweep):
    """bench.isolate=false: all points in the Hydra process. A big healthy point comes first; the
    small healthy point measured after it (and after an OOM and a divergence) must not inherit
    its memory peak."""
    proc, sweep_dir = sweep(
        "bench.isolate=false",
        "model.n_layer=2",
        "model.n_embd=384,32",
        "bench.inject_fault=null,oom@2,nan@2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = read_summary(sweep_dir)
    assert sorted(table["status"]) == sorted(["ok", "oom", "diverged"] * 2)
    healthy = records_by(sweep_dir, "model.n_embd", where={"bench.inject_fault": "null"})
    big, small = healthy["384"], healthy["32"]
    assert big["status"] == small["status"] == "ok"
    if small["mem_peak_rss_method"] != "vmhwm":
        pytest.skip("no resettable peak RSS here (/proc/self/clear_refs); ru_maxrss is lifetime")
    # The big point's weights, gradients and AdamW moments alone are ~16 bytes per parameter.
    assert big["mem_peak_rss_bytes"] - small["mem_peak_rss_bytes"] > 8 * big["n_params"]


# ---------------------------------------------------------------------------------------------
# Signals: Ctrl-C and kill -9
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "how,code,error",
    [
        ("ctrl-c", 130, "KeyboardInterrupt"),  # SIGINT to the process group, as a terminal does
        ("sigterm", 143, "Stopped: SIGTERM"),  # SIGTERM to the sweep alone: timeout, schedulers
        ("sigterm-group", 143, "Stopped: SIGTERM"),  # SIGTERM to every process: SLURM
    ],
)
def test_a_stop_records_the_point_as_interrupted_builds_the_table_and_exits(
    tmp_path, how, code, error
):
    stderr = tmp_path / "stderr.txt"
    points = ("perf.batch_size=1,2", "bench.measure_steps=100000", "bench.time_budget_s=600")
    with sweep_in_terminal(tmp_path, *points) as (proc, sweep_dir):
        # The job's log has a progress line once the first measured window is in: the loop runs.
        log = sweep_dir / "0" / "run-1" / "run.log"
        measuring = lambda: log.is_file() and b"measure step" in log.read_bytes()  # noqa: E731
        wait_until(measuring, "the first measured window", proc, timeout=120)
        processes = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        sig = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
        interrupt(proc, sig, group=how != "sigterm")  # sigterm: the sweep's process alone
    err = stderr.read_text()
    assert proc.returncode == code, err[-3000:]
    assert "interrupted at" in err and f"hydra.sweep.dir={sweep_dir}" in err
    record = read_result(sweep_dir / "0" / "result.json")
    assert record["status"] == "interrupted" and record["error"] == error
    assert record["measured_steps"] >= 10 and record["step_ms_median"] > 0
    assert not (sweep_dir / "1").exists()  # the sweep stopped
    table = read_summary(sweep_dir)
    assert table["status"].tolist() == ["interrupted"]
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive  # no measuring process left behind


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux")
def test_a_fork_server_that_dies_in_its_preload_costs_no_point(tmp_path):
    """The server's preload raising (as its no-CUDA assertion would): every point still runs,
    in a fresh interpreter, after one warning line."""
    (tmp_path / "broken_preload.py").write_text("raise RuntimeError('preload failed')\n")
    sweep_dir = tmp_path / "sweep"
    setup = "from nanogpt.runner import forkserver; forkserver.PRELOAD = ['broken_preload']"
    args = ["-m", *with_micro(["perf.batch_size=1,2"]), f"hydra.sweep.dir={sweep_dir}"]
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    proc = run_patched(setup, *args, cwd=tmp_path, env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("warning: no fork server") == 1
    statuses = [read_result(p)["status"] for p in sweep_dir.glob("*/result.json")]
    assert statuses == ["ok", "ok"]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_measuring_process_dies_with_its_job_process():
    """kill -9 of a job process takes its measuring process along (it would run 60 s)."""
    job_process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess; from nanogpt.runner.process import die_with_parent; "
            "p = subprocess.Popen(['sleep', '60'], preexec_fn=die_with_parent); "
            "print(p.pid, flush=True); p.wait()",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = psutil.Process(int(job_process.stdout.readline()))
    try:
        job_process.kill()
        job_process.wait(timeout=30)
        _, alive = psutil.wait_procs([child], timeout=10)
        assert not alive
    finally:
        if child.is_running():
            child.kill()
        job_process.stdout.close()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_kill_9_mid_sweep_then_one_rerun_completes_it_with_each_point_once(tmp_path):
    points = ("perf.batch_size=1,2",)
    with sweep_in_terminal(tmp_path, *points) as (proc, sweep_dir):
        wait_until((sweep_dir / "1" / "run-1" / "job.json").exists, "point 1's start", proc)
        parent = psutil.Process(proc.pid)
        wait_until(parent.children, "point 1's measuring process", proc, timeout=30)
        children = parent.children(recursive=True)
        # the sweep (Hydra's process) alone, mid-point
        interrupt(proc, signal.SIGKILL, group=False, timeout=30)
        _, alive = psutil.wait_procs(children, timeout=30)  # they die with it (test above)
        assert not alive
    # The killed sweep held the dir's lock (its pid is in the lock file); the kernel released
    # it with the process: no stale lock after kill -9, and the rerun below takes it.
    assert f'"pid": {proc.pid},' in (sweep_dir / LOCK_FILE).read_text()
    assert sweep_lock.holder(sweep_dir) is None
    assert (sweep_dir / "0" / "run-1" / "result.json").is_file()  # a point's run, POINT/run-R
    assert not (sweep_dir / "1" / "run-1" / "result.json").exists()
    # Debris a crash can leave: a half-written record and an atomic write's temp file.
    (sweep_dir / "9").mkdir()
    (sweep_dir / "9" / "result.json").write_text('{"status": "ok", "overrides": ["perf.ba')
    (sweep_dir / "1" / "run-1" / ".result.json.x1y2.tmp").write_text('{"status": "ok"')
    (sweep_dir / "0" / ".record-k9").mkdir()  # a record being placed when the sweep died
    (sweep_dir / "0" / ".record-k9" / "result.json").write_text('{"status": "ok", "ov')

    again = run_cli("-m", *with_micro(points), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)

    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: kept 1 run(s) of 1 point(s)" in again.stdout
    assert f"skipped unreadable record: {sweep_dir / '9' / 'result.json'}" in again.stderr
    assert ".record-k9" not in again.stderr  # no record of the sweep's, nor debris to list
    table = read_summary(sweep_dir)
    batch_sizes = sorted(
        dict(o.split("=") for o in row.split())["perf.batch_size"] for row in table["overrides"]
    )
    assert batch_sizes == ["1", "2"] and set(table["status"]) == {"ok"}  # each point once
    assert not list(sweep_dir.glob("*/run-*/measurement.json"))

    # A damaged pooled record (a derived file) is rebuilt from its runs, by the report and by
    # the rerun, with one line each; the table has both points.
    pooled = sweep_dir / "1" / "result.json"
    damaged = '{"status": "ok", "tokens_per'
    pooled.write_text(damaged)
    report = report_cli(sweep_dir)
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"rebuilt unreadable pooled record {pooled} from its runs" in report.stderr
    assert "(2 points)" in report.stdout and f"unreadable record: {pooled}" not in report.stderr
    pooled.write_text(damaged)
    rerun = run_cli("-m", *with_micro(points), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stderr.count("rebuilt unreadable pooled record") == 1
    assert f"rebuilt unreadable pooled record {pooled}" in rerun.stderr
    table = read_summary(sweep_dir)
    assert len(table) == 2 and set(table["status"]) == {"ok"}
    run = read_result(pooled.parent / "run-1" / "result.json")
    assert read_result(pooled)["tokens_per_s"] == run["tokens_per_s"]


@contextlib.contextmanager
def stopped(proc: subprocess.Popen):
    """`proc`'s process group stopped (SIGSTOP) for the block, then continued (SIGCONT)."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_second_sweep_into_a_dir_being_written_is_refused_naming_the_first(tmp_path):
    """Two sweeps into one dir at once: the second exits 2 with one line naming the first
    (its pid and host) and the fix, touching nothing; the report reads the dir meanwhile and
    says a sweep is still writing it; the first's table and records agree."""
    points = ("perf.batch_size=1,2,3",)
    with sweep_in_terminal(tmp_path, *points) as (proc, sweep_dir):
        saved_config = sweep_dir / "multirun.yaml"  # written by the sweeper, after the lock
        wait_until(saved_config.exists, "the first sweep's start", proc)
        assert sweep_lock.holder(sweep_dir)
        saved = saved_config.read_text()
        # The first sweep held still (SIGSTOP to its group, its lock held with it) while the
        # second starts: on a loaded machine the second's start outlasted the first's 3 points
        with stopped(proc):
            second = run_cli(
                "-m", *with_micro(points), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path
            )
        first_record = sweep_dir / "0" / "run-1" / "result.json"
        wait_until(first_record.exists, "the first sweep's first record", proc)
        with stopped(proc):
            report = report_cli(sweep_dir)
        proc.wait(timeout=300)
    assert second.returncode == CONFIG_EXIT, second.stderr[-3000:]
    line = second.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"error: hydra.sweep.dir: {sweep_dir} is being written by another")
    assert f"pid {proc.pid} on host {socket.gethostname()}" in line
    assert "give this one another hydra.sweep.dir" in line
    assert saved_config.read_text() == saved  # the second wrote nothing
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"note: a sweep is still writing {sweep_dir} (pid {proc.pid}" in report.stderr
    assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    # The first's table is its records: each row's figures are its point's one run's.
    table = read_summary(sweep_dir)
    assert len(table) == 3 and set(table["status"]) == {"ok"}
    for row in table.itertuples():
        run = read_result(Path(row.job_dir) / "run-1" / "result.json")
        assert run["status"] == "ok" and run["tokens_per_s"] == row.tokens_per_s
        assert run["overrides"] == row.overrides.split()
    assert sweep_lock.holder(sweep_dir) is None  # released with the process
    assert not list(sweep_dir.rglob(".record-*"))  # every record moved into place whole


# ---------------------------------------------------------------------------------------------
# Bad input: one message naming the key, non-zero exit, no traceback, no record
# ---------------------------------------------------------------------------------------------

# (case id, arguments, text the first line must name). Data files are made in bad_input_runs.
CONFIG_ERRORS = [
    ("zero-size", ["perf.batch_size=0"], "perf.batch_size"),
    ("negative-size", ["model.n_layer=-1"], "model.n_layer"),
    ("n_embd-not-divisible", ["model.n_embd=33"], "model.n_embd"),
    ("dtype-device-cannot-do", ["perf.dtype=tf32"], "perf.dtype"),
    ("attention-device-cannot-do", ["perf.attention=cudnn"], "perf.attention"),
    ("cuda-without-cuda", ["bench.device=cuda"], "bench.device"),
    ("missing-data-file", ["data=tokens", "data.path={d}/missing.bin"], "data.path"),
    ("data-shorter-than-block", ["data=tokens", "data.path={d}/short.bin"], "model.block_size"),
    ("odd-sized-bin", ["data=tokens", "data.path={d}/odd.bin"], "data.path"),
    ("empty-text", ["data=text", "data.path={d}/empty.txt"], "data.path"),
    ("non-utf8-text", ["data=text", "data.path={d}/latin1.txt"], "data.path"),
    ("token-beyond-vocab", ["data=tokens", "data.path={d}/big_ids.bin"], "model.vocab_size"),
    ("malformed-fault-knob", ["bench.inject_fault=oom"], "bench.inject_fault"),
    ("negative-lr", ["optimizer.lr=-1"], "optimizer.lr"),
    ("betas-past-one", ["optimizer.betas=[2,3]"], "optimizer.betas"),
    ("min-steps-past-steps", ["bench.min_measure_steps=9"], "bench.min_measure_steps"),
]
# Hydra's own errors (composition, override grammar), which run.py turns into one line.
HYDRA_ERRORS = [
    ("unknown-group-option", ["model=nosuch"], "model=nosuch"),
    ("unknown-key", ["model.nosuch=1"], "model.nosuch"),
    ("wrong-type", ["perf.batch_size=abc"], "perf.batch_size"),
    ("sweep-value-empty", ["-m", "perf.batch_size=1,,2"], "perf.batch_size=1,,2"),
    ("sweep-list-unclosed", ["-m", "perf.batch_size=[1,2"], "perf.batch_size=[1,2"),
]


def _params(cases):
    return [pytest.param(*case, id=case[0]) for case in cases]


# The CLI path of each kind of refusal runs for real once (bad_input_runs): a check of the spec
# (run.py's ConfigError line), Hydra's composition error (main_with_one_line_errors) and its
# override parser under -m; plus the report's. Every case of CONFIG_ERRORS and HYDRA_ERRORS is
# refused in-process too (test_every_bad_config_is_refused_in_process_naming_the_key), through
# the same to_spec and hydra_error_line whose words the CLI prints.
CLI_CASES = ["zero-size", "unknown-key", "sweep-list-unclosed"]


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    """The bad data files CONFIG_ERRORS name ({d})."""
    data = tmp_path_factory.mktemp("bad_data")
    np.array([1, 2, 3], dtype="<u2").tofile(data / "short.bin")
    (data / "odd.bin").write_bytes(b"\x01\x00\x02")
    (data / "empty.txt").write_bytes(b"")
    (data / "latin1.txt").write_bytes("déjà vu, encore et encore. ".encode("latin-1") * 10)
    np.array([1, 2, 300] * 20, dtype="<u2").tofile(data / "big_ids.bin")  # vocab_size is 256
    return data


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory, bad_data):
    """The CLI_CASES, each a real process, two at a time (each is ~3 s of imports), and the
    report on an empty dir (in this process: its exit code is what main returns): case id ->
    (process, the dir where no record may appear)."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "empty_sweep").mkdir()
    cases = dict((case[0], case[1]) for case in CONFIG_ERRORS + HYDRA_ERRORS)

    def run(case_id: str, args: list[str]):
        out = root / case_id
        mode = args[:1] if args[0] == "-m" else []
        overrides = with_micro([a.format(d=bad_data) for a in args[len(mode) :]])
        where = f"hydra.sweep.dir={out}" if mode else f"hydra.run.dir={out}"
        return case_id, (run_cli(*mode, *overrides, where, cwd=root), out)

    def report_empty():
        empty = root / "empty_sweep"
        proc = report_cli(empty)
        return "report-on-empty-dir", (proc, empty)

    jobs = [lambda c=c: run(c, cases[c]) for c in CLI_CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(pool.map(lambda job: job(), jobs))
    return dict([*runs.items(), report_empty()])  # the report in this process, after them


def _assert_refused(proc, out, named: str) -> list[str]:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and named in lines[0], proc.stderr
    assert not list(out.rglob("result.json"))
    return lines


@pytest.mark.parametrize(
    "case_id,args,named", _params(c for c in CONFIG_ERRORS + HYDRA_ERRORS if c[0] in CLI_CASES)
)
def test_bad_config_is_one_line_naming_the_key_and_nothing_is_recorded(
    bad_input_runs, case_id, args, named
):
    proc, out = bad_input_runs[case_id]
    lines = _assert_refused(proc, out, named)
    assert len(lines) == 1 and lines[0].startswith(f"error: {named}: ")
    assert proc.returncode == CONFIG_EXIT


@pytest.fixture(scope="module")
def hydra_conf():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        yield


def refusal_line(args: list[str], data) -> str:
    """What `python -m nanogpt.run ARGS` prints for a config it refuses, worked out in this
    process as run.py does: compose, check (to_spec), and word the error as run.py does."""
    overrides = with_micro([a.format(d=data) for a in args if a != "-m"])
    try:
        to_spec(compose("config", overrides=overrides))
    except ConfigError as err:  # run.main prints it and exits CONFIG_EXIT
        return f"error: {err}"
    except (HydraException, OmegaConfBaseException) as err:  # main_with_one_line_errors
        return f"error: {hydra_error_line(err)}"
    raise AssertionError(f"{args} was not refused")


@pytest.mark.parametrize("case_id,args,named", _params(CONFIG_ERRORS + HYDRA_ERRORS))
def test_every_bad_config_is_refused_in_process_naming_the_key(
    hydra_conf, bad_data, case_id, args, named
):
    # Refused before anything runs, so nothing is recorded; the exit code, the absence of a
    # traceback and of a record are asserted on the real CLI for CLI_CASES, one of each kind
    # (test_bad_config_is_one_line_naming_the_key_and_nothing_is_recorded).
    line = refusal_line(args, bad_data)
    assert "\n" not in line and line.startswith(f"error: {named}: "), line


def test_report_on_a_dir_without_records_is_one_line(bad_input_runs):
    proc, out = bad_input_runs["report-on-empty-dir"]
    lines = _assert_refused(proc, out, "result.json")
    assert len(lines) == 1 and proc.returncode == 2


def test_a_single_run_exits_0_only_when_its_point_is_ok(single):
    # One real single run, with a status whose code is neither 0 nor the generic 1; each status's
    # code is faults.exit_code's (the next test), and the faults behind the statuses are real in
    # test_injected_faults_each_get_a_record_and_only_errors_fail_the_sweep.
    proc, run_dir = single("bench.inject_fault=nan@2", "bench.isolate=false")
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert read_result(run_dir / "result.json")["status"] == "diverged"
    assert "recorded with status diverged (exit code 4)" in proc.stderr


def test_each_status_has_its_own_exit_code_and_only_ok_is_0():
    codes = {status: exit_code(status) for status in ("ok", "error", "oom", "diverged")}
    assert codes == {"ok": 0, "error": 1, "oom": 3, "diverged": 4}
    assert exit_code("a status added later") == 1  # never 0 for a point that is not ok
    assert exit_code("interrupted") == 128 + signal.SIGINT  # no SIGTERM came to this process


@pytest.mark.parametrize(
    "overrides,first_line",
    [
        (["model.n_embd=32", "model.n_head=2,3,4"], "error: point 2 of 3 ("),
        (
            ["perf.batch_size=1,2", "report.baseline='perf.batch_size=4'"],
            "error: report.baseline: ",
        ),
    ],
)
def test_a_bad_point_anywhere_stops_the_sweep_before_anything_is_measured(
    sweep, overrides, first_line
):
    proc, sweep_dir = sweep(*overrides)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(first_line), lines
    assert "model.n_head=3): model.n_embd: " in lines[0] or "report.baseline" in first_line
    assert not sweep_dir.exists()  # nothing measured, nothing written


def _can_mount_a_private_tmpfs() -> bool:
    probe = "mount -t tmpfs -o size=64k tmpfs /mnt"
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", probe],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_a_private_tmpfs(), reason="needs unshare and a tmpfs mount")
def test_a_full_disk_is_one_line_keeps_the_records_and_the_rerun_resumes(tmp_path):
    """A real ENOSPC: the sweep runs on a 64 KiB tmpfs in a private mount namespace (a few
    points' files fit), then is resumed on the real disk."""
    tiny, out = tmp_path / "tiny", tmp_path / "out"
    tiny.mkdir()
    out.mkdir()
    points = ["perf.batch_size=1,2,3,4,5,6"]
    run = [sys.executable, "-m", "nanogpt.run", "-m", *with_micro(points)]
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {tiny} && "
        f"{' '.join(run)} hydra.sweep.dir={tiny}/sweep 2> {out}/stderr.txt; "
        f"echo $? > {out}/code; cp -r {tiny}/sweep {out}/sweep"
    )
    subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        cwd=tmp_path,
        timeout=300,
        check=True,
    )
    lines = (out / "stderr.txt").read_text().strip().splitlines()
    assert (out / "code").read_text().strip() == "74", lines[-5:]
    assert "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith("error: ") and "No space left on device" in lines[-1]
    kept = [read_result(p) for p in (out / "sweep").glob("*/run-*/result.json")]
    assert 1 <= len(kept) < 6 and all(r["status"] == "ok" for r in kept)  # whole, readable
    again = run_cli(
        "-m", *with_micro(points), f"hydra.sweep.dir={out}/sweep", cwd=tmp_path, timeout=300
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resume: kept {len(kept)} run(s) of {len(kept)} point(s)" in again.stdout
    assert len(read_summary(out / "sweep")) == 6
