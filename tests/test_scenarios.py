"""Scenarios behind one interface (nanogpt/scenarios/base.py, issue 46 item 2): throughput and time
to loss each answer every face's hooks, the one picker gives a run and its record the same
scenario, and the callers (the measured loop, the job's seed and console line, the point's pool
and figures, the search's objectives, the plots) go through it: real micro runs on the CPU, in
process, as tests/test_time_to_loss.py measures them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.analysis.figures import derive_point
from nanogpt.config.choices import Objective
from nanogpt.publish import plots
from nanogpt.runner.job import summary_line
from nanogpt.scenarios import base
from nanogpt.scenarios.loop import measure
from nanogpt.train.distributed import World
from nanogpt.tune import objectives

from .conftest import with_micro

CPU = torch.device("cpu")
UNKNOWN_PEAK = Ceilings(Peak(None, "unknown"))  # no MFU: no figure here needs one
SCENARIOS = Path(base.__file__).parent


def _hooks(protocol: type) -> list[str]:
    """A face protocol's members: its methods and its data (annotations)."""
    methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and n[0] != "_"]
    return methods + list(getattr(protocol, "__annotations__", {}))


def test_every_scenario_has_every_face_with_its_protocols_hooks():
    assert {s.name for s in base.ALL} == {"throughput", "time_to_loss"}
    for scenario in base.ALL:
        for face, protocol in base.FACES.items():
            assert (SCENARIOS / scenario.name / f"{face}.py").is_file()
            module = scenario.face(face)
            assert isinstance(module, protocol), f"{scenario.name}/{face}.py"
            for hook in _hooks(protocol):
                want = getattr(protocol, hook, None)
                if not inspect.isfunction(want):
                    continue  # data: isinstance checked it is there
                wanted = [p for p in inspect.signature(want).parameters if p != "self"]
                got = list(inspect.signature(getattr(module, hook)).parameters)
                assert got == wanted, f"{scenario.name}/{face}.py: {hook}{tuple(got)}"


def test_every_objective_and_plot_is_one_scenarios():
    """The search's names (config/choices.Objective) each answered by exactly one scenario's
    guard; the PNGs are the scenarios' own, throughput's first."""
    owned = [name for s in base.ALL for name in s.guard.OBJECTIVES]
    assert sorted(owned) == sorted(o.value for o in Objective)
    assert base.of_objective("time_to_loss") is base.TIME_TO_LOSS
    assert base.of_objective("tokens_per_s") is base.THROUGHPUT
    with pytest.raises(KeyError):
        base.of_objective("no_such_objective")
    names = list(plots.every_plot())
    assert names == [*base.THROUGHPUT.plot.PLOTS, *base.TIME_TO_LOSS.plot.PLOTS]
    assert names[0] == "throughput.png" and names[-1] == "val_loss.png"


def _spec(text_file: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR

    overrides = (
        "data=text",
        f"data.path={text_file}",
        "data.tokenizer=char",
        "model.vocab_size=14",
        "model.block_size=8",
        "bench.diagnose=false",
        *overrides,
    )
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose(config_name="config", overrides=with_micro(list(overrides))))


# (its overrides, its scenario, words its console line has, a figure its point derives)
CASES = {
    "throughput": ((), base.THROUGHPUT, "tok/s", lambda p: p.timing.repeats),
    "time_to_loss": (
        ("bench.target_loss=0.001", "bench.max_steps=4", "bench.eval_every=2"),
        base.TIME_TO_LOSS,
        "time to loss 0.001",
        lambda p: p.time_to_loss.ttl_runs,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_and_its_point_go_through_their_scenario(case, text_file):
    overrides, scenario, words, runs_of = CASES[case]
    spec = _spec(text_file, *overrides)
    assert base.of_spec(spec) is scenario  # the one picker: bench.target_loss set or not
    specs = [scenario.checks.run_spec(spec, number) for number in (1, 2)]
    seeds = [s.bench.seed for s in specs]
    # time to loss seeds each run (a distribution over seeds); throughput keeps the point's
    assert seeds == ([spec.bench.seed] * 2 if case == "throughput" else [seeds[0], seeds[0] + 1])
    # the measured loop measures the parts its scenario's run face fills
    runs = [measure(s, CPU, World.from_env(), UNKNOWN_PEAK, text_file.parent, []) for s in specs]
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    assert [base.of_record(r) for r in runs] == [scenario, scenario]
    if case == "throughput":
        assert runs[0].steps and runs[0].time_to_loss.ttl_evals is None
    else:  # a target run times no window: its evaluations instead
        assert not runs[0].steps and [e["step"] for e in runs[0].time_to_loss.ttl_evals] == [
            0,
            2,
            4,
        ]
    # the point: pooled and derived by its scenario's pool face
    point = derive_point(runs, floor_s=0.0)
    assert runs_of(point) == 2
    # the job's console line is its scenario's
    line = summary_line(point, "p")
    assert line.startswith("[ok] p: ") and words in line
    other = "time to loss" if case == "throughput" else "tok/s"
    assert other not in line
    # the search's objectives read it through their scenario's guard
    for name in scenario.guard.OBJECTIVES:
        assert objectives.value(point.to_dict(), name) == scenario.guard.value(
            point.to_dict(), name, None, None
        )
