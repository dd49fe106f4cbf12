"""The guard that keeps `make test-fast` fast: a test not marked `slow` may not start a process.

`make test-fast` runs the tests without the `slow` marker and promises seconds. A test that
starts a process (a sweep, torchrun, a Jupyter kernel, W&B's service, a compile worker) costs
seconds, so it must carry `@pytest.mark.slow` or use a fixture in conftest's SLOW_FIXTURES.
Rather than trust every author to remember, the guard watches the real primitives every way
of starting a process in Python goes through (subprocess, multiprocessing, os.system, os.fork,
posix_spawn) while an unmarked test runs -- its set-up, call and tear-down, fixtures included --
and fails the test naming what it started and the fix. The primitives still start the process
afterwards: the guard observes, it does not fake.

Tests marked `cuda` are left alone: on a GPU a compiled point starts Triton's and Inductor's
compiler processes, and those tests run where `make test-gpu` runs them, not in a CPU
machine's `make test-fast` (they skip there).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import threading

import pytest

FIX = "mark it @pytest.mark.slow (or use a fixture listed in tests/conftest.py SLOW_FIXTURES)"

# (owner, attribute): every Python-level way to start a process ends in one of these.
# subprocess binds fork_exec at import (subprocess._fork_exec), multiprocessing reads it from
# _posixsubprocess; os.system, os.fork and os.forkpty start one in C; posix_spawn is
# subprocess's other path.
PRIMITIVES = [
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "system"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
]


def describe(name: str, args: tuple) -> str:
    """What was started, as far as the primitive's arguments tell."""
    if name in ("_fork_exec", "fork_exec") and args:
        return f"{name}({list(args[0])!r})"  # the argv
    if name in ("posix_spawn", "posix_spawnp", "system") and args:
        return f"{name}({args[0]!r}{', ' + repr(list(args[1])) if len(args) > 1 else ''})"
    return f"{name}()"


class ProcessGuard:
    """A pytest plugin: observes process starts while a test without the slow marker runs."""

    def __init__(self):
        self.item = None  # the unmarked test now running, or None
        self.started: list[str] = []
        self.lock = threading.Lock()
        self.originals = {}

    def install(self):
        for owner, attr in PRIMITIVES:
            original = getattr(owner, attr, None)
            if original is None:
                continue
            self.originals[owner, attr] = original
            setattr(owner, attr, self.watching(attr, original))

    def uninstall(self):
        for (owner, attr), original in self.originals.items():
            setattr(owner, attr, original)
        self.originals.clear()

    def watching(self, name, original):
        def started(*args, **kwargs):
            item = self.item
            if item is not None:
                what = describe(name, args)
                with self.lock:
                    self.started.append(what)
                if threading.current_thread() is threading.main_thread():
                    pytest.fail(
                        f"{item.nodeid} is not marked slow but started a process: {what}; {FIX}",
                        pytrace=False,
                    )
            return original(*args, **kwargs)

        started.__wrapped__ = original
        return started

    def phase(self, item):
        """Run one phase of `item` watched if it is unmarked; fail it for any start seen."""
        watched = not (item.get_closest_marker("slow") or item.get_closest_marker("cuda"))
        self.item = item if watched else None
        self.started = []
        try:
            result = yield
        finally:
            self.item = None
        if self.started:  # one a thread started, or one the test caught
            pytest.fail(
                f"{item.nodeid} is not marked slow but started {len(self.started)} process(es): "
                f"{'; '.join(self.started[:3])}; {FIX}",
                pytrace=False,
            )
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from self.phase(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self.phase(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        return (yield from self.phase(item))


def register(config) -> ProcessGuard:
    """Install the guard for this pytest session (tests/conftest.py's pytest_configure)."""
    guard = ProcessGuard()
    guard.install()
    config.pluginmanager.register(guard, "process-guard")
    config.add_cleanup(guard.uninstall)
    return guard
