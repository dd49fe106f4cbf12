"""The search's answer in the sweep dir.

  best.yaml   the winner's overrides (perf.grad_accum spelled out), to paste into a training
              config or to run again: `python -m nanogpt.run $(yq ...)`
  tune.md     the ranking with intervals, each leader's bottleneck verdict and quality verdict,
              every candidate with what became of it (pruned, oom, failed: why), and what the
              search cost against the full grid
  tune.json   the same, as data (the plot and the benchmark read it)
  tune.png    the objective per trial and, with two objectives or more, the Pareto front

Written atomically, after every rung is done (a resumed search rewrites them).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from nanogpt.analysis.display import number
from nanogpt.config.errors import ConfigError
from nanogpt.record.files import write_atomic
from nanogpt.scenarios import base as scenarios
from nanogpt.tune import ladder
from nanogpt.tune.ladder import pareto_front

BEST_YAML = "best.yaml"
TUNE_MD = "tune.md"
TUNE_JSON = "tune.json"
INTERVAL = "interval"


def best_overrides(best: dict) -> list[str]:
    """The winner's overrides, with the grad_accum its micro-batch got (tune.tokens_per_step)."""
    out = list(best["overrides"])
    accum = best["record"].get("grad_accum")
    if accum is not None and not any(o.startswith("perf.grad_accum=") for o in out):
        out.append(f"perf.grad_accum={accum}")
    return out


def summarize(
    *,
    probes: list,
    full: list,
    repeated: list,
    guard: dict,
    dims: dict,
    names: list[str],
    directions: list[str],
    fixed: list[str],
    budget,  # tune/fit.Budget
    margin: float,
    **settings,
) -> dict:
    """The search's answer as data (tune.json): every rung, what was refused and why, and the
    winner: the best finalist that leaves the memory margin free and that the quality guard
    does not flag."""
    from nanogpt.tune import fit  # torch (the estimate's model): not where a table is printed

    refused = {}
    for entry in repeated:
        if not fit.within_margin(entry.record.get("footprint_bytes"), budget, margin):
            refused[entry.key] = f"leaves less than {margin:.0%} of the memory budget free"
        verdict = (guard.get("verdicts") or {}).get(entry.key)
        if verdict and verdict.get("flagged"):
            refused[entry.key] = "trains differently from the baseline (quality guard)"
    best = ladder.winner(repeated, directions, refused)
    return {
        "objectives": names,
        "directions": directions,
        "space": dict(dims),
        "fixed": fixed,
        "grid_size": ladder.grid_size(dims),
        "budget": {"bytes": budget.bytes, "source": budget.source},
        "memory_margin": margin,
        "probes": [e.__dict__ for e in probes],
        "full": [e.__dict__ for e in full],
        "repeats": [e.__dict__ for e in repeated],
        "refused": refused,
        "quality": guard,
        "best": best.__dict__ if best else None,
        **settings,
    }


def write(sweep_dir: Path, summary: dict) -> None:
    ok = [e["values"] for e in summary["probes"] if e["values"] is not None and not e["reason"]]
    if len(summary["objectives"]) > 1:
        front = pareto_front([v[:2] for v in ok], summary["directions"][:2])
        summary["pareto"] = [ok[i][:2] for i in front]
    text = json.dumps(summary, indent=1, default=str)
    write_atomic(sweep_dir / TUNE_JSON, text)
    _WRITTEN[str(Path(sweep_dir).resolve())] = json.loads(text)  # as `read` would find it
    best = summary.get("best")
    if best:
        text = (
            "# The configuration the search chose (tune.md says why): overrides to paste into a\n"
            "# training config, or to run again with `python -m nanogpt.run KEY=VALUE ...`.\n"
            + yaml.safe_dump({"overrides": best_overrides(best)}, sort_keys=False)
        )
        write_atomic(sweep_dir / BEST_YAML, text)
    write_atomic(sweep_dir / TUNE_MD, markdown(summary))
    try:
        from nanogpt.publish.tune_plot import write_plot

        write_plot(sweep_dir, summary)
    except Exception as err:  # a plot never costs the answer
        print(f"tune: no plot ({type(err).__name__}: {err})")


