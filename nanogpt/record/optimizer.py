"""The record's optimizer part: what stepped each role of parameter, with what learning rate
and weight decay, the state it keeps, and the share of a step it takes. Filled by the measured
loop (probes/setup.py: the roles before the first step, the state counted after the measured
steps; the step share from the diagnosis, derived in analysis/derive.py)."""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.record.fields import json_only


@dataclass
class OptimizerPart:
    optimizer_stepped: str | None = None  # the classes that step, e.g. "Muon + AdamW"
    # role -> {n_params, tensors, lr, weight_decay, stepped_by, state_bytes, state_bytes_est}
    optimizer_roles: dict | None = json_only()
    optimizer_state_bytes: int | None = None  # counted: the state tensors after the steps
    optimizer_state_rule: str | None = json_only()  # the estimate's bytes a parameter
    optimizer_step_frac: float | None = None  # the diagnosis' optimizer share of the step
    muon_adjust_lr_fn: str | None = None  # optimizer=muon: torch.optim.Muon's lr adjustment
    optimizer_note: str | None = json_only()  # e.g. which part optimizer.impl applies to
