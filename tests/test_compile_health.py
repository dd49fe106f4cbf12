"""Compile health (the record's `compile` part, probes/compile_health.py) and what compile
bought (analysis/compare.compile_verdict): a user's model with a deliberate graph break compiled
for real in this process, its eager twin, and the table that sets one against the other."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from nanogpt.analysis import compare, derive, table
from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.analysis.figures import derive_point
from nanogpt.analysis.store import write_record
from nanogpt.config.spec import Exclusive, ModelConfig, RunSpec
from nanogpt.probes.compile_health import CompileProbe
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World

from .test_byo_contract import TINY

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

# byo's tiny model, its forward asking Dynamo for a break between its two halves, as a `print`
# or a `.item()` would: two graphs forward, the break counted with its reason.
BROKEN = TINY.replace(
    "logits = self.head(self.layers[0](self.wte(idx)))",
    "x = self.layers[0](self.wte(idx))\n        torch._dynamo.graph_break()\n"
    "        logits = self.head(x)",
).replace("{RETURN}", "loss")
assert "graph_break" in BROKEN  # TINY's forward still reads as replaced here


def _measured(tmp_path: Path, compiled: bool):
    (tmp_path / "broken.py").write_text(textwrap.dedent(BROKEN))
    build = {"_target_": "broken.Model"}
    model = ModelConfig(block_size=16, vocab_size=64, build=build, code_dir=str(tmp_path))
    spec = RunSpec(model=model)
    spec.bench.device, spec.bench.diagnose, spec.perf.batch_size = "cpu", False, 2
    spec.bench.warmup_steps, spec.bench.measure_steps, spec.perf.compile = 1, 4, compiled
    spec.bench.exclusive = Exclusive.off  # a shared machine: every point would warn
    ceilings = Ceilings(Peak(None, "unknown"))
    record = measure(spec, torch.device("cpu"), World(), ceilings, tmp_path, [])
    assert record.status == "ok", record.error
    record = derive_point([record], spec.bench.measure_s)  # as the worker does
    record.asked.overrides = [f"perf.compile={str(compiled).lower()}"]  # the worker's part
    return record


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The broken model measured eager and compiled (Inductor, on this CPU), in this process."""
    root = tmp_path_factory.mktemp("compile_health")
    return _measured(root, False), _measured(root, True), root


@pytest.mark.slow  # Inductor compiles (it starts g++)
def test_a_compiled_points_graph_break_is_counted_with_its_reason(twins):
    _, compiled, _ = twins
    part = compiled.compile
    # Dynamo counts the break where it takes it: in the user's forward, and at the runner's
    # call of it (byo.UserModel wraps the user's model), so once or more, one reason.
    assert part.graph_breaks >= 1
    [reason] = part.graph_break_reasons
    assert reason.startswith("Call to `torch._dynamo.graph_break()`")
    assert part.graphs >= 2  # the two halves of forward
    assert part.recompiles == part.recompiles_in_window == 0
    assert part.compile_s_counted > 0 and part.cudagraph_skips == 0
    assert part.compile_note is None
    assert "recompile" not in compiled.timing.unsteady_reasons


@pytest.mark.slow  # Inductor compiles (it starts g++)
def test_an_eager_points_compile_part_is_null_with_the_reason(twins):
    eager, _, _ = twins
    part = eager.compile.__dict__
    assert part.pop("compile_note") == "not compiled"
    assert set(part.values()) == {None}


@pytest.mark.slow  # Inductor compiles (it starts g++)
def test_the_table_says_what_compile_bought_with_the_graph_breaks(twins):
    """The two records written as a sweep writes them; the table's verdict and the line under
    the console's table name the break."""
    eager, compiled, root = twins
    sweep = root / "sweep"
    for number, record in enumerate((eager, compiled)):
        write_record(sweep / str(number), record)
    built_sweep = table.build_table(sweep)
    built = built_sweep.table
    bought = eager.timing.step_ms_median / compiled.timing.step_ms_median
    verdict = built["compile_verdict"]
    assert verdict.iloc[0] is None
    breaks = compiled.compile.graph_breaks
    said = f"compile bought {compare.number(bought)}×: {breaks} graph break"
    assert verdict.iloc[1].startswith(said)
    assert ", the first at Call to `torch._dynamo.graph_break()`" in verdict.iloc[1]
    lines = compare.recommend(built, built_sweep.series(), ["eager", "compiled"], None)
    assert f"compiled: {verdict.iloc[1]}" in lines


