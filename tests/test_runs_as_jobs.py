"""A run is a job (nanogpt/frontend/grid_sweeper.py): the grid sweeper launches one round of runs
per launch — run r of every point after every run r - 1 ended — under any launcher; a killed or
interrupted sweep, run again, measures only its missing runs. Real `python -m nanogpt.run -m`
sweeps of micro time-to-loss points on tinyshakespeare."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.scenarios.time_to_loss import pool as ttl

from .conftest import SHAKESPEARE, needs_shared, run_cli, with_micro
from .signalling import in_terminal, interrupt, wait_until

PARALLEL = ["hydra/launcher=parallel", "hydra.launcher.slots=1"]
# Two points to a target: 4.0 is read at the second evaluation (after 2 steps: test_time_to_loss)
TARGET = [
    "data=text",
    f"data.path={SHAKESPEARE}",
    "data.tokenizer=char",
    "model.vocab_size=65",
    "optimizer.lr=1e-2,2e-2",
    "bench.target_loss=4.0",
    "bench.eval_every=2",
    "bench.eval_batches=2",
    "bench.max_steps=4",
]


def ttl_args(sweep_dir, *extra: str) -> list[str]:
    return ["-m", *with_micro([*TARGET, *extra]), f"hydra.sweep.dir={sweep_dir}"]


def runs_of(sweep_dir) -> dict[tuple[int, int], dict]:
    """(point, run) -> the run's record, from POINT/run-R/result.json."""
    found = {}
    for path in sweep_dir.glob("*/run-*/result.json"):
        point, run = int(path.parent.parent.name), int(path.parent.name.removeprefix("run-"))
        found[(point, run)] = read_result(path)
    return found


def assert_rounds(sweep_dir, points: int, runs: int) -> None:
    """Every run r of every point started after every run r - 1 ended (each run's own span)."""
    found = runs_of(sweep_dir)
    assert set(found) == {(p, r) for p in range(points) for r in range(1, runs + 1)}
    assert {rec["status"] for rec in found.values()} == {"ok"}
    span = {key: rec["ttl_run_times"][0] for key, rec in found.items()}
    for run in range(2, runs + 1):
        ended = max(span[(p, run - 1)][1] for p in range(points))
        started = min(span[(p, run)][0] for p in range(points))
        assert ended < started, (run, span)


@needs_shared
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "parallel"])
def test_a_killed_sweep_rerun_measures_only_its_missing_runs(tmp_path, launcher):
    """A target sweep of 2 points × 3 runs under the basic and the parallel launcher: SIGKILL to
    its process group once point 0's run 2 is recorded, then the same command: the runs
    recorded ok before are kept (not measured again), the others measured once, and the table
    is an uninterrupted sweep's: 2 rows of 3 runs, `ttl_run_order` alternated, every run r of
    every point started after every run r - 1 ended (each run's own span)."""
    sweep_dir = tmp_path / "sweep"
    extra = PARALLEL if launcher == "parallel" else []
    args = ttl_args(sweep_dir, "bench.repeats=3", *extra)
    command = [sys.executable, "-m", "nanogpt.run", *args]
    with in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        wait_until(
            lambda: (sweep_dir / "0" / "run-2" / "result.json").is_file(),
            "run 2 of point 0 never ended",
            proc,
            every=0.02,
        )
        interrupt(proc, signal.SIGKILL, timeout=30)  # kill -9 of the whole group
    before = {key: rec["finished_at"] for key, rec in runs_of(sweep_dir).items()}
    before = {key: at for key, at in before.items() if runs_of(sweep_dir)[key]["status"] == "ok"}
    assert (0, 1) in before and (0, 2) in before and len(before) < 6
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resume: kept {len(before)} run(s) of 2 point(s)" in again.stdout
    after = runs_of(sweep_dir)
    for key, finished in before.items():  # kept, not measured again
        assert after[key]["finished_at"] == finished
    measured = [key for key in after if key not in before]
    assert len(measured) == 6 - len(before)  # each missing run once
    assert_rounds(sweep_dir, points=2, runs=3)
    table = read_summary(sweep_dir)
    assert table["ttl_runs"].tolist() == [3, 3] and set(table["status"]) == {"ok"}
    assert table["ttl_run_order"].iloc[1] == ttl.ALTERNATED


def measuring(proc: subprocess.Popen, run_log: Path) -> psutil.Process | None:
    """The process that measures a run, once it runs: in proc's tree, the child of the run's
    job process (a fork of the slot's fork server) with the run's log open, as its parent has."""

    def logs_the_run(process: psutil.Process) -> bool:
        return str(run_log) in {f.path for f in process.open_files()}

    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if logs_the_run(child) and logs_the_run(child.parent()) and not child.children():
                return child
    return None


