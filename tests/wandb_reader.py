"""Read an offline W&B run back from its run-ID.wandb file: config, history, summary, artifacts.

wandb 0.31 has no Python reader for these files (its writer is the Go `wandb-core`), so this
one follows the format: the LevelDB log format
(github.com/google/leveldb/blob/main/doc/log_format.md) holding one serialized
`wandb.proto.wandb_internal_pb2.Record` per log record.

- The file opens with a 7-byte header: b":W&B", magic 0xBEE1 (little-endian), version 0.
- Then 32 KiB blocks of chunks. A chunk has a 7-byte header (checksum u32, length u16, type u8)
  and its data; a record that does not fit in a block is split into FIRST, MIDDLE..., LAST.
  Fewer than 7 bytes left in a block are zero padding.
- wandb's checksum is zlib's CRC-32 of the type byte followed by the data.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# A machine without wandb (the bare GPU machines) skips the tests that read run files.
pb = pytest.importorskip("wandb.proto.wandb_internal_pb2", reason="reading W&B runs needs wandb")

FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)  # one dict per run.log call
    summary: dict = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)  # names of logged artifacts
    exit_code: int | None = None


def run_file(run_dir: Path) -> Path:
    """The run-ID.wandb file of a run dir such as wandb/offline-run-DATE-ID."""
    (path,) = Path(run_dir).glob("run-*.wandb")
    return path


def read_run(path: Path) -> OfflineRun:
    """Replay a run file's records into what the run logged."""
    run = OfflineRun()
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            _read_run_record(run, record.run)
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
            for item in record.summary.remove:
                run.summary.pop(_key(item), None)
        elif kind == "artifact":
            run.artifacts.append(record.artifact.name)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def iter_records(path: Path):
    data = Path(path).read_bytes()
    if not data.startswith(FILE_HEADER):
        raise ValueError(f"{path} is not a W&B run file (no {FILE_HEADER!r} header)")
    pending = b""
    pos = len(FILE_HEADER)
    while pos + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK_SIZE - pos % BLOCK_SIZE
        if left_in_block < CHUNK_HEADER.size:
            pos += left_in_block  # zero padding at the end of a block
            continue
        checksum, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        start = pos + CHUNK_HEADER.size
        chunk = data[start : start + length]
        if kind == 0 or len(chunk) < length:
            return  # preallocated zeros, or a tail cut short by a killed writer
        if zlib.crc32(bytes([kind]) + chunk) != checksum:
            raise ValueError(f"{path}: bad checksum in the chunk at byte {pos}")
        pos = start + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def _read_run_record(run: OfflineRun, record: pb.RunRecord) -> None:
    run.run_id = record.run_id
    run.name = record.display_name
    run.group = record.run_group
    run.job_type = record.job_type
    run.tags = list(record.tags)
    run.config.update(_items(record.config.update))


def _items(items) -> dict:
    """Key -> decoded value of a list of wandb ConfigItem/HistoryItem/SummaryItem."""
    return {_key(item): json.loads(item.value_json) for item in items}


def _key(item) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key
