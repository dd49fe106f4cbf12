"""Kineto's trace-point lines kept off the console.

Each time torch.profiler starts and stops, Kineto (its C++ side) writes two lines straight to
the process's stderr, file descriptor 2, past Python's logging:

    USDT:2026-11-23 23:24:35 8445:8445 SyncActivityProfilerHandler.cpp:52] profiler_start
    USDT:2026-11-23 23:24:35 8445:8445 SyncActivityProfilerHandler.cpp:59] profiler_stop

They mark user-space trace points (USDT) for tracing tools and say nothing to a user, yet every
diagnosed point printed them. Its only switch, KINETO_LOG_LEVEL, would silence Kineto's errors
with them. So while the profiler starts and while it stops, descriptor 2 goes to a temporary
file; afterwards every line but those two kinds is written back to stderr, in order.

Only then: the profiled steps in between write to the real stderr. Set aside for the whole
block, what a crash there says (a CUDA error's lines, faulthandler's traceback of a segfault,
the logging that preceded it) went into a temporary file that died with the process. A Python
exception still reaches the caller's record (probes/diagnose.py: `diag_error`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

TRACE_POINT = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def without_trace_points() -> Iterator[None]:
    """Run the block with stderr (descriptor 2) set aside; pass on all but Kineto's USDT lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            aside.seek(0)
            kept = [line for line in aside if not TRACE_POINT.match(line)]
            if kept:
                os.write(2, b"".join(kept))


@contextlib.contextmanager
def quiet_profiler(profiler: Any) -> Iterator[Any]:
    """`with profiler:`, its start and stop without Kineto's USDT lines, the block between them
    writing to the real stderr (a torch.profiler.profile or torch.autograd.profiler.profile)."""
    with without_trace_points():
        entered = profiler.__enter__()
    failure: tuple = (None, None, None)
    try:
        yield entered
    except BaseException as exc:
        failure = (type(exc), exc, exc.__traceback__)
        raise
    finally:
        with without_trace_points():
            profiler.__exit__(*failure)  # torch's profilers never swallow an exception