def test_the_verdict_from_a_hand_built_table():
    frame = pd.DataFrame(
        {
            "overrides": [
                "perf.compile=false x=1",
                "perf.compile=true x=1",
                "x=2 perf.compile=true",
            ],
            "status": ["ok", "ok", "ok"],
            "compile": [False, True, True],
            "step_ms_median": [12.0, 10.0, 9.0],
            "graph_breaks": [None, 7, 0],
            "recompiles": [None, 2, 0],
        }
    )
    verdict = compare.compile_verdict(frame, [None, ["a print in forward", "an .item()"], []])
    assert verdict.iloc[1] == (
        "compile bought 1.20×: 7 graph breaks, the first at a print in forward; 2 recompiles"
    )
    assert verdict.iloc[0] is None and verdict.iloc[2] is None  # eager; no twin (x=2)
    frame.loc[1, "graph_breaks"], frame.loc[1, "recompiles"] = 0, 0
    assert compare.compile_verdict(frame, [None] * 3).iloc[1] == (
        "compile bought 1.20×: no graph breaks"
    )
    frame.loc[1, "graph_breaks"] = None  # a torch without the counter
    assert "(graph breaks not counted)" in compare.compile_verdict(frame, [None] * 3).iloc[1]


def test_a_recompile_inside_the_measured_window_is_counted_there_and_makes_it_unsteady():
    """torch's counters for real, with Dynamo's eager backend (no Inductor: fast): a guard on a
    Python value that changes after the window opens recompiles the frame inside it."""
    mode = ["a"]  # a string Dynamo guards on by value (an int would turn dynamic)

    def f(x):
        return x * 2 if mode[0] == "a" else x * 3

    probe = CompileProbe(True)
    probe.start()
    g = torch.compile(f, backend="eager")
    x = torch.ones(3)
    g(x)
    mode[0] = "b"  # before the window: a recompile outside it
    g(x)
    probe.window_start()
    mode[0] = "c"
    g(x)
    probe.window_end()
    part = probe.result()
    assert part.recompiles == 2 and part.recompiles_in_window == 1
    assert part.graph_breaks == 0 and part.graphs == 3
    assert "mode[0] == 'a'" in part.recompile_reasons[0]
    steps = [10.0] * 9
    assert derive.steadiness(steps, 1.0, 0.0, False, part.recompiles_in_window).reasons == (
        derive.RECOMPILE,
    )
    assert derive.steadiness(steps, 1.0, 0.0, False, 0).steady


def test_a_pooled_point_keeps_the_recompiles_inside_every_repeats_window():
    """bench.repeats: the first repeat's part, its recompiles_in_window summed over repeats (a
    recompile in the second repeat's window is not lost to the first's clean one), and the
    point unsteady for it."""
    from nanogpt.record import Record, Setup, Timing
    from nanogpt.record.compile import CompilePart

    def run(recompiles: int) -> Record:
        timing = Timing(measured_steps=9, measured_s=1.0)
        setup = Setup(device="cpu", tokens_per_step=32, world_size=1, flops_per_token=1000)
        part = CompilePart(graph_breaks=2, recompiles_in_window=recompiles)
        steps = [{"phase": "measure", "step_ms_job": 10.0} for _ in range(9)]
        return Record(status="ok", setup=setup, timing=timing, compile=part, steps=steps)

    pooled = derive_point([run(0), run(1)], floor_s=0.0)
    assert pooled.compile.graph_breaks == 2 and pooled.compile.recompiles_in_window == 1
    assert pooled.timing.steady is False and pooled.timing.unsteady_reasons == ["recompile"]
    assert pooled.timing.steady_note == "run 2 of 2: 1 recompile(s) during the measured steps"
