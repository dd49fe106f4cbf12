"""The record's compile part: what torch.compile did to the point, read from torch's own
counters in the measuring process (probes/compile_health.py): graph breaks and their reasons,
the graphs captured, recompiles (those inside the measured steps make the point unsteady), the
time Dynamo and its backend spent compiling, and CUDA-graph skips. Null, with `compile_note`
saying why, for a point that did not compile or a counter this torch does not keep. The first
step's excess over the median step is rates' `compile_s`; what compile bought against the
point's eager twin is a table-level figure (analysis/compare.py, compile_verdict)."""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.record.fields import TOTAL, json_only, marked


@dataclass
class CompilePart:
    graph_breaks: int | None = None  # counters["graph_break"]: breaks Dynamo took, all reasons
    graph_break_reasons: list | None = json_only()  # the first few: "reason (xN)"
    graphs: int | None = None  # counters["stats"]["unique_graphs"]: graphs Dynamo captured
    # counters["stats"]["calls_captured"]: the calls (ops, modules, methods) put into those
    # graphs, the work handed to the backend; a code object compiled once for every block that
    # shares it is counted once
    graph_calls: int | None = None
    recompiles: int | None = None  # frames compiled again after a guard failed
    recompile_reasons: list | None = json_only()  # the first few guard failures
    # of them, during the measured steps: unsteady
    recompiles_in_window: int | None = marked(pool=TOTAL)
    compile_s_counted: float | None = None  # Dynamo + backend compile time, forward and backward
    # perf.compile_scope=blocks (and FSDP2): the blocks compiled, each on its own, e.g.
    # "blocks: 4 x Block" (a user's model: "layers: 2 x LlamaDecoderLayer"); null: the whole model
    compiled_blocks: str | None = None
    cudagraph_skips: int | None = None  # counters["inductor"]["cudagraph_skips"]
    # graphs Inductor's FX graph cache and AOTAutograd's cache had (or lacked) on disk
    compile_cache_hits: int | None = None
    compile_cache_misses: int | None = None
    compile_note: str | None = None  # why a figure above is null: "not compiled", ...
