"""The sweep table's files: summary.csv, summary.parquet and steps.parquet, typed.

A figure has one name in every file (`stored_names`): a record field as `part.field`
(`timing.step_ms_median`, `point.status`: `point` is the record's own part, whose fields stand at
result.json's top), a field of what was asked by its config path (`perf.dtype`, `model.name`;
one column where the sweep swept that key; `point_id`, `overrides`, `job_dir`, which no config
key holds, bare), the swept keys by config path, the figures that compare points (speedup,
p-values, verdicts) by their bare names, as they are no record field.
- summary.csv: what a person opens first. One row per point: the swept keys, then the `HEADLINE`
  columns below, in that order; a column empty in every row is left out. List and dict cells
  (a swept `[1,2]`) are JSON, so `read_summary` gives them back as lists; booleans are
  True/False.
- summary.parquet: the whole table with its types (every record field, the swept keys and
  every figure that compares points; lists stay lists, integers stay integers).
- steps.parquet: the long steps table (analysis/sweep_steps.py), keyed by job_dir, repeat, step.
Each is written atomically (temp file + rename). docs/record.md lists the headline columns.

In memory the table (analysis/table.py) keeps the record's flat names (`step_ms_median`), the
namespace of read_result and the library: `read_summary` is the one place a file's names become
the table's (`_flat`), for a file of this version and for one written before (a summary.csv with
the flat names, which are the table's own).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from nanogpt.record import TOP, columns, flat_fields
from nanogpt.record.fields import CONFIG
from nanogpt.record.fields import HEADLINE as PLACE
from nanogpt.record.files import write_atomic
from nanogpt.record.swept import split_overrides, swept_keys
from nanogpt.scenarios import base as scenarios

SUMMARY_CSV = "summary.csv"
SUMMARY_PARQUET = "summary.parquet"
STEPS_PARQUET = "steps.parquet"
SUMMARY_MD = "summary.md"


# summary.csv's columns after the swept keys, by the table's flat names (each written under its
# stored name): the figures that answer "which point, how fast, how sure, does it fit, why",
# then what identifies the point. Every other field is in summary.parquet and result.json.
# A record field says its own place (record/fields.py, HEADLINE: `marked(headline=30)` on
# Timing.step_ms_median), a scenario's comparison its columns' (its part's COMPARED: throughput's
# speedups at 50-53, time to loss's ratio, p-value and verdict at 64-66); the table's own other
# figures, which compare points and are no record's field, have theirs here, among them.
TABLE_PLACES = {
    "compile_breakeven_steps": 70,
    "compile_verdict": 71,
    # a checkpointing or offload policy against its twin that keeps everything
    # (analysis/memory_time.py)
    "ac_memory_saved_bytes": 72,
    "ac_time_paid_pct": 73,
    "ac_mib_per_pct": 74,
    "usd_per_1m_tokens": 82,
}


def _headline() -> tuple[str, ...]:
    """HEADLINE: every field marked with a headline place, every scenario's comparison columns
    and TABLE_PLACES, by place."""
    places = dict(TABLE_PLACES)
    for scenario in scenarios.ALL:
        places.update(scenario.part.COMPARED)
    for name, _, f in flat_fields():
        if PLACE in f.metadata:
            places[name] = f.metadata[PLACE]
    taken = sorted(places.values())
    if len(set(taken)) != len(taken):
        twice = sorted(n for n, p in places.items() if taken.count(p) > 1)
        raise ValueError(f"headline places taken twice: {twice}; give each field its own")
    return tuple(sorted(places, key=places.__getitem__))


HEADLINE = _headline()


def stored_names(columns) -> dict[str, str]:
    """The name in summary.csv and summary.parquet of each of the table's flat columns (module
    docstring); a column that is no record field (a swept key, a figure that compares points)
    keeps its name."""
    fields = {name: (part, f) for name, part, f in flat_fields()}
    names = {}
    for column in columns:
        if column not in fields:
            names[column] = column
            continue
        part, f = fields[column]
        if part == "asked":
            names[column] = f.metadata.get(CONFIG, column)
        else:
            names[column] = f"{'point' if part == TOP else part}.{column}"
    return names


def _nested(table: pd.DataFrame) -> pd.DataFrame:
    """The table with the files' names; an asked field's column dropped where a swept key's
    column has its name (`perf.dtype` swept: that column stands for the field too)."""
    names = stored_names(table.columns)
    copies = [c for c, n in names.items() if n != c and n in table.columns]
    return table.drop(columns=copies).rename(columns=names)


def _flat(table: pd.DataFrame) -> pd.DataFrame:
    """A file's table with the table's flat names: the one converter at the read boundary.
    A column under its stored name (`timing.step_ms_median`) takes its flat name; a column a
    file written before this naming holds under the flat name (summary.csv's `step_ms_median`)
    is already the table's. A swept key's column that also stands for an asked field keeps its
    name and gives the field a copy (`perf.dtype` and `dtype`): which keys are swept is read
    from the overrides column, as the table was built (analysis/table.py)."""
    flat = {stored: name for name, stored in stored_names(columns()).items()}
    overrides = table["overrides"] if "overrides" in table else []
    keys = swept_keys(
        [split_overrides(text if isinstance(text, str) else None) for text in overrides]
    )
    copies = {key: flat[key] for key in keys if key in flat and key in table.columns}
    out = table.rename(columns={c: flat[c] for c in table.columns if c in flat and c not in copies})
    if not copies:
        return out
    # one concat, not a column at a time: summary.parquet has hundreds of columns
    given = pd.DataFrame({name: table[column] for column, name in copies.items()})
    return pd.concat([out.drop(columns=[c for c in given if c in out]), given], axis=1)


def headline(table: pd.DataFrame, swept: list[str]) -> pd.DataFrame:
    """summary.csv's table: the swept keys' columns, then HEADLINE's; none empty in every row
    (a swept key's column always stays)."""
    names = [*swept, *(c for c in HEADLINE if c in table and c not in swept)]
    kept = [c for c in names if c in swept or table[c].notna().any()]
    return table[kept]


def _is_container(value) -> bool:
    return isinstance(value, list | tuple | dict)


def to_csv(table: pd.DataFrame) -> str:
    """The table as CSV text, list and dict cells as JSON."""
    encoded = table.copy()
    for column in encoded.columns:
        if encoded[column].dtype == object and encoded[column].map(_is_container).any():
            encoded[column] = encoded[column].map(
                lambda v: json.dumps(v) if _is_container(v) else v
            )
    return encoded.to_csv(index=False)


def read_summary(path: str | Path) -> pd.DataFrame:
    """A sweep's table read back with its types and the table's flat names (`_flat`): a sweep
    dir gives summary.parquet (every field), a file its own columns (summary.csv: the
    headline)."""
    return _flat(read_stored(path))


def read_stored(path: str | Path) -> pd.DataFrame:
    """A sweep's file as written, its columns under the names it has on disk, with its types:
    a sweep dir gives summary.parquet; in summary.csv a column whose every cell is JSON list or
    dict text comes back as lists or dicts (Parquet's lists as lists, not numpy arrays)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_PARQUET
    if path.suffix == ".parquet":
        return _from_arrow(pd.read_parquet(path))
    table = pd.read_csv(path)
    for column in table.columns:
        if table[column].dtype == object or pd.api.types.is_string_dtype(table[column]):
            decoded = _json_cells(table[column])
            if decoded is not None:
                table[column] = decoded
    return table


def _json_cells(column: pd.Series) -> pd.Series | None:
    present = column.dropna()
    if present.empty or not present.map(lambda v: isinstance(v, str) and v[:1] in "[{").all():
        return None
    try:
        values = present.map(json.loads)
    except ValueError:
        return None
    out = pd.Series([None] * len(column), index=column.index, dtype=object)
    out[values.index] = values
    return out


def _from_arrow(table: pd.DataFrame) -> pd.DataFrame:
    """Parquet list columns come back as numpy arrays: lists, as in the table that was written."""
    for column in table.columns:
        if table[column].dtype == object:
            table[column] = table[column].map(lambda v: v.tolist() if hasattr(v, "tolist") else v)
    return table


def to_parquet(table: pd.DataFrame) -> bytes:
    """The table as Parquet bytes. A column Arrow cannot type (mixed kinds of values, e.g. a
    swept key that is a number in one point and a list in another) is stored as JSON text."""
    import pyarrow as pa

    stored = table.copy()
    for column in stored.columns:
        if stored[column].dtype != object:
            continue
        try:
            pa.array(stored[column], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            stored[column] = stored[column].map(lambda v: None if v is None else json.dumps(v))
    buffer = io.BytesIO()
    stored.to_parquet(buffer, index=False, engine="pyarrow")
    return buffer.getvalue()


def write(
    sweep_dir: Path, table: pd.DataFrame, swept: list[str], steps: pd.DataFrame, markdown: str
) -> None:
    """summary.csv (the headline), summary.parquet (everything), both with the stored names,
    steps.parquet and summary.md, each atomically. Without pyarrow (a GPU image lacks it:
    ../shared/device/README.md) the two parquet files are not written and one line says so:
    the records and summary.csv hold the figures."""
    write_atomic(sweep_dir / SUMMARY_CSV, to_csv(_nested(headline(table, swept))))
    try:
        import pyarrow  # noqa: F401 (to_parquet's engine)
    except ImportError:
        print(f"{SUMMARY_PARQUET}, {STEPS_PARQUET}: not written, no pyarrow (pip install pyarrow)")
    else:
        write_atomic(sweep_dir / SUMMARY_PARQUET, to_parquet(_nested(table)))
        write_atomic(sweep_dir / STEPS_PARQUET, to_parquet(steps))
    write_atomic(sweep_dir / SUMMARY_MD, markdown)
