"""The guard of `make test-fast` (tests/process_guard.py), run for real on a pytest session of
its own: unmarked tests that start processes fail, naming the fix; the rest pass."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
from tests import process_guard


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts processes")
    process_guard.register(config)
"""

TESTS = """
import os
import subprocess
import sys
import threading

import pytest


def test_unmarked_runs_a_command():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_catches_what_the_guard_raises_yet_fails():
    try:
        os.system("true")
    except Exception:  # the guard's failure is no Exception: it is not caught here
        pass


def test_unmarked_starts_one_in_a_thread():
    thread = threading.Thread(target=subprocess.run, args=(["true"],))
    thread.start()
    thread.join()


@pytest.mark.slow
def test_marked_slow_may_start_one():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unmarked_without_a_process():
    assert sum(range(10)) == 45
"""


@pytest.mark.slow  # the session under test starts processes (for its slow test, and its guard's)
def test_an_unmarked_test_that_starts_a_process_fails_and_names_the_fix(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_guarded=TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=3)
    failed = {r.nodeid.split("::")[-1] for r in result.reprec.getfailures()}
    assert failed == {
        "test_unmarked_runs_a_command",
        "test_unmarked_catches_what_the_guard_raises_yet_fails",
        "test_unmarked_starts_one_in_a_thread",
    }
    result.stdout.fnmatch_lines(
        [
            "*test_unmarked_runs_a_command is not marked slow but started a process: "
            "*fork_exec(*-c*pass*mark it @pytest.mark.slow*",
            "*test_unmarked_starts_one_in_a_thread is not marked slow but started 1 process(es)*",
        ]
    )


def test_a_test_marked_alone_outside_its_file_stops_the_collection(pytester):
    """make test runs the `alone` tests from tests/test_alone.py by path: one marked elsewhere
    would run in neither part, so the collection refuses it, naming the file."""
    pytester.makeconftest(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n\n\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'alone: needs every core idle')\n"
    )
    pytester.makepyfile(
        test_elsewhere="import pytest\n\n\n@pytest.mark.alone\ndef test_x():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*test_elsewhere.py::test_x is marked alone: move it to test_alone.py*"]
    )
