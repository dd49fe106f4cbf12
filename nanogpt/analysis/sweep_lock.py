"""One writer a sweep dir: the sweep's process holds an OS file lock on SWEEP_DIR/.lock.

Two sweeps into one dir at once (the same command in two terminals, a cron job beside a hand
run, a SLURM array sent twice) would each write the same POINT/run-R dirs and each build a table
from the other's records: a table that agrees with none of them. So the multirun's process (the
one that submits, under hydra/launcher=slurm) takes `fcntl.flock(LOCK_EX)` on SWEEP_DIR/.lock
before it touches the dir, and holds it for its life; a second sweep into the dir is refused with
one line naming the holder (its pid and host, written into the file) and the fix.

The kernel releases a flock when the last descriptor of its open file goes, so a sweep that is
killed (kill -9, a lost login) leaves no stale lock: the pid and host left in the file are only
read while the lock is held. The descriptor is close-on-exec and closed in a forked child
(os.register_at_fork), so no measuring process, fork server or slot keeps the lock after the
sweep is gone.

`nanogpt.report DIR` reads without the lock (a table of the records so far is what it is for)
and says when a sweep still holds it (`holder`).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"
# A reader's probe (`holder`) holds a shared lock for a moment: a sweep that finds the lock taken
# tries again for this long before it refuses, so that a report run beside it never refuses it.
RETRY_S = 1.0

_held: dict[str, int] = {}  # resolved sweep dir -> the descriptor that holds its lock


class SweepBusy(Exception):
    """Another process holds the sweep dir's lock; str(): who (pid, host, since when)."""


def take(sweep_dir: Path) -> None:
    """Hold SWEEP_DIR/.lock for the rest of this process's life (once a dir: taking it again is
    a no-op). Raises SweepBusy naming the holder when another process has it."""
    key = str(Path(sweep_dir).resolve())
    if key in _held:
        return
    path = Path(sweep_dir) / LOCK_FILE
    if not path.parent.exists():  # made for the lock: gone again if the sweep writes nothing
        path.parent.mkdir(parents=True, exist_ok=True)
        atexit.register(_drop_if_unused, path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise SweepBusy(_describe(path)) from None
            time.sleep(0.05)
    # Who holds it, written in place: the lock is on this file (a new file, as an atomic
    # replace makes, would be unlocked). Read only while the lock is held, so never stale.
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    _held[key] = fd


def holder(sweep_dir: Path) -> str | None:
    """Who holds the sweep dir's lock (pid, host, since), or None when no process does. Takes
    a shared lock for a moment, never waits."""
    path = Path(sweep_dir) / LOCK_FILE
    if str(Path(sweep_dir).resolve()) in _held:
        return None  # this process: the writer itself
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no sweep ever took it (or it cannot be read: nothing to say)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _describe(path: Path) -> str:
    """`pid 123 on host h since 05:01:02 UTC` from the lock file (its writer may be between
    truncating and writing it: then `another process`)."""
    for _ in range(10):
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            since = time.strftime("%H:%M:%S UTC", time.gmtime(found["since"]))
            return f"pid {found['pid']} on host {found['host']} since {since}"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "another process"


def _drop_if_unused(sweep_dir: Path) -> None:
    """At exit: a sweep dir made for the lock that holds nothing else (a sweep refused at its
    start: bad input, no SLURM) is removed, so that a refusal leaves nothing behind."""
    try:
        if [p.name for p in sweep_dir.iterdir()] == [LOCK_FILE]:
            (sweep_dir / LOCK_FILE).unlink()
            sweep_dir.rmdir()
    except OSError:
        pass  # written meanwhile, or not ours to remove: kept


def _close_in_child() -> None:
    """A forked child closes its copy of the descriptor (the lock stays the parent's): a child
    that outlived a killed sweep must not keep the dir locked."""
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)