def _fmt(value, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _budget(budget: dict) -> str:
    """The memory budget as tune.md says it: GiB and where from, or why it is unknown."""
    if budget["bytes"] is None:
        return budget["source"]  # "unknown: ..."
    return f"{budget['bytes'] / 2**30:.3g} GiB ({budget['source']})"


def _interval(rec: dict) -> str:
    """The point's 95 % interval, as its scenario's guard says it (of its tokens/s, or with a
    target of its time to loss: a run to one has no tokens/s); "-" without one."""
    said = (scenario.guard.interval(rec) for scenario in scenarios.ALL)
    return next((line for line in said if line is not None), "-")


def markdown(s: dict) -> str:
    names, dirs = s["objectives"], s["directions"]
    lines = [
        "# tune: the search's answer",
        "",
        f"Objective: {', '.join(f'{n} ({d})' for n, d in zip(names, dirs, strict=True))}."
        f" Space: {', '.join(f'`{k}` {v or INTERVAL}' for k, v in s['space'].items())}"
        f" (full grid: {s['grid_size'] or 'continuous'} points). Fixed: "
        f"`{' '.join(s['fixed']) or 'nothing'}`. Memory budget: "
        f"{_budget(s['budget'])}, "
        f"margin {s['memory_margin']:.0%}.",
        "",
    ]
    best = s.get("best")
    if best:
        lines += [f"**Best:** `{' '.join(best_overrides(best))}`", ""]
    else:
        lines += ["**Best:** none recommended (see why below).", ""]
    lines += [
        "## Ranking (finalists, each measured in fresh processes, pooled; 95 % interval)",
        "",
        f"| rank | candidate | {' | '.join(names)} | 95 % interval | repeats | peak GiB | "
        "bottleneck | quality | recommended |",
        "|---|---|" + "---|" * len(names) + "---|---|---|---|---|---|",
    ]
    quality = s.get("quality") or {}
    verdicts = quality.get("verdicts") or {}
    finalists = sorted(
        (e for e in s["repeats"] if e["values"] is not None),
        key=lambda e: (-1 if s["directions"][0] == "maximize" else 1) * e["values"][0],
    )
    for rank, e in enumerate(finalists, 1):
        rec, v = e["record"], verdicts.get(e["key"])
        q = "not checked"
        if v:
            q = v.get("note") or (
                f"loss {v['loss']:.3f} vs {v['baseline_loss']:.3f} (floor ±{v['floor']:.3f})"
                + (" FLAGGED" if v["flagged"] else " ok")
            )
        refused = s["refused"].get(e["key"])
        lines.append(
            f"| {rank} | `{e['key']}` | "
            + " | ".join(number(x, 4) for x in e["values"])
            + f" | {_interval(rec)} | {rec.get('repeats') or 1} | "
            f"{_fmt(rec.get('peak_memory_gib'), '.2f')} | {_bottleneck(rec)} | {q} | "
            f"{'no: ' + refused if refused else 'yes'} |"
        )
    lines += ["", f"Quality: {quality.get('note') or 'checked'}"]
    if quality.get("checked") and "seeds" in quality:  # the short comparison (no target)
        lines.append(
            f" over {quality['steps']} steps at seeds {quality['seeds']}; baseline "
            f"`{' '.join(quality['baseline']) or 'the configured defaults'}`; the noise floor is "
            "the baseline's spread over the two seeds."
        )
    lines += ["", "## Leaders (the configured protocol, one process each)", ""]
    for e in s["full"]:
        verdict = e["record"].get("bottleneck")
        lines.append(
            f"- `{e['key']}`: {_outcome(e)}"
            + (f"; {verdict}: {e['record'].get('hint') or ''}" if verdict else "")
        )
    if not s["full"]:
        lines.append("- left out: every leader was a finalist")
    lines += ["", "## Every candidate (probe: a short window)", ""]
    lines += ["| trial | candidate | outcome |", "|---|---|---|"]
    for e in sorted(s["probes"], key=lambda e: e["trial"] if e["trial"] is not None else -1):
        lines.append(f"| {e['trial']} | `{e['key']}` | {_outcome(e)} |")
    lines += ["", "## What the search cost", "", *cost_lines(s)]
    return "\n".join(lines) + "\n"


def _bottleneck(rec: dict) -> str:
    verdict = rec.get("bottleneck")
    return f"{verdict}: {rec.get('hint') or ''}" if verdict else "- (no diagnosis)"


def _outcome(e: dict) -> str:
    if e["values"] is not None and not e["reason"]:
        return ", ".join(number(v, 4) for v in e["values"])
    return e["reason"] or "no figure"


def cost_lines(s: dict) -> list[str]:
    """Measured wall time of every point the search ran, against the full grid's estimate
    (its size x the mean wall time of a point under the configured protocol)."""
    rungs = {r: s[r] for r in ("probes", "full", "repeats")}
    spent = {r: sum(e["record"].get("wall_s") or 0 for e in es) for r, es in rungs.items()}
    ran = sum(1 for e in s["probes"] if e["record"])
    pruned = sum(1 for e in s["probes"] if not e["record"])
    full_walls = [e["record"]["wall_s"] for e in s["full"] if e["record"].get("wall_s")] or [
        e["record"]["wall_s"] / (e["record"].get("repeats") or 1)  # a finalist's one process
        for e in s["repeats"]
        if e["record"].get("wall_s")
    ]
    lines = [
        f"- candidates probed: {ran}; pruned before running: {pruned}; leaders measured once "
        f"with the full protocol: {len(s['full'])}; finalists: {len(s['repeats'])}",
        f"- points' wall time: probe {spent['probes']:.0f} s, full {spent['full']:.0f} s, "
        f"repeats {spent['repeats']:.0f} s; the search's own wall time {s['search_wall_s']:.0f} s",
    ]
    if s["grid_size"] and full_walls:
        per_point = sum(full_walls) / len(full_walls)
        grid = s["grid_size"] * per_point
        total = sum(spent.values())
        lines.append(
            f"- the full grid, estimated: {s['grid_size']} points x {per_point:.1f} s (a leader's "
            f"mean wall time a process) = {grid:.0f} s; the search's points took "
            f"{total / grid:.2f}x that "
            "(benchmarks/tune_vs_grid.py measures both)"
        )
    return lines


def finalists(s: dict) -> dict[str, str]:
    """The finalists (the repeats rung), what the console's table shows: job dir -> the
    candidate, named by the values the search chose (never the fixed overrides)."""
    return {e["record"]["job_dir"]: e["key"] for e in s["repeats"] if e["record"].get("job_dir")}


def closing_lines(s: dict) -> list[str]:
    """What the console says last: the answer (best.yaml's overrides, its figures and their
    interval over its processes) or why there is none, then what the search cost."""
    best = s.get("best")
    if best:
        rec = best["record"]
        figures = ", ".join(
            f"{name} {number(value, 4)}"
            for name, value in zip(s["objectives"], best["values"], strict=True)
        )
        lines = [
            f"best ({BEST_YAML}): {' '.join(best_overrides(best))}: {figures}; "
            f"{_interval(rec)} over {rec.get('repeats') or 1} processes"
        ]
    else:
        lines = [f"best: none recommended; {TUNE_MD} says why for each finalist"]
    return lines + [f"search: {line[2:]}" for line in cost_lines(s)]


def none_feasible(probes: list, sweep_dir: Path) -> ConfigError:
    """The search's error when no candidate fits or runs: their reasons, and where they are."""
    reasons = sorted({e.reason or "no figure" for e in probes})
    return ConfigError(
        "hydra.sweeper.params",
        f"no candidate of {len(probes)} fits or runs ({'; '.join(reasons)[:300]})",
        "widen the space (smaller perf.batch_size, perf.ac=selective or full, "
        "perf.loss=chunked) or raise bench.max_batch_memory_gib; every trial is in "
        f"{sweep_dir / TUNE_MD}",
    )


# The answers this process wrote, by sweep dir (resolved): the sweep's end takes its answer from
# here, never reading back the tune.json it has just written
_WRITTEN: dict[str, dict] = {}


def read(sweep_dir: Path) -> dict | None:
    """A search's answer as data (tune.json; the one this process wrote, held), or None in a
    sweep that is no search."""
    held = _WRITTEN.get(str(Path(sweep_dir).resolve()))
    if held is not None:
        return json.loads(json.dumps(held))  # a copy: the caller may change it
    path = sweep_dir / TUNE_JSON
    return json.loads(path.read_text()) if path.exists() else None
