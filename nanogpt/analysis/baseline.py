"""The speedup baseline: the point a sweep's other points are measured against.

Given a text (`report.baseline`, `--baseline`, the notebook's BASELINE): the first ok point
whose overrides contain it. Otherwise the rule below, which answers the question the sweep
asks: the point whose swept knobs are at their *reference* setting, the setting the others are
an improvement over. Knobs are taken in this order; each one that differs among the remaining
ok points keeps only the points at its reference, and the first point left (in sweep order)
is the baseline:

  compile                    eager (false): compile is measured against eager
  dtype                      the widest swept: fp32, then tf32, then bf16, then fp16 (bf16 before
                             fp16: autocast's default 16-bit type, and no loss scaling)
  attention                  manual (the materialised softmax(QK^T)V of the GPT-2 code), then
                             math (SDPA's unfused path), then auto, then the fused kernels
  ac                         none: recomputing is what costs time
  compile_mode               default
  optimizer_impl             for_loop, then foreach, then auto, then fused: the plain loop first
  grad_accum                 the fewest accumulation steps (1: none)
  world_size                 the fewest processes (1)
  batch_size, block_size     the smallest
  n_params                   the smallest model
Any other swept key (logger.log_interval, optimizer, data, a preset file): the first point of
the sweep, i.e. the value listed first. So compile x {bf16, fp16} gets eager bf16, and
compile x {fp32, tf32, bf16, fp16} eager fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nanogpt.record.swept import (
    override_key,
    parse_override,
    parse_value,
    point_values,
    split_overrides,
    swept_keys,
)

if TYPE_CHECKING:  # the table's types; pandas itself is imported where a table is read
    import pandas as pd

BASELINE_OVERRIDE = "report.baseline="


@dataclass(frozen=True)
class Knob:
    column: str  # the record's column
    key: str  # how the user sets it
    order: tuple | None  # preferred values, best first; None: the smallest
    why: str


KNOBS = (
    Knob("compile", "perf.compile", (False,), "eager: what compile is measured against"),
    Knob("dtype", "perf.dtype", ("fp32", "tf32", "bf16", "fp16"), "the widest dtype swept"),
    Knob(
        "attention",
        "perf.attention",
        ("manual", "math", "auto", "efficient", "flash", "cudnn"),
        "the unfused attention the kernels are measured against",
    ),
    Knob("ac", "perf.ac", ("none",), "no recompute"),
    Knob("offload", "perf.offload", ("none",), "kept tensors on the device"),
    Knob("compile_mode", "perf.compile_mode", ("default",), "the default compile mode"),
    Knob(
        "optimizer_impl",
        "optimizer.impl",
        ("for_loop", "foreach", "auto", "fused"),
        "the plain optimizer loop",
    ),
    Knob("grad_accum", "perf.grad_accum", None, "the fewest accumulation steps"),
    Knob("world_size", "dist.nproc", None, "the fewest processes"),
    Knob("batch_size", "perf.batch_size", None, "the smallest batch"),
    Knob("block_size", "model.block_size", None, "the shortest sequence"),
    Knob("n_params", "model", None, "the smallest model"),
)


class BaselineError(ValueError):
    """A baseline text that names no point, or several: one line, the problem and the fix."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"report.baseline: {problem}; {fix}")


@dataclass(frozen=True)
class Choice:
    position: int | None  # the baseline's row position in the table; None: no ok point
    reason: str  # why this point, in words


def choose(table: pd.DataFrame, text: str | None = None) -> Choice:
    """The baseline row's position and the reason, by the module's rule (or `text`)."""
    ok = table[table["status"] == "ok"]
    if text:
        found = named_point(text, list(ok["overrides"]), list(table["overrides"]))
        if found is None:
            raise BaselineError(
                f"'{text}' matches no ok point", "use text from one of the overrides in the table"
            )
        return Choice(table.index.get_loc(ok.index[found]), f"given: report.baseline='{text}'")
    if ok.empty:
        return Choice(None, "no point is ok")
    reasons = []
    for knob in KNOBS:
        if knob.column not in ok or _distinct(ok[knob.column]) < 2:
            continue
        value = _reference(ok[knob.column], knob.order)
        ok = ok[ok[knob.column].map(lambda v, value=value: _same(v, value))]
        reasons.append(f"{knob.key}={_shown(knob, ok.iloc[0])} ({knob.why})")
    if len(ok) > 1:
        reasons.append("the first of the points left (the values listed first)")
    if not reasons:  # nothing to choose between: say so, never an empty reason
        reasons.append("the only ok point")
    return Choice(table.index.get_loc(ok.index[0]), "; ".join(reasons))


