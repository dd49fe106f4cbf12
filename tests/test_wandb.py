"""W&B logging against real wandb in offline mode: every run is read back from its run file.

Each process runs in an environment with no WANDB_* variables and a temporary HOME (so no
~/.netrc and no API key), which is what `logger.mode=auto` decides on. W&B init costs about a
second, so the runs are few: one in-process 2-job sweep (2 runs + the summary run) serves
several tests.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from nanogpt.analysis import store as records
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.spec import LoggerConfig, LoggerMode
from nanogpt.publish.wandb_mode import api_key_configured, resolve_mode
from nanogpt.publish.wandb_sink import WandbSink, start_run
from nanogpt.record.summary_keys import summary_key
from tests.wandb_reader import OfflineRun, read_run, run_file

from .conftest import WANDB, WANDB_SWEEP, run_without_a_key, with_micro

HISTORY_STEPS = [3, 5, 7]
WINDOW_KEYS = {"step_ms", "tokens_per_s", "mfu", "loss", "lr", "mem_rss_bytes"}
NOT_IN_SUMMARY = {"wall_s"}  # measured around the point by the job process, after the run
# Runs the CLI with wandb made unimportable, as when it is not installed.
WITHOUT_WANDB = (
    "import sys; sys.modules['wandb'] = None; sys.argv[0] = 'nanogpt.run'; "
    "from nanogpt.run import hydra_main; hydra_main()"
)


def run_nanogpt(args: list[str], cwd: Path, env: dict | None = None, code: str | None = None):
    return run_without_a_key("nanogpt.run", args, cwd, env, code)


def offline_runs(directory: Path) -> list[Path]:
    return sorted((directory / "wandb").glob("offline-run-*"))


def the_run(directory: Path) -> OfflineRun:
    (run_dir,) = offline_runs(directory)
    return read_run(run_file(run_dir))


def result_of(job_dir: Path) -> dict:
    return read_result(job_dir / records.RESULT_FILE)


def measured_window_medians(job_dir: Path, window: int) -> list[float]:
    with open(job_dir / records.STEPS_FILE) as f:
        step_ms = [float(row["step_ms"]) for row in csv.DictReader(f) if row["phase"] == "measure"]
    return [statistics.median(step_ms[i : i + window]) for i in range(0, len(step_ms), window)]


def assert_run_holds_its_job(run: OfflineRun, job_dir: Path) -> None:
    """History and summary of the run are this job's own figures."""
    result = result_of(job_dir)
    assert run.name == result["overrides_str"]
    assert run.job_type == "point"
    assert run.config["perf"]["batch_size"] == result["batch_size"]
    assert run.config["perf"]["dtype"] == "fp32"  # resolved, plain values
    assert run.exit_code == 0

    assert [row["_step"] for row in run.history] == HISTORY_STEPS
    warmup, *measured = run.history
    assert {k for k in warmup if not k.startswith("_")} == {f"warmup/{k}" for k in WINDOW_KEYS}
    assert [row["train/step_ms"] for row in measured] == pytest.approx(
        measured_window_medians(job_dir, window=2)
    )
    for row in measured:
        assert {f"train/{k}" for k in WINDOW_KEYS} <= row.keys()
        assert row["train/lr"] == run.config["optimizer"]["lr"]
        step_s = row["train/step_ms"] / 1e3
        assert row["train/tokens_per_s"] == pytest.approx(result["tokens_per_step"] / step_s)
        # MFU is inversely proportional to step time, with the record's FLOPs and peak.
        assert row["train/mfu"] * row["train/step_ms"] == pytest.approx(
            result["mfu"] * result["step_ms_median"]
        )
    assert measured[-1]["train/loss"] == pytest.approx(result["loss_last"])

    assert run.summary["point/status"] == "ok"  # namespaced by the record's part
    # define_metric: the windows have no summary, so tokens_per_s there is the record's median
    # step's, and no last window's figure sits beside it.
    assert not [key for key in run.summary if key.startswith(("train/", "warmup/"))]
    assert run.summary["rates/tokens_per_s"] == result["tokens_per_s"]
    assert run.config["point"]["id"] == result["point_id"]  # one identity: the record's
    for key in result.keys() - NOT_IN_SUMMARY:
        assert run.summary[summary_key(key)] == result[key], key


@pytest.fixture(scope="module")
def in_process_sweep(wandb_sweep):
    """2 jobs in the one Hydra process (bench.isolate=false), W&B offline: the session's
    (conftest.WANDB_SWEEP), the first diagnosed, the second not."""
    return wandb_sweep


