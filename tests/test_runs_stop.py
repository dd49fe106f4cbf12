"""Issue 44 on real `python -m nanogpt.run -m` sweeps of micro points: Ctrl-C at any moment
ends a sweep with exit 130, one line and a table (moments reached by faults.signal_hook, not
by timing luck), and the search hands the parallel launcher batches of candidates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary

from .conftest import SHAKESPEARE, needs_shared, run_cli, with_micro
from .signalling import in_terminal

PARALLEL = ["hydra/launcher=parallel", "hydra.launcher.slots=1"]


# --- Ctrl-C at any moment (issue 44) ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "parallel"])
@pytest.mark.parametrize(
    "moment,nth",
    [
        ("record-written", 1),  # point 0's run has written its record, its job not yet returned
        ("job-start", 2),  # Hydra has composed point 1's job and is starting it
    ],
)
def test_ctrl_c_at_a_moment_ends_with_130_a_table_and_no_traceback(tmp_path, launcher, moment, nth):
    """One SIGINT to the sweep's process group (a terminal's Ctrl-C) at a moment reached
    deterministically (faults.signal_hook), under the basic and the parallel launcher: exit
    130, one line, the table of what is done, no traceback; the same command then completes."""
    from nanogpt.record.faults import SIGNAL_HOOK_ENV

    sweep_dir = tmp_path / "sweep"
    extra = PARALLEL if launcher == "parallel" else []
    args = ["-m", *with_micro(["perf.batch_size=1,2", *extra]), f"hydra.sweep.dir={sweep_dir}"]
    hook = {SIGNAL_HOOK_ENV: f"{moment}:{nth}:INT:{tmp_path / 'reached'}"}
    command = [sys.executable, "-m", "nanogpt.run", *args]
    with in_terminal(
        command,
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **hook},
    ) as proc:
        out, err = (b.decode() for b in proc.communicate(timeout=240))
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted at"), err[-3000:]
    assert f"hydra.sweep.dir={sweep_dir}" in err
    table = read_summary(sweep_dir)  # the table of what is done
    assert table["status"].tolist() == ["ok"] and "table:" in out
    again = run_cli(*args, cwd=tmp_path)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: kept 1 run(s) of 1 point(s)" in again.stdout
    assert read_summary(sweep_dir)["status"].tolist() == ["ok", "ok"]


# --- the search hands the launcher batches (issue 44) -------------------------------------------


def two_slot_search(sweep_dir: Path, *micro: str) -> list[str]:
    """A search of 2 candidates (perf.batch_size 1 or 2; `micro`: more micro-model overrides) on
    the parallel launcher's 2 slots of a core each: 2 probes of 2 steps, 2 leaders, 1 finalist
    of 2 runs."""
    probe = "['bench.measure_steps=2','bench.min_measure_steps=1','bench.diagnose=false']"
    return [
        "-m",
        "hydra/sweeper=tune",
        *with_micro(["perf.batch_size=choice(1,2)", *micro]),
        "hydra/launcher=parallel",
        "hydra.launcher.slots=2",
        "hydra.launcher.cores_per_slot=1",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.leaders=2",
        "hydra.sweeper.finalists=1",
        "hydra.sweeper.repeats=2",
        f"hydra.sweeper.probe={probe}",
        f"hydra.sweep.dir={sweep_dir}",
    ]


@pytest.mark.slow
def test_a_search_on_two_slots_measures_two_candidates_at_once(tmp_path):
    """hydra/sweeper=tune on hydra/launcher=parallel with 2 slots: the probe rung asks 2 trials
    before telling (Optuna's constant liar) and launches them as one batch, so both candidates
    are measured side by side (each record's co_running names the other); the leaders too."""
    sweep_dir = tmp_path / "sweep"
    # Each run warms up for a second at least: two runs handed out together then overlap even
    # where one slot's job starts a few tenths later (a busy machine), as a real point's would
    proc = run_cli(*two_slot_search(sweep_dir, "bench.warmup_s=1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = json.loads((sweep_dir / "tune_jobs.json").read_text())
    for rung in ("probe", "full"):
        records = [
            read_result(sweep_dir / str(n) / "result.json")
            for k, n in jobs.items()
            if k.startswith(rung)
        ]
        assert len(records) == 2
        first, second = records
        assert first["co_running"] and second["co_running"], (first["co_running"], second)
        assert first["overrides_str"] != second["overrides_str"]
    assert (sweep_dir / "best.yaml").is_file()


def _launches(stdout: str) -> list[list[str]]:
    """The parallel launcher's launches, as it prints them: a `parallel: N slot(s)` line, then a
    `  #JOB : OVERRIDES` line for each job that launch hands its slots."""
    launches: list[list[str]] = []
    for line in stdout.splitlines():
        if line.startswith("parallel: "):
            launches.append([])
        elif line.startswith("  #") and launches:
            launches[-1].append(line.split(" : ", 1)[1])
    return launches


@pytest.mark.slow
@needs_shared
def test_a_search_on_two_slots_hands_the_finalists_and_the_quality_runs_over_in_one_launch(
    tmp_path,
):
    """On 2 slots the finalist's 2 runs go out in one launch (not a round at a time, one slot
    idle), and the quality guard's runs (the baseline at its 2 seeds, the finalist at the first)
    in another: one launch each, whose runs are measured side by side (co_running)."""
    sweep_dir = tmp_path / "sweep"
    args = [
        *two_slot_search(sweep_dir, "data=text", f"data.path={SHAKESPEARE}"),
        "model.vocab_size=50304",
        "hydra.sweeper.quality.steps=4",
        "hydra.sweeper.quality.window=2",
        "hydra.sweeper.baseline=['perf.batch_size=1']",
    ]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launches = _launches(proc.stdout)
    repeated = [i for i, jobs in enumerate(launches) for j in jobs if "bench.repeats=2" in j]
    assert len(repeated) == 2 and len(set(repeated)) == 1, launches  # both runs, one launch
    guarded = [i for i, jobs in enumerate(launches) for j in jobs if "bench.seed=" in j]
    # the baseline at seeds 1337 and 1338, and the finalist at 1337 (the baseline's own run
    # when the finalist is the baseline: launched once)
    assert len(guarded) in (2, 3) and len(set(guarded)) == 1, launches
    assert len(launches) == 4, launches  # probes (one batch of 2), leaders, finalist, quality
    jobs = json.loads((sweep_dir / "tune_jobs.json").read_text())
    quality = [
        read_result(sweep_dir / str(n) / "run-1" / "result.json")
        for key, n in jobs.items()
        if key.startswith("quality")
    ]
    assert len(quality) == len(guarded)
    assert sum(bool(r["co_running"]) for r in quality) >= 2, [r["co_running"] for r in quality]
    assert json.loads((sweep_dir / "tune.json").read_text())["quality"]["checked"]