def _distinct(column: pd.Series) -> int:
    return len({repr(v) for v in column})


def _reference(column: pd.Series, order: tuple | None):
    values = list(column)
    if order is not None:
        for preferred in order:
            if any(_same(v, preferred) for v in values):
                return preferred
        return values[0]  # a value the rule does not know: the first point's
    # Imported here, not at the top: frontend/compose.py imports this module for names_baseline, and
    # a
    # sweep's fork server imports frontend/compose.py (through nanogpt.run) before its first point.
    import pandas as pd

    numbers = pd.to_numeric(column, errors="coerce")
    return values[0] if numbers.isna().all() else column[numbers.idxmin()]


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return str(a).lower() == str(b).lower()  # "False" read back from a CSV is False
    return a == b


def _shown(knob: Knob, row: pd.Series) -> str:
    value = row[knob.column]
    if knob.column == "n_params":
        return f"{row.get('model')} ({value:,} parameters)"
    return str(value).lower() if isinstance(value, bool | np.bool_) else str(value)


def names_baseline(overrides, baseline: str) -> bool:
    """Whether a point is one the baseline text names. Each override of the text must be one
    of the point's, whole and typed as Hydra types it (record/swept.py): `perf.batch_size=1`
    is not `perf.batch_size=16`, `perf.compile=false` is `perf.compile=False`; a word without
    `=` names a point one of whose values it is (`4x4` for `+sweep/accum_split=4x4`). The
    report.baseline override itself (every point of a sweep given one carries it) is no part
    of a point. `overrides`: a list, or a table's overrides cell."""
    values = point_values(_without_baseline(overrides))
    wanted = split_overrides(baseline)
    for item in wanted:
        parsed = parse_override(item)
        if parsed is None:  # a bare value
            if not any(_equal(value, parse_value(item)) for value in values.values()):
                return False
        elif parsed[0] not in values or not _equal(values[parsed[0]], parsed[1]):
            return False
    return bool(wanted)


def _without_baseline(overrides) -> list[str]:
    point = overrides if isinstance(overrides, list) else split_overrides(overrides)
    return [o for o in point if not o.lstrip("+").startswith(BASELINE_OVERRIDE)]


def _equal(a, b) -> bool:
    return repr(a) == repr(b) or (str(a).lower() == str(b).lower())


def named_point(baseline: str, candidates: list, points: list) -> int | None:
    """The position among `candidates` (each a point's overrides: a list, or a table's cell)
    of the point the baseline text names; None when it names none. One that names several is
    refused (BaselineError), each point named shown by the overrides that vary across
    `points` (the whole sweep), as the table names it. The one lookup of the sweep's check
    (compose.check_points) and the table's (choose)."""
    named = [i for i, overrides in enumerate(candidates) if names_baseline(overrides, baseline)]
    if len(named) < 2:
        return named[0] if named else None
    raise BaselineError(*_ambiguity([candidates[i] for i in named], points, baseline))


def _ambiguity(named: list, points: list, baseline: str) -> tuple[str, str]:
    """(problem, fix) for a baseline text that names several of a sweep's points."""
    varies = set(swept_keys([_without_baseline(point) for point in points]))
    shown = [
        " ".join(o for o in _without_baseline(point) if override_key(o) in varies) or "defaults"
        for point in named
    ]
    listed = "; ".join(shown[:4]) + ("; ..." if len(shown) > 4 else "")
    return (
        f"'{baseline}' names {len(named)} points ({listed})",
        f"name one whole, e.g. report.baseline='{shown[0]}'",
    )