@pytest.fixture(scope="module")
def result_keys(in_process_sweep) -> set[str]:
    _, sweep_dir = in_process_sweep
    return set(result_of(sweep_dir / "0"))


def test_each_job_of_an_in_process_multirun_is_its_own_run(in_process_sweep):
    _, sweep_dir = in_process_sweep
    runs = {job: the_run(sweep_dir / job / "run-1") for job in ("0", "1")}  # POINT/run-R
    assert runs["0"].run_id != runs["1"].run_id
    for job, run in runs.items():
        assert run.group == f"{sweep_dir.parent.name}/{sweep_dir.name}"  # date/time, not time
        assert_run_holds_its_job(run, sweep_dir / job)
    assert [r.config["bench"]["diagnose"] for r in runs.values()] == [True, False]


def test_sweep_table_goes_to_a_summary_run_of_the_same_group(in_process_sweep):
    _, sweep_dir = in_process_sweep
    (run_dir,) = offline_runs(sweep_dir)
    run = read_run(run_file(run_dir))
    assert (run.job_type, run.group) == ("sweep-summary", f"{sweep_dir.parent.name}/sweep")
    assert f"sweep-{sweep_dir.parent.name}-sweep" in run.artifacts  # summary.csv, named by group
    (logged,) = run.history
    assert logged["sweep_table.nrows"] == 2
    table = json.loads((run_dir / "files" / logged["sweep_table.path"]).read_text())
    logged_table = pd.DataFrame(table["data"], columns=table["columns"])
    summary = read_summary(sweep_dir)
    assert list(logged_table["overrides"]) == list(summary["overrides"])
    assert list(logged_table["mfu"]) == pytest.approx(list(summary["mfu"]))


