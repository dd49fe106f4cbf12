"""Compile health: what torch.compile did to a point, read from torch's own counters in the
process that measures it (record/compile.py holds the figures).

Dynamo and Inductor count as they work, process-wide (torch._dynamo.utils):
- counters["graph_break"]: reason -> breaks taken for it (a break splits the model into graphs
  that run with Python between them);
- counters["stats"]["unique_graphs"]: the graphs captured, and ["calls_captured"]: the calls
  put into them (what the backend is given to compile);
- get_compilation_metrics(): a CompilationMetrics per frame compiled (the last 64); one whose
  `recompile_reason` is set compiled a frame again because a guard failed (a new shape, a
  changed Python value). One inside the measured steps put a compile into a timed step;
- calculate_time_spent(): Dynamo's timed phases, "entire_frame_compile" (forward, Dynamo and
  its backend) and "entire_backward_compile" (AOTAutograd compiles backward at its first run);
- counters["inductor"]["cudagraph_skips"]: graphs Inductor ran without CUDA graphs (a CPU
  tensor, a mutated input ...), under mode=reduce-overhead / max-autotune;
- counters["inductor"]["fxgraph_cache_hit" / "_miss"] and counters["aot_autograd"]
  ["autograd_cache_hit" / "_miss"]: graphs found in (or missing from) the on-disk caches, the
  caches perf.compile_cache gave the point (runner/compile_cache.py).

All are process-wide and grow (torch._dynamo.reset() zeroes the compile time only), so the
probe keeps a copy at the start and reports the difference: a process that measured a point
before (a test, the fork server) adds nothing.
A counter this torch does not keep is null, and `compile_note` names it.
"""

from __future__ import annotations

import collections

import torch

from nanogpt.record.compile import CompilePart

REASONS_KEPT = 5  # graph_break_reasons / recompile_reasons: the first few
REASON_CHARS = 200  # each reason's first line, cut here


class CompileProbe:
    """start() before the first step, window_start() / window_end() around the measured steps,
    result() after: the compile part of the record."""

    def __init__(self, compiled: bool):
        self.compiled = compiled
        self.missing: list[str] = []  # the counters this torch does not keep
        self.before = self.window_from = self.window_to = None

    def start(self) -> None:
        if self.compiled:
            self.before = self._read()

    def window_start(self) -> None:
        if self.compiled:
            self.window_from = self._read()

    def window_end(self) -> None:
        if self.compiled:
            self.window_to = self._read()

    def result(self) -> CompilePart:
        if not self.compiled:
            return CompilePart(compile_note="not compiled")
        now, before = self._read(), self.before
        part = CompilePart()
        breaks = _grown(now["graph_break"], before["graph_break"])
        if breaks is not None:
            part.graph_breaks = sum(breaks.values())
            part.graph_break_reasons = [_reason(r, n) for r, n in breaks.items()][:REASONS_KEPT]
        graphs = _grown(now["stats"], before["stats"])
        part.graphs = None if graphs is None else graphs.get("unique_graphs", 0)
        part.graph_calls = None if graphs is None else graphs.get("calls_captured", 0)
        skips = _grown(now["inductor"], before["inductor"])
        part.cudagraph_skips = None if skips is None else skips.get("cudagraph_skips", 0)
        aot = _grown(now["aot_autograd"], before["aot_autograd"])
        if skips is not None and aot is not None:
            part.compile_cache_hits = skips["fxgraph_cache_hit"] + aot["autograd_cache_hit"]
            part.compile_cache_misses = skips["fxgraph_cache_miss"] + aot["autograd_cache_miss"]
        if now["compile_s"] is not None:  # torch._dynamo.reset() zeroes it: never below 0
            part.compile_s_counted = max(0.0, now["compile_s"] - before["compile_s"])
        recompiles = _new(now["metrics"], before["metrics"])
        if recompiles is not None:
            part.recompiles = len(recompiles)
            reasons = [_reason(m.recompile_reason, None) for m in recompiles]
            part.recompile_reasons = list(dict.fromkeys(reasons))[:REASONS_KEPT]
            if self.window_from is not None and self.window_to is not None:
                in_window = _new(self.window_to["metrics"], self.window_from["metrics"])
                part.recompiles_in_window = len(in_window)
        notes = [f"torch {torch.__version__} keeps no {name}" for name in self.missing]
        if part.recompiles is not None and part.recompiles_in_window is None:
            notes.append("no measured window (a time-to-loss run): recompiles_in_window null")
        part.compile_note = "; ".join(dict.fromkeys(notes)) or None
        return part

    def _read(self) -> dict:
        """A copy of every counter the part reads; None where this torch lacks one."""
        read = {}
        counters = self._get(lambda u: u.counters, "counters")
        for group in ("graph_break", "stats", "inductor", "aot_autograd"):
            read[group] = None if counters is None else collections.Counter(counters[group])
        read["compile_s"] = self._get(
            lambda u: u.calculate_time_spent()["total_wall_time"], "calculate_time_spent"
        )
        metrics = self._get(lambda u: u.get_compilation_metrics(), "get_compilation_metrics")
        if metrics is not None:  # the ones that recompiled a frame (the objects, compared by is)
            metrics = [m for m in metrics if getattr(m, "recompile_reason", None)]
        read["metrics"] = metrics
        return read

    def _get(self, read, name: str):
        try:
            from torch._dynamo import utils
        except ImportError:
            self.missing.append("torch._dynamo.utils")
            return None
        try:
            return read(utils)
        except (AttributeError, KeyError, TypeError):
            self.missing.append(f"torch._dynamo.utils.{name}")
            return None


def _grown(now, before) -> collections.Counter | None:
    """What a counter group gained since `before` (positive counts only); None if not kept."""
    return None if now is None or before is None else now - before


def _new(now: list | None, before: list | None) -> list | None:
    """The recompiling frames recorded since `before`."""
    if now is None or before is None:
        return None
    return [m for m in now if not any(m is b for b in before)]


# Dynamo's words for a break, and what they mean for a model's code (the first that the reason
# starts with): the record and the compile line say the cause, Dynamo's reason after it.
CAUSES = {
    # a higher-order op (torch.utils.checkpoint's) refuses a body that mutates Python state:
    # transformers 5.25's deprecation wrapper around a layer's forward does (docs/models.md)
    "HOP: Unsafe side effect": "a side effect inside a checkpointed block",
    # a function this torch's Dynamo has no rule for (torch 2.11: _is_autocast_available)
    "Attempted to call function marked as skipped": "a call this torch's Dynamo cannot trace",
}


def _reason(text, count: int | None) -> str:
    lines = str(text).strip().splitlines()
    line = " ".join(lines[0].split())[:REASON_CHARS] if lines else "(no reason given)"
    cause = next((c for start, c in CAUSES.items() if line.startswith(start)), None)
    line = f"{cause}: {line}" if cause else line
    return line if count is None or count == 1 else f"{line} (x{count})"
