"""The run specification: plain dataclasses, one per config group, and RunSpec holding them.

Hydra registers the groups as structured-config schemas (see nanogpt/frontend/compose.py), so a
wrong type or an unknown key fails at composition. Library code takes a `RunSpec` and never imports
Hydra. The package: config/choices.py (the Enums a key's values come from), config/groups.py (a
dataclass a config group), and here RunSpec and its plain-dict form (what a child process is
handed). Every name is importable from `nanogpt.config.spec`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from nanogpt.config.choices import (
    COMPILE_MODES,
    Ac,
    AcPolicy,
    Attention,
    DataKind,
    Dtype,
    Exclusive,
    Fp8,
    LoggerMode,
    Loss,
    Objective,
    Offload,
    OptimizerImpl,
    Schedule,
    Strategy,
    Tokenizer,
)
from nanogpt.config.groups import (
    BenchConfig,
    CostConfig,
    DataConfig,
    DistConfig,
    HardwareConfig,
    LoggerConfig,
    ModelConfig,
    OptimizerConfig,
    PerfConfig,
    ReportConfig,
    RoleConfig,
    RolesConfig,
    TuneConfig,
)

__all__ = [
    "COMPILE_MODES",
    "Ac",
    "AcPolicy",
    "Attention",
    "BenchConfig",
    "CostConfig",
    "DataConfig",
    "DataKind",
    "DistConfig",
    "Dtype",
    "Exclusive",
    "Fp8",
    "HardwareConfig",
    "LoggerConfig",
    "LoggerMode",
    "Loss",
    "ModelConfig",
    "Objective",
    "Offload",
    "OptimizerConfig",
    "OptimizerImpl",
    "PerfConfig",
    "ReportConfig",
    "RoleConfig",
    "RolesConfig",
    "RunSpec",
    "Schedule",
    "Strategy",
    "Tokenizer",
    "TuneConfig",
    "spec_from_dict",
    "spec_to_dict",
]


@dataclass
class RunSpec:
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    data: DataConfig = field(default_factory=DataConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


def spec_to_dict(spec: RunSpec) -> dict[str, Any]:
    """JSON-ready dict: Enums become their values."""
    return _plain(dataclasses.asdict(spec))


def spec_from_dict(raw: dict[str, Any]) -> RunSpec:
    """Inverse of spec_to_dict (used to hand a spec to a child process)."""
    return _from_dict(RunSpec, raw)


def _from_dict(cls: type, raw: dict[str, Any]) -> Any:
    """A spec dataclass from its dict, each field typed by its default's type: a nested
    dataclass (a config group, optimizer.roles and its roles) from its own dict, an Enum or a
    list of Enums from their values; a key the dict lacks keeps its default."""
    defaults = cls()
    values = dict(raw)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        default, value = getattr(defaults, f.name), values[f.name]
        if dataclasses.is_dataclass(default):
            values[f.name] = _from_dict(type(default), value)
        elif isinstance(default, enum.Enum):
            values[f.name] = type(default)(value)
        elif default and isinstance(default, list) and isinstance(default[0], enum.Enum):
            values[f.name] = [type(default[0])(v) for v in value]
    return cls(**values)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
