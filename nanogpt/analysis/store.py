"""A run's files in its job dir: `result.json` (the record) and `steps.csv` (its steps).

A run's steps are stored once, in steps.csv (Record.steps: a row a step, the measured rows with
`step_ms_job`, the time the statistics use); result.json holds the statistics derived from them,
never the steps. A run written before that (its record held the measured steps' times as
`step_ms_measured`, its steps.csv had no step_ms_job) is converted where its steps are read,
`read_steps`, by one function (`_steps_of_old`): every reader gets the steps in today's form.

A sweep dir holds a dir per point (its index) and in it a dir per run, POINT/run-R, set by the
sweeper (nanogpt/frontend/grid_sweeper.py); each run's job writes its own record there, by the
job process alone: its files written whole into a temporary folder, then moved into place
(`place_record`; one sweep a dir: analysis/sweep_lock.py). The point's own result.json beside its
runs is their pool (`pool_runs`), rebuilt where it is older than a run or cannot be read. A sweep
written before runs were jobs has one pooled result.json a point and no run dirs: it still
reads, as all its runs.

A sweep dir is found run by run: a point's identity is what it measures (`point_id`,
record/identity.py), not its job number nor the text of its overrides. Records written before
point_id existed are matched by their overrides, order-free. `Index` is what a resume reads:
every ok record of the sweep dir, by point and run, read once per process.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from nanogpt.analysis.figures import derive_point
from nanogpt.record import MEASURE, PARTS, STEP_COLUMNS, STEP_MS_JOB, TOP, Record, flat_fields
from nanogpt.record.files import read_json, write_atomic, write_json
from nanogpt.record.swept import point_key  # a point's overrides, order-free

RESULT_FILE = "result.json"
STEPS_FILE = "steps.csv"
MOVED_DIR = "moved"  # SWEEP_DIR/moved/POINT_ID: a record whose job dir another point now uses
OLD_STEPS = "step_ms_measured"  # a record written before the steps were stored once: its steps
RUN_PREFIX = "run-"  # POINT/run-R: run R (from 1) of the point in POINT
_RUN_DIR = re.compile(rf"{RUN_PREFIX}(\d+)")


def run_dir(point_dir: Path, number: int) -> Path:
    return Path(point_dir) / f"{RUN_PREFIX}{number}"


def run_number(job_dir: Path) -> int | None:
    """The run a job dir holds (POINT/run-R: R), or None for a point's own dir."""
    found = _RUN_DIR.fullmatch(Path(job_dir).name)
    return int(found.group(1)) if found else None


def run_dirs(point_dir: Path) -> list[tuple[int, Path]]:
    """(R, POINT/run-R) of every run dir of a point that holds a record, in run order."""
    found = [(run_number(p.parent), p.parent) for p in Path(point_dir).glob(f"*/{RESULT_FILE}")]
    return sorted((n, d) for n, d in found if n is not None)


def write_record(job_dir: Path, record: Record) -> None:
    """A run's steps.csv and result.json (place_record)."""
    place_record(Path(job_dir), record.steps, record.to_dict())


def place_record(job_dir: Path, steps: list[dict] | None, result: dict) -> None:
    """steps.csv (unless `steps` is None) and result.json, each written whole by this process
    into a temporary folder in job_dir, then moved into place, steps.csv first: a readable
    result.json always has its steps beside it, and a run dir never holds one process's
    result.json beside another's half-written steps. An OSError names the file's place."""
    job_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=job_dir, prefix=".record-"))
    try:
        names = [RESULT_FILE]
        if steps is not None:
            write_steps(staging, steps)
            names.insert(0, STEPS_FILE)
        write_result(staging, result)
        for name in names:
            os.replace(staging / name, job_dir / name)
    except OSError as err:
        where = job_dir / Path(err.filename).name if err.filename else job_dir
        raise OSError(err.errno, err.strerror, str(where)) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_steps(job_dir: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=STEP_COLUMNS, extrasaction="ignore")
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


def read_steps(job_dir: Path, record: dict | None = None) -> list[dict]:
    """A run's (or a pooled point's) steps: steps.csv's rows, text as written and an empty cell
    None; [] where there is none or it cannot be read. `record`: the record of the same dir as
    read (read_result), which is what tells a run written before the steps were stored once:
    its steps come back converted (_steps_of_old)."""
    try:
        with open(Path(job_dir) / STEPS_FILE, encoding="utf-8", newline="") as f:
            rows = [{k: v if v != "" else None for k, v in r.items()} for r in csv.DictReader(f)]
    except (OSError, UnicodeDecodeError, csv.Error):
        rows = []
    if record is not None and record.get(OLD_STEPS):
        return _steps_of_old(rows, record[OLD_STEPS])
    return rows


