"""Ctrl-C while a sweep writes its table: the table is finished first (one line, exit 130); a
second Ctrl-C stops it at once with one line that says how to build it, exit 130, no
traceback, and `python -m nanogpt.report DIR` then builds it from the records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from nanogpt.analysis.tidy import read_summary
from tests.conftest import report_cli, with_micro
from tests.signalling import in_terminal, interrupt, wait_until

# The table's writer made slow (the records are all written by then), so that a signal lands
# while it runs: it notes when it starts, then sleeps SECONDS (a handled signal does not cut a
# sleep short: PEP 475).
SLOW_TABLE = (
    "import time, pathlib; from nanogpt.analysis import table as t; real = t.write_summary; "
    "t.write_summary = lambda *a, **k: (pathlib.Path('writing').touch(), time.sleep({seconds}), "
    "real(*a, **k))"
)


def _sweep_with_a_slow_table(tmp_path, seconds: float):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *with_micro(["perf.batch_size=1,2"]), f"hydra.sweep.dir={sweep_dir}"]
    code = (
        f"import runpy, sys; {SLOW_TABLE.format(seconds=seconds)}; "
        "sys.argv[0] = 'nanogpt.run'; runpy.run_module('nanogpt.run', run_name='__main__')"
    )
    return sweep_dir, [sys.executable, "-c", code, *args]


@pytest.mark.slow
def test_one_ctrl_c_while_the_table_is_written_finishes_the_table_then_exits_130(tmp_path):
    sweep_dir, command = _sweep_with_a_slow_table(tmp_path, seconds=3)
    with in_terminal(
        command, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        wait_until(
            lambda: (tmp_path / "writing").exists(), "no table was written", proc, timeout=300
        )
        out, err = interrupt(proc, timeout=60)  # one terminal Ctrl-C, a second too late
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "Ctrl-C: finishing the table first (Ctrl-C again stops at once)" in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted while writing the table: it is finished")
    assert str(sweep_dir / "summary.csv") in line
    assert "(2 points)" in out  # the table was printed, as a finished sweep prints it
    assert sorted(read_summary(sweep_dir)["status"]) == ["ok", "ok"]


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_table_is_written_is_one_line_and_the_report_rebuilds_it(
    tmp_path,
):
    sweep_dir, command = _sweep_with_a_slow_table(tmp_path, seconds=60)
    with (
        open(tmp_path / "stderr.txt", "w") as stderr,
        in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=stderr) as proc,
    ):
        wait_until(
            lambda: (tmp_path / "writing").exists(), "no table was written", proc, timeout=300
        )
        os.killpg(proc.pid, signal.SIGINT)  # the first: noted, the table goes on
        wait_until(
            lambda: "finishing the table" in (tmp_path / "stderr.txt").read_text(),
            "the first Ctrl-C's line",
            proc,
            timeout=30,
        )
        interrupt(proc, timeout=30)  # the second: at once (the writer sleeps 60 s)
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    line = err.strip().splitlines()[-1]  # after the points' own log lines
    assert line.startswith("interrupted while writing the table; build it with")
    assert f"python -m nanogpt.report {sweep_dir}" in line
    assert not (sweep_dir / "summary.csv").exists()
    report = report_cli(sweep_dir)
    assert report.returncode == 0, report.stderr[-2000:]
    assert sorted(read_summary(sweep_dir)["status"]) == ["ok", "ok"]
