"""Time to loss in the search (hydra/sweeper=tune, docs/tune.md): its objective, and the quality
guard where a target is set.

The objective `time_to_loss` is a point's time_to_loss_s (minimised; null unless every run
reached the target). The guard: the finalists were measured as runs to the target, and so is
the baseline, with as many runs; a finalist is flagged when not every run reached the target,
or when the baseline's runs reach it sooner at p < report.ttl_alpha (the table's one-sided Welch
test, pool.py, asked the other way round).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from nanogpt.record.swept import point_key
from nanogpt.scenarios.time_to_loss import pool as ttl
from nanogpt.scenarios.time_to_loss.checks import target_of

if TYPE_CHECKING:
    from nanogpt.scenarios.base import Searching

NAME = "time_to_loss"  # tune.objective's name (config/choices.Objective)
# time_to_loss_s, minimised: null unless every run reached the target
OBJECTIVES = {NAME: "minimize"}
# the search's names -> a flat record's fields (tune/objectives.record_fields takes them in)
RECORD_FIELDS = {
    NAME: "time_to_loss_s",
    "ttl_s_per_run": "ttl_s_per_run",  # the quality guard's test (to_target)
    "ttl_note": "ttl_note",
    "ttl_ci_low": "ttl_ci_low",  # the answer's interval (publish/tune_answer.py)
    "ttl_ci_high": "ttl_ci_high",
}


def value(record: dict, name: str, usd_per_hour=None, usd_per_kwh=None) -> float | None:
    """The objective: the olympic mean of the runs (pool.py), null unless every run reached."""
    del usd_per_hour, usd_per_kwh
    if name != NAME:
        raise KeyError(name)
    out = record.get(RECORD_FIELDS[NAME])
    return None if out is None or not math.isfinite(out) else float(out)


def needs(name: str, usd_per_hour, usd_per_kwh, asked: bool) -> str | None:
    """Why the objective cannot be computed without a target (the key to set), or None."""
    del name, usd_per_hour, usd_per_kwh
    if not asked:  # the search's runs have no target
        return (
            "bench.target_loss: time_to_loss needs a target validation loss; set it "
            "(docs/time_to_loss.md)"
        )
    return None


def interval(record: dict) -> str | None:
    """The point's time-to-loss interval (a run to a target has no tokens/s), where it has
    one (every run reached)."""
    from nanogpt.analysis.display import number  # pandas: the answer's process, not a run's

    low, high = record.get("ttl_ci_low"), record.get("ttl_ci_high")
    return None if low is None else f"time to loss [{number(low)}, {number(high)}] s"


def _runs(record: dict) -> list[float]:
    """The times to loss of the runs that reached (a record as tune/jobs.kept keeps it)."""
    return [t for t in record.get("ttl_s_per_run") or [] if t is not None]


def ttl_verdict(baseline: dict, finalist: dict, alpha: float) -> dict:
    """{flagged, note, p_value, ratio}: flagged when the finalist's runs did not all reach the
    target, or when the baseline's reach it sooner at p < alpha (no flag with fewer than 2 runs
    a side: no test)."""
    if finalist.get("status") != "ok" or finalist.get("time_to_loss") is None:
        note = finalist.get("ttl_note") or finalist.get("error") or "no time to loss"
        return {"flagged": True, "note": f"FLAGGED: did not reach the target ({note})"}
    base, runs = _runs(baseline), _runs(finalist)
    p = ttl.p_value(runs, base)  # "the baseline's times are shorter"
    r = ttl.ratio(base, runs)[0] if base and runs else None
    flagged = p is not None and p < alpha
    note = (
        f"time to loss {finalist['time_to_loss']:.3g} s vs {baseline['time_to_loss']:.3g} s"
        + (f" (x{r:.2f})" if r is not None else "")
        + ("" if p is None else f", baseline sooner p={p:.3g}")
        + (" FLAGGED" if flagged else " ok")
    )
    return {"flagged": flagged, "note": note, "p_value": p, "ratio": r}


def to_target(baseline: dict, finalists: list, alpha: float, target: float) -> dict:
    """The guard with a target: each finalist's runs (entries with .key and .record) against
    the baseline's record, measured to the same target with as many runs."""
    if baseline.get("status") != "ok" or baseline.get("time_to_loss") is None:
        why = baseline.get("ttl_note") or baseline.get("error") or "no record"
        return {
            "checked": False,
            "note": f"quality not checked: the baseline did not reach the target ({why})",
        }
    return {
        "checked": True,
        "target_loss": target,
        "alpha": alpha,
        "note": f"time to loss {target:g} against the baseline's runs (one-sided Welch, "
        f"flagged at p < {alpha:g}, or when a run did not reach)",
        "verdicts": {e.key: ttl_verdict(baseline, e.record, alpha) for e in finalists},
    }


def quality(finalists: list, search: Searching) -> dict:
    """The guard with a target: the finalists were measured as runs to it, and so is the
    baseline, with as many runs (a finalist's own record where the baseline is one); each
    finalist's runs against the baseline's at p < report.ttl_alpha (to_target)."""
    same = [e.record for e in finalists if e.key == point_key(search.baseline)]
    if same:
        base = same[0]
    else:
        runs = [*search.baseline, f"bench.repeats={search.repeats}"]
        [base] = search.launch([(runs, "quality baseline")])
    config = search.config
    return to_target(base, finalists, config.report.ttl_alpha, target_of(config.bench))
