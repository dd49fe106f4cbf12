"""Throughput's face at the record's layer: its console line and its comparison's columns. Its
parts (timing, memory, rates, ...) are the record's own (record/measured.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# The table's columns its comparison adds (pool.compare: speedups against the baseline, no
# record field), at their summary.csv headline places (analysis/tidy.py). The console shows
# them as one `speedup` cell (analysis/display.speedup_text), so none has a place there.
COMPARED = {"speedup": 50, "speedup_ci_low": 51, "speedup_ci_high": 52, "speedup_verdict": 53}
COMPARED_SHOWN: dict[str, tuple[int, str, str]] = {}


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
