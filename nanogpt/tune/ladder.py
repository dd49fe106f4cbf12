"""Cheap before dear: which candidates climb from one rung to the next, and which one wins.

A search's rungs (successive halving over a short ladder):
  probe     every candidate, a short window (a few steps, no diagnosis)
  full      the `leaders` best probes, the configured measurement protocol
  repeats   the `finalists` best of those, measured again in `repeats` fresh processes (pooled,
            with an interval that holds the between-process noise one process cannot show)
The winner is the best finalist that leaves the memory margin free and trains as well as the
baseline (tune/quality.py). Pure functions over plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Entry:
    """One candidate on one rung."""

    key: str  # the candidate's overrides, sorted, joined: its identity in the search
    overrides: list[str]
    rung: str  # probe | full | repeats | quality
    trial: int | None = None  # the Optuna trial (probe rung)
    values: list[float] | None = None  # the objectives, None when infeasible
    reason: str | None = None  # why infeasible: pruned by estimate, oom, failed, invalid
    record: dict = field(default_factory=dict)  # the figures read from the record

    @property
    def feasible(self) -> bool:
        return self.values is not None and self.reason is None


def judged(entry: Entry, names: list[str]) -> Entry:
    """The entry with its verdict from its record (tune/jobs.kept): the objectives' values, or
    why there are none (ran out of memory, failed, a figure the record cannot give)."""
    record = entry.record
    status, found = record.get("status"), record.get("objectives") or []
    if status == "oom":
        entry.reason = "oom: ran out of memory"
    elif status != "ok":
        entry.reason = f"{status}: {record.get('error') or 'no record'}"
    elif any(v is None for v in found):
        missing = [n for n, v in zip(names, found, strict=True) if v is None]
        entry.reason = f"no figure for {', '.join(missing)}"
    else:
        entry.values = found
    return entry


def better(a: float, b: float, direction: str) -> bool:
    return a > b if direction == "maximize" else a < b


def dominates(a: list[float], b: list[float], directions: list[str]) -> bool:
    """a is no worse than b in every objective and better in one."""
    no_worse = all(not better(y, x, d) for x, y, d in zip(a, b, directions, strict=True))
    return no_worse and any(better(x, y, d) for x, y, d in zip(a, b, directions, strict=True))


def pareto_front(points: list[list[float]], directions: list[str]) -> list[int]:
    """Indices of the points no other point dominates."""
    return [
        i
        for i, p in enumerate(points)
        if not any(dominates(q, p, directions) for j, q in enumerate(points) if j != i)
    ]


def order(entries: list[Entry], directions: list[str]) -> list[Entry]:
    """Feasible entries best first by the first objective (the others break nothing: with
    several objectives, `climbers` takes the Pareto front first)."""
    sign = -1 if directions[0] == "maximize" else 1
    return sorted((e for e in entries if e.feasible), key=lambda e: sign * e.values[0])


def climbers(entries: list[Entry], directions: list[str], count: int) -> list[Entry]:
    """The `count` entries that go up a rung: with one objective the best; with several the
    Pareto front first (best first by the first objective), then the rest."""
    ranked = order(entries, directions)
    if len(directions) > 1:
        front = set(pareto_front([e.values for e in ranked], directions))
        ranked = [e for i, e in enumerate(ranked) if i in front] + [
            e for i, e in enumerate(ranked) if i not in front
        ]
    return ranked[: max(count, 0)]


def winner(finalists: list[Entry], directions: list[str], refused: dict[str, str]) -> Entry | None:
    """The best finalist not refused (key -> why: no memory margin, trains worse)."""
    for entry in order(finalists, directions):
        if entry.key not in refused:
            return entry
    return None


def grid_size(dims: dict[str, list[str] | None]) -> int | None:
    """How many points the full grid has; None with a continuous dimension."""
    size = 1
    for values in dims.values():
        if values is None:
            return None
        size *= len(values)
    return size