def _steps_of_old(rows: list[dict], measured: list[list[float]]) -> list[dict]:
    """The one converter of a run (or pooled point) written before its steps were stored once.
    Its record held the measured steps' times the statistics used (`measured`: step_ms_measured,
    a list per run, under torchrun the slowest rank's per step) and its steps.csv rank 0's rows
    without them. Each run's times go onto its measured rows, in order, as step_ms_job; where
    the counts differ (a steps.csv missing or cut short) that run's measured rows are the
    record's times alone (step and the other columns empty), as its statistics were computed
    from them."""
    pooled = len(measured) > 1  # a pool's rows are numbered by run; a run's own have no repeat
    for number, series in enumerate(measured, 1):
        at = [r for r in rows if r.get("phase") == MEASURE and int(r.get("repeat") or 1) == number]
        if len(at) == len(series):
            for row, ms in zip(at, series, strict=True):
                row[STEP_MS_JOB] = ms
            continue
        dropped = {id(row) for row in at}
        rows = [row for row in rows if id(row) not in dropped]
        rows += [
            {"phase": MEASURE, "step_ms": ms, STEP_MS_JOB: ms, "repeat": number if pooled else None}
            for ms in series
        ]
    return rows


def pool_runs(
    point_dir: Path,
    known: dict[Path, dict] | None = None,
    known_steps: dict[Path, list[dict]] | None = None,
) -> Record | None:
    """The point's record from its runs' (POINT/run-R), written to POINT/result.json and
    steps.csv; None for a point dir without runs (a record written before runs were jobs stays
    as it is). All ok: their pool, every figure derived once (analysis/figures.derive_point, as
    for one run); otherwise the first run that was not ok is the point's record (a later run of
    a failed point is never measured). A point with fewer runs than it asked (a sweep stopped
    between rounds) is the pool of those it has: its run count says so. `known`: records this
    process holds (the resume's Index), by resolved dir: not read again; `known_steps` their
    steps, likewise."""
    known, known_steps = known or {}, known_steps or {}

    def steps_of(where: Path, flat: dict) -> list[dict]:
        held = known_steps.get(Path(where).resolve())
        return list(held) if held is not None else read_steps(where, flat)

    runs = [
        (number, known.get(d.resolve()) or read_result(d / RESULT_FILE), d)
        for number, d in run_dirs(point_dir)
    ]
    runs = [(number, r, d) for number, r, d in runs if r is not None]
    if not runs:
        return None
    failed = [(r, d) for _, r, d in runs if r["status"] != "ok"]
    if failed:
        flat, where = failed[0]
        record = Record.from_dict(flat)
        record.steps = steps_of(where, flat)
    else:
        records = []
        for _, flat, where in runs:
            records.append(Record.from_dict(flat))
            records[-1].steps = steps_of(where, flat)
        floor_s = ((runs[0][1].get("measured_config") or {}).get("bench") or {}).get("measure_s")
        record = derive_point(records, floor_s or 0.0) if len(records) > 1 else records[0]
        record.wall_s = sum(r.wall_s or 0.0 for r in records)
    write_record(Path(point_dir), record)
    return record


def pool_sweep(sweep_dir: Path) -> dict[Path, Record]:
    """Every point of a sweep dir pooled from its runs (pool_runs), the dirs moved aside too,
    where a run is newer than the pool or the pool cannot be read (a derived file is rebuilt,
    never trusted when damaged: one line says so); the records pooled now, by point dir
    (resolved)."""
    runs = list(Path(sweep_dir).rglob(f"{RUN_PREFIX}*/{RESULT_FILE}"))
    newest: dict[Path, float] = {}
    for path in runs:
        point_dir = path.parent.parent
        newest[point_dir] = max(newest.get(point_dir, 0.0), path.stat().st_mtime)
    held = _INDEXES.get(str(Path(sweep_dir).resolve()))  # the runs this process holds
    known, known_steps = (held.records, held.steps) if held else ({}, {})
    pooled_now = {}
    for point_dir, ran in sorted(newest.items()):
        pooled = point_dir / RESULT_FILE
        stale = not pooled.is_file() or pooled.stat().st_mtime < ran
        damaged = not stale and read_result(pooled) is None
        if stale or damaged:  # else: pooled since its newest run, and readable
            record = pool_runs(point_dir, known, known_steps)
            if record is not None:
                pooled_now[point_dir.resolve()] = record
                if damaged:
                    print(
                        f"rebuilt unreadable pooled record {pooled} from its runs", file=sys.stderr
                    )
    return pooled_now


def sweep_id(sweep_dir: Path) -> str:
    """A sweep's id, the default W&B group: its dir's last two parts, DATE/TIME for Hydra's
    multirun/DATE/TIME (the time alone repeats on other days)."""
    return "/".join(Path(sweep_dir).resolve().parts[-2:])


def iter_records(
    sweep_dir: Path, moved: bool = True, runs: bool = False, known: dict | None = None
):
    """(path, record or None) for every point's result.json below a sweep dir (runs=True: the
    runs' too, POINT/run-R/result.json); moved=False leaves out those under SWEEP_DIR/moved/
    (points the sweep no longer has there: no rows of its table). `known`: flat records this
    process holds, by resolved dir: given, not read again."""
    aside = Path(sweep_dir) / MOVED_DIR
    known = known or {}
    for path in sorted(Path(sweep_dir).rglob(RESULT_FILE)):
        if not runs and run_number(path.parent) is not None:
            continue
        if any(part.startswith(".") for part in path.relative_to(sweep_dir).parts):
            continue  # a record being placed (place_record's temporary folder), or debris of one
        if moved or not path.is_relative_to(aside):
            held = known.get(path.parent.resolve())
            yield path, dict(held) if held is not None else read_result(path)


