"""Atomic file writes: a temp file in the same directory, fsynced, then `os.replace`d over the
target. A crash or a full disk leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp makes its file 0600; a record gets the mode open() would give it (0644 under the usual
# umask), so that others on a shared machine can read a sweep.
FILE_MODE = 0o666 & ~_umask()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to `path` atomically. An OSError names `path` (a failed
    write(2) names no file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    binary = isinstance(data, bytes)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is missing, unreadable or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def user_cache_dir() -> Path:
    """This tool's cache: $XDG_CACHE_HOME/nanogpt-sweep, ~/.cache when XDG_CACHE_HOME is unset
    (the XDG base-directory convention). Tokenized text and calibrations live below it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nanogpt-sweep"
