"""Throughput's face at the record's layer: its console line. Its parts (timing, memory, rates,
...) are the record's own (record/measured.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def measured(record) -> bool:
    """Every record can be a throughput record; scenarios/base.of_record asks it last."""
    del record
    return True


def console_line(result: Mapping[str, Any], fmt: Callable[[str, str], str]) -> str:
    """Step time, tokens/s, achieved TFLOP/s and MFU (runner/job.summary_line prefixes it)."""
    mfu = result.get("mfu")
    return (
        f"step {fmt('step_ms_median', '.1f')} ms, {fmt('tokens_per_s', ',.0f')} tok/s, "
        f"{fmt('achieved_tflops', '.3f')} TFLOP/s, "
        f"MFU {'-' if mfu is None else f'{mfu:.1%}'}"
    )
