"""A point's files in its job dir: `result.json` (the record) and `steps.csv` (its steps).

Both are written atomically (nanogpt/files.py), by the job process alone. A sweep dir is found
point by point: a point's identity is what it measures (`point_id`, results/identity.py), not
its job number nor the text of its overrides. Records written before point_id existed are
matched by their overrides, order-free.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from nanogpt.files import read_json, write_atomic, write_json
from nanogpt.results.record import PARTS, TOP, Record, flat_fields
from nanogpt.results.swept import point_key  # a point's overrides, order-free

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
MOVED_DIR = "moved"  # SWEEP_DIR/moved/POINT_ID: a record whose job dir another point now uses
STEPS_COLUMNS = ("step", "phase", "step_ms", "data_ms", "loss", "repeat")


def write_record(job_dir: Path, record: Record) -> None:
    """steps.csv, then result.json: a readable result.json always has its steps beside it."""
    write_steps(job_dir, record.steps)
    write_result(job_dir, record.to_dict())


def write_steps(job_dir: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=STEPS_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(job_dir / STEPS_FILE, buf.getvalue())


def write_result(job_dir: Path, result: dict) -> None:
    """result.json from a flat record: nested by part (record.nested), for people to read."""
    write_json(job_dir / RESULT_FILE, nested(result))


def read_result(path: Path) -> dict | None:
    """A record as the flat namespace every reader uses (record.flattened: an earlier flat
    result.json reads the same), or None when the file is unreadable or not a complete
    record."""
    data = read_json(path)
    return flattened(data) if isinstance(data, dict) and "status" in data else None


def sweep_id(sweep_dir: Path) -> str:
    """A sweep's id, the default W&B group: its dir's last two parts, DATE/TIME for Hydra's
    multirun/DATE/TIME (the time alone repeats on other days)."""
    return "/".join(Path(sweep_dir).resolve().parts[-2:])


def iter_records(sweep_dir: Path, moved: bool = True):
    """(path, record or None) for every result.json below a sweep dir; moved=False leaves out
    those under SWEEP_DIR/moved/ (points the sweep no longer has there: no rows of its table)."""
    aside = Path(sweep_dir) / MOVED_DIR
    for path in sorted(sweep_dir.rglob(RESULT_FILE)):
        if moved or not path.is_relative_to(aside):
            yield path, read_result(path)


def same_point(record: dict, pid: str, overrides: list[str]) -> bool:
    """Whether a record measured the point `pid` (a record without a point_id: the same
    overrides)."""
    if record.get("point_id"):
        return record["point_id"] == pid
    return point_key(record.get("overrides") or []) == point_key(overrides)


def find_ok(sweep_dir: Path, pid: str, overrides: list[str]) -> Path | None:
    """The job dir of an earlier `ok` record of the same point, if any."""
    for path, record in iter_records(sweep_dir):
        if record and record.get("status") == "ok" and same_point(record, pid, overrides):
            return path.parent
    return None


def move_other_point(sweep_dir: Path, job_dir: Path, pid: str, overrides: list[str]) -> None:
    """Before a point writes its record into job_dir: an ok record of another point there (job
    dirs are numbered by position, and a resumed sweep's list of points may have changed) moves
    to SWEEP_DIR/moved/ID/, where a later point of the sweep still finds it. Renames only: the
    record is never half in one place."""
    record = read_result(job_dir / RESULT_FILE)
    if not record or record.get("status") != "ok" or same_point(record, pid, overrides):
        return
    other = record.get("point_id") or point_key(record.get("overrides") or []).replace("/", "_")
    target = sweep_dir / MOVED_DIR / other
    target.mkdir(parents=True, exist_ok=True)
    if (job_dir / STEPS_FILE).is_file():
        os.replace(job_dir / STEPS_FILE, target / STEPS_FILE)
    os.replace(job_dir / RESULT_FILE, target / RESULT_FILE)


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """result.json's form of a flat record: the record's own fields (status, error, wall_s, ...)
    at the top, then each part's under its name (`asked`, `setup`, `timing`, `memory`, ...), as
    a person reads it. A key the schema does not know stays at the top."""
    part_of = {name: part for name, part, _ in flat_fields()}
    out: dict[str, Any] = {}
    for name, value in flat.items():
        part = part_of.get(name, TOP)
        if part == TOP:
            out[name] = value
        else:
            out.setdefault(part, {})[name] = value
    return out


def flattened(data: dict[str, Any]) -> dict[str, Any]:
    """The flat namespace of a result.json: a nested record's parts lifted to the top; a flat
    one (written before records were nested) as it is. A part's name is never a flat field
    that holds a dict (`optimizer` the part is a dict; `optimizer` the asked name is text)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in PARTS and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat
