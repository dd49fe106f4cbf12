"""The record's diagnosis part: the bottleneck verdict, its hint and the figures behind them.
probes/diagnose.py measures the figures; analysis/bottleneck.py holds the rules that judge them."""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.record.fields import marked


@dataclass
class Diagnosis:
    """The diagnosis of one point: verdict, hint and the figures behind them
    (docs/measurement.md, Diagnosis). All shares are fractions; null everywhere, with
    `diag_error` saying why, when not run."""

    # host-bound | device-bound | data-bound | communication-bound
    bottleneck: str | None = marked(headline=80, shown=(80, "bottleneck", "text"))
    bottleneck_hint: str | None = None
    # shares of the step's wall time, summing to 1 (diag_step_*_frac) ...
    diag_step_device_frac: float | None = None
    diag_step_host_frac: float | None = None
    diag_step_data_frac: float | None = None
    diag_step_comm_frac: float | None = None
    # ... apart from shares of device time by kind, summing to 1 (diag_device_time_*_frac)
    diag_device_time_matmul_frac: float | None = None
    diag_device_time_attention_frac: float | None = None
    diag_device_time_elementwise_frac: float | None = None
    diag_device_time_optimizer_frac: float | None = None
    diag_device_time_communication_frac: float | None = None
    diag_device_time_other_frac: float | None = None
    diag_ops_per_step: float | None = None  # CUDA: kernels; CPU: aten operators
    diag_us_per_op: float | None = None  # device time per kernel / operator
    diag_op_floor_us: float | None = None  # CPU: an operator's fixed host cost (no-arithmetic ops)
    diag_mem_headroom_bytes: int | None = None
    diag_mem_headroom_frac: float | None = None
    diag_matmul_emulated: str | None = None  # why the dtype has no native matmul here, if so
    diag_steps: int | None = None  # profiled steps the figures come from
    diag_step_ms: float | None = None  # their median wall time (profiler on: not a statistic)
    diag_method: str | None = None
    diag_error: str | None = None  # why the diagnosis is null: off, skipped, or failed