@pytest.mark.slow
def test_auto_without_a_key_logs_offline_from_the_measuring_child(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_nanogpt([*with_micro(WANDB), f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "job.json").exists()  # measured in the child process
    (wandb_run_dir,) = offline_runs(run_dir)
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("W&B:")]
    assert "no API key" in line and f"`wandb sync {wandb_run_dir}`" in line
    assert "warning" not in proc.stderr
    assert_run_holds_its_job(the_run(run_dir), run_dir)


def test_disabled_and_none_write_no_wandb_files(tmp_path, result_keys):
    sweep_dir = tmp_path / "sweep"
    overrides = ["logger=none,wandb", "logger.mode=disabled", "bench.isolate=false"]
    proc = run_nanogpt(["-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not list(sweep_dir.rglob("wandb")) and "W&B" not in proc.stdout + proc.stderr
    for job in ("0", "1"):
        result = result_of(sweep_dir / job)
        assert result["status"] == "ok" and set(result) == result_keys


def free_port() -> int:
    """A local port nothing listens on: a W&B server that cannot be reached."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_wandb_service(tmp_path: Path) -> dict:
    """wandb's own variable for the service process its runs talk to (the format is wandb's:
    its own token class writes it), pointed at a socket nothing listens on: a real wandb.init
    fails to connect, offline as well as online."""
    from wandb.sdk.lib.service.service_token import UnixServiceToken

    token = UnixServiceToken(parent_pid=1, path=str(tmp_path / "no-service.sock"))
    return {"WANDB_SERVICE": token.env_value}


FAILURES = {
    "init": (dead_wandb_service, ["logger.mode=offline"], None, "wandb.init failed"),
    "not installed": (lambda _: {}, [], WITHOUT_WANDB, "wandb cannot be imported"),
}


class RefusingServer(BaseHTTPRequestHandler):
    """A W&B server on the loopback interface that refuses every API key."""

    def refuse(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"errors": [{"message": "invalid api key"}]}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = refuse

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusingServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_an_unreachable_server_is_asked_once_a_sweep_and_costs_seconds(tmp_path):
    """A key, and W&B's server out of reach (a closed loopback port): the sweep asks once, with
    one warning, and every run and the summary run log offline from their start, each with its
    `wandb sync` command; the sweep takes about as long as the same sweep with logger=none
    (each run used to wait out its own online init: ~33 s a run)."""
    env = {"WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": f"http://127.0.0.1:{free_port()}"}

    def timed(name: str, *overrides: str):
        sweep_dir = tmp_path / name
        args = [
            "-m",
            *with_micro(["perf.batch_size=1,2", *overrides]),
            f"hydra.sweep.dir={sweep_dir}",
        ]
        started = time.perf_counter()
        proc = run_nanogpt(args, tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc, sweep_dir, time.perf_counter() - started

    _, _, none_s = timed("none", *WANDB, "logger=none")  # the same steps, no W&B
    proc, sweep_dir, wandb_s = timed("wandb", *WANDB)  # logger.init_timeout_s: its 30 s default
    assert wandb_s < none_s + 15, (wandb_s, none_s)
    (warning,) = [line for line in proc.stderr.splitlines() if "cannot be reached" in line]
    assert warning.startswith(f"warning: W&B: {env['WANDB_BASE_URL']} cannot be reached (")
    assert "every run of this sweep logs offline" in warning
    assert "online init failed" not in proc.stderr  # no run tried
    (view,) = [line for line in proc.stderr.splitlines() if "W&B view" in line]
    assert "not published (W&B unreachable at the sweep's start" in view
    for directory in (sweep_dir / "0" / "run-1", sweep_dir / "1" / "run-1", sweep_dir):
        (run_dir,) = offline_runs(directory)
        assert read_run(run_file(run_dir)).exit_code == 0
    assert "W&B unreachable at the sweep's start" in proc.stdout  # where the runs' data went


@pytest.mark.slow
def test_online_init_that_fails_logs_offline_and_says_how_to_sync(tmp_path, refusing_server):
    """A key makes `auto` go online; the server answers but refuses the key: the point's run
    and the sweep's summary run go offline in the same process, each with its `wandb sync`
    command, and the result is unchanged; the sweep's view is saved to its file without
    waiting on that server again."""
    url = refusing_server
    sweep_dir = tmp_path / "sweep"
    overrides = [*WANDB, "logger.init_timeout_s=2", "bench.isolate=false"]
    args = ["-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}"]
    proc = run_nanogpt(args, tmp_path, env={"WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": url})
    assert proc.returncode == 0, proc.stderr
    fallbacks = [line for line in proc.stderr.splitlines() if "online init failed (" in line]
    assert len(fallbacks) == 2 and all("logging offline instead" in x for x in fallbacks)
    # the view is not tried against the server the summary run just failed to reach
    (view,) = [line for line in proc.stderr.splitlines() if "W&B view" in line]
    assert "not published (the sweep's summary run: online init failed)" in view
    for directory, job_type in ((sweep_dir / "0" / "run-1", "point"), (sweep_dir, "sweep-summary")):
        # One run dir: the failed online attempt left none behind.
        (run_dir,) = [
            p
            for p in (directory / "wandb").iterdir()
            if p.name.startswith(("run-", "offline-run-"))
        ]
        assert run_dir.name.startswith("offline-run-")
        assert f"upload later with `wandb sync {run_dir}`" in proc.stdout
        run = read_run(run_file(run_dir))
        assert run.job_type == job_type and run.exit_code == 0
    assert_run_holds_its_job(the_run(sweep_dir / "0" / "run-1"), sweep_dir / "0")
    assert result_of(sweep_dir / "0")["status"] == "ok"


@pytest.mark.parametrize("failure", FAILURES)
def test_a_wandb_failure_costs_one_warning_never_the_result(tmp_path, result_keys, failure):
    make_env, overrides, code, message = FAILURES[failure]
    run_dir = tmp_path / "run"
    args = [*with_micro([*WANDB, *overrides, "bench.isolate=false"]), f"hydra.run.dir={run_dir}"]
    proc = run_nanogpt(args, tmp_path, env=make_env(tmp_path), code=code)
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "warning: W&B" in line]
    assert message in warning
    result = result_of(run_dir)
    assert result["status"] == "ok" and set(result) == result_keys


@pytest.mark.slow  # wandb and the env record start processes
def test_a_run_that_fails_at_log_ends_with_one_warning_and_never_raises(tmp_path, caplog):
    """A real offline run that wandb ends under the sink (logging to a finished run raises
    wandb's UsageError): one warning, the run closed, later windows and the summary dropped."""
    logger = LoggerConfig(backend="wandb", mode=LoggerMode.offline, project="p")
    run = start_run(logger, job_type="point", name="n", group="g", config={}, run_dir=tmp_path)
    sink = WandbSink(run)
    run.run.finish()  # the wandb run ends: its own log() now refuses
    window = {"phase": "measure", "step": 3, "step_ms": 1.0}
    with caplog.at_level("WARNING"):
        sink.window(window)
        sink.window({**window, "step": 5})
        sink.finish({"status": "ok"})
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("W&B: run.log failed (UsageError")
    assert run.run is None  # closed: nothing more is sent


def test_auto_mode_follows_wandb_mode_then_the_key(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode(LoggerMode.auto) == ("offline", "no API key (WANDB_API_KEY or ~/.netrc)")
    netrc.write_text("machine example.com login user password " + "k" * 40 + "\n")
    assert not api_key_configured()  # a key for another host
    netrc.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert resolve_mode(LoggerMode.auto) == ("online", None)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(LoggerMode.auto) == ("disabled", "WANDB_MODE=disabled")
    assert resolve_mode(LoggerMode.offline) == ("offline", None)


def test_the_repeats_of_a_point_are_tied_by_its_id(single):
    proc, run_dir = single("bench.repeats=2", "logger=wandb", "logger.mode=offline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = [d for run in ("run-1", "run-2") for d in offline_runs(run_dir / run)]  # RUN_DIR/run-R
    runs = sorted((read_run(run_file(d)) for d in found), key=lambda r: r.name)
    assert len(runs) == 2 and [r.name[-12:] for r in runs] == ["(repeat 1/2)", "(repeat 2/2)"]
    record = read_result(run_dir / "result.json")
    assert "(repeat" not in record["overrides_str"] and record["repeats"] == 2  # pooled
    points = [run.config["point"] for run in runs]
    assert {p["id"] for p in points} == {record["point_id"]}
    assert [(p["repeat"], p["repeats"]) for p in points] == [(1, 2), (2, 2)]
    assert all(p["supersedes"] == [] for p in points)  # repeats never supersede each other
    assert points[0]["overrides"]["bench/repeats"] == 2  # typed: an int, not "2"


@pytest.mark.slow
def test_a_point_measured_again_supersedes_its_earlier_runs(tmp_path, in_process_sweep):
    """A sweep run again into its dir (bench.rerun=true measures its ok points again): the new
    point run and the new summary run name the runs they supersede; offline, that is the mark.
    The first sweep is the session's (WANDB_SWEEP), run again on a copy."""
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(in_process_sweep[1], sweep_dir)  # the shared sweep stays as it was
    ids = {}
    for rerun in ("false", "true"):
        if rerun == "true":
            args = ["-m", *with_micro([*WANDB_SWEEP, "bench.rerun=true"])]
            proc = run_nanogpt([*args, f"hydra.sweep.dir={sweep_dir}"], tmp_path)
            assert proc.returncode == 0, proc.stderr
        for where in ("0", "."):
            runs = sorted(offline_runs(sweep_dir / where / ("run-1" if where == "0" else "")))
            assert len(runs) == (1 if rerun == "false" else 2), runs
            ids[where, rerun] = read_run(run_file(runs[-1]))
    for where in ("0", "."):
        first, second = ids[where, "false"], ids[where, "true"]
        assert first.run_id != second.run_id
        supersedes = (
            second.config["point"]["supersedes"] if where == "0" else second.config["supersedes"]
        )
        assert supersedes == [first.run_id]
        assert (first.config.get("point") or first.config)["supersedes"] == []


def test_a_search_asks_once_too_and_hands_offline_to_its_runs(tmp_path, monkeypatch, capsys):
    """The search (hydra/sweeper=tune) starts as a grid does (the multirun's callback): W&B's
    server out of reach is decided once, with one warning, and every run it launches (they
    inherit this process's environment) logs offline; a later sweep in the process asks anew."""
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.callback import SweepReport
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.publish.wandb_mode import SWEEP_OFFLINE_ENV

    url = f"http://127.0.0.1:{free_port()}"
    for name in ("WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.delenv(SWEEP_OFFLINE_ENV, raising=False)
    search = ["hydra/sweeper=tune", "logger=wandb", "+sweep=tune_cpu"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = compose(
            "config", [*search, f"hydra.sweep.dir={tmp_path / 'search'}"], return_hydra_config=True
        )
        SweepReport().on_multirun_start(config)
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "W&B" in x]
    assert line.startswith(f"warning: W&B: {url} cannot be reached (ConnectionRefusedError")
    mode, reason = resolve_mode(LoggerMode.auto)  # as each run's process resolves it
    assert mode == "offline" and reason.startswith("W&B unreachable at the sweep's start")
    assert resolve_mode(LoggerMode.online)[0] == "offline"  # asked online: the same answer
    monkeypatch.setenv("WANDB_MODE", "offline")  # now a sweep that would not go online
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        config = compose(
            "config", [*search, f"hydra.sweep.dir={tmp_path / 'again'}"], return_hydra_config=True
        )
        SweepReport().on_multirun_start(config)
    assert SWEEP_OFFLINE_ENV not in os.environ  # no probe, no stale decision
    assert "W&B" not in capsys.readouterr().err
