"""Conventions Hydra users expect: a point is what it measures (resume), Hydra's own fix hints,
a preset needs -m, the sweep expanded as Hydra's sweeper expands it (public APIs only).

Real Hydra throughout: the compose API, Hydra's own sweeper as the reference for the expansion,
and real `python -m nanogpt.run -m` processes.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, tests only
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR, expand, runs_here
from nanogpt.record.identity import measured_config, point_id_of

from .conftest import run_cli, with_micro


@functools.cache  # a composition costs ~0.3 s; the tests below compare against spec_of() often
def spec_of(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=with_micro(overrides))
    try:
        return to_spec(cfg)
    except ValueError:  # a key this machine cannot run (dist.nproc on one device): unchecked
        return OmegaConf.to_object(cfg)


# ------------------------------------------------------------------------------------------
# Identity
# ------------------------------------------------------------------------------------------

OUTPUT_ONLY = [
    "logger=wandb",
    "logger.mode=offline",
    "logger.project=other",
    "logger.tags=[a,b]",
    "logger.init_timeout_s=5",
    "report.baseline='perf.batch_size=2'",
    "report.plots=true",
    "report.memory_budget_gib=4",
    "cost.usd_per_hour=2.5",
    "cost.usd_per_kwh=0.3",
    "bench.rerun=true",
    "data.cache_dir=/tmp/elsewhere",
    "bench.repeats=2",  # how many runs, not what a run measures: a resume keeps the ok ones
]
MEASURED = [
    "perf.batch_size=3",
    "perf.dtype=bf16",
    "model.n_layer=2",
    "optimizer.lr=0.001",
    "optimizer.roles.embeddings.lr=0.001",  # a key left out at its default (record/identity.py)
    "data=text",
    "bench.measure_steps=5",
    "bench.isolate=false",
    "dist.nproc=2",
    "dist.nodes=2",  # left out at its default (record/identity.py): an older point keeps its id
    "hardware.peak_tflops=1.5",
    "hardware.calibrate=true",
    "logger.log_interval=2",  # a sync per window: the loop measures differently
]


@pytest.mark.parametrize("override", OUTPUT_ONLY)
def test_output_only_keys_leave_the_point_as_it_is(override):
    assert point_id_of(spec_of(override)) == point_id_of(spec_of())


@pytest.mark.parametrize("override", MEASURED)
def test_every_measured_key_makes_another_point(override):
    assert point_id_of(spec_of(override)) != point_id_of(spec_of())


def test_the_measured_config_is_every_key_of_the_measured_groups():
    measured = measured_config(spec_of())
    assert set(measured) == {
        "model",
        "optimizer",
        "perf",
        "data",
        "bench",
        "dist",
        "hardware",
        "logger",
    }
    assert "rerun" not in measured["bench"] and set(measured["logger"]) == {"log_interval"}
    assert measured["perf"]["batch_size"] == 2 and measured["perf"]["dtype"] == "fp32"
    # an override that spells the default is the same point as none
    assert point_id_of(spec_of("perf.dtype=fp32")) == point_id_of(spec_of())
    assert point_id_of(spec_of("hardware.recalibrate=true")) == point_id_of(
        spec_of("hardware.calibrate=true")
    )


@pytest.mark.slow  # the record's environment() asks git for the commit
def test_a_point_id_is_computed_once_per_point_and_carried(tmp_path, monkeypatch):
    """A single run of a point with two runs computes the point's id once, for both, and
    carries it in its Job (runner/handoff.py): the record's point_id is that value; neither the
    worker (its W&B run's id) nor the record computes it again. In this process
    (bench.isolate=false)."""
    from nanogpt.record import identity
    from nanogpt.runner.handoff import Job
    from nanogpt.runner.job import run_single

    spec = spec_of("bench.isolate=false", "bench.repeats=2", "bench.diagnose=false")
    expected, digests, digest = point_id_of(spec), [], identity.point_id
    monkeypatch.setattr(identity, "point_id", lambda m: digests.append(digest(m)) or digests[-1])
    assert run_single(spec, Job(tmp_path, overrides=["bench.repeats=2"])).status == "ok"
    assert digests == [expected]  # once per point, whatever it has of repeats
    assert read_result(tmp_path / "result.json")["point_id"] == expected


# ------------------------------------------------------------------------------------------
# Resume
# ------------------------------------------------------------------------------------------


def records(sweep_dir: Path) -> dict[str, dict]:
    """batch size -> record, for the records in the job dirs."""
    found = {}
    for path in sweep_dir.glob("*/result.json"):
        record = read_result(path)
        found[record["measured_config"]["perf"]["batch_size"]] = record
    return found


@pytest.mark.slow
def test_resume_skips_what_was_measured_whatever_else_changed(tmp_path):
    sweep_dir = tmp_path / "sweep"
    fast = ["bench.isolate=false"]

    def run(*overrides):
        args = ["-m", *with_micro([*fast, *overrides]), f"hydra.sweep.dir={sweep_dir}"]
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    run("perf.batch_size=1,2")
    first = records(sweep_dir)
    assert set(first) == {1, 2}

    # The same points, with other output keys and a point put in front: every job dir shifts,
    # nothing already measured is measured again, nothing is lost.
    again = run(
        "perf.batch_size=3,1,2",
        "logger=wandb",
        "logger.mode=disabled",
        "report.plots=true",
        "cost.usd_per_hour=2",
    )
    assert "resume: kept 2 run(s) of 2 point(s)" in again.stdout
    second = records(sweep_dir)
    assert set(second) == {1, 2, 3}
    for size in (1, 2):
        assert second[size]["finished_at"] == first[size]["finished_at"]  # kept, not remeasured
        assert second[size]["point_id"] == first[size]["point_id"]
    table = read_summary(sweep_dir)
    assert len(table) == 3 and set(table["status"]) == {"ok"}

    # A key the loop measures with makes new points.
    third = run("perf.batch_size=1", "logger.log_interval=2")
    assert "resume: kept" not in third.stdout
    remeasured = read_result(sweep_dir / "0" / "result.json")
    assert remeasured["measured_config"]["logger"]["log_interval"] == 2
    assert remeasured["finished_at"] != first[1]["finished_at"]
    # job dir 0 held the batch-3 point: it moved aside, where a later resume still finds it
    moved = [read_result(p) for p in (sweep_dir / "moved").glob("*/result.json")]
    assert second[3]["point_id"] in {record["point_id"] for record in moved}


# ------------------------------------------------------------------------------------------
# The sweep, expanded with Hydra's public override parser
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["perf.batch_size=1,2", "perf.dtype=fp32,bf16"],
        ["a=1,2", "b=3", "a=5,6", "c=x,y", "b=4,7"],  # a key given again keeps its place
        ["+sweep/accum_split=16x1,8x2", "perf.compile=true"],
        ["model.n_layer=range(1,4)", "x='a,b',c"],
        ["perf.dtype=choice(fp32,bf16)", "~bench.seed"],
    ],
)
def test_points_are_those_hydras_basic_sweeper_makes(overrides):
    parsed = OverridesParser.create().parse_overrides(overrides)
    [reference] = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    assert expand(overrides) == reference


# ------------------------------------------------------------------------------------------
# Hydra's errors and hints
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_group_without_plus_keeps_hydras_hint_in_one_line(tmp_path):
    proc = run_cli(
        "-m",
        "sweep=compile_dtype_cpu",
        *with_micro([]),
        f"hydra.sweep.dir={tmp_path / 's'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "+sweep=compile_dtype_cpu" in line
    assert "Traceback" not in proc.stderr and not list(tmp_path.rglob("result.json"))


@pytest.mark.slow
def test_a_preset_without_multirun_is_refused_naming_the_fix(tmp_path):
    proc = run_cli(
        "+sweep=compile_dtype_cpu",
        *with_micro([]),
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: +sweep=compile_dtype_cpu: ") and "-m +sweep=" in line
    assert not list(tmp_path.rglob("result.json"))


@pytest.mark.slow
def test_a_bad_key_points_at_the_resolved_config(tmp_path):
    proc = run_cli("perf.nosuch=1", *with_micro([]), cwd=tmp_path)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: perf.nosuch: ") and "--cfg job --resolve" in line


# ------------------------------------------------------------------------------------------
# Logs
# ------------------------------------------------------------------------------------------

LOGGED = ["logger.log_interval=2", "bench.measure_steps=4"]


def progress_lines(text: str) -> list[str]:
    return re.findall(r"measure step \d+(?:/\d+)?: [\d.]+ ms/step", text)


@pytest.mark.slow
def test_every_job_dir_holds_its_points_log_and_a_file_gets_plain_lines(sweep):
    # a forked measuring child (point 0) and one measured in the job process (point 1)
    proc, sweep_dir = sweep("bench.isolate=true,false", *LOGGED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in ("0", "1"):
        log = (sweep_dir / job / "run-1" / "run.log").read_text()  # POINT/run-R
        assert len(progress_lines(log)) == 2  # 4 measured steps, a window of 2
        record = read_result(sweep_dir / job / "result.json")
        # the run is named by what the sweep varies, not by the micro model's fixed overrides
        (line,) = [x for x in log.splitlines() if "[ok] " in x]
        isolate = next(o for o in record["overrides_str"].split() if o.startswith("bench.isolate="))
        assert f"[ok] {isolate}: step " in line and "model.n_layer" not in line
    # stdout is a pipe here: no bar, no carriage-return redraws, one line a window
    assert "\r" not in proc.stdout + proc.stderr and len(progress_lines(proc.stdout)) == 4


@pytest.mark.slow
def test_on_a_terminal_the_bar_shows_progress_and_the_log_keeps_the_lines(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()  # stderr is a terminal: the measuring child draws the bar
    size = struct.pack("HHHH", 24, 100, 0, 0)  # rows, columns: tqdm draws nothing 0 wide
    fcntl.ioctl(follower, termios.TIOCSWINSZ, size)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "nanogpt.run", *with_micro(LOGGED), f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
        timeout=300,
    )
    os.close(follower)
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        terminal += chunk
    os.close(leader)
    assert proc.returncode == 0
    assert b"steps: 100%" in terminal and b"\r" in terminal  # tqdm's bar, redrawn in place
    assert progress_lines(proc.stdout) == []  # the bar shows them on the terminal
    assert len(progress_lines((run_dir / "run.log").read_text())) == 2


@pytest.mark.parametrize(
    ("target", "here"),
    [
        ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", True),
        ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", True),
        ("hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher", True),
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", True),
        ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", False),
        ("hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher", False),
        ("hydra_plugins.hydra_rq_launcher.rq_launcher.RQLauncher", False),
    ],
)
def test_only_cluster_launchers_run_points_elsewhere(target, here):
    config = OmegaConf.create({"hydra": {"launcher": {"_target_": target}}})
    assert runs_here(config) is here
