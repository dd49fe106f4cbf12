"""Ctrl-C while a sweep writes its table: one line that says how to build it, exit 130, no
traceback; `python -m nanogpt.report DIR` then builds it from the records."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nanogpt.analysis.tidy import read_summary
from tests.conftest import report_cli, with_micro
from tests.signalling import in_terminal, interrupt, wait_until

# The table's writer made slow (the records are all written by then), so that the signal
# lands while it runs; it notes when it starts.
SLOW_TABLE = (
    "import time, pathlib; from nanogpt.analysis import table as t; real = t.write_summary; "
    "t.write_summary = lambda *a, **k: (pathlib.Path('writing').touch(), time.sleep(60), "
    "real(*a, **k))"
)


@pytest.mark.slow
def test_ctrl_c_while_the_table_is_written_is_one_line_and_the_report_rebuilds_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *with_micro(["perf.batch_size=1,2"]), f"hydra.sweep.dir={sweep_dir}"]
    code = (
        f"import runpy, sys; {SLOW_TABLE}; sys.argv[0] = 'nanogpt.run'; "
        "runpy.run_module('nanogpt.run', run_name='__main__')"
    )
    command = [sys.executable, "-c", code, *args]
    with in_terminal(
        command, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        wait_until(
            lambda: (tmp_path / "writing").exists(), "no table was written", proc, timeout=300
        )
        # a terminal's Ctrl-C
        out, err = interrupt(proc, timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    line = err.strip().splitlines()[-1]  # after the points' own log lines
    assert line.startswith("interrupted while writing the table")
    assert f"python -m nanogpt.report {sweep_dir}" in line
    assert not (sweep_dir / "summary.csv").exists()
    report = report_cli(sweep_dir)
    assert report.returncode == 0, report.stderr[-2000:]
    assert sorted(read_summary(sweep_dir)["status"]) == ["ok", "ok"]