def same_point(record: dict, pid: str, overrides: list[str]) -> bool:
    """Whether a record measured the point `pid` (a record without a point_id: the same
    overrides)."""
    if record.get("point_id"):
        return record["point_id"] == pid
    return point_key(record.get("overrides") or []) == point_key(overrides)


def _key(record: dict) -> str:
    """What a record is found by: its point_id, or its overrides (written before point_id)."""
    return record.get("point_id") or "overrides:" + point_key(record.get("overrides") or [])


class Index:
    """Every ok record below a sweep dir, read once: a run's by (point, R), a pooled record
    written before runs were jobs by point (a point's result.json beside run dirs is their pool,
    not such a record). A resume asks it for each run; the runs this process writes are added."""

    def __init__(self, sweep_dir: Path):
        self.runs: dict[tuple[str, int], Path] = {}
        self.pooled: dict[str, Path] = {}
        self.owner: dict[Path, str] = {}  # an ok record's dir (resolved) -> its point's key
        self.records: dict[Path, dict] = {}  # an ok record's dir (resolved) -> the record
        self.steps: dict[Path, list[dict]] = {}  # a run this process wrote -> its steps' rows
        for path, record in iter_records(Path(sweep_dir), runs=True):
            if not record or record.get("status") != "ok":
                continue
            self.owner[path.parent.resolve()] = _key(record)
            self.records[path.parent.resolve()] = record
            number = run_number(path.parent)
            if number is not None:
                self.runs[(_key(record), number)] = path.parent
            elif not run_dirs(path.parent):
                self.pooled[_key(record)] = path.parent

    def find(self, keys: list[str], number: int) -> tuple[Path, bool, dict] | None:
        """(dir, pooled, record) of an ok record of run `number` of the point found by any of
        `keys`: the run's own, or an old pooled record of the point (all its runs)."""
        for key in keys:
            candidates = ((self.runs.get((key, number)), False), (self.pooled.get(key), True))
            for found, pooled in candidates:
                if found is not None and (found / RESULT_FILE).is_file():
                    return found, pooled, self.records[Path(found).resolve()]
        return None

    def add(self, job_dir: Path, record: dict, steps: list[dict] | None = None) -> None:
        """A run this process wrote: its record and its steps (steps.csv's rows), held."""
        number = run_number(job_dir)
        if steps is not None:
            self.steps[Path(job_dir).resolve()] = steps
        if record.get("status") == "ok" and number is not None:
            self.runs[(_key(record), number)] = Path(job_dir)
            self.owner[Path(job_dir).resolve()] = _key(record)
            self.records[Path(job_dir).resolve()] = record

    def others_in(self, point_dir: Path, keys: list[str]) -> list[tuple[Path, str]]:
        """(dir, key) of the ok records of another point in point_dir or its run dirs."""
        point_dir = Path(point_dir).resolve()
        return [
            (where, key)
            for where, key in self.owner.items()
            if point_dir in (where, where.parent) and key not in keys
        ]


_INDEXES: dict[str, Index] = {}


def index(sweep_dir: Path) -> Index:
    """The sweep dir's Index, built at its first use in this process."""
    key = str(Path(sweep_dir).resolve())
    if key not in _INDEXES:
        _INDEXES[key] = Index(Path(sweep_dir))
    return _INDEXES[key]


def move_other_point(sweep_dir: Path, point_dir: Path, keys: list[str]) -> None:
    """Before a point (found by any of `keys`: its point_id, the one it had before, its
    overrides) writes a run into point_dir: the ok records of another point there (dirs are
    numbered by position, and a resumed sweep's list of points may have changed) move to
    SWEEP_DIR/moved/ID/ (its runs as ID/run-R), where a later point of the sweep still finds
    them. Renames only: a record is never half in one place. Asks the Index: no file read."""
    point_dir = Path(point_dir).resolve()
    others = index(sweep_dir).others_in(point_dir, keys)
    for where, key in others:
        target = Path(sweep_dir) / MOVED_DIR / key.replace("/", "_")
        if where != point_dir:
            target = target / where.name
        target.mkdir(parents=True, exist_ok=True)
        for name in (STEPS_FILE, RESULT_FILE):  # result.json last: it says the record is whole
            if (where / name).is_file():
                os.replace(where / name, target / name)
    if others:  # paths changed: read again when next asked
        _INDEXES.pop(str(Path(sweep_dir).resolve()), None)


def copy_record(source: Path, job_dir: Path, record: dict) -> dict:
    """An ok record (as read) kept from another dir (a resumed sweep whose points moved) copied
    into job_dir, steps first (read_steps: a run of before in today's form); the record."""
    if Path(source).resolve() != Path(job_dir).resolve():
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        steps = read_steps(source, record)
        record = {k: v for k, v in record.items() if k != OLD_STEPS} | {"job_dir": str(job_dir)}
        place_record(Path(job_dir), steps or None, record)
    return record


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