@needs_shared
@pytest.mark.slow
def test_ctrl_c_mid_run_of_a_target_sweep_under_the_parallel_launcher_then_it_resumes(tmp_path):
    """The 'Why' of issue 43: Ctrl-C in a run (one SIGINT to the process group, as a terminal
    sends it) under hydra/launcher=parallel, then the same command: it completes, where every
    rerun used to stop at once on the earlier attempt's `interrupted` record."""
    sweep_dir = tmp_path / "sweep"
    # each evaluation reads 200 batches: a run lasts a tenth of a second or more
    args = ttl_args(sweep_dir, "bench.repeats=2", "bench.eval_batches=200", *PARALLEL)
    args = [a.replace("optimizer.lr=1e-2,2e-2", "optimizer.lr=1e-2") for a in args]  # 1 point
    command = [sys.executable, "-m", "nanogpt.run", *args]
    run_log = sweep_dir / "0" / "run-1" / "run.log"
    with in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        run_1 = wait_until(lambda: measuring(proc, run_log), "run 1", proc, every=0.01)
        # The process measuring run 1 is held (SIGSTOP) while the terminal's Ctrl-C goes to the
        # whole group, so the signal lands inside the run however fast the machine; the other
        # processes take it wherever they are, as a user's Ctrl-C finds them.
        run_1.suspend()
        assert not (run_log.parent / "result.json").exists(), "run 1 ended before it was held"
        _, err = interrupt(proc, held=(run_1,))
        assert proc.returncode == 130, err.decode()[-3000:]
    assert read_result(sweep_dir / "0" / "run-1" / "result.json")["status"] == "interrupted"
    again = run_cli(*args, cwd=tmp_path)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    table = read_summary(sweep_dir)
    assert set(table["status"]) == {"ok"} and table["ttl_runs"].tolist() == [2]


@pytest.mark.slow
def test_hydras_own_sweeper_refuses_more_than_one_run_a_point_in_one_line(tmp_path):
    proc = run_cli(
        "-m",
        "hydra/sweeper=basic",
        *with_micro(["bench.repeats=2", "perf.batch_size=1,2"]),
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: bench.repeats: is 2 but hydra/sweeper=basic runs one job")
    assert "bench.repeats=1" in line and not (tmp_path / "sweep" / "0").exists()


# --- a run's record is read once (issue 44) -----------------------------------------------------

# Runs nanogpt.run as `python -m` does, counting this process's reads of each record file (a
# run's or a point's result.json and steps.csv: an audit hook sees every open() of the
# interpreter), written to OUT at exit.
COUNTING = """
import atexit, collections, json, os, runpy, sys
out, opened = sys.argv.pop(1), collections.Counter()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, os.PathLike)):
        path, mode = os.fspath(args[0]), str(args[1] or "r")
        if path.endswith(("result.json", "steps.csv")) and not set("wax+") & set(mode):
            opened[path] += 1
sys.addaudithook(hook)
atexit.register(lambda: open(out, "w").write(json.dumps(opened)))
sys.argv[0] = "nanogpt.run"
runpy.run_module("nanogpt.run", run_name="__main__", alter_sys=True)
"""
FILES = ("result.json", "steps.csv")  # a record's files
# Every output of the sweep's end: the summary files and console, the plots, the W&B summary
# run (its table, the pooled figures) and the W&B view
OUTPUTS = ["report.plots=true", "logger=wandb", "logger.mode=offline"]


@pytest.mark.slow
def test_the_sweep_process_opens_each_runs_record_at_most_once(tmp_path):
    """The job owns its run's record and hands it back in memory (the objective, the status,
    a kept run, its steps); the resume's index reads the sweep dir once a process; the table
    pools each point's runs from what it holds or reads them once, and every output (summary
    files, console, plots, the W&B table, summary run and view) takes the sweep it built,
    reading no record file again. Counted for real (sys.addaudithook) in the sweep process of a
    2-point, 2-run sweep on the basic launcher (its jobs run there), then of its resume with
    one run more a point. The W&B summary run holds each point's pooled figures."""
    from .wandb_reader import read_run, run_file

    sweep_dir = tmp_path / "sweep"
    for repeats in (2, 3):
        out = tmp_path / f"opened_{repeats}.json"
        args = with_micro(["perf.batch_size=1,2", f"bench.repeats={repeats}", *OUTPUTS])
        command = [sys.executable, "-c", COUNTING, str(out), "-m", *args]
        proc = subprocess.run(
            [*command, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "plot: " in proc.stdout and (sweep_dir / "wandb_view.json").is_file()
        opened = json.loads(out.read_text())
        runs = list(sweep_dir.glob("*/run-*/result.json"))
        assert len(runs) == 2 * repeats
        assert max(opened.values(), default=0) <= 1, opened  # each file at most once
        # The first sweep reads nothing back: its runs' records and steps, and the points' pools
        # it wrote, are held. The resume's index reads every record once (the 4 kept runs', the
        # 2 points' earlier pools), the pool the kept runs' steps once, the new runs' nothing.
        kept = [f"{p}/run-{r}/{name}" for p in (0, 1) for r in (1, 2) for name in FILES]
        expected = [] if repeats == 2 else [*kept, "0/result.json", "1/result.json"]
        assert sorted(str(Path(p).relative_to(sweep_dir)) for p in opened) == sorted(expected)
    assert "resume: kept 4 run(s) of 2 point(s)" in proc.stdout
    summary = read_summary(sweep_dir)
    assert summary["repeats"].tolist() == [3, 3]
    # the pooled figures in the sweep's W&B summary run (the resume's, the newest)
    summary_run = read_run(run_file(sorted((sweep_dir / "wandb").glob("offline-run-*"))[-1]))
    assert summary_run.job_type == "sweep-summary"
    points = summary_run.summary["points"]
    assert list(points) == summary["overrides"].tolist()
    for row in summary.itertuples():
        pooled = points[row.overrides]
        assert pooled["repeats"] == 3 and pooled["status"] == "ok"
        assert pooled["tokens_per_s"] == pytest.approx(row.tokens_per_s)
        assert pooled["step_ms_median"] == pytest.approx(row.step_ms_median)


# A plain 2-point sweep, run as make sweep runs it: under a relative hydra.sweep.dir (Hydra's
# default, multirun/DATE/TIME, is relative to where the command runs, while a job's output dir
# is absolute: a run's place in its sweep is one relative to the other).
PLAIN = ["perf.batch_size=1,2"]


@pytest.fixture(scope="module")
def relative_sweep(tmp_path_factory) -> Path:
    """PLAIN, run from a folder of its own into rel/sweep there: its sweep dir. Tests read it;
    one that changes it works on a copy."""
    root = tmp_path_factory.mktemp("relative")
    proc = run_cli("-m", *with_micro(PLAIN), "hydra.sweep.dir=rel/sweep", cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "rel" / "sweep"


@pytest.mark.slow
def test_a_sweep_dir_written_before_runs_were_jobs_still_reads_and_resumes(
    tmp_path, relative_sweep
):
    """A sweep dir of the old layout — one pooled result.json a point, no run dirs, its
    point_id digesting bench.repeats — read by the same command: each ok point counts as all
    its runs, kept (none measured again), one row each."""
    from nanogpt.analysis import store
    from nanogpt.record.identity import point_id

    sweep_dir = tmp_path / "sweep"
    args = ["-m", *with_micro(PLAIN), f"hydra.sweep.dir={sweep_dir}"]
    shutil.copytree(relative_sweep, sweep_dir)  # a sweep of these points, measured once
    finished = {}
    for point in ("0", "1"):  # rewritten as before: the run's record is the point's, its id old
        record = read_result(sweep_dir / point / "run-1" / "result.json")
        measured = record["measured_config"]
        measured["bench"]["repeats"] = 1
        record["point_id"] = point_id(measured)
        for path in (sweep_dir / point).iterdir():
            if path.is_dir():
                shutil.rmtree(path)
        (sweep_dir / point / "result.json").unlink()
        store.write_result(sweep_dir / point, record)
        finished[point] = record["finished_at"]
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: kept 2 run(s) of 2 point(s)" in again.stdout
    for point, at in finished.items():
        assert read_result(sweep_dir / point / "result.json")["finished_at"] == at
    assert not list(sweep_dir.glob("*/run-*/result.json"))  # nothing measured
    assert read_summary(sweep_dir)["status"].tolist() == ["ok", "ok"]


@pytest.mark.slow
def test_a_sweep_under_a_relative_sweep_dir_measures_its_runs(relative_sweep):
    # every run of make sweep failed so from a fresh clone, without a line (the sweep exited 0:
    # the fixture checks it)
    for point in ("0", "1"):
        run = read_result(relative_sweep / point / "run-1" / "result.json")
        assert run["status"] == "ok"
