"""The sweep table's files: summary.csv, summary.parquet and steps.parquet, typed.

- summary.csv: what a person opens first. One row per point: the swept keys, by config path
  (`perf.dtype`), then the `HEADLINE` columns below, in that order; a column empty in every
  row is left out. List and dict cells (a swept `[1,2]`) are JSON, so `read_summary` gives them
  back as lists; booleans are True/False.
- summary.parquet: the whole table with its types (every record field, the swept keys and
  every figure that compares points; lists stay lists, integers stay integers), its columns
  named by where each figure lives (`parquet_names`): a record field as `part.field`
  (`timing.step_ms_median`, `point.status`), a field of what was asked by its config path
  (`perf.dtype`; one column where the sweep swept that key), the swept keys by config path,
  the figures that compare points (speedup, p-values, verdicts) by their bare names.
  `read_summary` gives the flat names back, so code reads one namespace whichever file.
- steps.parquet: the long steps table (analysis/sweep_steps.py), keyed by job_dir, repeat, step.
Each is written atomically (temp file + rename). docs/record.md lists the headline columns.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

from nanogpt.record.files import write_atomic
from nanogpt.scenarios.time_to_loss import part as ttl_part

SUMMARY_CSV = "summary.csv"
SUMMARY_PARQUET = "summary.parquet"
STEPS_PARQUET = "steps.parquet"
SUMMARY_MD = "summary.md"
# summary.parquet's metadata (DataFrame.attrs): the swept columns that also stand for an asked
# field ({"perf.dtype": "dtype"}), whose own column parquet_names would give the same name
SWEPT_ASKED = "nanogpt_swept_asked"


# summary.csv's columns after the swept keys: the figures that answer "which point, how fast,
# how sure, does it fit, why", then what identifies the point. Every other field is in
# summary.parquet and result.json.
HEADLINE = (
    "status",
    "tokens_per_s",
    "tokens_per_s_ci_low",
    "tokens_per_s_ci_high",
    "step_ms_median",
    "step_ms_cv",
    "steady",
    "contended",
    "mfu",
    "peak_memory_bytes",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_verdict",
    *ttl_part.HEADLINE,  # a target loss's points (scenarios/time_to_loss/)
    "compile_breakeven_steps",
    "compile_verdict",
    "bottleneck",
    "tokens_per_kwh",
    "usd_per_1m_tokens",
    "repeats",
    "model",
    "n_params",
    "tokens_per_step",
    "device_name",
    "error",
    "overrides",
    "point_id",
    "job_dir",
)


def parquet_names(columns) -> dict[str, str]:
    """summary.parquet's name of each flat column (module docstring); a column that is no
    record field (a swept key, a figure that compares points) keeps its name."""
    from nanogpt.record import TOP, flat_fields
    from nanogpt.record.fields import CONFIG

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
    """The table with summary.parquet's names; an asked copy of a swept key's column dropped
    (the file's metadata, SWEPT_ASKED, says which field each such column also stands for)."""
    names = parquet_names(table.columns)
    copies = {c: n for c, n in names.items() if n != c and n in table.columns}
    out = table.drop(columns=list(copies)).rename(columns=names)
    out.attrs = {**table.attrs, SWEPT_ASKED: {n: c for c, n in copies.items()}}
    return out


def _flat(table: pd.DataFrame) -> pd.DataFrame:
    """summary.parquet's table with the flat names; a swept key's column that also stands for
    an asked field keeps its name and gives the field a copy."""
    from nanogpt.record import columns

    swept = table.attrs.get(SWEPT_ASKED) or {}  # swept column -> the asked field's flat name
    flat = {nested: name for name, nested in parquet_names(columns()).items()}
    out = table.rename(columns={c: flat[c] for c in table.columns if c in flat and c not in swept})
    for column, name in swept.items():
        if column in table.columns:
            out[name] = table[column]
    return out


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
    """A sweep's table read back with its types: a sweep dir gives summary.parquet (every
    field); a file is read as it is (summary.csv: a column whose every cell is JSON list or
    dict text comes back as lists or dicts)."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY_PARQUET
    if path.suffix == ".parquet":
        return _flat(_from_arrow(pd.read_parquet(path)))
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
    """summary.csv (the headline), summary.parquet (everything), steps.parquet and summary.md,
    each atomically. Without pyarrow (a GPU image lacks it: ../shared/device/README.md) the two
    parquet files are not written and one line says so: the records and summary.csv hold the
    figures."""
    write_atomic(sweep_dir / SUMMARY_CSV, to_csv(headline(table, swept)))
    try:
        import pyarrow  # noqa: F401 (to_parquet's engine)
    except ImportError:
        print(f"{SUMMARY_PARQUET}, {STEPS_PARQUET}: not written, no pyarrow (pip install pyarrow)")
    else:
        write_atomic(sweep_dir / SUMMARY_PARQUET, to_parquet(_nested(table)))
        write_atomic(sweep_dir / STEPS_PARQUET, to_parquet(steps))
    write_atomic(sweep_dir / SUMMARY_MD, markdown)
